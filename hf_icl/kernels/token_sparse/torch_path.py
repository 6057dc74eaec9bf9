"""Per-token block-sparse causal attention in PyTorch, executed key block by key block (MoBA's schedule).

Every query token attends the key blocks IT selected. Running that per query tile over the union of its tokens'
picks makes the work follow the unions (on random q/k they cover almost every causal block). Here the work follows
the selected (query token, key block) pairs instead:

1. The pairs are listed key block by key block (a ``nonzero`` over the selection laid out as (batch, KV head, key
   block, query head, token), so no sort is needed), and each key block's queries are cut into work items of at
   most ``_MAX_ITEM`` queries. Items are bucketed by size (8, 16, ..., ``_MAX_ITEM`` queries), so each bucket is one
   batched matmul padded to its own size: the padding is bounded by a factor two for small items, not by the widest.
2. An item gathers its queries (one row per pair) and reads its K and V block once, for every query head of the KV
   group that chose it (grouped-query attention without repeating K / V). Scores are float32 whatever the input
   dtype. Only the pairs of a token's own block need the causal mask, so they run as separate items.
3. Each token's partial results over its blocks are merged exactly: its largest score over all its pairs is found
   first (a scatter ``amax``), then ``exp(s - max)``, the row sums and ``p @ v`` are added up per token
   (``index_add``) and divided once. The maximum is a constant of the softmax, so it is detached from autograd;
   gradients flow through the scores, the gathers and the additions.

Memory. Queries are processed in *ranges* of consecutive tokens; the caller's ``select(start, stop)`` gives the
selection of one range at a time, so nothing of size (heads × tokens × key blocks) is held for the whole sequence.
A range is split further into *pieces* whose score tensors hold at most ``_MAX_SCORE_ELEMENTS`` floats (a token's
pairs always stay in one piece, so each piece merges completely).

Padding: blocks, causality and budgets are laid over each row's real tokens (padding squeezed out, as
:func:`hf_icl.kernels.block_sparse_reference.real_positions` lays them), so a padded row gives what it gives alone.
A padded query, or a query that selected no block at or before its own, gets zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..block_sparse_reference import real_positions

__all__ = ["attend_selected", "query_range_length", "query_ranges", "token_sparse_attention_torch"]

#: cap on the float32 scores one piece holds ((queries × keys) summed over its items): bounds the executor's memory
_MAX_SCORE_ELEMENTS = 1 << 22
#: cap on the selection one range holds (batch × heads × tokens × key blocks booleans, and the block scores behind it)
_MAX_SELECTION_ELEMENTS = 1 << 21
#: the most queries one work item takes from a key block; items run in buckets of 8, 16, ..., this many queries
_MAX_ITEM = 128
_MIN_ITEM = 8


def query_range_length(batch: int, heads: int, n_q: int, n_blocks: int, block_size: int) -> int:
    """How many consecutive query tokens one range takes: a multiple of ``block_size`` whose selection holds at most
    ``_MAX_SELECTION_ELEMENTS`` entries (at least one block of tokens, at most all of them)."""
    per_token = max(1, batch * heads * n_blocks)
    tokens = max(block_size, (_MAX_SELECTION_ELEMENTS // per_token) // block_size * block_size)
    return min(n_q, tokens)


def query_ranges(n_q: int, length: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: queries ``0 … n_q`` in consecutive ranges of ``length``."""
    return [(start, min(n_q, start + length)) for start in range(0, n_q, length)]


