"""Per-token block-sparse causal attention, forward, in Triton: key-block-major work, log-sum-exp merge (MoBA style).

Every query token ``(b, h, t)`` attends the keys of its own list of key blocks (``indices``/``counts``, as
:func:`hf_icl.kernels.token_selection.fused.select_token_blocks_triton` returns them), with causality at token
level (key position ≤ query position ``q_offset + t``) and, with ``lengths``, only the row's real keys.

Why key-block-major (MoBA, arXiv 2502.13189). Each token has its own selection, so a query-block-major kernel (the
block-sparse kernel of :mod:`hf_icl.kernels.block_sparse_attention`) would have to take the union of a query tile's
blocks and mask per token: its work follows the union, not the selection. Here the work follows the selected
(token, block) pairs exactly:

1. **Work list** (:mod:`.triton_pairs`, torch ops on the device, no host sync): live pairs are sorted (stably) by
   their KV block ``(b, h // g, j)``, so the pairs of one K / V tile from all ``g`` query heads of its group are
   adjacent; each block's list is cut into work items of at most ``BLOCK_M`` pairs. The grid is a host-side upper
   bound on the number of items, ``min(P, NB + ceil(P / BLOCK_M))`` (``P = B·H·Nq·W`` slots, ``NB = B·Hk·Mk``
   KV blocks); surplus programs read an empty range from the device tables and return.
2. **Partial attention** (:func:`_token_sparse_fwd_kernel`, one program per item): the K and V tiles of the item's
   block are loaded once (``block_size × D``), the item's query rows are gathered (each pair id decodes to its
   ``(b, h, t, slot)``), ``S = q·kᵀ·scale`` in float32 via ``tl.dot``, masked (key after the query, key past ``Nk``
   or the row's length), and the block-local softmax gives the normalised partial output ``o_s`` (float32) and
   ``lse_s = m + log Σ exp(S − m)``, written at the pair's slot in ``(B, H, Nq, W, D)`` / ``(B, H, Nq, W)``
   buffers (the pair id *is* that row-major slot index).
3. **Merge** (:func:`_token_sparse_merge_kernel`, one program per (b, h, tile of tokens)): over the token's
   ``counts`` slots, an online log-sum-exp combine ``LSE = logsumexp_s lse_s``,
   ``out = Σ_s exp(lse_s − LSE) o_s``; written in q's dtype, ``LSE`` in float32. Slots that are not live (a block
   wholly after the query, a padded query) keep the ``-inf`` the partial-LSE buffer is filled with and weigh 0; a
   token with no live slot (``counts == 0``, a query at or past its row's length) gets zeros and ``-inf``.

The softmax runs in base 2 (``log2(e)`` folded into the scale), all scores, statistics, partial outputs and the merge
in float32. On a GPU the dots take native fp16 / bf16 operands (float32 accumulation; the probabilities are cast to
the value dtype for ``P·V``, as FlashAttention does) and IEEE float32 for float32 inputs (``input_precision="ieee"``:
no TF32). Under ``TRITON_INTERPRET=1`` (triton 3.9) bf16 dots return garbage, so the launcher sets ``UPCAST_DOT`` and
every dot operand is cast to float32 first; its float32 → bf16 cast also truncates instead of rounding to nearest, so
there the merge rounds the bf16 output itself (``ROUND_BF16``) before the then exact cast.

Tiles (:func:`forward_tiles`, :func:`backward_tiles`): ``BLOCK_M`` pairs per item (up to 128 in the forward for
fp16 / bf16 and blocks of ≤ 64 keys), clamped down to ``g · Nq`` (≥ 16) for decode; chosen from a few timings on an
H200 with triton 3.6, not a full tuning. No loop inside a program, hence ``num_stages=1``.

Why not something else. A query-major online softmax over a token's blocks would gather a different K / V tile for
every token (no reuse across the tokens and heads that chose the same block); the slot layout trades memory
(``B·H·Nq·W·(D + 1)`` float32 partials, i.e. ``W`` times a float32 output) for reading each K / V tile once per
``BLOCK_M`` pairs and a deterministic, atomic-free forward. The partial buffers are the cost to watch at long
contexts and wide selections.
"""

