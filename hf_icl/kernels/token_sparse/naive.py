"""The reference for per-token block-sparse attention: dense softmax under the per-token mask, in float64.

O(Nq · Nk) memory: for tests and small inputs only. It knows nothing of key blocks' work lists or merges.
"""

from __future__ import annotations

import torch

from ..block_sparse_reference import token_keep_mask

__all__ = ["keep_to_indices", "token_sparse_attention_naive"]


def token_sparse_attention_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    token_keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float64 softmax of each query over the keys of its kept blocks at or before its real position (blocks over
    the row's real tokens); a query that sees no key gets zeros. ``(B, H, Nq, D)`` float64."""
    heads, n_k = query.shape[1], key.shape[2]
    group = heads // key.shape[1]
    allowed = token_keep_mask(token_keep, block_size, n_k, n_k - query.shape[2], key_valid)
    k = key.double().repeat_interleave(group, dim=1)
    v = value.double().repeat_interleave(group, dim=1)
    scores = (query.double() @ k.transpose(-1, -2)) * scaling
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return probs @ v


def keep_to_indices(token_keep: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A bool selection ``(B, H, Nq, Mk)`` → ``indices (B, H, Nq, width)`` int32 (ascending kept blocks, the rest
    repeating the last kept one, 0 for a token that kept none) and ``counts (B, H, Nq)`` int32. ``width`` must bound
    every row's count (a host-side bound, so no device read). Rows keeping more raise ``ValueError`` only on CPU."""
    n_blocks = token_keep.shape[-1]
    width = max(1, min(int(width), n_blocks))
    counts = token_keep.sum(-1)
    if not token_keep.is_cuda and counts.numel() and int(counts.max()) > width:
        raise ValueError(f"width={width} is below the largest count of kept blocks, {int(counts.max())}")
    # kept blocks sort first, ascending: key = index for kept, index + Mk otherwise
    order = torch.arange(n_blocks, device=token_keep.device) + n_blocks * (~token_keep).long()
    indices = order.topk(width, dim=-1, largest=False).values
    last = indices.gather(-1, (counts - 1).clamp_min(0).unsqueeze(-1))
    slot = torch.arange(width, device=token_keep.device)
    indices = torch.where(slot < counts.unsqueeze(-1), indices, last)
    indices = torch.where(counts.unsqueeze(-1) > 0, indices, 0)
    return indices.int(), counts.int()
