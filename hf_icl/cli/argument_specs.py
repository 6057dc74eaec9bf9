"""What each command accepts, written down for the torch-free front door: every flag's spellings, whether it takes
a value, the value's kind (int, float, a JSON object, a comma-separated list, ...), its choices and whether it is
required, rendered from the live parsers into ``hf_icl_cli/arguments.json``. :mod:`hf_icl_cli.early_checks` parses a
command line against it before ``hf_icl`` (and torch) is imported, so a misspelt flag, a non-number or a value outside
the choices is refused at once. ``python -m hf_icl.cli.argument_specs`` rewrites the file (``python -m
hf_icl.cli.help_texts`` does both); a test fails while it differs from the parsers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_icl_cli.commands import COMMANDS

from .checks import fixed_width

ARGUMENTS_FILE = Path(__file__).resolve().parents[2] / "hf_icl_cli" / "arguments.json"

#: argparse's own types by the kind name the front door knows them by; custom types carry ``cli_kind``
_KINDS = {None: "str", str: "str", int: "int", float: "float"}


def value_kind(action: argparse.Action) -> str:
    """The kind of value ``action`` parses (``"any"``: one the front door does not check; the live parser will)."""
    kind = _KINDS.get(action.type) or getattr(action.type, "cli_kind", None)
    if kind is None and getattr(action.type, "__name__", "") == "string_to_bool":  # HfArgumentParser's bool fields
        kind = "bool"
    return kind or "any"


def action_spec(action: argparse.Action) -> dict:
    """One argument as JSON: ``flags`` (empty for a positional), ``dest``, ``nargs`` (0: a switch), ``kind``,
    ``choices`` (strings only, else None), ``required``, ``minimum`` (None: no bound)."""
    takes_value = action.nargs != 0
    choices = list(action.choices) if action.choices is not None else None
    if choices is not None and not all(isinstance(choice, str) for choice in choices):
        choices = None  # non-string choices (enums) are compared after conversion: left to the live parser
    return {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "nargs": action.nargs if takes_value else 0,
        "kind": value_kind(action) if takes_value else None,
        "choices": choices,
        "required": bool(action.required),
        "minimum": getattr(action, "minimum", None),  # OptionParser's: the least an integer flag may be
    }


def parser_spec(parser: argparse.ArgumentParser) -> dict:
    """A command's parser as JSON: its usage line and every argument but ``--help`` / ``--version``."""
    skipped = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return {
        "prog": parser.prog,
        "usage": parser.format_usage(),
        "allow_abbrev": parser.allow_abbrev,
        "arguments": [action_spec(a) for a in parser._actions if not isinstance(a, skipped)],
    }


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """The live parser of every command the front door checks: the argparse commands and ``train`` (``bench``
    dispatches to each benchmark's own parser and is checked there)."""
    from .icl_commands import train_parser
    from .parser import build_parser

    (subparsers,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {name: parser for name, parser in subparsers.choices.items() if name not in ("train", "bench")}
    parsers["train"] = train_parser()
    return parsers


def render_all() -> dict[str, dict]:
    with fixed_width():  # the usage lines wrap as the stored help texts do
        specs = {name: parser_spec(parser) for name, parser in command_parsers().items()}
    assert set(specs) <= set(COMMANDS), sorted(set(specs) - set(COMMANDS))
    return specs


def write() -> Path:
    ARGUMENTS_FILE.write_text(json.dumps(render_all(), indent=1, ensure_ascii=False) + "\n")
    return ARGUMENTS_FILE


if __name__ == "__main__":
    print(f"wrote {write()}")