from __future__ import annotations

import math

import torch

from .._common import (
    INDEX_DTYPES,  # noqa: F401  (the indices/counts dtypes this op takes, as before)
    check_block_lists,
    check_kernel_runnable,
    check_qkv,
    describe,
    is_interpreted,
    tl,
    triton,
)
from .triton_pairs import PairList, build_pair_list, cut_work_items

__all__ = [
    "BLOCK_SIZES",
    "HEAD_DIMS",
    "backward_tiles",
    "forward_tiles",
    "token_sparse_forward_triton",
    "validate_token_sparse",
]

BLOCK_SIZES = (16, 32, 64, 128)
HEAD_DIMS = (16, 32, 64, 128)
LENGTH_DTYPES = (torch.int32, torch.int64)
LOG2_E = 1.4426950408889634
MERGE_TOKENS = 16  # tokens per merge program


# ----------------------------------------------------------------------------------------------------------------
# Tile configurations (untuned guesses for sm_90 until a GPU benchmark)
# ----------------------------------------------------------------------------------------------------------------


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def forward_tiles(n_q: int, group: int, block_size: int, head_dim: int, elem_bytes: int = 2) -> dict[str, int]:
    """``BLOCK_M`` (pairs per item) and launch options of the forward kernel.

    ``BLOCK_M`` is the number of pairs one KV block can have at most (``g · Nq``: a decode step's group) rounded up
    to a power of two, clamped to [16, cap] (``tl.dot`` needs 16 rows). fp16 / bf16: cap 128 for blocks of at most
    64 keys (4 warps), else 64. float32: cap 64. Measured on an H200 (triton 3.6, bf16, D = 128, block 64, 8k tokens,
    10 % density): BLOCK_M 128 / 4 warps 1.86 ms, 64 / 4 warps 2.50 ms, 128 / 8 warps 2.72 ms. A program holds Q
    ``(BLOCK_M, D)``, K and V ``(block_size, D)`` and S ``(BLOCK_M, block_size)``.

        >>> forward_tiles(1, 4, 64, 128)
        {'BLOCK_M': 16, 'num_warps': 4, 'num_stages': 1}
    """
    if elem_bytes <= 2:
        cap, warps = (128 if block_size <= 64 else 64), 4
    else:
        cap = 64
        warps = 8 if (cap * block_size >= 64 * 64 and head_dim >= 64) or block_size * head_dim >= 128 * 128 else 4
    block_m = min(cap, max(16, _next_power_of_2(n_q * group)))
    return {"BLOCK_M": block_m, "num_warps": warps, "num_stages": 1}


