"""CAB's prefill on one GPU, taken apart: where the registered call's time goes, kernel by kernel, and how the fused
selection kernel's launch shape moves its time.

    python scripts/profile_cab_gpu.py --output OUT/profile.md                  # on the GPU: bf16, T=32768, 12 heads
    TRITON_INTERPRET=1 python scripts/profile_cab_gpu.py --dry-run --output F  # tiny sizes on CPU (CI runs it)

1. **Profile**: ``torch.profiler`` over ``--calls`` CAB calls and as many causal SDPA calls on the same random q/k/v
   (after two warm-up calls of each); the kernels sorted by their own device time.
2. **Query-range budget**: the registered call on the kernel route for each ``--range-mib`` (how much float32
   partial output one query range may hold): median time, number of ranges and peak extra memory. A smaller budget
   holds less memory but launches more ranges.
3. **Selection sweep**: the fused per-token selection (``select_token_blocks_triton``, indices and counts, one launch
   over all T queries) for each way of scoring (outer products per head dim, or float32 ``tl.dot``) × bisection (32
   passes, or stopping a tile once each row's bound is found) × tile size (float32 scores a program holds) × warps
   per program, timed with ``triton.testing.do_bench`` (median); each output compared with the default launch's (the
   launch shape only decides which program computes a row and the early exit only when to stop; ``tl.dot`` sums in
   another order, so a row whose candidates tie within rounding may pick another block). First, for scale, the same
   launch for ``streaming`` (no scores, no ranking: the writes alone). The fastest is a candidate for the kernel's
   defaults.

Each section is printed and appended to ``--output`` as soon as it is measured.

``scripts/gpu_check.sh`` runs it; record its tables in ``docs/results/cab.md`` with the date and the card.
"""

from __future__ import annotations

import argparse
import itertools
from contextlib import contextmanager
from functools import partial

import torch

