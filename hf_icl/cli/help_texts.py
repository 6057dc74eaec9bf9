"""``hf-icl COMMAND --help`` without importing torch: every command's help (and every benchmark's, ``hf-icl bench NAME
--help``), rendered here from the live parsers at a fixed width into ``hf_icl_cli/help_texts.json``, which
:mod:`hf_icl_cli` serves. ``python -m hf_icl.cli.help_texts`` rewrites it and ``hf_icl_cli/arguments.json`` (the flags
the front door checks before importing torch, :mod:`.argument_specs`); a test fails while either differs from what
the parsers print."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from hf_icl_cli.commands import COMMANDS

from .checks import fixed_width

HELP_FILE = Path(__file__).resolve().parents[2] / "hf_icl_cli" / "help_texts.json"


def render(command: str) -> str:
    """What ``hf-icl COMMAND --help`` prints at ``HELP_WIDTH`` columns (``command`` may be ``"bench NAME"``)."""
    from . import main

    out = io.StringIO()
    with fixed_width(), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*command.split(), "--help"])
    return out.getvalue()


def help_keys() -> list[str]:
    """Every command, and ``bench NAME`` for every benchmark."""
    from ..benchmarks import BENCHMARKS

    return [*COMMANDS, *(f"bench {name}" for name in BENCHMARKS)]


def render_all() -> dict[str, str]:
    return {key: render(key) for key in help_keys()}


if __name__ == "__main__":
    from .argument_specs import write

    HELP_FILE.write_text(json.dumps(render_all(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {HELP_FILE} and {write()}")