def backward_tiles(n_q: int, group: int, block_size: int, head_dim: int, elem_bytes: int = 2) -> dict[str, int]:
    """``BLOCK_M`` and launch options of the backward kernel, which holds Q, dO ``(BLOCK_M, D)``, K, V
    ``(block_size, D)``, S / P / dP ``(BLOCK_M, block_size)`` and three float32 products.

    fp16 / bf16: 64 pairs and 4 warps, 128 and 8 warps for blocks of 128 keys (H200, bf16, 8k tokens, D = 128:
    block 64: 64 / 4 warps 3.34 ms, 32 / 4 warps 4.63 ms; block 128: 128 / 8 warps 1.94 ms, 64 / 4 warps 2.23 ms).
    float32 (twice the shared memory): 64 pairs, 32 when ``block_size · D`` exceeds 64 · 128.

        >>> backward_tiles(512, 2, 128, 128)
        {'BLOCK_M': 128, 'num_warps': 8, 'num_stages': 1}
    """
    if elem_bytes <= 2:
        cap, warps = (128, 8) if block_size >= 128 else (64, 4)
    else:
        cap = 64 if block_size * head_dim <= 64 * 128 else 32
        warps = 8 if block_size * head_dim >= 64 * 64 else 4
    block_m = min(cap, max(16, _next_power_of_2(n_q * group)))
    return {"BLOCK_M": block_m, "num_warps": warps, "num_stages": 1}


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def validate_token_sparse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, lengths: torch.Tensor | None, check_values: bool = True,
) -> None:  # fmt: skip
    """Raise ``ValueError`` naming the argument, the value and what is allowed.

    Shapes, dtypes, devices and scalars need no device read; ``check_values`` adds the value ranges (``0 <= counts
    <= W``, valid entries of ``indices`` strictly ascending in ``[0, Mk)``, ``0 <= lengths <= Nk``) in one sync.
    """
    check_qkv(q, k, v, scaling=scaling, head_dims=HEAD_DIMS, block_size=block_size, block_sizes=BLOCK_SIZES)
    batch, heads, n_q, _ = q.shape
    n_k = k.shape[2]
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or not 0 <= q_offset <= n_k - n_q:
        raise ValueError(
            f"q_offset must be an int in [0, Nk - Nq] = [0, {n_k - n_q}] (query t sits at key position "
            f"q_offset + t), got {q_offset!r} with Nq={n_q}, Nk={n_k}"
        )
    check_block_lists(q, indices, counts, (batch, heads, n_q), rows="Nq", slots="W")
    width = indices.shape[3]
    if width < 1:
        raise ValueError(f"indices must have at least one slot (dim 3, W >= 1), got shape {tuple(indices.shape)}")
    if lengths is not None:
        if (
            not isinstance(lengths, torch.Tensor)
            or lengths.dtype not in LENGTH_DTYPES
            or tuple(lengths.shape) != (batch,)
        ):
            raise ValueError(
                f"lengths must be None or an int32 / int64 tensor of shape (B,)=({batch},), got {describe(lengths)}"
            )
        if lengths.device != q.device:
            raise ValueError(f"q and lengths must be on the same device, got {q.device} and {lengths.device}")
    if not check_values:
        return
    mk = math.ceil(n_k / block_size)
    cnt = counts.to(torch.int64)
    idx = indices.to(torch.int64)
    valid = torch.arange(width, device=q.device) < cnt[..., None]
    out_of_range = valid & ((idx < 0) | (idx >= mk))
    not_ascending = valid[..., 1:] & (idx[..., 1:] <= idx[..., :-1])
    flags = [
        ((cnt < 0) | (cnt > width)).any(),
        out_of_range.any(),
        not_ascending.any(),
        ((lengths < 0) | (lengths > n_k)).any() if lengths is not None else torch.zeros((), dtype=torch.bool),
    ]
    bad_counts, bad_range, bad_order, bad_lengths = torch.stack([f.to(q.device) for f in flags]).tolist()
    if bad_counts:
        raise ValueError(
            f"counts must lie in [0, W] = [0, {width}], got values in [{int(cnt.min())}, {int(cnt.max())}]"
        )
    if bad_range:
        bad = idx[out_of_range]
        raise ValueError(
            f"indices: the first counts entries must be key block ids in [0, Mk) = [0, {mk}) (Nk={n_k}, "
            f"block_size={block_size}), got values in [{int(bad.min())}, {int(bad.max())}]"
        )
    if bad_order:
        raise ValueError("indices: the first counts entries of each query must be strictly ascending block ids")
    if bad_lengths:
        raise ValueError(
            f"lengths must lie in [0, Nk] = [0, {n_k}], got values in [{int(lengths.min())}, {int(lengths.max())}]"
        )


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------

_token_sparse_fwd_kernel = None
_token_sparse_merge_kernel = None
item_range = None
item_block = None
item_rows = None
load_rows = None
key_block = None
masked_scores = None
tile_dot = None

