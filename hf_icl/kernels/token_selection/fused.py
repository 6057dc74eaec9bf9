"""CAB's per-token block selection as one fused Triton kernel: block scores, forced blocks, budgets and top-k.

The rule is :mod:`hf_icl.kernels.token_selection.rule`'s (its
:func:`~hf_icl.kernels.token_selection.rule.select_token_blocks` is the PyTorch reference and the dispatcher). Query
token ``t`` sits at position ``p = n_keys - Nq + t``, its own block is ``c = p // block_size``; it keeps its local
window ``c - local_blocks < j <= c`` and the sinks ``j < sink_blocks``, then the best candidates ``sink_blocks <= j <=
c - local_blocks`` up to its budget (``row``: ``max(1, round((1 - sparsity) (c + 1)))``, ``topk``: ``topk``; forced
blocks count toward it), ties to the lower block; tokens before ``min_seq_len`` keep every visible block.

One launch. A program takes a tile of query tokens for *all* the query heads of one KV head (grouped-query
attention: the KV head's summaries are read once for its group) and holds each row's scores for every key block in
registers, ``(rows, Mk)`` float32:

* scores: ``scaling * q · summary`` (``"bound"``: ``q⁺ · kmax + q⁻ · kmin``), float32 sums over the head dim, the
  query upcast to float32 first (so bf16 / fp16 queries are scored like the reference scores them): a float32
  ``tl.dot`` (IEEE, no TF32) over chunks of 16 head dims for tiles of at least 16 rows (prefill), one outer product
  per head dim otherwise (a decode step's few rows);
* FRC (``frc``, ``frc_low``, ``hybrid``): candidate scores min–max normalised per row, the two-hop term
  ``A @ hop`` against the hop matrix the caller passes (``(B, Hk, Mk, Mk)``), ``A - lam · two_hop / n``;
* top-k without a sort: a bisection over the 32-bit order-preserving integer image of the float ranks finds each
  row's k-th largest value (32 passes over the row, whatever k; ``_EARLY_EXIT``, off until timed on a GPU, stops a
  tile once every row has its bound), every candidate above it is kept and the ties at it are taken in block order
  with a prefix sum, so ties go to the lower block index exactly as in the reference;
* no host synchronisation and no data-dependent Python control flow (CUDA-graph capturable).

Exactness. The selection logic (budgets in float64 like the reference, tie order, FRC normalisation with
round-to-nearest division; the launch disables the compiler's multiply-add fusion so each of those operations rounds
on its own, as PyTorch's do) is the reference's bit for bit. The block scores and the two-hop term are float32 sums
(the dot's, or explicit fused multiply-adds one head dim / key block after the other) whose rounding differs from
PyTorch's matmul, so scores agree to float32 rounding. Selections are therefore identical unless two candidates'
ranks lie within rounding of each other without being equal; exact ties (equal keys give equal scores in both) and
inputs whose products and sums are exact (small integers, dyadic means) compare exactly (the tests pin the tie rule
so).

Outputs: ``token_keep (B, H, Nq, Mk)`` bool, and optionally the kept blocks as a list per query token: ``indices
(B, H, Nq, W)`` int32, ascending block ids, the first ``counts[b, h, t]`` valid and the rest repeating the last of
them (every entry a valid block id, as :func:`~hf_icl.kernels.block_sparse_reference.selected_block_indices` leaves
them); ``counts (B, H, Nq)`` int32. ``W`` is :func:`selection_width`, a host-side bound on any row's count (no
device read). With ``Nq == 1`` (decode) that is the ``(B, H, 1, K)`` / ``(B, H, 1)`` layout the split-K decode
kernel takes. ``streaming`` and ``dense`` select the same blocks for every batch row and head: their outputs are
expanded views (as in the reference).

Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors (tests). Its only ``tl.dot`` takes float32 operands (the
query is upcast first), so the interpreter's bf16 dot problem does not arise; the two-hop term stays float32 outer
products in registers. Speed (H100, T = 32k, 12 heads, D = 64, bf16, one launch over all queries): 14.0 ms with outer
products on 8 warps, 5.5 ms with the dot on 4 warps (``scripts/profile_cab_gpu.py``; docs/results/cab.md).
"""

from __future__ import annotations

import math
import struct

import torch

