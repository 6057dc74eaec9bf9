"""A generation step (one query per head) over per-token block lists: the split-K decode kernel.

With one query, per-token and per-block selections coincide, so the block-sparse split-K decode kernel
(:func:`hf_icl.kernels.block_sparse_decode.block_sparse_decode_triton`) runs it as it is; this entry only passes the
fused selection's ``(indices, counts)`` straight through (no conversion, no validation, no host sync), and a
left-padded batch's per-row key starts (``row_starts``).
"""

from __future__ import annotations

import torch

from ..block_sparse_attention import HEAD_DIMS
from ..block_sparse_decode import block_sparse_decode_triton

__all__ = ["KERNEL_HEAD_DIMS", "token_sparse_decode"]

#: head dims every CAB kernel (prefill, backward, decode) takes
KERNEL_HEAD_DIMS = HEAD_DIMS


def token_sparse_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, group_heads: bool = False,
    row_starts: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``query (B, H, 1, D)`` at position ``q_offset`` over the blocks listed in ``indices (B, H, 1, W)`` /
    ``counts (B, H, 1)`` of ``key`` / ``value (B, H / g, Nk, D)``; ``group_heads``: every head of a KV group keeps
    the same blocks (one program serves the group); ``row_starts (B,)`` (None: 0): row b's keys are the cache rows
    ``[row_starts[b], Nk)`` (a left-padded row's real tokens), its blocks and query position counted from there
    (read on the device, no host sync). Returns ``(B, H, 1, D)``."""
    return block_sparse_decode_triton(
        query, key, value, indices, counts, block_size=block_size, scaling=scaling, q_offset=q_offset,
        validate=False, group_heads=group_heads, row_starts=row_starts,
    )  # fmt: skip
