"""The ``hf-icl`` commands (``hf_icl_cli`` answers ``hf-icl --help`` before this package is imported).

Every long option takes both spellings, ``--n-prompts`` or ``--n_prompts``. Multi-GPU training:
``accelerate launch -m hf_icl.cli train --config configs/garg_linear_regression.yaml``.

``checks`` holds the checks every command makes before any work (and :class:`CLIError`), ``icl_commands`` the ICL
commands, ``lm_commands`` the causal-LM ones (niah, perplexity), ``parser`` the parser; here are :func:`main` and the
``bench`` dispatcher.
"""

from __future__ import annotations

import sys

from ..deprecation import moved
from ..progress import quiet_library_bars
from ..validation import one_line
from .checks import CLIError, allocation_error, flag_spelling
from .icl_commands import run_train
from .parser import build_parser

__all__ = ["CLIError", "build_parser", "main", "run_bench", "run_train"]

#: public names ``hf_icl.cli`` held when it was one module, and where they live now (deprecated aliases, for one
#: release)
MOVED = {
    **dict.fromkeys(("COMMANDS", "DESCRIPTION"), "hf_icl_cli.commands"),
    **dict.fromkeys(
        ("DEFAULT_N_DIMS", "run_compare", "run_dataset", "run_evaluate", "run_push", "run_quickstart", "run_reproduce"),
        "hf_icl.cli.icl_commands",
    ),
    "run_tasks": "hf_icl.cli.icl_commands",
    **dict.fromkeys(("run_niah_command", "run_perplexity_command"), "hf_icl.cli.lm_commands"),
}


def run_bench(argv: list[str]) -> int:
    from ..benchmarks import BENCHMARKS, run_benchmark

    if not argv or argv[0] in ("-h", "--help"):
        print("usage: hf-icl bench NAME [benchmark flags]   (hf-icl bench NAME --help for its flags)\n")
        width = max(map(len, BENCHMARKS)) + 2  # every description starts in the same column
        print("\n".join(f"  {name:<{width}}{what}" for name, what in BENCHMARKS.items()))
        return 0
    try:
        run_benchmark(argv[0], argv[1:])
    except (RuntimeError, MemoryError) as err:  # a size past the up-front estimates: torch's allocation failure
        raise allocation_error(err, argv) from None
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else None
    try:
        with quiet_library_bars():  # a log file gets no carriage-return bars from transformers or datasets
            if command == "train":  # HfArgumentParser owns every training flag
                return run_train(argv[1:])
            if command == "bench":  # each benchmark parses its own flags
                return run_bench(argv[1:])
            args = build_parser().parse_args(argv)
            return args.run(args)
    except (ValueError, OSError) as err:  # user errors (bad values, missing files, no Hub): one line, no traceback
        print(f"hf-icl {command}: error: {_spelled(command, one_line(err))}", file=sys.stderr)
        return 2
    # a diverged run names the checkpoint to resume from: one line too (the class, looked up only when an error
    # propagates, exists once training was imported; () matches nothing)
    except getattr(sys.modules.get("hf_icl.training.resume"), "TrainingDivergedError", ()) as err:
        print(f"hf-icl {command}: error: {_spelled(command, one_line(err))}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as err:  # an absurd size: torch's allocation failure, as one line
        failure = allocation_error(err, argv)
        if failure is err:
            raise
        print(f"hf-icl {command}: error: {one_line(failure)}", file=sys.stderr)
        return 2


def _spelled(command: str | None, message: str) -> str:
    """A training refusal as the command line spells it: the trainer words its errors for Python
    (``overwrite_output_dir=True``), the user of ``hf-icl train`` typed flags (``--overwrite_output_dir``)."""
    if command != "train":
        return message
    from ..training import ICLTrainingArguments

    return flag_spelling(message, ICLTrainingArguments.__dataclass_fields__)


__getattr__ = moved(__name__, MOVED)
