"""A command line checked before torch is imported: each command's flags, their value kinds, choices, minimums and
required arguments (``arguments.json``, written from the live parsers by :mod:`hf_icl.cli.argument_specs`) rebuilt as
a plain argparse parser. A misspelt flag, ``--max-steps ten``, a value outside the choices or below a flag's minimum
is refused in a fraction of a second, worded as the live command words it, instead of after the seconds ``import
hf_icl`` takes. What it accepts is parsed again by the live parser, which also checks what cannot be written down
here (files, combinations of flags, ``train``'s ranges, which its dataclass checks)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .argument_types import TYPES, below_minimum

ARGUMENTS_FILE = Path(__file__).resolve().parent / "arguments.json"


def _specs() -> dict:
    try:
        return json.loads(ARGUMENTS_FILE.read_text())
    except (OSError, ValueError):  # a broken install: the live parser checks everything instead
        return {}


def early_parser(spec: dict) -> argparse.ArgumentParser:
    """A parser that accepts exactly the command lines the command's live parser accepts (values unconverted but
    checked: kind and choices)."""
    parser = argparse.ArgumentParser(
        prog=spec["prog"],
        usage=spec["usage"].removeprefix("usage: ").rstrip(),
        allow_abbrev=spec["allow_abbrev"],
        add_help=False,
    )
    for argument in spec["arguments"]:
        options = {"dest": argument["dest"]} if argument["flags"] else {}
        if argument["nargs"] == 0:  # a switch (store_true, --no-x, ...)
            options.update(action="store_const", const=True)
        else:
            options.update(nargs=argument["nargs"], type=TYPES.get(argument["kind"]), choices=argument["choices"])
        if argument["flags"]:
            options["required"] = argument["required"]
        parser.add_argument(*(argument["flags"] or [argument["dest"]]), **options)
    return parser


def check_command_line(argv: list[str]) -> None:
    """Parse ``argv`` (``[COMMAND, ...]``) against the stored spec of its command; a bad line exits with status 2 and
    argparse's message. A command without a stored spec (``bench``, an unknown word) is left to the live parser."""
    if any(word in ("-h", "--help") for word in argv):
        return  # help is the live parser's to print (with a --config's values as defaults)
    spec = _specs().get(argv[0]) if argv else None
    if spec is None:
        return
    parser = early_parser(spec)
    parsed = parser.parse_args(argv[1:])
    for argument in spec["arguments"]:
        flag = argument["flags"][0] if argument["flags"] else argument["dest"]
        refusal = below_minimum(flag, getattr(parsed, argument["dest"], None), argument.get("minimum"))
        if refusal is not None:  # one line, as the live command words it
            parser.exit(2, f"{spec['prog']}: error: {refusal}\n")