from hf_icl.attention import cab as cab_module
from hf_icl.attention.cab import run_selection_only
from hf_icl.attention.cab_params import CABParams
from hf_icl.benchmarks.cab_pairs import (
    MIB,
    InputSpec,
    build_inputs,
    cab_call,
    peak_extra_bytes,
    sdpa_call,
    stand_in_module,
)
from hf_icl.benchmarks.report import hardware_name
from hf_icl.benchmarks.timing import emit_markdown, median_seconds
from hf_icl.kernels.token_selection import fused
from hf_icl.kernels.token_selection.rule import key_block_summaries


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU (run it with TRITON_INTERPRET=1)")
    parser.add_argument("--length", type=int, default=32768, help="tokens T")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3, help="profiled calls of each")
    parser.add_argument("--tiles", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--dot", type=int, nargs="+", default=[0, 1], help="score with tl.dot: 0 (no), 1 (yes)")
    parser.add_argument(
        "--early-exit", type=int, nargs="+", default=[0, 1], help="bisection: 0 (32 passes), 1 (early exit)"
    )
    parser.add_argument("--range-mib", type=float, nargs="+", default=[1024, 256, 64], help="query-range budgets, MiB")
    parser.add_argument("--output", default=None, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.length, args.heads, args.head_dim, args.block_size, args.calls = 256, 2, 32, 16, 1
        args.tiles, args.warps, args.range_mib = [1024], [1, 4], [1.0, 1 / 64]
    for name in ("length", "heads", "head_dim", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not 0 < args.sparsity < 1:
        parser.error(f"--sparsity must lie in (0, 1), got {args.sparsity}")
    if any(t < 16 or t & (t - 1) for t in args.tiles):
        parser.error(f"--tiles must be powers of two >= 16, got {args.tiles}")
    if any(m <= 0 for m in args.range_mib):
        parser.error(f"--range-mib must be positive, got {args.range_mib}")
    if not set(args.dot + args.early_exit) <= {0, 1}:
        parser.error(f"--dot and --early-exit take 0 or 1, got {args.dot} and {args.early_exit}")
    if any(w not in (1, 2, 4, 8, 16) for w in args.warps):
        parser.error(f"--warps must be among 1, 2, 4, 8, 16, got {args.warps}")
    args.device = torch.device("cpu" if args.dry_run else "cuda")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device is visible (use --dry-run on a CPU)")
    args.dtype = torch.float32 if args.dry_run else torch.bfloat16
    # random Gaussian q, k, v as the bench's pairs section draws them (seed 0), so a fresh process rebuilds the same
    args.spec = InputSpec("random", args.length, args.head_dim, args.heads, args.heads, str(args.dtype).split(".")[-1])
    return args


def profile_table(args, query, key, value) -> list[str]:
    """The kernels of ``--calls`` CAB calls and ``--calls`` SDPA calls, by their own device (CPU: host) time."""
    params = CABParams(sparsity=args.sparsity, block_size=args.block_size, min_seq_len=0)
    module, scaling = stand_in_module(params), args.head_dim**-0.5
    cuda = args.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad():
        for _ in range(2):
            cab_call(module, query, key, value, scaling)
            sdpa_call(query, key, value, scaling, False)
        _synchronize(args.device)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.calls):
                with torch.profiler.record_function("cab_call"):
                    cab_call(module, query, key, value, scaling)
            for _ in range(args.calls):
                with torch.profiler.record_function("sdpa_call"):
                    sdpa_call(query, key, value, scaling, False)
            _synchronize(args.device)
    sort_by = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=25, max_name_column_width=70)
    title = (
        f"Profile: CAB calls ({args.calls}; magnitude, row budget, sparsity {args.sparsity}, block {args.block_size}) "
        f"then as many causal SDPA calls, B=1, H={args.heads}, T={args.length}, D={args.head_dim}, "
        f"{str(args.dtype).removeprefix('torch.')}, sorted by {sort_by}:"
    )
    return [title, "", "```", table.rstrip(), "```", ""]


def sweep_table(args, query, key) -> list[str]:
    """The fused selection per launch variant (scores × early exit × tile values × warps), timed, each compared with
    the default launch's output."""
    scaling = args.head_dim**-0.5
    summaries = key_block_summaries(key, args.block_size, "mean")
    rule = dict(block_size=args.block_size, policy="magnitude", budget="row", sparsity=args.sparsity)

    def select():
        return fused.select_token_blocks_triton(
            query, summaries, n_keys=args.length, scaling=scaling, return_indices=True, **rule
        )

    default = {name: getattr(fused, name) for name in ("_DOT_SCORES", "_EARLY_EXIT", "_TILE_VALUES", "_NUM_WARPS")}
    with torch.no_grad():
        reference = [x.clone() for x in select()]
        rows = []
        for dot, early, tile, warps in itertools.product(args.dot, args.early_exit, args.tiles, args.warps):
            variant = {"_DOT_SCORES": bool(dot), "_EARLY_EXIT": bool(early), "_TILE_VALUES": tile, "_NUM_WARPS": warps}
            with _patched(fused, variant):
                got = select()
                differ = int((got[0] != reference[0]).sum())  # token_keep entries
                rows.append((variant, _median_ms(select, args.device), differ))
        streaming = dict(rule, policy="streaming")
        writes_ms = _median_ms(
            lambda: fused.select_token_blocks_triton(
                query, None, n_keys=args.length, scaling=scaling, return_indices=True, **streaming
            ),
            args.device,
        )
    lines = [
        f"Fused selection sweep: `select_token_blocks_triton` (magnitude, row budget, sparsity {args.sparsity}, "
        f"indices and counts) over all T={args.length} queries, H={args.heads}, D={args.head_dim}, one launch; "
        f"median ms; the default launch: {_describe(default)}. The same launch for `streaming` (writes only): "
        f"{writes_ms:.3f} ms.",
        "",
        "| scores | bisection | tile values | warps | ms | token_keep entries unlike the default's "
        f"(of {reference[0].numel()}) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for variant, ms, differ in rows:
        scores, bisection = _describe(variant).split(", ")[:2]
        lines.append(
            f"| {scores} | {bisection} | {variant['_TILE_VALUES']} | {variant['_NUM_WARPS']} | {ms:.3f} | {differ} |"
        )
    best = min(rows, key=lambda row: row[1])
    lines += ["", f"Fastest: {_describe(best[0])}, {best[1]:.3f} ms.", ""]
    return lines


def range_table(args, query, key, value) -> list[str]:
    """The registered call on the kernel route per query-range budget (the float32 partials one range may hold):
    time, ranges and peak extra memory, since a smaller budget trades memory for launches."""
    params = CABParams(sparsity=args.sparsity, block_size=args.block_size, min_seq_len=0, backend="triton")
    module, scaling = stand_in_module(params), args.head_dim**-0.5
    rows = []
    with torch.no_grad():
        for mib in args.range_mib:
            with _patched(cab_module, {"_KERNEL_RANGE_BYTES": int(mib * MIB)}):
                ranges = run_selection_only(query, key, params, scaling)
                call = partial(cab_call, module, query, key, value, scaling)
                ms = _median_ms(call, args.device)
                peak = peak_extra_bytes("cab", args.spec, params, args.device) if args.device.type == "cuda" else None
                rows.append((mib, ranges, ms, "n/a" if peak is None else f"{peak / MIB:.1f}"))
    lines = [
        "Query-range budget of the kernel route (`_KERNEL_RANGE_BYTES`, default "
        f"{cab_module._KERNEL_RANGE_BYTES / MIB:g} MiB): the registered call (magnitude, row budget, sparsity "
        f"{args.sparsity}) on T={args.length}, median ms, and the extra memory its peak holds beyond q, k, v.",
        "",
        "| range budget MiB | ranges | ms | peak extra MiB |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {mib:g} | {ranges} | {ms:.3f} | {peak} |" for mib, ranges, ms, peak in rows]
    return lines + [""]


def _describe(variant: dict) -> str:
    warps = variant["_NUM_WARPS"] or "derived"
    return (
        f"{'dot' if variant['_DOT_SCORES'] else 'outer'}, {'early exit' if variant['_EARLY_EXIT'] else '32 passes'}, "
        f"tile {variant['_TILE_VALUES']}, warps {warps}"
    )


@contextmanager
def _patched(module, values: dict):
    """Set module attributes (the kernels' private tuning knobs) for the block, then put them back."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _median_ms(call, device: torch.device) -> float:
    """``triton.testing.do_bench``'s median on a GPU (it clears the L2 cache between runs); one timed call on a CPU
    (the dry run only checks that every section runs)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median"))
    return 1e3 * median_seconds(call, 1, device, warmup=0)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> None:
    args = parse_args(argv)
    query, key, value = build_inputs(args.spec, args.device)
    header = [f"`python scripts/profile_cab_gpu.py` on {hardware_name(args.device)}, torch {torch.__version__}", ""]
    # each section printed and appended as soon as it is measured: a run cut short keeps what it finished (the
    # sweep, whose variants each compile, runs last)
    for section in (
        lambda: header + profile_table(args, query, key, value),
        lambda: range_table(args, query, key, value),
        lambda: sweep_table(args, query, key),
    ):
        emit_markdown(section(), args.output)


if __name__ == "__main__":
    main()
