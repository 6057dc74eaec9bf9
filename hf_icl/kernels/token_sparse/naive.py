"""The reference for per-token block-sparse attention: dense softmax under the per-token mask, in float64.

O(Nq · Nk) memory: for tests and small inputs only. It knows nothing of key blocks' work lists or merges.
"""

from __future__ import annotations

import torch

from ..block_sparse_reference import token_keep_mask

__all__ = ["token_sparse_attention_naive"]


def token_sparse_attention_naive(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, token_keep: torch.Tensor,
    *, block_size: int, scaling: float, key_valid: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
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
