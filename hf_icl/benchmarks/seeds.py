"""N seeds of one small model trained at once (``hf-icl train --seeds N``) against N separate runs of the same steps.

hf-icl bench seeds --seeds 3 --steps 50 --models gpt2_icl linear_gpt --output docs/results/seeds.md

Two comparisons, each measured in this run: ``process`` times one ``python -m hf_icl.cli train --seeds N`` against N
``python -m hf_icl.cli train --seed S`` processes (what a user runs); ``call`` times one ``train()`` of the stack
against N ``train()`` calls in this process (imports already paid). Both sides train, evaluate and write the same
final model folders; the bench also checks each stacked seed's weights equal its separate run's (``torch.equal``).
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

from hf_icl.training import ICLTrainingArguments, train
from hf_icl.training.seed_stack import seed_arguments

from .flags import BenchParser, check_flags
from .report import cpu_name, machine_line
from .timing import emit_markdown

MODES = ("process", "call")


def run_arguments(args, model_type: str, output_dir: Path, seeds: int) -> ICLTrainingArguments:
    """The benchmark's run: ``seeds`` seeds from seed 0 (seeds=1: seed 0 alone)."""
    return ICLTrainingArguments(
        output_dir=str(output_dir),
        model_type=model_type,
        model_size="tiny",
        n_dims=args.n_dims,
        n_points=args.n_points,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        eval_prompts=args.eval_prompts,
        eval_steps=0,
        save_steps=0,
        report_to="none",
        disable_tqdm=True,
        seeds=seeds,
    )


def separate_runs(stacked: ICLTrainingArguments) -> list[ICLTrainingArguments]:
    """The N one-seed runs a stack equals (their output folders are the stack's seed folders, elsewhere)."""
    root = Path(stacked.output_dir).with_name(Path(stacked.output_dir).name + "-separate")
    runs = [seed_arguments(stacked, index) for index in range(stacked.seeds)]
    for run in runs:
        run.output_dir = str(root / Path(run.output_dir).name)
    return runs


def in_process(runs: list[ICLTrainingArguments]) -> float:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for run in runs:
            train(run)
    return time.perf_counter() - start


def in_processes(runs: list[ICLTrainingArguments], threads: int) -> float:
    """Seconds of running every run as its own ``python -m hf_icl.cli train`` process, one after the other."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    for run in runs:
        command = [sys.executable, "-m", "hf_icl.cli", *shlex.split(run.command_line())[1:]]
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return time.perf_counter() - start


def same_weights(stacked: ICLTrainingArguments, separate: list[ICLTrainingArguments]) -> bool:
    for run in separate:
        name = Path(run.output_dir).name
        a = load_file(str(Path(stacked.output_dir) / name / "model.safetensors"))
        b = load_file(str(Path(run.output_dir) / "model.safetensors"))
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
            return False
    return True


def measure(args, model_type: str, mode: str, root: Path) -> tuple[float, float, bool]:
    """Median seconds of the stack and of the separate runs (alternating, ``--repeats`` each), and whether every
    seed's weights matched."""
    stacked_times, separate_times, identical = [], [], True
    if mode == "call":  # the first train() in a process pays lazy imports (plotting, baselines): not either side's
        in_process([run_arguments(args, model_type, root / f"{model_type}-warm-up", 1)])
    for repeat in range(args.repeats):
        stacked = run_arguments(args, model_type, root / f"{model_type}-{mode}-{repeat}", args.seeds)
        separate = separate_runs(stacked)
        if mode == "call":
            separate_times.append(in_process(separate))
            stacked_times.append(in_process([stacked]))
        else:
            separate_times.append(in_processes(separate, args.threads))
            stacked_times.append(in_processes([stacked], args.threads))
        identical = identical and same_weights(stacked, separate)
    return statistics.median(stacked_times), statistics.median(separate_times), identical


def main(argv=None) -> str:
    parser = BenchParser(prog="hf-icl bench seeds", description=__doc__)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per run (at least 2)")
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps of every run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--n-dims", type=int, default=5)
    parser.add_argument("--n-points", type=int, default=11)
    parser.add_argument("--eval-prompts", type=int, default=64)
    parser.add_argument("--models", nargs="+", default=["gpt2_icl", "linear_gpt"], help="ICL architectures")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--repeats", type=int, default=1, help="timings per side (the median is reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and OMP_NUM_THREADS of processes)")
    parser.add_argument("--output", default=None, help="append the markdown table to this file")
    args = parser.parse_args(argv)
    positive = ("steps", "batch_size", "n_dims", "n_points", "eval_prompts", "repeats", "threads")
    check_flags(parser, args, ints={"seeds": (2, None), **{name: (1, None) for name in positive}})
    from hf_icl.modeling import MODEL_CLASSES

    for model_type in args.models:
        if model_type not in MODEL_CLASSES:
            allowed = sorted(MODEL_CLASSES)
            parser.error(f"--models: {model_type!r} is not a registered ICL architecture; allowed: {allowed}")
    torch.set_num_threads(args.threads)

    command = (
        f"hf-icl bench seeds --seeds {args.seeds} --steps {args.steps} --batch-size {args.batch_size} "
        f"--n-dims {args.n_dims} --n-points {args.n_points} --eval-prompts {args.eval_prompts} "
        f"--models {' '.join(args.models)} --modes {' '.join(args.modes)} --repeats {args.repeats} "
        f"--threads {args.threads}"
    )
    lines = [
        f"### {args.seeds} seeds stacked vs {args.seeds} separate runs ({args.steps} steps, tiny models, "
        f"B={args.batch_size}, N={args.n_points}, d={args.n_dims})",
        "",
        machine_line(
            command, cpu_name(), f"{os.cpu_count()} cores", f"{args.threads} threads", f"torch {torch.__version__}"
        ),
        "",
        "| model | separate runs as | stacked s | separate s | speed-up | every seed bit-identical |",
        "|---|---|---:|---:|---:|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="hf-icl-bench-seeds-") as tmp:
        for model_type in args.models:
            for mode in args.modes:
                stacked, separate, identical = measure(args, model_type, mode, Path(tmp))
                how = f"{args.seeds} processes" if mode == "process" else f"{args.seeds} train() calls"
                lines.append(
                    f"| {model_type} | {how} | {stacked:.2f} | {separate:.2f} | {separate / stacked:.2f}× | "
                    f"{'yes' if identical else 'NO'} |"
                )
    return emit_markdown(lines, args.output)


if __name__ == "__main__":
    main()
