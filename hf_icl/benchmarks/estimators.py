"""Benchmark the in-context estimators of ``hf_icl.estimators``.

Times :class:`~hf_icl.estimators.LeastSquares` against the anchor codebase's method (a Python
loop over prefixes, each a batched ``torch.linalg.lstsq`` with the default driver), checks that
both predict the same, then times the other estimators at the same shape. Prints markdown.

    hf-icl bench estimators                      # B=1280, N=41, d=20 on CPU
    hf-icl bench estimators --threads 2 --all --output bench.md
"""

from __future__ import annotations

import argparse

import torch

from hf_icl.estimators import get_estimator

from .flags import BenchParser, bench_device, bench_memory, check_flags
from .report import cpu_name
from .timing import median_seconds

# Vectorised estimators timed at the full batch, with the arguments used for the table.
VECTORISED = [
    ("ridge", {"lam": 0.1}),
    ("optimal_ridge", {"noise_std": [0.1, 0.5]}),
    ("kernel_ridge", {"lam": 0.1, "bandwidth": 1.0}),
    ("lasso", {"alpha": 0.1}),
    ("knn", {"k": 3}),
    ("averaging", {}),
    ("one_step_gd", {"lr": 0.05}),
    ("nadaraya_watson", {"kernel": "rbf", "bandwidth": 1.0}),
    ("nadaraya_watson", {"kernel": "hilbert"}),
]
# Per-prompt (sklearn / xgboost) or heavy (one network per prefix) estimators: only with --all.
SLOW = [
    ("two_layer_nn", {}),
    ("decision_tree", {}),
    ("xgboost", {}),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = BenchParser(prog="hf-icl bench estimators", description=__doc__)
    parser.add_argument("--batch", type=int, default=1280, help="prompts per batch (B)")
    parser.add_argument("--n-points", type=int, default=41, help="examples per prompt (N)")
    parser.add_argument("--n-dims", type=int, default=20, help="input dimension (d)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs; the median is reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs before timing")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="device of the prompts (default: cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all", action="store_true", help="also time the NN, decision tree and XGBoost")
    parser.add_argument("--all-batch", type=int, default=8, help="batch size for the --all estimators")
    parser.add_argument("--all-repeats", type=int, default=1, help="timed runs for the --all estimators")
    parser.add_argument(
        "--budget", type=float, default=10.0, help="seconds of timed runs per estimator in the second table"
    )
    parser.add_argument("--output", default=None, help="append the markdown report to this file")
    args = parser.parse_args(argv)
    positive = ("batch", "n_points", "n_dims", "repeats", "threads", "all_batch", "all_repeats")
    check_flags(
        parser,
        args,
        ints={**{name: (1, None) for name in positive}, "warmup": (0, None)},
        floats={"budget": (0.0, None, True)},
    )
    bench_device(parser, args.device)
    bench_memory(  # the float32 prompts alone: a lower bound of the peak
        parser,
        f"--batch {args.batch} --n-points {args.n_points} --n-dims {args.n_dims}",
        4 * max(args.batch, args.all_batch) * args.n_points * (args.n_dims + 1),
        args.device,
        "the float32 prompts",
    )
    return args


def make_prompts(batch: int, n_points: int, n_dims: int, seed: int, device: str):
    """Noiseless linear regression in float32: xs ~ N(0, I), w ~ N(0, I), ys = xs @ w."""
    generator = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n_points, n_dims, generator=generator)
    w = torch.randn(batch, n_dims, generator=generator)
    ys = torch.einsum("bnd,bd->bn", xs, w)
    return xs.to(device), ys.to(device)


def anchor_least_squares(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The anchor codebase's method: one batched lstsq per prefix, predicting x_i · w (0 at i = 0)."""
    preds = torch.zeros_like(ys)
    for i in range(1, xs.shape[1]):
        weights = torch.linalg.lstsq(xs[:, :i], ys[:, :i, None]).solution
        preds[:, i] = (xs[:, i] * weights[:, :, 0]).sum(-1)
    return preds


def relative_error(preds: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |preds - reference| / max |reference|``: the error relative to the targets' scale."""
    preds, reference = preds.double(), reference.double()
    return float((preds - reference).abs().max() / reference.abs().max())


def compare_least_squares(args: argparse.Namespace) -> tuple[list[str], bool]:
    xs, ys = make_prompts(args.batch, args.n_points, args.n_dims, args.seed, args.device)
    ours = get_estimator("least_squares")
    anchor_time = median_seconds(anchor_least_squares, args.repeats, args.device, xs, ys, warmup=args.warmup)
    ours_time = median_seconds(ours, args.repeats, args.device, xs, ys, warmup=args.warmup)
    preds = ours(xs, ys)
    error_vs_float32 = relative_error(preds, anchor_least_squares(xs, ys))
    # The float32 anchor carries its own rounding error near the square prefix (i = d), so the
    # pass/fail check is against the same anchor run in float64.
    error_vs_float64 = relative_error(preds, anchor_least_squares(xs.double(), ys.double()))
    agrees = error_vs_float64 <= 1e-4
    lines = [
        "| method | median time (ms) | speed-up |",
        "| --- | ---: | ---: |",
        f"| anchor: loop over prefixes of `torch.linalg.lstsq` | {anchor_time * 1e3:.1f} | 1.0× |",
        f"| `LeastSquares` (all prefixes at once) | {ours_time * 1e3:.1f} | {anchor_time / ours_time:.1f}× |",
        "",
        f"Max relative error (max |ours − anchor| / max |anchor|): {error_vs_float64:.2e} vs the anchor in "
        f"float64 ({'agrees' if agrees else 'DISAGREES'} to 1e-4), {error_vs_float32:.2e} vs the timed "
        "float32 anchor.",
    ]
    return lines, agrees


def time_estimators(args: argparse.Namespace) -> list[str]:
    full = (args.batch, args.repeats, args.warmup)
    rows = [("least_squares", {}, *full)] + [(name, kwargs, *full) for name, kwargs in VECTORISED]
    if args.all:
        # No warm-up for the slow ones: they are dominated by per-fit work, not first-call costs.
        rows += [(name, kwargs, args.all_batch, args.all_repeats, 0) for name, kwargs in SLOW]
    lines = ["| estimator | B | median time (ms) | ms per prompt |", "| --- | ---: | ---: | ---: |"]
    for name, kwargs, batch, repeats, warmup in rows:
        xs, ys = make_prompts(batch, args.n_points, args.n_dims, args.seed, args.device)
        estimator = get_estimator(name, **kwargs)
        seconds = median_seconds(estimator, repeats, args.device, xs, ys, warmup=warmup, budget_s=args.budget)
        lines.append(f"| `{estimator.name}` | {batch} | {seconds * 1e3:.1f} | {seconds * 1e3 / batch:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    header = [
        f"### Estimator benchmark: B={args.batch}, N={args.n_points}, d={args.n_dims}, device={args.device}",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_name()}, "
        f"median of {args.repeats} runs after {args.warmup} warm-up (fewer runs for estimators past "
        f"{args.budget:g} s of timing).",
        "",
    ]
    comparison, agrees = compare_least_squares(args)
    report = "\n".join([*header, *comparison, "", *time_estimators(args), ""])
    print(report)
    if args.output:
        with open(args.output, "a", encoding="utf-8") as handle:
            handle.write(report + "\n")
    if not agrees:
        raise SystemExit("LeastSquares disagrees with the anchor beyond relative 1e-4")
    return report


if __name__ == "__main__":
    main()
