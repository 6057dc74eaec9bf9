"""Forward block-sparse causal attention with an online softmax (flash-attention style), in Triton.

Each query block of ``block_size`` rows attends to the key blocks listed for it in ``indices`` (ascending, the first
``counts`` entries valid). One program handles one query block of one query head, or of several query heads at once
(below); it loads the query tile once, then streams the selected key / value tiles, keeping a running row max ``m``,
a running sum ``l`` and a rescaled fp32 accumulator, and finally writes ``acc / l`` in the input dtype (optionally
also ``lse = m + log(l)`` in fp32).

Rules shared with the PyTorch reference (:func:`hf_icl.kernels.block_sparse_reference.block_sparse_attention`):

* query block ``i`` covers absolute positions ``q_offset + i * block_size ...``; ``q_offset`` is a multiple of
  ``block_size`` unless ``Nq == 1`` (decode, any offset);
* token-level causality: a key at a position after the query's position is masked; key rows past ``Nk`` are masked;
* scores, softmax statistics and the accumulator are float32 whatever the input dtype;
* an optional ``key_padding_mask (B, Nk)`` (True = real key) masks padded keys for every query;
* grouped-query attention: ``k`` / ``v`` may have ``H / g`` heads, query head ``h`` reading KV head ``h // g``.

A query row that can see no key at all (only possible when its selection misses every past block) gets zeros and
``lse = -inf``, never NaN.

What makes it fast (FlexAttention's "full" vs "partial" blocks, FlashAttention's GQA packing):

* **Full tiles without masks.** A kept key block that lies wholly before the first query of the tile and wholly
  inside ``Nk`` (and there is no key padding mask) needs no per-element mask: every key in it is visible to every
  row. Because the list is ascending, these blocks are a prefix of it, found by a binary search; the kernel runs
  that prefix in a loop with no masks and no ``-inf`` guards, and only the rest (the diagonal block, a ragged last
  block, any block in the future) in a masked loop. The causal mask is thus applied to the diagonal block only.
* **GQA-aware K / V loads.** When every query head of a KV group keeps the same blocks (``group_heads``), one
  program stacks the query tiles of ``heads_per_program`` heads of the group (``heads_per_program * block_size``
  rows) and reads each K / V tile once for all of them, instead of once per query head. CAB's ``streaming`` policy
  (and any selection made per KV head) satisfies this; its score-based policies select per query head, and then
  the launcher falls back to one head per program (see :func:`selection_shared_by_groups`).
* **Tile sizes per head dim**: keys are streamed in tiles of ``block_n`` keys (several small key blocks gathered
  into one tile, or a large block cut into several), with ``num_warps`` / ``num_stages`` chosen per head dim by
  :func:`forward_tile_config`. These are untuned guesses until a GPU run (``hf-icl bench cab --device cuda``).
* Query blocks are launched last-first: later blocks keep more key blocks, so the long programs start early.

Under ``TRITON_INTERPRET=1`` (triton 3.9) ``tl.dot`` on bf16 tiles returns wrong values, so the launcher sets the
``UPCAST_DOT`` constexpr there and the dot operands are cast to float32 first; on a GPU the same kernel runs native
fp16 / bf16 dots with fp32 accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._common import (
    BACKENDS,
    INDEX_DTYPES,  # noqa: F401  (the indices/counts dtypes this op takes, as before)
    SUPPORTED_DTYPES,
    check_block_lists,
    check_kernel_runnable,
    check_key_padding_mask,
    check_qkv,
    describe,
    is_interpreted,
    resolve_backend,
    tl,
    triton,
)
from .block_sparse_reference import block_sparse_attention, selected_block_indices, token_mask

__all__ = [
    "BACKENDS",
    "BLOCK_SIZES",
    "HEAD_DIMS",
    "SUPPORTED_DTYPES",
    "TileConfig",
    "block_sparse_attention_forward",
    "block_sparse_attention_reference",
    "block_sparse_attention_triton",
    "forward_tile_config",
    "selection_lists",
    "selection_shared_by_groups",
]

BLOCK_SIZES = (16, 32, 64, 128)
HEAD_DIMS = (32, 64, 128)
#: keys per streamed tile that the kernels accept (powers of two, so a tile and a key block always nest)
TILE_KEYS = (16, 32, 64, 128)
LOG2_E = 1.4426950408889634  # the kernels run the softmax in base 2: exp(x) = exp2(x * log2(e))


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, q_offset: int, *, scaling) -> None:
    """Raise ``ValueError`` naming the argument, the value and what is allowed (q / k / v, block size, offset,
    scaling). Shapes and scalars only: no device sync."""
    check_qkv(q, k, v, scaling=scaling, head_dims=HEAD_DIMS, block_size=block_size, block_sizes=BLOCK_SIZES)
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an int >= 0, got {q_offset!r}")
    if q.shape[2] > 1 and q_offset % block_size != 0:
        raise ValueError(
            f"q_offset must be a multiple of block_size={block_size} unless Nq == 1 (decode), "
            f"got q_offset={q_offset} with Nq={q.shape[2]}"
        )


def validate_selection(
    q: torch.Tensor, k: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor, block_size: int
) -> None:
    """Check ``indices (B, H, Mq, K)`` and ``counts (B, H, Mq)`` against ``q`` / ``k`` (shapes, dtypes, values).

    The value checks (``1 <= counts <= K``, ``0 <= indices < Mk``) read the tensors, one device sync each.
    """
    batch, heads, n_q, _ = q.shape
    q_blocks, k_blocks = math.ceil(n_q / block_size), math.ceil(k.shape[2] / block_size)
    check_block_lists(q, indices, counts, (batch, heads, q_blocks), rows="Mq", slots="K")
    width = indices.shape[3]
    if width < 1:
        raise ValueError(f"indices must list at least one key block (K >= 1), got shape {tuple(indices.shape)}")
    if counts.numel() and (int(counts.min()) < 1 or int(counts.max()) > width):
        raise ValueError(f"counts must be in [1, K={width}], got values in [{int(counts.min())}, {int(counts.max())}]")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= k_blocks):
        raise ValueError(
            f"indices must be key-block ids in [0, Mk={k_blocks}), got values in "
            f"[{int(indices.min())}, {int(indices.max())}]"
        )


def validate_keep(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, block_size: int) -> None:
    """Check the bool block mask ``keep (B, H, Mq, Mk)``; every query block must keep at least one key block."""
    if not isinstance(keep, torch.Tensor):
        raise ValueError(f"keep must be a torch.Tensor, got {type(keep).__name__}")
    if keep.dtype != torch.bool:
        raise ValueError(f"keep.dtype must be torch.bool, got {keep.dtype}")
    if keep.device != q.device:
        raise ValueError(f"q and keep must be on the same device, got {q.device} and {keep.device}")
    expected = (q.shape[0], q.shape[1], math.ceil(q.shape[2] / block_size), math.ceil(k.shape[2] / block_size))
    if tuple(keep.shape) != expected:
        raise ValueError(f"keep must have shape (B, H, Mq, Mk)={expected}, got {tuple(keep.shape)}")
    if keep.numel() and not bool(keep.any(-1).all()):
        raise ValueError("keep must select at least one key block in every query block row, got an empty row")


def validate_keep_call(q, k, v, keep, key_padding_mask, *, block_size: int, q_offset: int, scaling) -> None:
    """Every check of a call that selects by the bool block mask ``keep``: q / k / v and the scalars, ``keep``, the
    key padding mask."""
    validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
    validate_keep(q, k, keep, block_size)
    check_key_padding_mask(key_padding_mask, q, k)


def validate_list_call(q, k, v, indices, counts, key_padding_mask, *, block_size: int, q_offset: int, scaling) -> None:
    """Every check of a call that selects by block lists ``(indices, counts)`` (value checks: device syncs)."""
    validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
    validate_selection(q, k, indices, counts, block_size)
    check_key_padding_mask(key_padding_mask, q, k)


# ----------------------------------------------------------------------------------------------------------------
# Which heads may share K / V loads, and the tile sizes
# ----------------------------------------------------------------------------------------------------------------


def selection_shared_by_groups(keep: torch.Tensor, kv_heads: int) -> bool:
    """Whether every query head of each grouped-query group keeps the same blocks in ``keep (B, H, Mq, Mk)``.

    That is the condition for reading each K / V tile once per group. A selection broadcast over heads (stride 0 on
    dim 1, as CAB's head-independent policies return it) is shared without looking; otherwise the groups are compared
    on the device (one sync).

    >>> keep = torch.ones(1, 4, 2, 2, dtype=torch.bool).tril()
    >>> selection_shared_by_groups(keep, kv_heads=2)
    True
    >>> keep[:, 1, 1, 0] = False  # head 1 (group 0) drops a block head 0 keeps
    >>> selection_shared_by_groups(keep, kv_heads=2), selection_shared_by_groups(keep, kv_heads=4)
    (False, True)
    """
    heads = keep.shape[1]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide the {heads} query heads of keep, got {kv_heads!r}")
    if kv_heads == heads or keep.stride(1) == 0:
        return True
    groups = keep.unflatten(1, (kv_heads, heads // kv_heads))
    return bool((groups == groups[:, :, :1]).all())


def selection_lists(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``keep (B, H, Mq, Mk)`` → the kernels' ``indices (B, H, Mq, K)`` and ``counts (B, H, Mq)``.

    A selection broadcast over heads (stride 0 on dim 1) is listed for one head and broadcast back, so the lists
    stay shared (and :func:`selection_shared_by_groups` stays free).

    >>> keep = torch.tensor([[True, False], [True, True]]).expand(1, 3, 2, 2)
    >>> indices, counts = selection_lists(keep)
    >>> counts.tolist(), indices.stride(1)
    ([[[1, 2], [1, 2], [1, 2]]], 0)
    """
    if keep.shape[1] > 1 and keep.stride(1) == 0:
        indices, valid = selected_block_indices(keep[:, :1])
        heads = keep.shape[1]
        return indices.expand(-1, heads, -1, -1), valid.sum(-1).expand(-1, heads, -1)
    indices, valid = selected_block_indices(keep)
    return indices, valid.sum(-1)


def _indices_shared_by_groups(indices: torch.Tensor, counts: torch.Tensor, kv_group: int) -> bool:
    """:func:`selection_shared_by_groups` for the ``(indices, counts)`` layout: equal counts and equal valid ids
    (slots past ``counts`` may hold anything)."""
    if kv_group == 1 or (indices.stride(1) == 0 and counts.stride(1) == 0):
        return True
    heads = indices.shape[1]
    ids = indices.unflatten(1, (heads // kv_group, kv_group))
    cnt = counts.unflatten(1, (heads // kv_group, kv_group))
    slot_valid = torch.arange(indices.shape[-1], device=indices.device) < cnt[..., None]
    same_ids = (ids == ids[:, :, :1]) | ~slot_valid
    return bool((cnt == cnt[:, :, :1]).all() & same_ids.all())


def _resolve_sharing(group_heads, grouped_query: bool, is_shared, check: bool) -> bool:
    """``group_heads`` (None = detect, True = the caller vouches, False = one head per program) → whether the
    kernels may stack a KV group's query heads; ``is_shared()`` looks at the selection (a device sync), which
    ``check`` also asks of a True."""
    if group_heads is not None and not isinstance(group_heads, bool):
        raise ValueError(f"group_heads must be None, True or False, got {group_heads!r}")
    if not grouped_query or group_heads is False:
        return False
    shared = is_shared() if group_heads is None or check else True
    if group_heads and not shared:
        raise ValueError(
            "group_heads=True needs every query head of a KV-head group to keep the same blocks, but the selection "
            "differs within a group; pass group_heads=None (detect) or False (one head per program)"
        )
    return shared


def resolve_group_heads(group_heads, indices: torch.Tensor, counts: torch.Tensor, kv_group: int, check: bool) -> bool:
    """Whether the kernels may stack the query heads of each KV group (``kv_group`` of them) for the selection
    ``(indices, counts)``, given the caller's ``group_heads`` (see :func:`block_sparse_attention_triton`)."""
    return _resolve_sharing(
        group_heads, kv_group > 1, lambda: _indices_shared_by_groups(indices, counts, kv_group), check
    )


def resolve_keep_groups(group_heads, keep: torch.Tensor, kv_heads: int, check: bool) -> bool:
    """:func:`resolve_group_heads` for a ``keep (B, H, Mq, Mk)`` selection over ``kv_heads`` K / V heads."""
    grouped_query = kv_heads != keep.shape[1]
    return _resolve_sharing(group_heads, grouped_query, lambda: selection_shared_by_groups(keep, kv_heads), check)


@dataclass(frozen=True)
class TileConfig:
    """How a block-sparse kernel tiles its work (see :func:`forward_tile_config` for the defaults per head dim).

    Attributes:
        block_n: keys per streamed K / V tile, one of 16, 32, 64, 128 (a tile gathers several small key blocks, or
            cuts a large one; the forward kernel only).
        heads_per_program: query heads of one KV group stacked in one program (their rows share each K / V tile);
            must divide the group size, and be 1 when the group's heads select different blocks.
        num_warps: warps per program (1, 2, 4, 8 or 16).
        num_stages: software-pipelining depth of the key loop (>= 1).

    >>> TileConfig(block_n=64, heads_per_program=2, num_warps=4, num_stages=3).rows(block_size=32)
    64
    """

    block_n: int
    heads_per_program: int = 1
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        if not is_int(self.block_n) or self.block_n not in TILE_KEYS:
            raise ValueError(f"block_n must be one of {list(TILE_KEYS)}, got {self.block_n!r}")
        if not is_int(self.heads_per_program) or self.heads_per_program < 1:
            raise ValueError(f"heads_per_program must be an int >= 1, got {self.heads_per_program!r}")
        if not is_int(self.num_warps) or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of [1, 2, 4, 8, 16], got {self.num_warps!r}")
        if not is_int(self.num_stages) or self.num_stages < 1:
            raise ValueError(f"num_stages must be an int >= 1, got {self.num_stages!r}")

    def rows(self, block_size: int) -> int:
        """Rows of a program's query tile: the stacked heads' query blocks, padded to a power of two."""
        return triton_next_power_of_2(self.heads_per_program * block_size)

    def launch(self) -> dict[str, int]:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


def triton_next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (``tl.arange`` lengths must be powers of two)."""
    return 1 << max(n - 1, 0).bit_length()


def stacked_heads(block_size: int, heads_per_group: int, row_cap: int) -> int:
    """The most query heads of a group (a divisor of ``heads_per_group``) whose stacked query blocks, padded to a
    power of two, stay within ``row_cap`` rows (the fp32 accumulators live in registers); at least 1."""
    fitting = [d for d in range(1, heads_per_group + 1) if heads_per_group % d == 0]
    return max(d for d in fitting if d == 1 or triton_next_power_of_2(d * block_size) <= row_cap)


def forward_tile_config(block_size: int, head_dim: int, heads_per_group: int = 1) -> TileConfig:
    """The forward kernel's tiles for ``block_size``, ``head_dim`` and ``heads_per_group`` query heads that share a
    selection (1: no stacking).

    Untuned guesses from FlashAttention-2's choices, until a GPU run (``hf-icl bench cab --device cuda``) tunes them:
    128-key tiles for D <= 64 and 64-key tiles for D = 128 (K + V tiles of 16-32 KB in bf16); 8 warps once the
    fp32 accumulator reaches 128 × 128, else 4; 3 pipeline stages, 2 for D = 128 (shared memory); heads of a group
    stacked up to 256 rows for D <= 64 and 128 rows for D = 128.

    >>> forward_tile_config(64, 128, heads_per_group=4)
    TileConfig(block_n=64, heads_per_program=2, num_warps=8, num_stages=2)
    """
    heads = stacked_heads(block_size, heads_per_group, row_cap=256 if head_dim <= 64 else 128)
    rows = triton_next_power_of_2(heads * block_size)
    return TileConfig(
        block_n=128 if head_dim <= 64 else 64,
        heads_per_program=heads,
        num_warps=8 if rows * head_dim >= 128 * 128 else 4,
        num_stages=2 if head_dim >= 128 else 3,
    )


def check_tile_config(tiles, kv_group: int, grouped: bool) -> TileConfig:
    """``tiles`` must be a :class:`TileConfig` whose stacked heads divide the group (1 unless ``grouped``)."""
    if not isinstance(tiles, TileConfig):
        raise ValueError(f"tiles must be a TileConfig or None, got {type(tiles).__name__}")
    allowed = kv_group if grouped else 1
    if allowed % tiles.heads_per_program:
        raise ValueError(
            f"tiles.heads_per_program must divide {allowed} (the heads of a KV group that share a selection), "
            f"got {tiles.heads_per_program}"
        )
    return tiles


# ----------------------------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------------------------

_block_sparse_attention_kernel = None  # the Triton kernel, defined below when triton imports
count_below = full_key_blocks = load_key_tiles = online_softmax_step = None  # its jit helpers, likewise

if triton is not None:

    @triton.jit
    def count_below(entries, stride, count, limit):
        """How many of the ascending ids ``entries[0], entries[stride], …`` (``count`` of them) are < ``limit``:
        a binary search, log2(count) scalar loads."""
        lo = count.to(tl.int32) * 0
        hi = count.to(tl.int32)
        while lo < hi:
            mid = (lo + hi) // 2
            below = tl.load(entries + mid * stride) < limit
            lo = tl.where(below, mid + 1, lo)
            hi = tl.where(below, hi, mid)
        return lo

    @triton.jit
    def full_key_blocks(entries, stride, count, first_query, n_k, BS: tl.constexpr, HAS_KEY_MASK: tl.constexpr):
        """The leading entries that are *full* blocks for a tile whose earliest query sits at ``first_query``: the
        whole block is at or before that query and inside ``n_k``, and no key padding mask applies."""
        n_full = count.to(tl.int32) * 0
        if not HAS_KEY_MASK:
            limit = tl.minimum(first_query + 1, n_k) // BS  # blocks below this one end by first_query and n_k
            n_full = count_below(entries, stride, count, limit)
        return n_full

    @triton.jit
    def load_key_tiles(
        k_base, v_base, k_pos, k_ok, ks_n, ks_d, vs_n, vs_d, cols, key_valid_row, kvs_n,
        MASKED: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
    ):  # fmt: skip
        """``(k_tile, v_tile, k_ok)``: the K and V rows at key positions ``k_pos``. ``MASKED``: only the rows
        ``k_ok`` (narrowed to the real keys of ``key_valid_row`` with ``HAS_KEY_MASK``) are read, the others are 0;
        else (a full block or tile) every row is read and ``k_ok`` is returned unread."""
        k_rows = k_pos.to(tl.int64)[:, None]
        if MASKED:
            if HAS_KEY_MASK:
                k_ok = k_ok & (tl.load(key_valid_row + k_pos.to(tl.int64) * kvs_n, mask=k_ok, other=0) != 0)
            k_tile = tl.load(k_base + k_rows * ks_n + cols[None, :] * ks_d, mask=k_ok[:, None], other=0.0)
            v_tile = tl.load(v_base + k_rows * vs_n + cols[None, :] * vs_d, mask=k_ok[:, None], other=0.0)
        else:
            k_tile = tl.load(k_base + k_rows * ks_n + cols[None, :] * ks_d)
            v_tile = tl.load(v_base + k_rows * vs_n + cols[None, :] * vs_d)
        return k_tile, v_tile, k_ok

    @triton.jit
    def online_softmax_step(s, m_i, MASKED: tl.constexpr):
        """One online-softmax update from the scores ``s`` (base-2 logits) and the running row maxima ``m_i``:
        ``(m_new, p, alpha)`` with ``p = exp2(s - m_new)`` and ``alpha = exp2(m_i - m_new)`` the old sums' factor.
        ``MASKED``: a row with nothing allowed so far keeps ``m = -inf`` and subtracts 0 instead, so exp2 gives 0,
        not NaN; else (a full tile) every row has finite scores."""
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MASKED:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        return m_new, p, alpha

    @triton.jit
    def _attend_key_tile(
        acc, m_i, l_i, q_tile, q_pos,                               # the running softmax state, the query rows
        first_key, n_listed_keys, entries, stride,                  # which listed keys
        k_base, v_base, ks_n, ks_d, vs_n, vs_d, cols, n_k, key_valid_row, kvs_n, qk_scale,
        BS: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST_DOT: tl.constexpr, MASKED: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):  # fmt: skip
        """One online-softmax step over listed keys ``first_key … first_key + BLOCK_N`` (keys of the selected
        blocks, counted in list order: listed key f is row ``f % BS`` of block ``entries[f // BS]``).

        ``MASKED=False`` is the full-tile path: no bounds, causal or padding masks, no ``-inf`` guards.
        """
        listed = first_key + tl.arange(0, BLOCK_N)
        if MASKED:
            listed_ok = listed < n_listed_keys
            block = tl.load(entries + (listed // BS) * stride, mask=listed_ok, other=0)
        else:
            listed_ok = listed >= 0  # a full tile: every listed key is real (unread)
            block = tl.load(entries + (listed // BS) * stride)
        k_pos = block * BS + listed % BS  # absolute key positions
        k_tile, v_tile, k_ok = load_key_tiles(
            k_base, v_base, k_pos, listed_ok & (k_pos < n_k), ks_n, ks_d, vs_n, vs_d, cols, key_valid_row, kvs_n,
            MASKED, HAS_KEY_MASK,
        )  # fmt: skip
        if UPCAST_DOT:
            k_tile = k_tile.to(tl.float32)
            v_tile = v_tile.to(tl.float32)

        s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * qk_scale  # fp32, base-2 logits
        if MASKED:
            s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new, p, alpha = online_softmax_step(s, m_i, MASKED)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if UPCAST_DOT:
            acc += tl.dot(p, v_tile, input_precision="ieee")
        else:
            acc += tl.dot(p.to(v_tile.dtype), v_tile, input_precision="ieee")
        return acc, m_new, l_i

    @triton.jit
    def _block_sparse_attention_kernel(
        q, k, v, out, lse, indices, counts, key_valid, tile_counts,  # tensors
        heads, kv_group, n_q, n_k, q_blocks, q_offset, qk_scale,     # shapes, base-2 scale
        qs_b, qs_h, qs_n, qs_d, ks_b, ks_h, ks_n, ks_d, vs_b, vs_h, vs_n, vs_d,  # q / k / v strides
        os_b, os_h, os_n, os_d, ls_b, ls_h, ls_n,                    # out / lse strides
        is_b, is_h, is_m, is_k, cs_b, cs_h, cs_m, kvs_b, kvs_n,      # indices / counts / key_valid strides
        BS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr, RETURN_LSE: tl.constexpr, HAS_KEY_MASK: tl.constexpr, COUNT_TILES: tl.constexpr,
    ):  # fmt: skip
        """One program per (query block, batch, group of GROUP query heads sharing a selection): the heads' query
        blocks are stacked as rows (row r: head ``h0 + r // BS``, query ``r % BS`` of the block)."""
        blk = q_blocks - 1 - tl.program_id(0)  # the latest query blocks (the most key blocks) first
        pid = tl.program_id(1)
        program_heads = heads // GROUP
        # int64 offsets: B * H * N * D can exceed 2**31 for long KV caches.
        b = (pid // program_heads).to(tl.int64)
        h0 = (pid % program_heads).to(tl.int64) * GROUP
        r = tl.arange(0, BLOCK_M)
        row_head = h0 + r // BS
        q_row = blk * BS + r % BS
        row_ok = (q_row < n_q) & (r < GROUP * BS)  # padded query rows and the power-of-two padding of the stack
        q_pos = q_offset + q_row  # absolute query positions
        cols = tl.arange(0, BLOCK_D).to(tl.int64)

        q_ptrs = q + b * qs_b + row_head[:, None] * qs_h + q_row.to(tl.int64)[:, None] * qs_n + cols[None, :] * qs_d
        q_tile = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        if UPCAST_DOT:
            q_tile = q_tile.to(tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        kv_head = h0 // kv_group
        k_base = k + b * ks_b + kv_head * ks_h
        v_base = v + b * vs_b + kv_head * vs_h
        key_valid_row = key_valid + b * kvs_b
        entries = indices + b * is_b + h0 * is_h + blk.to(tl.int64) * is_m  # the stacked heads' shared list
        count = tl.load(counts + b * cs_b + h0 * cs_h + blk.to(tl.int64) * cs_m).to(tl.int32)
        n_listed_keys = count * BS
        n_full = full_key_blocks(entries, is_k, count, q_offset + blk * BS, n_k, BS, HAS_KEY_MASK)
        full_tiles = n_full * BS // BLOCK_N  # tiles made only of full blocks
        for t in range(full_tiles):
            acc, m_i, l_i = _attend_key_tile(
                acc, m_i, l_i, q_tile, q_pos, t * BLOCK_N, n_listed_keys, entries, is_k, k_base, v_base,
                ks_n, ks_d, vs_n, vs_d, cols, n_k, key_valid_row, kvs_n, qk_scale,
                BS, BLOCK_N, UPCAST_DOT, False, HAS_KEY_MASK,
            )  # fmt: skip
        masked_start = full_tiles * BLOCK_N
        for first_key in range(masked_start, n_listed_keys, BLOCK_N):
            acc, m_i, l_i = _attend_key_tile(
                acc, m_i, l_i, q_tile, q_pos, first_key, n_listed_keys, entries, is_k, k_base, v_base,
                ks_n, ks_d, vs_n, vs_d, cols, n_k, key_valid_row, kvs_n, qk_scale,
                BS, BLOCK_N, UPCAST_DOT, True, HAS_KEY_MASK,
            )  # fmt: skip

        has_keys = l_i > 0.0
        result = acc / tl.where(has_keys, l_i, 1.0)[:, None]  # rows that saw no key stay 0
        o_ptrs = out + b * os_b + row_head[:, None] * os_h + q_row.to(tl.int64)[:, None] * os_n + cols[None, :] * os_d
        tl.store(o_ptrs, result.to(out.dtype.element_ty), mask=row_ok[:, None])
        if RETURN_LSE:
            row_lse = tl.where(
                has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * 0.6931471805599453, float("-inf")
            )
            tl.store(lse + b * ls_b + row_head * ls_h + q_row.to(tl.int64) * ls_n, row_lse, mask=row_ok)
        if COUNT_TILES:
            slot = tile_counts + ((b * heads + h0) * q_blocks + blk) * 2
            tl.store(slot, full_tiles)
            tl.store(slot + 1, tl.cdiv(n_listed_keys - masked_start, BLOCK_N))


def block_sparse_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, return_lse: bool = False,
    key_padding_mask: torch.Tensor | None = None, validate: bool = True, group_heads: bool | None = None,
    tiles: TileConfig | None = None, tile_counts: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Triton block-sparse causal attention of ``q (B, H, Nq, D)`` over ``k`` / ``v (B, H / g, Nk, D)``.

    Args:
        indices: ``(B, H, Mq, K)`` int32 / int64 key-block ids per query block, ascending; the first
            ``counts[b, h, i]`` are used (see :func:`hf_icl.kernels.block_sparse_reference.selected_block_indices`).
        counts: ``(B, H, Mq)`` number of valid ids per query block, in ``[1, K]``.
        block_size: tokens per block (16, 32, 64 or 128), for queries and keys alike.
        scaling: softmax scale applied to ``q @ k^T``.
        q_offset: absolute position of query 0 (a multiple of ``block_size`` unless ``Nq == 1``).
        return_lse: also return the float32 log-sum-exp ``(B, H, Nq)`` of the scaled, masked scores.
        key_padding_mask: optional bool ``(B, Nk)``, False for padded keys (masked for every query).
        validate: check the inputs first; ``False`` skips the checks and their device syncs, for selections made by
            :func:`~hf_icl.kernels.block_sparse_reference.selected_block_indices` (valid by construction).
        group_heads: under grouped-query attention, whether one program may serve several query heads of a KV
            group (each K / V tile read once for them): ``None`` detects it (free for a selection broadcast over
            heads, else one device sync), ``True`` vouches for it (checked when ``validate``), ``False`` runs one
            head per program. Valid only when the group's heads have the same ``counts`` and ids.
        tiles: the tiling (default :func:`forward_tile_config` for this block size, head dim and group).
        tile_counts: optional int32 ``(B, H, Mq, 2)`` tensor (a diagnostic): each program writes, at its first
            head, how many key tiles it streamed without masks and with masks.

    Returns the ``(B, H, Nq, D)`` output in the input dtype (contiguous), and ``lse`` if asked. Runs on CUDA
    tensors, or on CPU tensors under ``TRITON_INTERPRET=1``; strided inputs are read in place.
    """
    if validate:
        validate_list_call(
            q, k, v, indices, counts, key_padding_mask, block_size=block_size, q_offset=q_offset, scaling=scaling
        )
    check_kernel_runnable(_block_sparse_attention_kernel, q, "block_sparse_attention_triton")
    batch, heads, n_q, head_dim = q.shape
    kv_group = heads // k.shape[1]
    grouped = resolve_group_heads(group_heads, indices, counts, kv_group, check=validate)
    if tiles is None:
        tiles = forward_tile_config(block_size, head_dim, kv_group if grouped else 1)
    tiles = check_tile_config(tiles, kv_group, grouped)
    q_blocks = math.ceil(n_q / block_size)
    _check_tile_counts(tile_counts, (batch, heads, q_blocks, 2), q.device)
    key_valid = key_valid_tensor(key_padding_mask, q)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(batch, heads, n_q, dtype=torch.float32, device=q.device)
    if batch * heads > 0:
        _block_sparse_attention_kernel[(q_blocks, batch * heads // tiles.heads_per_program)](
            q, k, v, out, lse, indices, counts, key_valid,
            lse if tile_counts is None else tile_counts,  # unread without COUNT_TILES
            heads, kv_group, n_q, k.shape[2], q_blocks, q_offset, float(scaling) * LOG2_E,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
            *indices.stride(), *counts.stride(), *key_valid.stride(),
            BS=block_size, GROUP=tiles.heads_per_program, BLOCK_M=tiles.rows(block_size), BLOCK_N=tiles.block_n,
            BLOCK_D=head_dim, UPCAST_DOT=is_interpreted(_block_sparse_attention_kernel), RETURN_LSE=return_lse,
            HAS_KEY_MASK=key_padding_mask is not None, COUNT_TILES=tile_counts is not None,
            **tiles.launch(),
        )  # fmt: skip
    return (out, lse) if return_lse else out


def _check_tile_counts(tile_counts, shape: tuple[int, ...], device: torch.device) -> None:
    """The diagnostic output must be a contiguous int32 tensor of ``shape`` on ``device`` (or None)."""
    if tile_counts is None:
        return
    ok = (
        isinstance(tile_counts, torch.Tensor)
        and tile_counts.dtype == torch.int32
        and tuple(tile_counts.shape) == shape
        and tile_counts.is_contiguous()
        and tile_counts.device == device
    )
    if not ok:
        raise ValueError(
            f"tile_counts must be None or a contiguous int32 tensor {shape} on {device}, got {describe(tile_counts)}"
        )


def kernels_runnable(device: torch.device | str) -> bool:
    """Whether the block-sparse kernels can run on tensors of ``device``: CUDA, or CPU under the interpreter."""
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or is_interpreted(_block_sparse_attention_kernel)


def key_valid_tensor(key_padding_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The kernel's int8 ``(B, Nk)`` key-validity operand; a 1 × 1 placeholder when there is no mask (unread)."""
    if key_padding_mask is None:
        return torch.ones(1, 1, dtype=torch.int8, device=q.device)
    return key_padding_mask.to(torch.int8)


def padding_attention_mask(key_padding_mask: torch.Tensor | None, n_q: int) -> torch.Tensor | None:
    """``(B, Nk)`` key padding → the reference's bool ``(B, 1, Nq, Nk)`` attention mask (the same for every query)."""
    return None if key_padding_mask is None else key_padding_mask[:, None, None, :].expand(-1, 1, n_q, -1)


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query K / V ``(B, H / g, N, D)`` → ``(B, H, N, D)`` by repeating each KV head g times (references)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


# ----------------------------------------------------------------------------------------------------------------
# PyTorch reference and dispatcher
# ----------------------------------------------------------------------------------------------------------------


def _reference_lse(
    q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Plain masked ``logsumexp`` (B, H, Nq) fp32 over the kept blocks and the causal mask (dense, O(Nq * Nk))."""
    allowed = token_mask(keep, block_size, q.shape[2], k.shape[2], q_offset)
    if key_padding_mask is not None:
        allowed = allowed & padding_attention_mask(key_padding_mask, q.shape[2])
    scores = (q.float() @ expand_kv(k, q.shape[1]).float().transpose(-1, -2)) * scaling
    return torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def block_sparse_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, return_lse: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """PyTorch path: :func:`hf_icl.kernels.block_sparse_reference.block_sparse_attention`, plus a dense masked lse."""
    settings = {"block_size": block_size, "q_offset": q_offset, "scaling": scaling}
    validate_keep_call(q, k, v, keep, key_padding_mask, **settings)
    heads = q.shape[1]
    attention_mask = padding_attention_mask(key_padding_mask, q.shape[2])
    out = block_sparse_attention(
        q, expand_kv(k, heads), expand_kv(v, heads), keep, attention_mask=attention_mask, **settings
    )
    if not return_lse:
        return out
    return out, _reference_lse(q, k, keep, key_padding_mask=key_padding_mask, **settings)


def block_sparse_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, return_lse: bool = False,
    key_padding_mask: torch.Tensor | None = None, backend: str = "auto", group_heads: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Block-sparse causal attention selected by the bool block mask ``keep (B, H, Mq, Mk)``.

    ``backend="auto"`` runs the Triton kernel on CUDA tensors when triton is importable and the PyTorch path
    otherwise; ``"triton"`` or ``"torch"`` force one. Returns ``out`` (B, H, Nq, D), and the fp32 ``lse``
    (B, H, Nq) when ``return_lse`` is set. ``group_heads`` (None: detect) lets one kernel program serve the query
    heads of a KV group that share their selection (:func:`selection_shared_by_groups`). Not differentiable through
    the kernel: training goes through :func:`hf_icl.kernels.block_sparse_backward.block_sparse_flash_attention`.

    >>> q, k, v = torch.randn(1, 2, 40, 32), torch.randn(1, 1, 40, 32), torch.randn(1, 1, 40, 32)
    >>> keep = torch.ones(1, 2, 3, 3, dtype=torch.bool).tril()
    >>> block_sparse_attention_forward(q, k, v, keep, block_size=16, scaling=32**-0.5).shape
    torch.Size([1, 2, 40, 32])
    """
    kwargs = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset, "return_lse": return_lse}
    if resolve_backend(backend, q) == "torch":
        return block_sparse_attention_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **kwargs)
    # the kernel call below skips its own checks
    validate_keep_call(q, k, v, keep, key_padding_mask, block_size=block_size, q_offset=q_offset, scaling=scaling)
    grouped = resolve_keep_groups(group_heads, keep, k.shape[1], check=True)
    indices, counts = selection_lists(keep)
    return block_sparse_attention_triton(
        q, k, v, indices, counts, key_padding_mask=key_padding_mask, validate=False, group_heads=grouped, **kwargs
    )
