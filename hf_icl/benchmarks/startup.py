"""Start-up cost: what ``import hf_icl`` adds to importing torch and ``transformers.modeling_utils`` (which any
model needs anyway), and how fast ``hf-icl --help`` answers (it imports neither).

Each case runs in a fresh interpreter ``--repeats`` times, interleaved so that a busy moment of the machine
hits every case alike; the table reports medians. Targets: ``import hf_icl`` at most 1 s over the baseline,
``hf-icl --help`` under 2 s. Run it on an idle machine.

hf-icl bench startup --repeats 7 --output docs/results/startup.md
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time

from .flags import BenchParser, check_flags
from .report import cpu_name, load_average, load_text, machine_line
from .timing import emit_markdown

#: case → Python code a fresh interpreter runs
CASES = {
    "baseline: import torch, transformers.modeling_utils": "import torch, transformers.modeling_utils",
    "import hf_icl": "import hf_icl",
    "hf-icl --help": "import sys, hf_icl_cli\ntry:\n    hf_icl_cli.main(['--help'])\nexcept SystemExit:\n    pass",
    "python (nothing imported)": "pass",
}
IMPORT_TARGET_S = 1.0
HELP_TARGET_S = 2.0


def wall_seconds(code: str) -> float:
    """Wall time of a fresh ``python -c code`` (its output discarded)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
    return time.perf_counter() - started


def measure(repeats: int) -> dict[str, float]:
    """Median wall seconds of every case, rounds interleaved."""
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(repeats):
        for case, code in CASES.items():
            times[case].append(wall_seconds(code))
    return {case: statistics.median(values) for case, values in times.items()}


def main(argv=None) -> str:
    parser = BenchParser(prog="hf-icl bench startup", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per case")
    parser.add_argument("--output", default=None, help="append the markdown table to this file")
    args = parser.parse_args(argv)
    check_flags(parser, args, ints={"repeats": (1, None)})
    load = load_text(load_average())
    medians = measure(args.repeats)
    baseline = medians["baseline: import torch, transformers.modeling_utils"]
    added = medians["import hf_icl"] - baseline
    help_s = medians["hf-icl --help"]
    lines = [
        "### Start-up time",
        "",
        machine_line(
            f"hf-icl bench startup --repeats {args.repeats}",
            cpu_name(),
            f"{os.cpu_count()} cores",
            f"load average {load} at the start",
            f"Python {platform.python_version()}",
        ),
        "",
        "| case | median wall s (fresh interpreter) |",
        "|---|---:|",
        *(f"| {case} | {seconds:.2f} |" for case, seconds in medians.items()),
        "",
        f"`import hf_icl` adds **{added:+.2f} s** to the baseline (target ≤ {IMPORT_TARGET_S:.0f} s: "
        f"{'met' if added <= IMPORT_TARGET_S else 'NOT met'}); `hf-icl --help` takes **{help_s:.2f} s** "
        f"(target < {HELP_TARGET_S:.0f} s: {'met' if help_s < HELP_TARGET_S else 'NOT met'}).",
    ]
    return emit_markdown(lines, args.output)
