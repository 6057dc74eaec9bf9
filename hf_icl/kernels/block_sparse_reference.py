"""Exact softmax attention over selected key blocks, in PyTorch (autograd-capable).

Each query block attends only to the key blocks its row of ``keep`` selects: those blocks are
gathered, so the work is ``O(selected blocks)``, not ``O(N²)``. Token-level causality (inside
the diagonal block) and an optional boolean attention mask are applied within the gathered
blocks. This is the CPU / reference execution; the Triton kernel of the next stage must match it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..validation import check_scaling
from ._common import describe


def selected_block_indices(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, H, Mq, Mk)`` bool → indices ``(B, H, Mq, K)`` of the kept key blocks (ascending) and a
    validity mask ``(B, H, Mq, K)``, K being the largest number kept by any row."""
    counts = keep.sum(-1)
    width = max(int(counts.max()), 1)
    indices = _kept_first(keep, width)
    valid = torch.arange(width, device=keep.device) < counts.unsqueeze(-1)
    return indices, valid


def _kept_first(keep: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` block ids of each row with its kept blocks first, ascending, then the others ascending."""
    n_k = keep.shape[-1]
    # key = index for kept blocks, index + Mk otherwise: the smallest keys are the kept blocks in order
    order = torch.arange(n_k, device=keep.device) + n_k * (~keep).long()
    return order.topk(width, dim=-1, largest=False).values % n_k


def keep_to_indices(token_keep: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A bool selection ``(B, H, Nq, Mk)`` → ``indices (B, H, Nq, width)`` int32 (ascending kept blocks, the rest
    repeating the last kept one, 0 for a token that kept none) and ``counts (B, H, Nq)`` int32. ``width`` must bound
    every row's count (a host-side bound, so no device read); a row keeping more raises ``ValueError`` on CPU."""
    width = max(1, min(int(width), token_keep.shape[-1]))
    counts = token_keep.sum(-1)
    if not token_keep.is_cuda and counts.numel() and int(counts.max()) > width:
        raise ValueError(f"width={width} is below the largest count of kept blocks, {int(counts.max())}")
    indices = _kept_first(token_keep, width)
    last = indices.gather(-1, (counts - 1).clamp_min(0).unsqueeze(-1))
    slot = torch.arange(width, device=token_keep.device)
    indices = torch.where(slot < counts.unsqueeze(-1), indices, last)
    indices = torch.where(counts.unsqueeze(-1) > 0, indices, 0)
    return indices.int(), counts.int()


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """``(B, H, N, D)`` → ``(B, H, M, bs, D)``, zero-padding the last block."""
    pad = -x.shape[2] % block_size
    x = F.pad(x, (0, 0, 0, pad))
    return x.unflatten(2, (x.shape[2] // block_size, block_size))


def block_sparse_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, attention_mask: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """Causal attention of ``query (B, H, Nq, D)`` over the kept blocks of ``key``/``value (B, H, Nk, D)``.

    Args:
        keep: ``(B, H, Mq, Mk)`` bool block selection (query blocks of the Nq queries, which start
            at absolute position ``q_offset``; ``q_offset`` must be a multiple of ``block_size``
            unless Nq == 1).
        attention_mask: optional bool ``(B, 1 or H, Nq, Nk)``, True where attention is allowed
            (padding); applied on top of causality and the block selection.
        dropout: dropout probability on the attention weights (pass 0 at evaluation).

    Returns ``(B, H, Nq, D)`` in the query dtype. A query that can see no key at all (a padded
    position) gets zeros, never NaN.
    """
    _check_arguments(query, key, value, keep, block_size, scaling, q_offset, attention_mask, dropout)
    batch, heads, n_q, dim = query.shape
    indices, valid = selected_block_indices(keep)  # (B, H, Mq, K)
    n_k_blocks = keep.shape[-1]
    # Unused slots point one block past the keys: wholly in every query's future, so they are masked
    # like the rest of the future (and like the padding of a partial last block, beyond Nk).
    indices = indices.masked_fill(~valid, n_k_blocks)
    # fewer queries than a block (decode): one query block of just those rows, not padded to block_size
    q_rows = min(block_size, n_q)
    q_blocks = _blocks(query, q_rows)  # (B, H, Mq, q_rows, D)
    n_q_blocks = q_blocks.shape[2]
    n_k = key.shape[2]
    q_pos = q_offset + torch.arange(n_q_blocks * q_rows, device=query.device).view(n_q_blocks, q_rows, 1)
    k_pos = (indices.unsqueeze(-1) * block_size + torch.arange(block_size, device=query.device)).flatten(-2)
    # the selected keys' rows of the (B·H·Nk, D) tensor: gathering them reads only the selected blocks,
    # where padding K and V to whole blocks first would copy the entire cache at every decode step
    heads_offset = torch.arange(batch * heads, device=query.device).view(batch, heads, 1, 1) * n_k
    rows = (heads_offset + k_pos.clamp(max=n_k - 1)).flatten()

    def gathered(x):  # (B, H, Nk, D) → (B, H, Mq, K·bs, D)
        return x.reshape(-1, dim).index_select(0, rows).view(batch, heads, n_q_blocks, -1, dim)

    allowed = (k_pos.unsqueeze(-2) <= q_pos) & (k_pos < n_k).unsqueeze(-2)  # (B, H, Mq, q_rows, K·bs)
    if attention_mask is not None:
        allowed = allowed & _gather_token_mask(attention_mask, indices, block_size, q_rows, heads)
    # an additive mask built in one pass (SDPA would convert a bool mask in two), in 4-D
    # (batch·heads, query blocks, …) so SDPA takes its fused kernel, not the unfused fallback
    bias = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill_(~allowed, float("-inf"))
    out = F.scaled_dot_product_attention(
        q_blocks.flatten(0, 1),
        gathered(key).flatten(0, 1),
        gathered(value).flatten(0, 1),
        attn_mask=bias.flatten(0, 1),
        dropout_p=dropout,
        scale=scaling,
    ).reshape(batch, heads, n_q_blocks * q_rows, dim)  # CUDA SDPA may return a non-contiguous layout
    if attention_mask is not None:
        out = out.nan_to_num(0.0)  # padded queries see nothing; causality alone never empties a row
    return out[:, :, :n_q]


def _check_arguments(query, key, value, keep, block_size, scaling, q_offset, attention_mask, dropout) -> None:
    """Shapes, dtypes, devices and scalars of :func:`block_sparse_attention` (no device sync)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(
                f"{name} must be a 4-D (batch, heads, tokens, head_dim) floating-point tensor, got {describe(x)}"
            )
        if x.dtype != query.dtype or x.device != query.device:
            raise ValueError(
                f"{name} must have query's dtype and device ({query.dtype} on {query.device}), "
                f"got {x.dtype} on {x.device}"
            )
    if key.shape != value.shape or key.shape[:2] != query.shape[:2] or key.shape[3] != query.shape[3]:
        raise ValueError(
            "key and value must have equal shapes (B, H, Nk, D) with query's B, H and D, got "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if min(query.shape[2], key.shape[2]) < 1:
        raise ValueError(f"query and key must hold at least one token, got {query.shape[2]} and {key.shape[2]}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    check_scaling(scaling)
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an integer >= 0, got {q_offset!r}")
    if query.shape[2] > 1 and q_offset % block_size:
        raise ValueError(
            f"q_offset must be a multiple of block_size={block_size} unless Nq == 1 (decode), got q_offset={q_offset}"
        )
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    expected = (*query.shape[:2], -(-query.shape[2] // block_size), -(-key.shape[2] // block_size))
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or tuple(keep.shape) != expected:
        raise ValueError(f"keep must be a bool tensor of shape (B, H, Mq, Mk)={expected}, got {describe(keep)}")
    if keep.device != query.device:
        raise ValueError(f"keep must be on query's device {query.device}, got {keep.device}")
    if attention_mask is not None:
        mask_ok = (
            isinstance(attention_mask, torch.Tensor)
            and attention_mask.dtype == torch.bool
            and attention_mask.dim() == 4
            and attention_mask.shape[0] == query.shape[0]
            and attention_mask.shape[1] in (1, query.shape[1])
            and tuple(attention_mask.shape[2:]) == (query.shape[2], key.shape[2])
        )
        if not mask_ok:
            raise ValueError(
                f"attention_mask must be None or a bool (B, 1 or H, Nq, Nk) tensor, got {describe(attention_mask)}"
            )


def _gather_token_mask(
    mask: torch.Tensor, indices: torch.Tensor, block_size: int, q_rows: int, heads: int
) -> torch.Tensor:
    """Bool ``(B, 1|H, Nq, Nk)`` mask → ``(B, H, Mq, q_rows, K·bs)`` aligned with the gathered keys."""
    batch, _, n_q, n_k = mask.shape
    pad_q, pad_k = -n_q % q_rows, -n_k % block_size + block_size  # + the extra future block
    mask = F.pad(mask, (0, pad_k, 0, pad_q), value=False).expand(batch, heads, -1, -1)
    mask = mask.unflatten(2, (-1, q_rows)).unflatten(-1, (-1, block_size))  # (B, H, Mq, q_rows, Mk, bs)
    index = indices[:, :, :, None, :, None].expand(-1, -1, -1, q_rows, -1, block_size)
    return mask.gather(4, index).flatten(-2)


def token_mask(keep: torch.Tensor, block_size: int, n_q: int, n_k: int, q_offset: int = 0) -> torch.Tensor:
    """Block selection ``(B, H, Mq, Mk)`` → ``(B, H, Nq, Nk)`` bool: kept block and causal (key ≤ query position)."""
    kept = keep.repeat_interleave(block_size, dim=2).repeat_interleave(block_size, dim=3)[:, :, :n_q, :n_k]
    causal = (q_offset + torch.arange(n_q, device=keep.device))[:, None] >= torch.arange(n_k, device=keep.device)
    return kept & causal


def dense_masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Reference: full N×N attention masked to the same blocks (for tests and small inputs)."""
    allowed = token_mask(keep, block_size, query.shape[2], key.shape[2], q_offset)
    if attention_mask is not None:
        allowed = allowed & attention_mask
    scores = (query.float() @ key.float().transpose(-1, -2)) * scaling
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return (probs @ value.float()).to(query.dtype)


# --------------------------------------------------------------------------------------------------
# per-token selections over the real (unpadded) tokens
# --------------------------------------------------------------------------------------------------


def real_positions(
    key_valid: torch.Tensor | None, n_q: int, n_k: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Where every token sits once padding is squeezed out.

    Queries are the last ``n_q`` of the ``n_k`` keys (transformers' prefill, chunked prefill and decode calls).
    Returns ``q_pos (B|1, Nq)`` long, each query's index among its row's real tokens (-1 for a padded query);
    ``key_index (B, Nk)`` long, the position of the row's i-th real key (tail entries repeat the last real key,
    they lie beyond ``n_real`` and are masked), or None when there is no padding; ``n_real (B|1,)`` long.
    Blocks, sinks and budgets are laid over these real indices, so a padded row selects what it selects alone.
    """
    if key_valid is None:
        q_pos = (n_k - n_q + torch.arange(n_q, device=device))[None, :]
        return q_pos, None, torch.full((1,), n_k, device=device)
    real_index = key_valid.long().cumsum(-1) - 1
    q_pos = real_index[:, n_k - n_q :].masked_fill(~key_valid[:, n_k - n_q :], -1)
    # valid keys first, in order (a stable sort of the padding flags)
    key_index = torch.sort((~key_valid).to(torch.uint8), dim=-1, stable=True).indices
    return q_pos, key_index, key_valid.sum(-1)


def token_keep_mask(
    token_keep: torch.Tensor, block_size: int, n_k: int, q_offset: int = 0, key_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token selection ``(B, H, Nq, Mk)`` → the ``(B, H, Nq, Nk)`` bool mask it attends with (dense; small N).

    A query attends a real key iff the key's real index is at most its own and the key's block (real index //
    ``block_size``) is kept for that query; queries sit at ``q_offset …`` (``q_offset + Nq == Nk``).
    """
    n_q = token_keep.shape[2]
    q_pos, _, _ = real_positions(key_valid, n_q, n_k, token_keep.device)
    if key_valid is None:
        k_pos = torch.arange(n_k, device=token_keep.device)[None, :]
        valid = torch.ones(1, n_k, dtype=torch.bool, device=token_keep.device)
    else:
        k_pos, valid = key_valid.long().cumsum(-1) - 1, key_valid
    block = (k_pos // block_size).clamp(0, token_keep.shape[-1] - 1)  # (B|1, Nk)
    kept = token_keep.gather(-1, block[:, None, None, :].expand(*token_keep.shape[:3], n_k))
    causal = (k_pos[:, None, :] <= q_pos[:, :, None]) & valid[:, None, :] & (q_pos >= 0)[:, :, None]
    return kept & causal[:, None]