def token_sparse_attention_torch(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    token_keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    key_valid: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal attention of every query over the key blocks it selected, ``token_keep (B, H, Nq, Mk)`` bool.

    ``query (B, H, Nq, D)`` are the last ``Nq`` of the ``Nk`` positions of ``key`` / ``value (B, H / g, Nk, D)``;
    ``key_valid (B, Nk)`` marks real tokens (None: no padding). Selected blocks after a query's own are ignored.
    Returns ``(B, H, Nq, D)`` in the query dtype. See the module docstring for how the work follows the pairs.
    """
    return attend_selected(
        query,
        key,
        value,
        lambda start, stop: token_keep[:, :, start:stop],
        block_size=block_size,
        scaling=scaling,
        key_valid=key_valid,
        dropout=dropout,
    )


def attend_selected(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    select: Callable[[int, int], torch.Tensor],
    *,
    block_size: int,
    scaling: float,
    key_valid: torch.Tensor | None = None,
    dropout: float = 0.0,
    range_length: int | None = None,
) -> torch.Tensor:
    """:func:`token_sparse_attention_torch` with the selection computed range by range: ``select(start, stop)``
    returns the ``(B, H, stop - start, Mk)`` bool selection of queries ``start ≤ t < stop``. ``range_length``
    (default :func:`query_range_length`) sets how many queries one call asks for."""
    batch, heads, n_q, dim = query.shape
    kv_heads, n_k = key.shape[1], key.shape[2]
    n_blocks = -(-n_k // block_size)
    q_pos, key_index, _ = real_positions(key_valid, n_q, n_k, query.device)
    work = torch.promote_types(query.dtype, torch.float32)  # scores and sums: float32 at least
    blocks = _KeyBlocks(
        keys=_real_blocks(key, key_index, block_size).to(work),
        values=_real_blocks(value, key_index, block_size).to(work),
        kv_heads=kv_heads,
        n_blocks=n_blocks,
        block_size=block_size,
    )
    if range_length is None:
        range_length = query_range_length(batch, heads, n_q, n_blocks, block_size)
    ranges = query_ranges(n_q, range_length)
    outputs = []
    for start, stop in ranges:
        keep = select(start, stop)
        q_range = query[:, :, start:stop].to(work) * scaling
        pos = q_pos[:, start:stop].expand(batch, -1)
        outputs.append(_attend_range(q_range, pos, keep, blocks, dropout).to(query.dtype))
    if len(outputs) == 1:
        return outputs[0]
    if torch.is_grad_enabled():
        return torch.cat(outputs, dim=2)
    out = query.new_empty(batch, heads, n_q, dim)  # inference: each range written in place as it is done
    for (start, stop), piece in zip(ranges, outputs, strict=True):
        out[:, :, start:stop] = piece
    return out


class _KeyBlocks:
    """K and V of every (row, KV head) cut into blocks over the real tokens: ``(B·Hk·Mk, bs, D)`` each."""

    def __init__(self, keys, values, kv_heads: int, n_blocks: int, block_size: int):
        self.keys, self.values = keys, values
        self.kv_heads, self.n_blocks, self.block_size = kv_heads, n_blocks, block_size


def _real_blocks(x: torch.Tensor, key_index: torch.Tensor | None, block_size: int) -> torch.Tensor:
    """``(B, Hk, Nk, D)`` → ``(B·Hk·Mk, bs, D)``: each row's real tokens first (padding squeezed out), in blocks."""
    if key_index is not None:
        x = x.gather(2, key_index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[-1]))
    pad = -x.shape[2] % block_size
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(-1, block_size, x.shape[-1])


