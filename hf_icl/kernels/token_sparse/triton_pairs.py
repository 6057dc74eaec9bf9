"""The key-block-major work list of per-token block-sparse attention, built with torch ops on the device.

A *pair* is one (query token, selected key block) entry of the selection: slot ``s`` of query ``(b, h, t)``, whose
flat id is ``pid = ((b * H + h) * Nq + t) * W + s`` (the row-major index into ``indices (B, H, Nq, W)``, so the same
id addresses the per-slot partial results ``(B, H, Nq, W, ...)`` the forward kernel writes).

A pair is *live* when it can contribute to the output: ``s < counts[b, h, t]``, its block id ``j`` is a real block
(``0 <= j < Mk``), the block starts at or before the query's position (``j * block_size <= q_offset + t``; a block
wholly after the query is fully masked by causality) and, with ``lengths``, the query is a real token
(``q_offset + t < lengths[b]``, which also puts the block's first key before the row's length). So every live pair
sees at least one key (its block's first), and nothing else needs computing.

Live pairs are keyed by their KV block ``kvb = (b * Hk + h // g) * Mk + j`` (one key for all ``g`` query heads of a
KV group: a K / V tile is read once for the whole group), dead ones by the sentinel ``B * Hk * Mk``; a stable sort on
that key groups each KV block's pairs (in pid order) and puts the dead ones last. ``torch.searchsorted`` gives each
block's first sorted position; each block's list is cut into *work items* of at most ``block_m`` pairs, and item
``i``'s block is again a ``searchsorted`` of ``i`` in the cumulative item counts. Item tables have a host-side size,
an upper bound from the shapes only (:func:`item_bound`); items past the real number get an empty range and their
programs return at once.

No step reads the device: no ``.item()``, ``.tolist()``, ``nonzero``, boolean-mask indexing or
``repeat_interleave`` without a size, so building the list never synchronises and is CUDA-graph capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PairList", "WorkItems", "build_pair_list", "cut_work_items", "item_bound"]


@dataclass
class PairList:
    """Live pairs sorted by KV block.

    Attributes:
        order: int64 ``(P,)``, ``P = B * H * Nq * W``: pair ids sorted by KV block (stable), dead pairs last.
        bounds: int64 ``(NB + 1,)``, ``NB = B * Hk * Mk``: block ``kvb``'s pairs are
            ``order[bounds[kvb]:bounds[kvb+1]]`` (``bounds[NB]`` is the number of live pairs).
        n_blocks: ``NB``, the number of KV blocks (host int, from the shapes).
    """

    order: torch.Tensor
    bounds: torch.Tensor
    n_blocks: int


@dataclass
class WorkItems:
    """Work item tables, one entry per program of the launch grid (``n_items`` of them, a host-side bound).

    Attributes:
        kvb: int64 ``(n_items,)``: the item's KV block (``n_blocks`` for an empty item past the real ones).
        start: int64 ``(n_items,)``: first position of the item's pairs in ``PairList.order``.
        end: int64 ``(n_items,)``: one past the last (``end == start`` for an empty item).
        block_m: pairs per item at most.
    """

    kvb: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    block_m: int

    @property
    def n_items(self) -> int:
        return self.kvb.shape[0]


def item_bound(n_pairs: int, n_blocks: int, block_m: int) -> int:
    """A host-side upper bound on the number of work items: each nonempty block gives ``ceil(c / block_m)``
    ≤ ``c / block_m + 1`` items, and no item is empty, so items ≤ ``min(P, NB + ceil(P / block_m))``.

        >>> item_bound(6000, 20, 64)
        114
    """
    return max(1, min(n_pairs, n_blocks + -(-n_pairs // block_m)))


def build_pair_list(
    indices: torch.Tensor,
    counts: torch.Tensor,
    *,
    kv_heads: int,
    n_keys: int,
    block_size: int,
    q_offset: int,
    lengths: torch.Tensor | None,
) -> PairList:
    """Sort the live (query, block) pairs of ``indices (B, H, Nq, W)`` / ``counts (B, H, Nq)`` by KV block.

    ``indices`` / ``counts`` may be expanded views; ``lengths`` is None or ``(B,)`` integer. No device sync.
    """
    batch, heads, n_q, width = indices.shape
    device = indices.device
    group = heads // kv_heads
    mk = -(-n_keys // block_size)
    n_blocks = batch * kv_heads * mk
    idx = indices.to(torch.int64)
    slot = torch.arange(width, device=device, dtype=torch.int64)
    q_pos = q_offset + torch.arange(n_q, device=device, dtype=torch.int64)  # (Nq,)
    live = slot < counts.to(torch.int64)[..., None]
    live = live & (idx >= 0) & (idx < mk) & (idx * block_size <= q_pos[:, None])
    if lengths is not None:
        row_len = lengths.to(device=device, dtype=torch.int64).view(batch, 1, 1, 1)
        live = live & (q_pos[:, None] < row_len)
    kv_row = (
        torch.arange(batch, device=device, dtype=torch.int64)[:, None] * kv_heads
        + torch.arange(heads, device=device, dtype=torch.int64)[None, :] // group
    )  # (B, H): b * Hk + h // g
    key = torch.where(live, kv_row[:, :, None, None] * mk + idx, n_blocks).reshape(-1)
    # 32-bit keys halve the radix sort's passes (the sentinel NB must fit)
    key_dtype = torch.int32 if n_blocks < 2**31 - 1 else torch.int64
    sorted_key, order = torch.sort(key.to(key_dtype), stable=True)
    bounds = torch.searchsorted(sorted_key, torch.arange(n_blocks + 1, device=device, dtype=key_dtype)).to(torch.int64)
    return PairList(order=order, bounds=bounds, n_blocks=n_blocks)


def cut_work_items(pairs: PairList, block_m: int) -> WorkItems:
    """Cut every KV block's pair list into items of at most ``block_m`` pairs (no device sync)."""
    device = pairs.order.device
    n_blocks = pairs.n_blocks
    n_pairs = pairs.order.shape[0]
    per_block = pairs.bounds[1:] - pairs.bounds[:-1]
    items_per_block = (per_block + (block_m - 1)) // block_m
    items_through = torch.cumsum(items_per_block, 0)  # inclusive: items of blocks 0..kvb
    n_items = item_bound(n_pairs, n_blocks, block_m)
    item = torch.arange(n_items, device=device, dtype=torch.int64)
    kvb = torch.searchsorted(items_through, item, right=True)  # block whose items cover item i; NB past the end
    real = kvb < n_blocks
    block = kvb.clamp(max=n_blocks - 1)
    first_item = items_through[block] - items_per_block[block]
    start = pairs.bounds[block] + (item - first_item) * block_m
    end = torch.minimum(start + block_m, pairs.bounds[block + 1])
    start = torch.where(real, start, 0)
    end = torch.where(real, end, 0)
    return WorkItems(kvb=kvb, start=start, end=end, block_m=block_m)
