"""CAB speed against dense attention, every number measured in the same run on the same inputs.

    hf-icl bench cab --device cuda --output docs/results/cab.md   # the GPU tables (bf16)
    hf-icl bench cab --device cpu --output docs/results/cab.md    # the CPU tables (fp32, PyTorch path)
    TRITON_INTERPRET=1 hf-icl bench cab --smoke                   # every section on tiny shapes

Sections, in the order they run (each written to ``--output`` as soon as it is measured):

0. **Pairs** (:mod:`.cab_pairs`, first: the numbers that decide): the registered ``"cab"`` call against SDPA on
   random and on captured q/k (``--qk``), with the selected pairs, the executed work, the selection's share and the
   peak extra memory; ``--pairs-only`` runs it alone. Then the end-to-end prefill (3), decode (4) and the selection
   alone, then the older per-kernel sections below (coarsening, and the block-level kernel over the tile unions of
   the per-token selection, kept for comparison with the pair execution).

1. **Coarsening**: ``coarsen_max_l2`` vs its PyTorch path (CUDA) or a per-block loop (CPU); on CUDA also the
   achieved bandwidth against the measured device-to-device copy bandwidth.
2. **Prefill attention** per shape (B, H, D), length T and sparsity: dense causal SDPA (flash backend on CUDA),
   CAB total (coarsen + score + select + sparse attention), the sparse kernel alone on a precomputed selection,
   FlexAttention compiled with the same block mask, and the selection's share of CAB's time; then a roofline table
   of the same runs: each time's floor (:mod:`hf_icl.kernels.roofline`, peaks from ``--peak-bandwidth`` /
   ``--peak-flops``, default H100 SXM) as a percentage of it.
   **Selection alone**: the per-token selection CAB runs, its PyTorch path vs the fused Triton kernel
   (``select_token_blocks(backend=...)``), and how many (token, block) entries the two disagree on. GPU only: on a CPU
   the kernel runs only under ``TRITON_INTERPRET=1`` (``--smoke`` exercises it there).
3. **End-to-end prefill** of a GPT-2-shaped model (12 layers, width 768, 12 heads, random weights, no LM head) with
   ``attn_implementation="cab"`` vs ``"sdpa"``.
4. **Decode**: latency per generated token of the same model vs cache length (one step on a prefilled cache, which
   is cropped back after every step so each repetition sees the same length): sdpa, CAB re-summarising the whole
   key cache every step (a plain ``DynamicCache``), and CAB selecting from the block summaries a ``CABCache`` keeps
   up to date (what ``generate`` uses after ``enable_cab``). On CPU at small sizes, e.g.
   ``hf-icl bench cab --device cpu --lengths 256 --shapes 1,2,64 --sparsities 0.9 --model-lengths
   --cache-lengths 1024 4096 --model-layers 2``.

Timings are medians over ``--repeats`` runs after ``--warmup`` runs, with CUDA events on a GPU.
"""

from __future__ import annotations

import argparse
import sys

import torch

from hf_icl.kernels.block_sparse_attention import kernels_runnable
from hf_icl.kernels.roofline import H100_SXM, DevicePeaks

# this module: the command line; sections 0 in cab_pairs, 1, 2 and the selection alone in cab_kernel_sections, 3 and 4
# in cab_model_sections
from . import cab_pairs
from .cab_kernel_sections import (  # noqa: F401 - the sections' names, importable from here as before
    attention_section,
    cab_prefill,
    coarsening_section,
    compiled_flex,
    copy_bandwidth,
    dense_causal,
    executed_sparsity,
    flex_block_mask,
    kernel_only,
    naive_coarsen,
    naive_coarsen_qk,
    roofline_header,
    roofline_row,
    selection_section,
    sparse_attention,
    tile_unions,
)
from .cab_model_sections import decode_section, model_prefill_section
from .flags import BenchParser, bench_memory, check_flags
from .report import hardware_name, machine_line
from .timing import emit_markdown