if triton is not None:
    # Helpers shared by the forward and backward work-item kernels (:mod:`.triton_backward` imports them).

    @triton.jit
    def item_range(item_start, item_end):
        """This program's work item: the first and one-past-last positions of its pairs in the sorted order."""
        item = tl.program_id(0)
        return tl.load(item_start + item), tl.load(item_end + item)

    @triton.jit
    def item_block(item_kvb, mk, kv_heads):
        """The work item's KV block: ``(b, hk, j)`` and its KV row ``b * Hk + hk``."""
        kvb = tl.load(item_kvb + tl.program_id(0))
        j = kvb % mk
        kv_row = kvb // mk
        return kv_row // kv_heads, kv_row % kv_heads, j, kv_row

    @triton.jit
    def item_rows(order, start, end, heads, n_q, width, BLOCK_M: tl.constexpr):
        """The work item's pairs: which of its ``BLOCK_M`` rows are real, their pair ids, tokens and query heads."""
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        pid = tl.load(order + rows, mask=row_ok, other=0)  # int64 pair ids = slot index in (B, H, Nq, W)
        t = (pid // width) % n_q
        h = (pid // (width * n_q)) % heads
        return row_ok, pid, t, h

    @triton.jit
    def load_rows(base, row_offsets, row_ok, cols, stride_d, UPCAST: tl.constexpr):
        """The tile ``base[row_offsets + cols * stride_d]`` (0 in rows not ok); float32 with ``UPCAST``."""
        tile = tl.load(base + row_offsets[:, None] + cols[None, :] * stride_d, mask=row_ok[:, None], other=0.0)
        if UPCAST:
            tile = tile.to(tl.float32)
        return tile

    @triton.jit
    def key_block(lengths, b, j, n_k, sl_b, BS: tl.constexpr, HAS_LENGTHS: tl.constexpr):
        """Key positions of block ``j`` and which of them are real (before ``Nk`` and the row's length)."""
        k_pos = j * BS + tl.arange(0, BS)
        if HAS_LENGTHS:
            key_end = tl.minimum(tl.load(lengths + b * sl_b).to(tl.int64), n_k)
        else:
            key_end = n_k
        return k_pos, k_pos < key_end

    @triton.jit
    def masked_scores(q_tile, k_tile, qk_scale, row_ok, k_ok, k_pos, q_pos):
        """``S = q·kᵀ·qk_scale`` (float32, base-2 logits) and the mask of allowed (real, causal) entries."""
        s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * qk_scale
        allowed = row_ok[:, None] & k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        return s, allowed

    @triton.jit
    def tile_dot(a, b, TRANS_A: tl.constexpr):
        """``a·b`` (``aᵀ·b`` with ``TRANS_A``), ``a`` (float32) cast to ``b``'s dtype first: native fp16 / bf16
        operands with float32 accumulation, or float32 throughout (then the cast is a no-op, as under UPCAST_DOT)."""
        a = a.to(b.dtype)
        if TRANS_A:
            a = tl.trans(a)
        return tl.dot(a, b, input_precision="ieee")

    @triton.jit
    def _token_sparse_fwd_kernel(
        q, k, v, partial_o, partial_lse,                                   # tensors
        order, item_kvb, item_start, item_end, lengths,                    # the work list (item_launch's operands)
        heads, kv_heads, n_q, width, n_k, mk, q_offset, qk_scale,          # shapes, base-2 scale
        sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sl_b,  # q / k / v / lengths strides
        BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST_DOT: tl.constexpr,
        HAS_LENGTHS: tl.constexpr,
    ):  # fmt: skip
        """One work item: up to ``BLOCK_M`` pairs of one KV block → their normalised partial outputs and LSEs."""
        start, end = item_range(item_start, item_end)
        if start >= end:  # a surplus program of the upper-bound grid
            return
        b, hk, j, _ = item_block(item_kvb, mk, kv_heads)
        row_ok, pid, t, h = item_rows(order, start, end, heads, n_q, width, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        q_tile = load_rows(q + b * sq_b, h * sq_h + t * sq_t, row_ok, cols, sq_d, UPCAST_DOT)
        k_pos, k_ok = key_block(lengths, b, j, n_k, sl_b, BS, HAS_LENGTHS)
        k_tile = load_rows(k + b * sk_b + hk * sk_h, k_pos * sk_n, k_ok, cols, sk_d, UPCAST_DOT)
        v_tile = load_rows(v + b * sv_b + hk * sv_h, k_pos * sv_n, k_ok, cols, sv_d, UPCAST_DOT)

        s, allowed = masked_scores(q_tile, k_tile, qk_scale, row_ok, k_ok, k_pos, q_offset + t)
        s = tl.where(allowed, s, float("-inf"))
        m = tl.max(s, axis=1)
        m_use = tl.where(m == float("-inf"), 0.0, m)  # a row with no key: exp2(-inf - 0) = 0, no NaN
        p = tl.exp2(s - m_use[:, None])
        l_sum = tl.sum(p, axis=1)
        o = tile_dot(p, v_tile, False)
        seen = l_sum > 0
        l_safe = tl.where(seen, l_sum, 1.0)
        o = o / l_safe[:, None]
        lse = tl.where(seen, (m_use + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))  # natural log
        tl.store(partial_o + pid[:, None] * BLOCK_D + cols[None, :], o, mask=row_ok[:, None])
        tl.store(partial_lse + pid, lse, mask=row_ok)

    @triton.jit
    def _round_to_bfloat16(x):
        """float32 → the nearest bfloat16 value (ties to even), still float32: the interpreter's float32 → bf16 cast
        truncates (triton 3.9), so under it the merge rounds first and the cast is then exact. Finite inputs only."""
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _token_sparse_merge_kernel(
        partial_o, partial_lse, counts, out, lse,  # tensors
        heads, n_q, width,                         # shapes
        sc_b, sc_h, sc_t, so_b, so_h, so_t, so_d,  # counts / out strides
        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_BF16: tl.constexpr,
    ):  # fmt: skip
        """A tile of tokens of one (b, h): log-sum-exp merge of their slots' partial results."""
        tile = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // heads
        h = bh % heads
        t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = t < n_q
        cnt = tl.load(counts + b * sc_b + h * sc_h + t.to(tl.int64) * sc_t, mask=t_ok, other=0)
        cnt = tl.minimum(cnt, width)
        n_slots = tl.max(cnt, axis=0)
        first = (bh * n_q + t) * width  # pair id of the token's slot 0
        cols = tl.arange(0, BLOCK_D)
        m = tl.full([BLOCK_T], float("-inf"), tl.float32)
        l_sum = tl.zeros([BLOCK_T], tl.float32)
        acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
        for s in range(0, n_slots):
            ok = t_ok & (s < cnt)
            lse_s = tl.load(partial_lse + first + s, mask=ok, other=float("-inf"))
            live = lse_s > float("-inf")
            o_s = tl.load(partial_o + (first + s)[:, None] * BLOCK_D + cols[None, :], mask=live[:, None], other=0.0)
            m_new = tl.maximum(m, lse_s)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_use)
            w = tl.exp(lse_s - m_use)
            l_sum = l_sum * alpha + w
            acc = acc * alpha[:, None] + w[:, None] * o_s
            m = m_new
        seen = l_sum > 0
        l_safe = tl.where(seen, l_sum, 1.0)
        result = acc / l_safe[:, None]
        if ROUND_BF16:
            result = _round_to_bfloat16(result)
        total = tl.where(seen, tl.where(m == float("-inf"), 0.0, m) + tl.log(l_safe), float("-inf"))
        out_ptrs = out + b * so_b + h * so_h + t[:, None].to(tl.int64) * so_t + cols[None, :] * so_d
        tl.store(out_ptrs, result.to(out.dtype.element_ty), mask=t_ok[:, None])
        tl.store(lse + bh * n_q + t, total, mask=t_ok)


# ----------------------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------------------


def _lengths_operand(lengths: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The kernels' lengths operand; a one-element placeholder when there is none (unread)."""
    if lengths is None:
        return torch.zeros(1, dtype=torch.int32, device=q.device)
    return lengths


def item_launch(
    kernel, tiles_for, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pairs: PairList,
    width: int, block_size: int, scaling: float, q_offset: int, lengths: torch.Tensor | None,
) -> tuple[tuple[int], tuple, dict]:  # fmt: skip
    """``(grid, operands, options)`` of a work-item kernel, forward or backward: ``pairs`` cut into items of
    ``tiles_for``'s ``BLOCK_M``; the operands both kernels take after their own tensors (item tables, lengths,
    shapes, base-2 scale, then the q / k / v / lengths strides); the launch options (constexprs, warps, stages)."""
    _, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    tiles = tiles_for(n_q, heads // kv_heads, block_size, head_dim, q.element_size())
    items = cut_work_items(pairs, tiles.pop("BLOCK_M"))
    length_op = _lengths_operand(lengths, q)
    scalars = (heads, kv_heads, n_q, width, n_k, math.ceil(n_k / block_size), q_offset, float(scaling) * LOG2_E)
    strides = (*q.stride(), *k.stride(), *v.stride(), length_op.stride(0))
    operands = (pairs.order, items.kvb, items.start, items.end, length_op, *scalars, *strides)
    options = {
        "BS": block_size,
        "BLOCK_M": items.block_m,
        "BLOCK_D": head_dim,
        "UPCAST_DOT": is_interpreted(kernel),
        "HAS_LENGTHS": lengths is not None,
        **tiles,
    }
    return (items.n_items,), operands, options


def launch_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, lengths: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, PairList]:  # fmt: skip
    """Build the work list, run the partial and merge kernels: ``(out, lse, pairs)`` (no validation)."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    width = indices.shape[3]
    device = q.device
    pairs = build_pair_list(
        indices, counts, kv_heads=kv_heads, n_keys=n_k, block_size=block_size, q_offset=q_offset, lengths=lengths
    )
    n_pairs = batch * heads * n_q * width
    partial_o = torch.empty(n_pairs, head_dim, dtype=torch.float32, device=device)
    partial_lse = torch.full((n_pairs,), float("-inf"), dtype=torch.float32, device=device)
    grid, operands, options = item_launch(
        _token_sparse_fwd_kernel, forward_tiles, q, k, v, pairs, width, block_size, scaling, q_offset, lengths
    )
    _token_sparse_fwd_kernel[grid](q, k, v, partial_o, partial_lse, *operands, **options)
    out = torch.empty(batch, heads, n_q, head_dim, dtype=q.dtype, device=device)
    lse = torch.empty(batch, heads, n_q, dtype=torch.float32, device=device)
    _token_sparse_merge_kernel[(math.ceil(n_q / MERGE_TOKENS), batch * heads)](
        partial_o, partial_lse, counts, out, lse,
        heads, n_q, width,
        *counts.stride(), *out.stride(),
        BLOCK_T=MERGE_TOKENS, BLOCK_D=head_dim, ROUND_BF16=options["UPCAST_DOT"] and q.dtype == torch.bfloat16,
        num_warps=4 if head_dim >= 64 else 2,
    )  # fmt: skip
    return out, lse, pairs


def token_sparse_forward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, lengths: torch.Tensor | None = None, validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per-token block-sparse causal attention, forward only: ``(out (B, H, Nq, D) in q's dtype, lse (B, H, Nq)
    float32)``. See :func:`hf_icl.kernels.token_sparse.triton_backward.token_sparse_attention_triton` for the
    arguments; ``validate=False`` skips every check (and with it the one device sync of the value checks)."""
    if validate:
        validate_token_sparse(
            q, k, v, indices, counts, block_size=block_size, scaling=scaling, q_offset=q_offset, lengths=lengths
        )
    check_kernel_runnable(_token_sparse_fwd_kernel, q, "token_sparse_forward_triton")
    out, lse, _ = launch_forward(
        q, k, v, indices, counts, block_size=block_size, scaling=scaling, q_offset=q_offset, lengths=lengths
    )
    return out, lse