def _attend_range(q_range, q_pos, keep, blocks: _KeyBlocks, dropout: float) -> torch.Tensor:
    """One range of queries: ``q_range (B, H, R, D)`` (scaled, work dtype), ``q_pos (B, R)`` real positions (−1:
    padded), ``keep (B, H, R, Mk)``. Returns ``(B, H, R, D)`` in the work dtype."""
    batch, heads, n_rows, dim = q_range.shape
    kv_heads, n_blocks = blocks.kv_heads, blocks.n_blocks
    group = heads // kv_heads
    # (B, Hk, Mk, g, R): one nonzero lists the pairs key block by key block, a group's query heads together
    pairs = keep.view(batch, kv_heads, group, n_rows, n_blocks).permute(0, 1, 4, 2, 3).nonzero()
    b, kvh, j, gi, t = pairs.unbind(1)
    own = q_pos.div(blocks.block_size, rounding_mode="floor")[b, t]  # −1 for padded queries
    live = (j <= own) & (own >= 0)  # blocks after a query's own (and padded queries) are dropped
    if not bool(live.all()):
        b, kvh, j, gi, t, own = (x[live] for x in (b, kvh, j, gi, t, own))
    rows_total = batch * heads * n_rows
    pairs = _Pairs(
        block=(b * kv_heads + kvh) * n_blocks + j,
        row=((b * heads + kvh * group + gi) * n_rows) + t,
        token=t,
        own=j == own,  # the own block's pairs need the causal mask, the others are wholly in the past
    )
    flat_q = torch.cat([q_range.reshape(rows_total, dim), q_range.new_zeros(1, dim)])  # + a padding row
    pos_flat = torch.cat([q_pos[:, None, :].expand(batch, heads, n_rows).reshape(-1), q_pos.new_full((1,), -1)])
    # per token: Σ p·v and Σ p (two accumulators: no concatenated copy of every p @ v)
    weighted, norm = q_range.new_zeros(rows_total + 1, dim), q_range.new_zeros(rows_total + 1)
    # a token's pairs stay together: cut the range where the running pair count crosses the score budget
    per_token = torch.bincount(pairs.token, minlength=n_rows)
    cuts = _piece_bounds(per_token, max(1, _MAX_SCORE_ELEMENTS // blocks.block_size))
    for start, stop in cuts:
        piece = pairs if len(cuts) == 1 else pairs.subset((pairs.token >= start) & (pairs.token < stop))
        weighted, norm = _attend_piece(flat_q, pos_flat, piece, blocks, dropout, weighted, norm)
    out = weighted[:rows_total] / norm[:rows_total, None].clamp_min(torch.finfo(torch.float32).tiny)
    return out.view(batch, heads, n_rows, dim)


class _Pairs(NamedTuple):
    """The (query token, key block) pairs of a range, in key-block order: ``block`` (into the key blocks), ``row``
    (into the flattened queries), ``token`` (the query's index in the range), ``own`` (its own block)."""

    block: torch.Tensor
    row: torch.Tensor
    token: torch.Tensor
    own: torch.Tensor

    def subset(self, chosen: torch.Tensor) -> _Pairs:
        return _Pairs(*(x[chosen] for x in self))


def _piece_bounds(per_token: torch.Tensor, budget: int) -> list[tuple[int, int]]:
    """Split tokens into consecutive pieces of at most ``budget`` pairs each (a token heavier than the budget gets a
    piece of its own)."""
    totals = per_token.cumsum(0).tolist()
    bounds, start, base = [], 0, 0
    for t, total in enumerate(totals):
        if total - base > budget and t > start:
            bounds.append((start, t))
            start, base = t, totals[t - 1]
    bounds.append((start, len(totals)))
    return bounds


def _attend_piece(flat_q, pos_flat, pairs: _Pairs, blocks: _KeyBlocks, dropout: float, weighted, norm):
    """Every pair of a piece (whole tokens): scores, each token's maximum over its pairs, then ``exp(s − max)``;
    ``p @ v`` and ``Σ p`` added to the tokens' rows of ``weighted`` and ``norm`` (both returned)."""
    pad_row = flat_q.shape[0] - 1
    buckets = []
    for masked in (False, True):
        chosen = pairs.own if masked else ~pairs.own
        if bool(chosen.any()):
            buckets.extend(_bucketed_items(pairs.block[chosen], pairs.row[chosen], pad_row, masked))
    # pass 1: scores of every item, and each token's largest score over all its pairs
    scores = []
    row_max = flat_q.new_full((pad_row + 1,), float("-inf"))
    for bucket in buckets:
        s = _scores(flat_q, pos_flat, blocks, bucket)
        scores.append(s)
        row_max.scatter_reduce_(0, bucket.rows.flatten(), s.detach().amax(-1).flatten(), "amax")
    row_max = row_max.masked_fill(~torch.isfinite(row_max), 0.0)
    # pass 2: exp(s − max), then [p @ v, Σ p] added up per token
    inplace = not torch.is_grad_enabled()  # inference: reuse the score buffers and accumulate in place
    for bucket, s in zip(buckets, scores, strict=True):
        shift = row_max[bucket.rows][..., None]
        p = s.sub_(shift).exp_() if inplace else torch.exp(s - shift)
        row_sums = p.sum(-1)  # before dropout: the normaliser is the undropped sum
        if dropout:
            p = F.dropout(p, p=dropout)
        pv = torch.matmul(p, blocks.values.index_select(0, bucket.blocks))
        add = torch.Tensor.index_add_ if inplace else torch.Tensor.index_add  # autograd: a fresh accumulator
        rows = bucket.rows.flatten()
        weighted, norm = add(weighted, 0, rows, pv.flatten(0, 1)), add(norm, 0, rows, row_sums.flatten())
    return weighted, norm


class _Bucket:
    """Work items of one size: ``blocks (n,)`` key-block ids, ``rows (n, size)`` query rows (the padding row at the
    end where an item has fewer queries), ``masked``: whether the items hold own-block pairs (causal mask)."""

    def __init__(self, blocks, rows, masked):
        self.blocks, self.rows, self.masked = blocks, rows, masked


def _bucketed_items(block_id: torch.Tensor, row: torch.Tensor, pad_row: int, masked: bool) -> list[_Bucket]:
    """Pairs sorted by key block → work items of at most ``_MAX_ITEM`` queries, grouped by padded size."""
    blocks, per_block = torch.unique_consecutive(block_id, return_counts=True)
    first = per_block.cumsum(0) - per_block
    rank = torch.arange(len(block_id), device=block_id.device) - first.repeat_interleave(per_block)
    items_per_block = (per_block + _MAX_ITEM - 1) // _MAX_ITEM
    item_first = items_per_block.cumsum(0) - items_per_block
    item = item_first.repeat_interleave(per_block) + rank // _MAX_ITEM
    slot = rank % _MAX_ITEM
    item_block = blocks.repeat_interleave(items_per_block)
    item_size = torch.zeros_like(item_block).index_add_(0, item, torch.ones_like(item))
    # sizes rounded up to a power of two (at least _MIN_ITEM): at most twice the real work, one matmul per size
    padded = torch.clamp(2 ** torch.ceil(torch.log2(item_size.double())).long(), min=_MIN_ITEM, max=_MAX_ITEM)
    result = []
    for size in torch.unique(padded).tolist():
        chosen = (padded == size).nonzero().squeeze(1)
        local = torch.full((len(item_block),), -1, dtype=torch.long, device=block_id.device)
        local[chosen] = torch.arange(len(chosen), device=block_id.device)
        in_bucket = local[item] >= 0
        rows = torch.full((len(chosen), size), pad_row, dtype=torch.long, device=block_id.device)
        rows[local[item][in_bucket], slot[in_bucket]] = row[in_bucket]
        result.append(_Bucket(item_block[chosen], rows, masked))
    return result


def _scores(flat_q, pos_flat, blocks: _KeyBlocks, bucket: _Bucket) -> torch.Tensor:
    """``(n, size, bs)`` float scores of a bucket's queries against its items' key blocks; own-block items masked
    causally (a key after the query's real position gets −inf; each query sees at least itself)."""
    queries = flat_q.index_select(0, bucket.rows.flatten()).view(*bucket.rows.shape, -1)
    s = torch.matmul(queries, blocks.keys.index_select(0, bucket.blocks).transpose(-1, -2))
    if bucket.masked:
        block_size = blocks.block_size
        first_key = (bucket.blocks % blocks.n_blocks) * block_size
        k_pos = first_key[:, None, None] + torch.arange(block_size, device=s.device)
        q_pos = pos_flat[bucket.rows][..., None]
        # the padding row (position −1) keeps its scores: finite, never read back
        s = s.masked_fill((k_pos > q_pos) & (q_pos >= 0), float("-inf"))
    return s
