"""``hf-icl COMMAND --help`` without importing torch: every command's help, rendered here from the live parsers at a
fixed width into ``hf_icl_cli/help_texts.json``, which :mod:`hf_icl_cli` serves. ``python -m hf_icl.cli.help_texts``
rewrites the file; a test fails while it differs from what the parsers print."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

from hf_icl_cli.commands import COMMANDS

#: the width the help is rendered at (argparse reads COLUMNS)
WIDTH = 100
HELP_FILE = Path(__file__).resolve().parents[2] / "hf_icl_cli" / "help_texts.json"


def render(command: str) -> str:
    """What ``hf-icl COMMAND --help`` prints at :data:`WIDTH` columns."""
    from . import main

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([command, "--help"])
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return out.getvalue()


def render_all() -> dict[str, str]:
    return {command: render(command) for command in COMMANDS}


if __name__ == "__main__":
    HELP_FILE.write_text(json.dumps(render_all(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {HELP_FILE}")
