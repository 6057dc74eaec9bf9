"""Garg et al.'s evaluation suite on the zoo's three linear-regression models, and one table of all three.

Runs ``hf-icl evaluate --model models/NAME --suite garg`` for each model (cached: a rerun computes only what a
run's ``metrics.json`` lacks), then collects the runs with :func:`hf_icl.evaluation.read_runs` and prints each
model's error at the last scored position of every evaluation beside least squares and 3-NN (markdown).

Usage::

    python scripts/garg_suite_zoo.py                       # 1280 prompts per evaluation, into outputs/garg
    python scripts/garg_suite_zoo.py --n-prompts 256 --output-dir /tmp/garg
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

MODELS = {"gpt2-icl-linear-regression": "gpt2_icl", "sgpt-linear-regression": "sgpt",
          "linear-gpt-linear-regression": "linear_gpt"}  # fmt: skip
BASELINES = ("least_squares", "knn")


def run_suites(models_dir: Path, output_dir: Path, n_prompts: int) -> None:
    """The suite on every model; each run's own summary goes to stderr (stdout gets the combined table)."""
    from hf_icl.cli import main

    for name in MODELS:
        argv = ["evaluate", "--model", str(models_dir / name), "--suite", "garg", "--n-prompts", str(n_prompts)]
        with contextlib.redirect_stdout(sys.stderr):
            status = main([*argv, "--output-dir", str(output_dir / name)])
        if status != 0:
            raise RuntimeError(f"the garg suite failed on {name}")


def last_position_table(output_dir: Path) -> str:
    """One markdown row per evaluation: every model's and baseline's error at the last scored position
    (mean [5-95 % band]); the baselines' numbers come from the first model's run (all runs share the prompts)."""
    from hf_icl.evaluation import read_runs

    runs = read_runs(output_dir)
    first = next(iter(MODELS))
    keep = runs.predictor.isin(MODELS.values()) & (runs.predictor == runs.model)
    keep |= runs.predictor.isin(BASELINES) & (runs.run == first)
    rows = runs[keep]
    rows = rows.loc[rows.groupby(["run", "evaluation", "predictor"]).n_examples.idxmax()]
    columns = [*MODELS.values(), *BASELINES]
    lines = ["| evaluation | last position | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    for evaluation in dict.fromkeys(runs.evaluation):  # the suite's order
        cells = rows[rows.evaluation == evaluation].set_index("predictor")
        text = [f"{r.value:.3g} [{r.lower:.3g}, {r.upper:.3g}]" for r in (cells.loc[c] for c in columns)]
        lines.append(f"| {evaluation} | {int(cells.n_examples.iloc[0])} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, default=Path("models"), help="where the zoo's folders are")
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/garg"), help="one run folder per model")
    parser.add_argument("--n-prompts", type=int, default=1280, help="prompts per evaluation (Garg et al.: 1280)")
    args = parser.parse_args(argv)
    if args.n_prompts < 1:
        parser.error(f"--n-prompts must be at least 1, got {args.n_prompts}")
    run_suites(args.models_dir, args.output_dir, args.n_prompts)
    table = last_position_table(args.output_dir)
    print(table)
    return table


if __name__ == "__main__":
    main()