from ...validation import check_choice, check_float, check_int, check_scaling
from .._common import (
    SUPPORTED_DTYPES,
    check_attention_tensor,
    check_kernel_runnable,
    describe,
    is_interpreted,
    tl,
    triton,
)
from .policies import FRC_POLICIES as _FRC_POLICIES
from .policies import FUSED_BUDGETS, FUSED_POLICIES
from .policies import SCORED_POLICIES as _SCORED_POLICIES

__all__ = [
    "FUSED_BUDGETS",
    "FUSED_POLICIES",
    "MAX_KEY_BLOCKS",
    "fused_rule_unsupported",
    "fused_selection_unsupported",
    "selection_width",
    "select_token_blocks_triton",
]

#: the kernel holds a row's score for every key block in registers: 4096 blocks = 256k tokens at block size 64
MAX_KEY_BLOCKS = 4096
_POLICY_CODES = {name: code for code, name in enumerate(FUSED_POLICIES)}
# a program's tile of scores, rows × key blocks: at most this many float32 values and 64 rows; FRC holds three such
# tiles, so it takes half. Measured on an H100 (triton 3.6, bf16, T = 32768, 12 heads, D = 64, magnitude at 90 %, one
# launch over all queries; scripts/profile_cab_gpu.py, docs/results/cab.md): tiles of 8192 values (16 rows × 512
# blocks) scored with tl.dot on 4 warps take 5.5 ms; the outer products on the 8 warps derived before, 14.0 ms; tiles
# of 2048 / 4096 values (under 16 rows: no dot), 10.9-18.1 ms whatever the warps
_TILE_VALUES = 8192
_MAX_ROWS = 64
#: warps per program; None derives them from the tile (one warp per 2048 values, at most 4: 4 beat 2 and 8 on the
#: H100 above, with either way of scoring)
_NUM_WARPS: int | None = None
#: score tiles of >= 16 rows with float32 tl.dot (IEEE: no TF32) instead of one outer product per head dim (the
#: sweep above: 2.5x faster; every selection equal to the outer products' on its inputs)
_DOT_SCORES = True
#: end a tile's bisection once every row has found its k-th key's bound (same selections; fewer passes expected on
#: untied scores). Not yet timed on a GPU: scripts/profile_cab_gpu.py sweeps it, off until it measures faster
_EARLY_EXIT = False
_HOP_CHUNK = 16  # the two-hop term picks A's columns out of chunks of this many key blocks


# ----------------------------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------------------------

_token_selection_kernel = None  # defined below when triton imports