GPU_DEFAULTS = {
    "lengths": [4096, 8192, 16384, 32768, 65536],
    "shapes": ["1,12,64", "1,32,128"],
    "sparsities": [0.5, 0.75, 0.9, 0.95],
    "model_lengths": [8192, 16384, 32768],
    "cache_lengths": [4096, 8192, 16384, 32768],
    "dtype": "bfloat16",
}
CPU_DEFAULTS = {
    "lengths": [4096, 8192],
    "shapes": ["1,12,64"],
    "sparsities": [0.5, 0.9, 0.95],
    "model_lengths": [],
    "cache_lengths": [],
    "dtype": "float32",
}
SMOKE = {
    "lengths": [64, 96],
    "shapes": ["1,2,32"],
    "sparsities": [0.5, 0.9],
    "model_lengths": [64],
    "cache_lengths": [64],
    "dtype": "float32",
    "block_size": 16,
    "repeats": 1,
    "warmup": 0,
    "model_layers": 1,
}


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = BenchParser(prog="hf-icl bench cab", description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes through every section (CI / interpreter)")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--shapes", nargs="+", help="B,H,D triples, e.g. 1,12,64 1,32,128")
    parser.add_argument("--sparsities", type=float, nargs="+")
    parser.add_argument("--model-lengths", type=int, nargs="*", help="end-to-end prefill lengths ([] to skip)")
    parser.add_argument("--cache-lengths", type=int, nargs="*", help="decode cache lengths ([] to skip)")
    parser.add_argument("--model-layers", type=int, default=12)
    parser.add_argument("--model-sparsity", type=float, default=0.9)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--policy", default="magnitude")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-flex", dest="flex", action="store_false", help="skip FlexAttention")
    parser.add_argument(
        "--peak-bandwidth",
        type=float,
        default=H100_SXM.bandwidth,
        help="device memory bandwidth for the roofline, bytes/s (default: H100 SXM, 3.35e12)",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=H100_SXM.flop_rate,
        help="device dense matrix FLOP/s for the roofline (default: H100 SXM bf16, 9.9e14)",
    )
    parser.add_argument("--output", default=None, help="append the markdown to this file")
    cab_pairs.add_options(parser)
    args = parser.parse_args(argv)
    defaults = dict(SMOKE if args.smoke else GPU_DEFAULTS if args.device == "cuda" else CPU_DEFAULTS)
    explicit = {name for name in defaults if any(a.startswith("--" + name.replace("_", "-")) for a in argv)}
    for name, value in defaults.items():
        if getattr(args, name) is None or (args.smoke and name not in explicit):
            setattr(args, name, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    _check_sizes(parser, args)
    args.dtype_name, args.dtype, args.device = args.dtype, getattr(torch, args.dtype), torch.device(args.device)
    try:
        args.peaks = DevicePeaks(bandwidth=args.peak_bandwidth, flop_rate=args.peak_flops)
    except ValueError as error:
        parser.error(f"--peak-bandwidth / --peak-flops: {error}")
    if args.device.type == "cpu" and not args.smoke:
        args.flex = False  # compiled FlexAttention is a GPU baseline
    problem = cab_pairs.configure(args, argv)
    if problem:
        parser.error(problem)
    return args


def _check_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every size and fraction flag in range (and ``--shapes`` parsed to ``(B, H, D)`` triples) before any work."""
    shapes = []
    for text in args.shapes:
        parts = text.split(",")
        if len(parts) != 3 or not all(part.strip().isdigit() and int(part) >= 1 for part in parts):
            parser.error(f"--shapes takes B,H,D triples of positive integers, e.g. 1,12,64, got {text!r}")
        shapes.append(tuple(int(part) for part in parts))
    args.shapes = shapes
    check_flags(
        parser,
        args,
        ints={
            "lengths": (1, None),
            "model_lengths": (1, None),
            "cache_lengths": (1, None),
            "model_layers": (1, None),
            "repeats": (1, None),
            "warmup": (0, None),
            "block_size": (16, 128),
        },
        floats={"sparsities": (None, None, True), "model_sparsity": (None, None, True)},  # finite
    )
    if args.block_size & (args.block_size - 1):
        parser.error(f"--block-size must be a power of two in [16, 128], got {args.block_size}")
    for name in ("sparsities", "model_sparsity"):
        values = getattr(args, name)
        if any(not 0 <= value < 1 for value in (values if isinstance(values, list) else [values])):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must lie in [0, 1) (the fraction of blocks dropped), got {values}")
    longest, itemsize = max(args.lengths), getattr(torch, args.dtype).itemsize
    widest = max(shapes, key=lambda shape: shape[0] * shape[1] * shape[2])
    bench_memory(
        parser,
        f"--lengths {longest} --shapes {','.join(map(str, widest))}",
        3 * itemsize * longest * widest[0] * widest[1] * widest[2],
        args.device,
        "q, k and v",
    )


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    use_kernel = kernels_runnable(args.device)
    sparse = f"sparse attention: {'Triton kernel' if use_kernel else 'PyTorch path'}"
    command = f"hf-icl bench cab {' '.join(argv)}"
    header = [
        machine_line(command, hardware_name(args.device), f"torch {torch.__version__}", args.dtype_name, sparse),
        "",
    ]
    # each section is written as soon as it is measured, so a run cut short keeps what it finished
    report = [emit_markdown(header, args.output)]
    if args.pairs_only:
        report += [emit_markdown(lines, args.output) for lines in cab_pairs.pairs_sections(args)]
        return "\n".join(report)
    # the registered call against SDPA first (the numbers that decide), the older per-kernel sections last
    if args.pairs:
        report += [emit_markdown(lines, args.output) for lines in cab_pairs.pairs_sections(args)]
    if args.model_lengths:
        report.append(emit_markdown(model_prefill_section(args), args.output))
    if args.cache_lengths:
        report.append(emit_markdown(decode_section(args), args.output))
    fused_selection = args.device.type == "cuda" or (args.smoke and use_kernel)  # a CPU runs it interpreted only
    for shape in args.shapes:
        report.append(emit_markdown(selection_section(args, shape, fused_selection), args.output))
    report.append(
        emit_markdown(coarsening_section(args, use_kernel and (args.device.type == "cuda" or args.smoke)), args.output)
    )
    flex = compiled_flex(args) if args.flex else None
    for shape in args.shapes:
        report.append(emit_markdown(attention_section(args, shape, use_kernel, flex), args.output))
    return "\n".join(report)  # as the file holds it: each section after a blank line


if __name__ == "__main__":
    main()
