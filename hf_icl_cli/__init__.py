"""The ``hf-icl`` console command's front door.

``hf-icl --help``, ``hf-icl --version`` and ``hf-icl COMMAND --help`` are answered here, without importing torch,
transformers or ``hf_icl`` itself (whose import registers every model with transformers' Auto classes and takes
seconds): a command's help is served from ``help_texts.json``, rendered from the live parsers by
:mod:`hf_icl.cli.help_texts` (a test keeps it equal to them). A command line is then checked against the flags
written down in ``arguments.json`` (:mod:`.early_checks`), so a bad flag or value is refused before torch is
imported. Every other call is handed to
:func:`hf_icl.cli.main`, imported inside :func:`main` only (``hf_icl.cli`` imports :mod:`hf_icl_cli.commands`, so a
module-level import here would be a cycle).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from .commands import COMMANDS, DESCRIPTION
from .early_checks import check_command_line

__all__ = ["COMMANDS", "DESCRIPTION", "command_help", "front_parser", "main", "stored_help", "version"]


def version() -> str:
    try:
        return metadata.version("hf-icl")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from pathlib import Path

        init = Path(__file__).resolve().parents[1] / "hf_icl" / "__init__.py"
        for line in init.read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
        return "unknown"


def front_parser() -> argparse.ArgumentParser:
    """The top-level parser: the command list, --help and --version (no per-command options)."""
    parser = argparse.ArgumentParser(
        prog="hf-icl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hf-icl {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_line in COMMANDS.items():
        commands.add_parser(name, help=help_line, add_help=False)
    return parser


def command_help(command: str) -> str | None:
    """The stored ``hf-icl COMMAND --help`` text (None if there is none)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent / "help_texts.json"
    try:
        return json.loads(path.read_text()).get(command)
    except (OSError, ValueError):  # a broken install: the live parser answers instead
        return None


def stored_help(argv: list[str]) -> str | None:
    """The stored help ``argv`` asks for: ``COMMAND --help``, ``bench NAME --help``, or ``reproduce PAPER [EXPERIMENT]
    --help`` (argparse prints the command's help there); None when it asks for none or other flags come first (``train
    --config FILE --help`` shows the file's values as defaults: the live parser answers)."""
    if argv[-1] not in ("-h", "--help") or any(word.startswith("-") for word in argv[:-1]):
        return None
    words = argv[:-1]
    if words[0] == "bench":
        return command_help(" ".join(words))
    return command_help(words[0])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-"):  # no command yet: --help, --version, or a usage error
        front_parser().parse_args(argv)  # prints and exits for all three
    if (text := stored_help(argv)) is not None:
        sys.stdout.write(text)
        return 0
    check_command_line(argv)  # flags, kinds and choices, before the seconds of importing torch
    from hf_icl.cli import main as run_command

    return run_command(argv)
