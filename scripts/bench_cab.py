"""CAB speed against dense attention, measured in one run.

    python scripts/bench_cab.py --device cpu                  # T = 4096, 8192; 12 heads; D = 64
    python scripts/bench_cab.py --device cpu --output docs/results/cab.md

Two tables: max-L2 coarsening (the dispatcher's backend vs a naive per-block PyTorch loop), and
CAB prefill attention (coarsen + score + select + gathered exact attention) vs dense causal
``scaled_dot_product_attention`` at several sparsities. Medians after a warm-up; ratios are
against the dense baseline of the same run.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from hf_icl.attention.block_sparse import block_sparse_attention
from hf_icl.attention.cab import CABParams, select_cab_blocks
from hf_icl.benchmarking import emit_markdown, median_seconds
from hf_icl.kernels.coarsen import coarsen_max_l2


def naive_coarsen(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """One block at a time, as the research notebook's PyTorch baseline does."""
    blocks = []
    for start in range(0, x.shape[2], block_size):
        chunk = x[:, :, start : start + block_size]
        best = chunk.float().norm(dim=-1).argmax(dim=-1)
        blocks.append(chunk.gather(2, best[..., None, None].expand(-1, -1, 1, x.shape[-1])))
    return torch.cat(blocks, dim=2)


def naive_coarsen_qk(q, k, block_size):
    return naive_coarsen(q, block_size), naive_coarsen(k, block_size)


def dense_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def cab_prefill(q, k, v, params: CABParams, scaling: float) -> torch.Tensor:
    keep = select_cab_blocks(q, k, params, scaling)
    return block_sparse_attention(q, k, v, keep, block_size=params.block_size, scaling=scaling)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.5, 0.9, 0.95])
    parser.add_argument("--policy", default="hybrid")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None, help="append the markdown to this file")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    scaling = args.head_dim**-0.5
    lines = [
        f"`python scripts/bench_cab.py --device {args.device}` · {platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {args.dtype}, {time.strftime('%Y-%m-%d')}",
        "",
        f"Coarsening (B=1, H={args.heads}, D={args.head_dim}, block {args.block_size}):",
        "",
        "| T | naive loop ms | coarsen_max_l2 ms | speed-up |",
        "|---:|---:|---:|---:|",
    ]
    attention_rows = []
    for length in args.lengths:
        g = torch.Generator(device=args.device).manual_seed(0)
        q, k, v = (
            torch.randn(1, args.heads, length, args.head_dim, generator=g, device=args.device).to(dtype)
            for _ in range(3)
        )
        naive = median_seconds(naive_coarsen_qk, args.repeats, args.device, q, k, args.block_size)
        fast = median_seconds(coarsen_max_l2, args.repeats, args.device, q, k, args.block_size)
        lines.append(f"| {length} | {1e3 * naive:.2f} | {1e3 * fast:.2f} | {naive / fast:.1f}× |")
        dense = median_seconds(dense_causal, args.repeats, args.device, q, k, v)
        attention_rows.append(f"| {length} | dense SDPA | {1e3 * dense:.1f} | 1.0× |")
        for sparsity in args.sparsities:
            params = CABParams(sparsity=sparsity, block_size=args.block_size, policy=args.policy, min_seq_len=0)
            sparse = median_seconds(cab_prefill, args.repeats, args.device, q, k, v, params, scaling)
            attention_rows.append(
                f"| {length} | CAB {args.policy} @ {sparsity:.2f} | {1e3 * sparse:.1f} | {dense / sparse:.2f}× |"
            )
    lines += [
        "",
        f"Prefill attention (B=1, H={args.heads}, D={args.head_dim}, block {args.block_size}), CAB = coarsen + score "
        "+ select + gathered exact attention:",
        "",
        "| T | method | median ms | speed-up vs dense |",
        "|---:|---|---:|---:|",
        *attention_rows,
    ]
    return emit_markdown(lines, args.output)


if __name__ == "__main__":
    main()