if triton is not None:

    @triton.jit
    def _order_key(rank):
        """float32 → int32 whose order is the float order (NaN and -inf lowest, -0 = +0), as the reference's keys."""
        lowest = -3.4028234663852886e38
        value = tl.where((rank != rank) | (rank == float("-inf")), lowest, rank)
        value = tl.where(value == 0.0, 0.0, value)
        bits = value.to(tl.int32, bitcast=True)
        return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)

    @triton.jit
    def _halve(key, candidate, k, lo, hi):
        """One bisection pass per row: the new ``(lo, hi)`` and whether ``lo`` now has exactly k candidates at or
        above it (once true it stays true: a later ``lo`` only rises to keys with k candidates above)."""
        mid = lo + ((hi - lo + 1) >> 1)
        n_at_least = tl.sum((candidate & (key >= mid.to(tl.int32)[:, None])).to(tl.int32), axis=1)
        enough = n_at_least >= k
        return tl.where(enough, mid, lo), tl.where(enough, hi, mid - 1), enough & (n_at_least == k)

    @triton.jit
    def _top_among(rank, candidate, count, EARLY_EXIT: tl.constexpr):
        """Per row, the ``count`` highest-``rank`` candidates, ties to the lower column: bool ``(rows, cols)``.

        Bisection for the k-th largest order key (k = min(count, candidates)): ``lo`` always has at least k
        candidates at or above it; 32 halvings of the 32-bit range leave it at that key. Then every candidate
        above it, and the first ``k - above`` candidates equal to it in column order.

        ``EARLY_EXIT``: a row is done as soon as ``lo`` has exactly k candidates at or above it (then no candidate
        lies between ``lo`` and the k-th key, so the rule below keeps the same ones) or its bounds meet; the tile
        stops when all its rows are done (at most the same 32 passes: rows whose k-th key is tied need them all).
        """
        key = _order_key(rank)  # int32 per entry; the bisection bounds are int64 per row (no overflow at the ends)
        n_candidates = tl.sum(candidate.to(tl.int32), axis=1)
        k = tl.maximum(tl.minimum(count, n_candidates), 0)
        lo = tl.full(k.shape, -(2**31), tl.int64)
        hi = tl.full(k.shape, 2**31 - 1, tl.int64)
        if EARLY_EXIT:
            done = (n_candidates == k) | (k == 0)  # every candidate, or none: the starting bound already says so
            passes = 0
            while (passes < 32) & (tl.min(done.to(tl.int32), axis=0) == 0):
                lo, hi, exact = _halve(key, candidate, k, lo, hi)
                done = done | exact | (lo == hi)
                passes += 1
        else:
            for _ in range(32):
                lo, hi, _exact = _halve(key, candidate, k, lo, hi)
        threshold = lo.to(tl.int32)
        above = candidate & (key > threshold[:, None])
        tied = candidate & (key == threshold[:, None])
        still = k - tl.sum(above.to(tl.int32), axis=1)
        first_ties = tied & (tl.cumsum(tied.to(tl.int32), axis=1) <= still[:, None])
        return (above | first_ties) & (k > 0)[:, None]

    @triton.jit
    def _summary_products(
        q_rows, qs_d, row_ok, summary, s_rows, ss_d, summary_ok, head_dim,
        SIGN: tl.constexpr, ROWS: tl.constexpr, MK: tl.constexpr, DOT: tl.constexpr,
    ):  # fmt: skip
        """``q · summary`` for every (row, key block), float32 ``(ROWS, MK)``; ``SIGN`` 1 / -1 keeps only the
        query's positive / negative components (the bound score's two halves), 0 all of them.

        ``DOT`` (tiles of at least 16 rows): float32 ``tl.dot`` (IEEE, no TF32) over chunks of 16 head dims, whole
        tiles loaded at once; otherwise one outer product per head dim in registers (any tile, no shared memory, but
        one dependent load after another)."""
        raw = tl.zeros([ROWS, MK], tl.float32)
        if DOT:
            dims = tl.arange(0, 16)
            for d0 in range(0, head_dim, 16):
                d_ok = d0 + dims < head_dim
                q_tile = tl.load(
                    q_rows[:, None] + (d0 + dims)[None, :] * qs_d, mask=row_ok[:, None] & d_ok[None, :], other=0.0
                ).to(tl.float32)
                if SIGN > 0:
                    q_tile = tl.maximum(q_tile, 0.0)
                elif SIGN < 0:
                    q_tile = tl.minimum(q_tile, 0.0)
                s_tile = tl.load(
                    summary + s_rows[None, :] + (d0 + dims)[:, None] * ss_d,
                    mask=summary_ok[None, :] & d_ok[:, None],
                    other=0.0,
                )
                raw = tl.dot(q_tile, s_tile, raw, input_precision="ieee")
            return raw
        for d in range(0, head_dim):
            q_col = tl.load(q_rows + d * qs_d, mask=row_ok, other=0.0).to(tl.float32)
            if SIGN > 0:
                q_col = tl.maximum(q_col, 0.0)
            elif SIGN < 0:
                q_col = tl.minimum(q_col, 0.0)
            s_col = tl.load(summary + s_rows + d * ss_d, mask=summary_ok, other=0.0)
            raw = tl.fma(q_col[:, None], s_col[None, :], raw)
        return raw

    @triton.jit
    def _frc(
        scores, candidate, hop_base, hs_r, cols, n_summaries, lam,
        ROWS: tl.constexpr, MK: tl.constexpr, HOP_CHUNK: tl.constexpr,
    ):  # fmt: skip
        """Causal FRC per row: ``A - lam * (A @ hop) / n_candidates`` on the candidates, 0 elsewhere. ``hop_base``
        points at row 0 of this KV head's ``hop`` matrix, one pointer per column ``cols``; ``hs_r`` is its row
        stride."""
        lo = tl.min(tl.where(candidate, scores, float("inf")), axis=1)
        hi = tl.max(tl.where(candidate, scores, float("-inf")), axis=1)
        span = hi - lo
        lo_finite = (lo == lo) & (lo != float("inf")) & (lo != float("-inf"))
        safe_lo = tl.where(lo_finite, lo, 0.0)
        tiny = 1.1754943508222875e-38
        # the divisor of rows without contrast is never used: 1, not a near-zero span (no overflow to warn about)
        divisor = tl.where(span > 0, tl.maximum(span, tiny), 1.0)
        a = tl.where(span[:, None] > 0, tl.math.div_rn(scores - safe_lo[:, None], divisor[:, None]), 1.0)
        a = tl.where(candidate, a, 0.0)
        # two_hop = A @ hop as outer products, one hop row r at a time. A's column r is picked out of the register
        # tile in two one-hot sums (its chunk of HOP_CHUNK columns, then the column), which add zeros only: exact.
        chunks = tl.reshape(a, (ROWS, MK // HOP_CHUNK, HOP_CHUNK))
        chunk_ids = tl.arange(0, MK // HOP_CHUNK)
        inner = tl.arange(0, HOP_CHUNK)
        col_ok = cols < n_summaries
        two_hop = tl.zeros([ROWS, MK], tl.float32)
        for c in range(0, tl.cdiv(n_summaries, HOP_CHUNK)):  # rows past the summaries are zero: skipped
            a_chunk = tl.sum(tl.where(chunk_ids[None, :, None] == c, chunks, 0.0), axis=1)
            for i in tl.static_range(HOP_CHUNK):
                r = c * HOP_CHUNK + i
                a_col = tl.sum(tl.where(inner[None, :] == i, a_chunk, 0.0), axis=1)
                hop_row = tl.load(
                    hop_base + r.to(tl.int64) * hs_r, mask=col_ok & (cols * 0 + r < n_summaries), other=0.0
                )
                two_hop = tl.fma(a_col[:, None], hop_row[None, :], two_hop)
        n_candidates = tl.maximum(tl.sum(candidate.to(tl.int32), axis=1), 1).to(tl.float32)
        frc = a - tl.math.div_rn(lam * two_hop, n_candidates[:, None])
        return tl.where(candidate, frc, 0.0)

    @triton.jit
    def _token_selection_kernel(
        q, s_first, s_second, hop, token_keep, indices, counts,  # tensors
        group, kv_heads, n_q, q_offset, n_blocks, n_summaries, head_dim, block_size, scaling,  # shapes, scale
        keep_fraction_bits, topk, sink_blocks, local_blocks, min_seq_len, lam, magnitude_fraction, width,  # the rule
        qs_b, qs_h, qs_n, qs_d, ss_b, ss_h, ss_m, ss_d, hs_b, hs_h, hs_r, hs_m,  # q / summaries / hop strides
        ks_b, ks_h, ks_n, ks_m, is_b, is_h, is_n, is_w, cs_b, cs_h, cs_n,        # token_keep / indices / counts strides
        POLICY: tl.constexpr, BOUND: tl.constexpr, ROW_BUDGET: tl.constexpr, BLOCK_T: tl.constexpr,
        ROWS: tl.constexpr, MK: tl.constexpr, HOP_CHUNK: tl.constexpr, WIDTH_PAD: tl.constexpr,
        WRITE_INDICES: tl.constexpr, DOT_SCORES: tl.constexpr, EARLY_EXIT: tl.constexpr,
    ):  # fmt: skip
        """One program per (tile of BLOCK_T query tokens, batch * KV head); its rows are (group head, token)."""
        tile = tl.program_id(0)
        bk = tl.program_id(1)
        b = (bk // kv_heads).to(tl.int64)
        hk = (bk % kv_heads).to(tl.int64)
        r = tl.arange(0, ROWS)
        in_group = r // BLOCK_T
        t = tile * BLOCK_T + r % BLOCK_T
        row_ok = (in_group < group) & (t < n_q)
        h = hk * group + in_group.to(tl.int64)
        pos = q_offset + t
        own = pos // block_size
        cols = tl.arange(0, MK)
        col_ok = cols < n_blocks

        visible = (cols[None, :] <= own[:, None]) & col_ok[None, :]
        forced = visible & ((cols[None, :] > (own - local_blocks)[:, None]) | (cols[None, :] < sink_blocks))
        candidate = visible & ~forced

        if POLICY == 0:  # dense
            kept = visible
        else:
            if ROW_BUDGET:  # max(1, floor(f (c + 1) + 0.5)) in float64, f = 1 - sparsity, as the reference rounds
                fraction = keep_fraction_bits.to(tl.int64).to(tl.float64, bitcast=True)
                n_keep = tl.maximum((fraction * (own + 1).to(tl.float64) + 0.5).to(tl.int32), 1)
            else:
                n_keep = tl.zeros([ROWS], tl.int32) + topk
            remaining = tl.maximum(n_keep - tl.sum(forced.to(tl.int32), axis=1), 0)
            if POLICY == 1:  # streaming: candidates are sink..c-local, the most recent `remaining` of them
                chosen = candidate & (cols[None, :] > (own - local_blocks - remaining)[:, None])
            else:
                # block scores, each KV head's summaries read once for its whole group of query heads
                q_rows = q + b * qs_b + h * qs_h + t.to(tl.int64) * qs_n
                s_rows = b * ss_b + hk * ss_h + cols.to(tl.int64) * ss_m
                summary_ok = cols < n_summaries
                if BOUND:  # positive query components meet kmax, negative ones kmin: two sums, added (the reference)
                    raw = _summary_products(
                        q_rows, qs_d, row_ok, s_second, s_rows, ss_d, summary_ok, head_dim, 1, ROWS, MK, DOT_SCORES
                    )
                    raw = raw + _summary_products(
                        q_rows, qs_d, row_ok, s_first, s_rows, ss_d, summary_ok, head_dim, -1, ROWS, MK, DOT_SCORES
                    )
                else:
                    raw = _summary_products(
                        q_rows, qs_d, row_ok, s_first, s_rows, ss_d, summary_ok, head_dim, 0, ROWS, MK, DOT_SCORES
                    )
                scores = raw * scaling
                if POLICY == 2:  # magnitude
                    chosen = _top_among(scores, candidate, remaining, EARLY_EXIT)
                else:
                    hop_base = hop + b * hs_b + hk * hs_h + cols.to(tl.int64) * hs_m
                    frc = _frc(scores, candidate, hop_base, hs_r, cols, n_summaries, lam, ROWS, MK, HOP_CHUNK)
                    if POLICY == 3:  # frc
                        chosen = _top_among(frc, candidate, remaining, EARLY_EXIT)
                    elif POLICY == 4:  # frc_low
                        chosen = _top_among(-frc, candidate, remaining, EARLY_EXIT)
                    else:  # hybrid: magnitude's share first (float32, as the reference), FRC among the rest
                        n_magnitude = tl.floor(remaining.to(tl.float32) * magnitude_fraction + 0.5).to(tl.int32)
                        by_magnitude = _top_among(scores, candidate, n_magnitude, EARLY_EXIT)
                        chosen = by_magnitude | _top_among(
                            frc, candidate & ~by_magnitude, remaining - n_magnitude, EARLY_EXIT
                        )
            kept = forced | chosen
            kept = kept | (visible & (pos < min_seq_len)[:, None])  # short prefixes stay dense

        k_rows = token_keep + b * ks_b + h * ks_h + t.to(tl.int64) * ks_n
        tl.store(k_rows[:, None] + cols.to(tl.int64)[None, :] * ks_m, kept, mask=row_ok[:, None] & col_ok[None, :])
        if WRITE_INDICES:
            count = tl.sum(kept.to(tl.int32), axis=1)
            slot = tl.cumsum(kept.to(tl.int32), axis=1) - 1  # each kept block's place in its row's list
            i_rows = indices + b * is_b + h * is_h + t.to(tl.int64) * is_n
            tl.store(
                i_rows[:, None] + slot.to(tl.int64) * is_w,
                cols[None, :] + tl.zeros([ROWS, MK], tl.int32),
                mask=kept & row_ok[:, None] & (slot < width),
            )
            # the tail repeats the row's last kept block: every entry is a valid block id (readers stop at count)
            last = tl.max(tl.where(kept, cols[None, :], 0), axis=1)
            w = tl.arange(0, WIDTH_PAD)
            tl.store(
                i_rows[:, None] + w.to(tl.int64)[None, :] * is_w,
                last[:, None] + tl.zeros([ROWS, WIDTH_PAD], tl.int32),
                mask=row_ok[:, None] & (w[None, :] >= count[:, None]) & (w[None, :] < width),
            )
            tl.store(counts + b * cs_b + h * cs_h + t.to(tl.int64) * cs_n, count, mask=row_ok)

# ----------------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------------


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _scores_with_dot(rows: int) -> bool:
    """Whether a tile of ``rows`` query rows is scored with ``tl.dot`` (which needs 16 rows)."""
    return _DOT_SCORES and rows >= 16


def selection_width(
    n_blocks: int,
    *, n_keys: int, block_size: int, policy: str,
    budget: str = "row", sparsity: float = 0.9, topk: int = 8, sink_blocks: int = 1, local_blocks: int = 1,
    min_seq_len: int = 0,
) -> int:  # fmt: skip
    """A host-side bound on how many blocks any query token keeps (the indices' last dim), from the arguments only.

    A token keeps ``max(n_forced, budget)`` blocks (forced ones count toward the budget), every visible block when
    it lies before ``min_seq_len``, and every visible block under ``dense`` (or a row budget at sparsity 0).

        >>> selection_width(100, n_keys=6400, block_size=64, policy="magnitude", sparsity=0.9)
        11
    """
    if policy == "dense" or (budget == "row" and sparsity == 0):
        return max(1, n_blocks)
    if budget == "row":  # the reference's bound on round((1 - sparsity) (c + 1)) for c < Mk
        budget_bound = int((1.0 - sparsity) * n_blocks + 0.5) + 1
    else:
        budget_bound = topk
    width = max(budget_bound, sink_blocks + local_blocks)
    if min_seq_len > 0:
        width = max(width, (min(min_seq_len, n_keys) - 1) // block_size + 1)
    return max(1, min(n_blocks, width))


def fused_rule_unsupported(n_blocks: int, policy: str, budget: str = "row") -> str | None:
    """Why the fused kernel cannot run this selection rule, whatever the tensors (None when it can)."""
    if policy not in FUSED_POLICIES:
        return f"policy={policy!r} is not fused (the kernel runs {', '.join(FUSED_POLICIES)})"
    if budget not in FUSED_BUDGETS:
        return f"budget={budget!r} is not fused (the kernel runs {', '.join(FUSED_BUDGETS)})"
    if n_blocks > MAX_KEY_BLOCKS:
        return f"{n_blocks} key blocks exceed the kernel's {MAX_KEY_BLOCKS} (a row's scores live in registers)"
    return None


def fused_selection_unsupported(
    query: torch.Tensor, n_blocks: int, policy: str, budget: str = "row", key_valid: torch.Tensor | None = None
) -> str | None:
    """Why the fused kernel cannot run this selection (None when it can): the reason a ``ValueError`` names."""
    if triton is None:
        return "triton could not be imported"
    reason = fused_rule_unsupported(n_blocks, policy, budget)
    if reason is not None:
        return reason
    if key_valid is not None:
        return (
            "padded batches run on the PyTorch path (blocks are laid over each row's real tokens; the fused "
            "selection takes unpadded inputs, key_valid=None)"
        )
    if not isinstance(query, torch.Tensor) or query.dtype not in SUPPORTED_DTYPES:
        return f"query.dtype must be one of {[str(d) for d in SUPPORTED_DTYPES]}"
    if not query.is_cuda and not is_interpreted(_token_selection_kernel):
        return f"the kernel needs CUDA tensors (got device {query.device}) unless TRITON_INTERPRET=1 was set"
    return None


def _validate(query, summaries, hop, n_keys, block_size, policy, budget, sparsity, topk, sink, local, min_seq, lam, mf):
    """Shapes and scalars only (no device read); raise ``ValueError`` naming the argument, value and what is allowed."""
    check_attention_tensor("query", query)
    check_int("block_size", block_size, low=1)
    check_int("n_keys", n_keys, low=query.shape[2])
    check_choice("policy", policy, FUSED_POLICIES)
    check_choice("budget", budget, FUSED_BUDGETS)
    if check_float("sparsity", sparsity, low=0.0) >= 1:
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity}")
    check_int("topk", topk, low=1)
    check_int("sink_blocks", sink, low=0)
    check_int("local_blocks", local, low=1)
    check_int("min_seq_len", min_seq, low=0)
    check_float("lam", lam, low=0.0)
    check_float("magnitude_fraction", mf, low=0.0, high=1.0)
    n_blocks = -(-n_keys // block_size)
    if n_blocks > MAX_KEY_BLOCKS:
        raise ValueError(f"n_keys={n_keys} gives {n_blocks} key blocks; the kernel takes at most {MAX_KEY_BLOCKS}")
    if policy not in _SCORED_POLICIES or (budget == "row" and sparsity == 0):  # no scores: every visible block
        return
    batch, heads, _, dim = query.shape
    if not isinstance(summaries, (tuple, list)) or len(summaries) not in (1, 2):
        raise ValueError(
            f"summaries must be a tuple of 1 tensor (mean / max_l2 keys) or 2 (bound: kmin, kmax) for "
            f"policy={policy!r}, got {type(summaries).__name__} of length {len(summaries) if summaries else 0}"
        )
    least = max(0, (n_keys - 1) // block_size)
    for i, s in enumerate(summaries):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.dim() != 4:
            raise ValueError(f"summaries[{i}] must be a float32 (B, Hk, Mk, D) tensor, got {describe(s)}")
        if s.shape != summaries[0].shape:
            raise ValueError(f"summaries must share one shape, got {[tuple(x.shape) for x in summaries]}")
        if s.device != query.device:
            raise ValueError(f"query and summaries[{i}] must be on the same device, got {query.device} and {s.device}")
    _, kv_heads, n_summaries, s_dim = summaries[0].shape
    if summaries[0].shape[0] != batch or s_dim != dim or kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"summaries must be (B, Hk, Mk, D) with query's B={batch} and D={dim} and Hk dividing H={heads}, "
            f"got {tuple(summaries[0].shape)}"
        )
    if not least <= n_summaries <= n_blocks:
        raise ValueError(
            f"summaries must cover between {least} (the complete blocks before the last query's own) and {n_blocks} "
            f"key blocks for n_keys={n_keys}, block_size={block_size}; got {n_summaries}"
        )
    if policy in _FRC_POLICIES:
        expected = (batch, kv_heads, n_summaries, n_summaries)
        if not isinstance(hop, torch.Tensor) or hop.dtype != torch.float32 or tuple(hop.shape) != expected:
            raise ValueError(f"hop must be a float32 tensor of shape (B, Hk, Mk, Mk)={expected}, got {describe(hop)}")
        if hop.device != query.device:
            raise ValueError(f"query and hop must be on the same device, got {query.device} and {hop.device}")


def _tiles(n_q: int, group: int, mk: int, tile_values: int) -> dict[str, int]:
    """Rows per program: ``group`` heads (padded to a power of two) × ``BLOCK_T`` tokens, as many as the tile allows
    (a decode step, one token, takes just its group)."""
    group_pad = _next_power_of_2(group)
    rows_wanted = max(1, min(_MAX_ROWS, tile_values // mk))
    block_t = min(max(1, rows_wanted // group_pad), _next_power_of_2(n_q))
    return {"BLOCK_T": block_t, "ROWS": group_pad * block_t}


def select_token_blocks_triton(
    query: torch.Tensor, summaries: tuple[torch.Tensor, ...] | None,
    *, n_keys: int, scaling: float, block_size: int, policy: str,
    budget: str = "row", sparsity: float = 0.9, topk: int = 8, sink_blocks: int = 1, local_blocks: int = 1,
    min_seq_len: int = 0, lam: float = 0.5, magnitude_fraction: float = 0.5,
    hop: torch.Tensor | None = None, return_indices: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The per-token selection ``(B, H, Nq, Mk)`` bool in one kernel launch (see the module docstring).

    Args:
        query: ``(B, H, Nq, D)``, the last ``Nq`` of ``n_keys`` positions (no padding), fp32 / fp16 / bf16.
        summaries: float32 ``(B, Hk, Mk, D)`` key-block summaries of the score (``(kmin, kmax)`` for ``"bound"``,
            ``(kmean,)``, ``(krep,)``): :func:`hf_icl.kernels.token_selection.rule.key_block_summaries`, or a cache's
            (at least the complete blocks before the last query's own block). Unused (may be None) for
            ``streaming`` and ``dense``.
        n_keys: keys in the sequence (queries included); ``Mk = ceil(n_keys / block_size)``.
        hop: for ``frc`` / ``frc_low`` / ``hybrid``, the float32 ``(B, Hk, Mk, Mk)`` hop matrix (block ``r``'s mean key
            scored against block ``k < r``, rows min–max normalised; one per KV head).
        return_indices: also return ``indices (B, H, Nq, W)`` int32 and ``counts (B, H, Nq)`` int32.

    The other arguments are :func:`~hf_icl.kernels.token_selection.rule.select_token_blocks`'s.

        >>> import torch
        >>> q = torch.randn(1, 2, 1, 32)
        >>> token_keep = select_token_blocks_triton(q, None, n_keys=200, scaling=32 ** -0.5, block_size=16,
        ...                                     policy="streaming", sparsity=0.5)  # doctest: +SKIP
        >>> token_keep.shape                                                # doctest: +SKIP
        torch.Size([1, 2, 1, 13])
    """
    args = (n_keys, block_size, policy, budget, sparsity, topk, sink_blocks, local_blocks, min_seq_len)
    _validate(query, summaries, hop, *args, lam, magnitude_fraction)
    scaling = check_scaling(scaling)
    check_kernel_runnable(_token_selection_kernel, query, "select_token_blocks_triton")
    batch, heads, n_q, head_dim = query.shape
    n_blocks = -(-n_keys // block_size)
    dense = policy == "dense" or (budget == "row" and sparsity == 0)
    scored = policy in _SCORED_POLICIES and not dense
    # streaming and dense ignore the query: one (batch, head) computes them, expanded like the reference's result
    out_batch, out_heads = (batch, heads) if scored else (1, 1)
    kv_heads = summaries[0].shape[1] if scored else 1
    n_summaries = summaries[0].shape[2] if scored else 0
    group = out_heads // kv_heads
    mk = max(16, _next_power_of_2(n_blocks))
    tiles = _tiles(n_q, group, mk, _TILE_VALUES // 2 if policy in _FRC_POLICIES else _TILE_VALUES)
    num_warps = _NUM_WARPS or min(4, _next_power_of_2(max(1, tiles["ROWS"] * mk // 2048)))
    width = selection_width(
        n_blocks, n_keys=n_keys, block_size=block_size, policy=policy, budget=budget, sparsity=sparsity, topk=topk,
        sink_blocks=sink_blocks, local_blocks=local_blocks, min_seq_len=min_seq_len,
    )  # fmt: skip
    device = query.device
    token_keep = torch.empty(out_batch, out_heads, n_q, n_blocks, dtype=torch.bool, device=device)
    shape = (out_batch, out_heads, n_q)
    indices = torch.empty(*shape, width if return_indices else 1, dtype=torch.int32, device=device)
    counts = torch.empty(*shape if return_indices else (1, 1, 1), dtype=torch.int32, device=device)
    placeholder = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=device)
    first = summaries[0] if scored else placeholder
    second = summaries[1] if scored and len(summaries) == 2 else first
    hop_tensor = hop if scored and policy in _FRC_POLICIES else placeholder
    fraction_bits = struct.unpack("<q", struct.pack("<d", 1.0 - float(sparsity)))[0]
    grid = (math.ceil(n_q / tiles["BLOCK_T"]), out_batch * kv_heads)
    if n_q and n_blocks and out_batch * out_heads:
        _token_selection_kernel[grid](
            query, first, second, hop_tensor, token_keep, indices, counts,
            group, kv_heads, n_q, n_keys - n_q, n_blocks, n_summaries, head_dim, block_size, scaling,
            fraction_bits, topk, sink_blocks, local_blocks, min_seq_len, float(lam), float(magnitude_fraction), width,
            *query.stride(), *first.stride(), *hop_tensor.stride(), *token_keep.stride(), *indices.stride(),
            *counts.stride(),
            POLICY=_POLICY_CODES["dense" if dense else policy], BOUND=scored and len(summaries) == 2,
            ROW_BUDGET=budget == "row", MK=mk, HOP_CHUNK=_HOP_CHUNK, WIDTH_PAD=_next_power_of_2(width),
            WRITE_INDICES=return_indices, DOT_SCORES=_scores_with_dot(tiles["ROWS"]), EARLY_EXIT=_EARLY_EXIT,
            # the reference rounds every product and sum on its own: no fused multiply-adds
            enable_fp_fusion=False,
            num_warps=num_warps,
            **tiles,
        )  # fmt: skip
    full = (batch, heads, n_q)
    token_keep = token_keep.expand(*full, n_blocks)
    if not return_indices:
        return token_keep
    return token_keep, indices.expand(*full, width), counts.expand(full)
