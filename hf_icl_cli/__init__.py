"""The ``hf-icl`` console command's front door.

``hf-icl --help`` and ``hf-icl --version`` are answered here, without importing torch, transformers
or ``hf_icl`` itself (whose import registers every model with transformers' Auto classes and takes
seconds); every other call is handed to :func:`hf_icl.cli.main`.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

DESCRIPTION = """\
in-context learning research on Hugging Face: train ICL models, compare them with classical
estimators, evaluate under distribution shifts, CAB block-sparse attention on real LLMs.

Every long option takes both spellings (--n-prompts or --n_prompts); `hf-icl COMMAND --help`
lists a command's options. Multi-GPU:
  accelerate launch -m hf_icl.cli train --config configs/garg_linear_regression.yaml
"""

#: every sub-command and its one-line help (hf_icl.cli builds its parsers with these lines)
COMMANDS = {
    "quickstart": "train a tiny GPT-2 in context, compare it with estimators, save, reload, check",
    "train": "train an ICL model (every training argument is a flag; --config YAML)",
    "evaluate": "evaluate a trained model against estimators (--suite garg: Garg et al.'s distribution shifts)",
    "push": "upload a trained model folder (weights, config, card, plots) to the Hugging Face Hub",
    "compare": "compare in-context estimators on a task family",
    "tasks": "list task families and their hyperparameters",
    "dataset": "build an ICLTasks dataset, save it to disk or push it to the Hub",
    "niah": "needle-in-a-haystack: dense vs CAB policies x sparsities on a causal LM (resumable)",
    "perplexity": "long-text perplexity: dense vs CAB policies x sparsities",
    "reproduce": "reproduce a research document's experiments (hf-icl reproduce --help lists them)",
    "bench": "run a benchmark: cab, estimators, linear-attention, samplers, sgpt, startup (hf-icl bench NAME --help)",
}


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-"):  # no command yet: --help, --version, or a usage error
        front_parser().parse_args(argv)  # prints and exits for all three
    from hf_icl.cli import main as run_command

    return run_command(argv)
