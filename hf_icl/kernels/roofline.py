"""The floor of (block-sparse) causal attention: the fewest bytes and FLOPs its kept blocks need, and its roofline time.

A kernel can run no faster than ``max(bytes / bandwidth, FLOPs / FLOP rate)`` for the work it must do; a measured
time over that floor says how far the kernel is from the machine (and whether moving bytes or arithmetic bounds it).
For a block selection ``keep (B, H, Mq, Mk)`` over ``Nq`` queries at ``q_offset`` and ``Nk`` keys:

* **FLOPs**: ``4 · D`` per attended (query, key) pair: ``2 · D`` for the score ``q · k`` and ``2 · D`` for
  ``p · v``. A pair is attended when the key's block is kept for the query's block, the key is at or before the
  query and inside ``Nk``; the softmax's exponentials are not counted (FlashAttention's convention).
* **bytes**: ``q`` read once and the output written once (``Nq · D`` elements per head each); every kept key block
  that holds at least one attended pair read once (its K and V tiles, ``2 · tokens · D`` elements) per query
  block and per reader, the reader being the query head, or the whole KV group when its heads share the selection
  and a kernel reads each tile once for all of them. This is the traffic of a kernel that keeps nothing in cache
  between query blocks.
* **compulsory bytes**: each K / V element that any kept block needs read once per KV head in all (perfect reuse
  across query blocks, e.g. from L2): the floor a kernel could reach only by caching K / V.

Per-token selections (every query token keeps its own key blocks) are counted in (token, block) *pairs*:
:func:`dense_causal_pairs` is how many pairs dense causal attention visits, :func:`token_sparse_work` the FLOPs and
bytes of a key-block-major executor that runs, per key block, the tokens that chose it and merges each token's
partial outputs by their log-sum-exp (MoBA's schedule).

Peaks are passed as numbers (bytes/s, FLOP/s); :data:`H100_SXM` holds the datasheet figures. Datasheet peaks are
leads: a measured copy bandwidth and matrix-product rate make a truer floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._common import describe

__all__ = [
    "H100_SXM",
    "AttentionFloor",
    "DevicePeaks",
    "TokenSparseWork",
    "attended_pairs",
    "block_sparse_floor",
    "dense_causal_floor",
    "dense_causal_pairs",
    "token_sparse_work",
]


@dataclass(frozen=True)
class DevicePeaks:
    """A device's peak memory bandwidth (bytes/s) and dense matrix FLOP rate (FLOP/s).

    >>> DevicePeaks(bandwidth=2e12, flop_rate=300e12).ridge_point  # FLOPs per byte where the bounds cross
    150.0
    """

    bandwidth: float
    flop_rate: float

    def __post_init__(self):
        for name in ("bandwidth", "flop_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")

    @property
    def ridge_point(self) -> float:
        return self.flop_rate / self.bandwidth


#: H100 SXM datasheet: ~3.35 TB/s HBM3, ~990 TFLOP/s dense bf16 (tensor cores, no sparsity)
H100_SXM = DevicePeaks(bandwidth=3.35e12, flop_rate=989.5e12)


@dataclass(frozen=True)
class AttentionFloor:
    """Bytes and FLOPs an attention call cannot do without (see the module docstring).

    >>> floor = AttentionFloor(bytes=4e9, flops=1e12, compulsory_bytes=1e9)
    >>> peaks = DevicePeaks(bandwidth=2e12, flop_rate=1e15)
    >>> floor.seconds(peaks), floor.bound(peaks), floor.fraction(0.004, peaks)
    (0.002, 'memory', 0.5)
    >>> floor.seconds(peaks, compulsory=True), floor.bound(peaks, compulsory=True)
    (0.001, 'compute')
    """

    bytes: float
    flops: float
    compulsory_bytes: float

    def seconds(self, peaks: DevicePeaks, *, compulsory: bool = False) -> float:
        """The roofline time: the larger of the memory time and the compute time."""
        moved = self.compulsory_bytes if compulsory else self.bytes
        return max(moved / peaks.bandwidth, self.flops / peaks.flop_rate)

    def bound(self, peaks: DevicePeaks, *, compulsory: bool = False) -> str:
        """``"memory"`` or ``"compute"``: which term sets :meth:`seconds`."""
        moved = self.compulsory_bytes if compulsory else self.bytes
        return "memory" if moved / peaks.bandwidth >= self.flops / peaks.flop_rate else "compute"

    def fraction(self, measured_seconds: float, peaks: DevicePeaks, *, compulsory: bool = False) -> float:
        """The floor as a fraction of ``measured_seconds``: 1.0 would be a kernel at the roofline."""
        if (
            isinstance(measured_seconds, bool)
            or not isinstance(measured_seconds, (int, float))
            or measured_seconds <= 0
        ):
            raise ValueError(f"measured_seconds must be a positive number, got {measured_seconds!r}")
        return self.seconds(peaks, compulsory=compulsory) / measured_seconds


def _check_positive_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_ints(minimum: int = 1, /, **values) -> None:
    """Every keyword's value must be an int >= ``minimum`` (checked in the order given)."""
    for name, value in values.items():
        _check_positive_int(name, value, minimum)


def _clamped_prefix_sum(n: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """``sum_{u=0..n} clamp(u, 0, cap)`` elementwise (0 for n < 0), in int64."""
    n = n.clamp_min(-1)
    below = torch.minimum(n, cap)  # the part of 0..n where clamp(u) = u
    ramp = below.clamp_min(0) * (below + 1) // 2
    return ramp + (n - cap).clamp_min(0) * cap


def attended_pairs(block_size: int, n_q: int, n_k: int, q_offset: int = 0) -> torch.Tensor:
    """``(Mq, Mk)`` int64: how many (query, key) pairs of query block i and key block j causality allows
    (key position <= query position, key inside ``Nk``, query inside ``Nq``), in closed form.

    >>> attended_pairs(2, n_q=3, n_k=3).tolist()  # queries 0,1 | 2 against keys 0,1 | 2
    [[3, 0], [2, 1]]
    """
    m_q, m_k = math.ceil(n_q / block_size), math.ceil(n_k / block_size)
    q_first = q_offset + torch.arange(m_q, dtype=torch.int64) * block_size
    q_last = q_offset + torch.clamp((torch.arange(m_q, dtype=torch.int64) + 1) * block_size, max=n_q) - 1
    k_first = torch.arange(m_k, dtype=torch.int64) * block_size
    k_tokens = torch.clamp(n_k - k_first, max=block_size)
    # a query at p sees clamp(p + 1 - k_first, 0, tokens) keys of the block: sum that over p in [q_first, q_last]
    hi = q_last[:, None] + 1 - k_first[None, :]
    lo = q_first[:, None] + 1 - k_first[None, :]
    cap = k_tokens.expand(m_q, -1)
    return _clamped_prefix_sum(hi, cap) - _clamped_prefix_sum(lo - 1, cap)


def block_sparse_floor(
    keep: torch.Tensor,
    *, block_size: int, n_q: int, n_k: int, head_dim: int, q_offset: int = 0, kv_heads: int | None = None,
    element_size: int = 2, group_reads: bool | None = None,
) -> AttentionFloor:  # fmt: skip
    """The floor of block-sparse causal attention over the selection ``keep (B, H, Mq, Mk)``.

    Args:
        keep: bool block selection (query block i keeps key block j).
        block_size, n_q, n_k, q_offset: the geometry (queries at ``q_offset …``, ``Mq = ceil(Nq / bs)``,
            ``Mk = ceil(Nk / bs)``).
        head_dim: ``D``.
        kv_heads: K / V heads (grouped-query attention; default ``H``).
        element_size: bytes per q / k / v / output element (2 for bf16 / fp16, 4 for fp32).
        group_reads: whether a KV group's query heads read each K / V tile once together (the union of their
            kept blocks per query block); ``None`` decides it like the kernels do: when the group's heads share
            their selection. ``False`` counts one read per query head.

    >>> keep = torch.ones(1, 1, 2, 2, dtype=torch.bool).tril()  # dense causal over 2 blocks of 4 tokens
    >>> floor = block_sparse_floor(keep, block_size=4, n_q=8, n_k=8, head_dim=2, element_size=1)
    >>> floor.flops == 4 * 2 * (8 * 9 // 2), floor.bytes  # q + out: 2 * 8 * 2; K/V: 3 tiles * 2 * 4 * 2
    (True, 80.0)
    """
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.dim() != 4:
        raise ValueError(f"keep must be a bool (B, H, Mq, Mk) tensor, got {describe(keep)}")
    _check_ints(block_size=block_size, n_q=n_q, n_k=n_k, head_dim=head_dim)
    _check_ints(0, q_offset=q_offset)
    _check_ints(element_size=element_size)
    batch, heads, m_q, m_k = keep.shape
    expected = (math.ceil(n_q / block_size), math.ceil(n_k / block_size))
    if (m_q, m_k) != expected:
        raise ValueError(f"keep must have (Mq, Mk)={expected} for n_q={n_q}, n_k={n_k}, got {(m_q, m_k)}")
    kv_heads = heads if kv_heads is None else kv_heads
    _check_positive_int("kv_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(f"kv_heads must divide the {heads} query heads of keep, got {kv_heads}")
    if group_reads is not None and not isinstance(group_reads, bool):
        raise ValueError(f"group_reads must be None, True or False, got {group_reads!r}")

    pairs = attended_pairs(block_size, n_q, n_k, q_offset).to(keep.device)  # (Mq, Mk)
    attended = keep & (pairs > 0)  # kept blocks that hold work for their query block
    flops = 4 * head_dim * float((attended.sum((0, 1)).to(torch.int64) * pairs).sum())

    k_tokens = torch.clamp(n_k - torch.arange(m_k, device=keep.device) * block_size, max=block_size)
    groups = attended.unflatten(1, (kv_heads, heads // kv_heads))  # (B, Hk, g, Mq, Mk)
    if group_reads is None:
        group_reads = bool((groups == groups[:, :, :1]).all())
    readers = groups.any(2) if group_reads else attended
    tile_tokens = float((readers.sum((0, 1, 2)).to(torch.int64) * k_tokens).sum())
    needed_tokens = float((groups.any(2).any(2).sum((0, 1)).to(torch.int64) * k_tokens).sum())  # once per KV head
    q_and_out = 2 * batch * heads * n_q * head_dim
    return AttentionFloor(
        bytes=float(element_size * (q_and_out + 2 * head_dim * tile_tokens)),
        flops=flops,
        compulsory_bytes=float(element_size * (q_and_out + 2 * head_dim * needed_tokens)),
    )


def dense_causal_floor(
    *, batch: int, heads: int, n: int, head_dim: int, kv_heads: int | None = None, element_size: int = 2
) -> AttentionFloor:
    """The floor of dense causal self-attention over ``n`` tokens: q, k, v read once, the output written once,
    ``4 · D`` FLOPs for each of the ``n (n + 1) / 2`` causal pairs per head.

    >>> dense_causal_floor(batch=1, heads=2, n=4, head_dim=8, element_size=1).flops
    640.0
    """
    _check_ints(batch=batch, heads=heads, n=n, head_dim=head_dim, element_size=element_size)
    kv_heads = heads if kv_heads is None else kv_heads
    _check_positive_int("kv_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads}")
    moved = float(element_size * batch * n * head_dim * (2 * heads + 2 * kv_heads))
    return AttentionFloor(
        bytes=moved, flops=float(4 * head_dim * batch * heads * n * (n + 1) // 2), compulsory_bytes=moved
    )


def dense_causal_pairs(n_q: int, n_k: int, block_size: int, q_offset: int = 0) -> int:
    """How many (query token, key block) pairs dense causal attention visits: query ``t`` at position
    ``p = q_offset + t`` visits the key blocks ``0 … p // block_size`` (its own block included), per head and row.

    >>> dense_causal_pairs(5, 5, 2)  # positions 0,1 see block 0; 2,3 blocks 0-1; 4 blocks 0-2
    9
    """
    _check_ints(n_q=n_q, n_k=n_k, block_size=block_size)
    _check_ints(0, q_offset=q_offset)
    if q_offset + n_q > n_k:
        raise ValueError(f"the queries must lie inside the keys: q_offset + n_q = {q_offset + n_q} > n_k = {n_k}")

    # sum over p in [q_offset, q_offset + n_q) of (p // bs + 1), in closed form per whole block
    def upto(n: int) -> int:  # sum over p in [0, n) of (p // bs + 1)
        full, rest = divmod(n, block_size)
        return block_size * full * (full + 1) // 2 + rest * (full + 1)

    return upto(q_offset + n_q) - upto(q_offset)


@dataclass(frozen=True)
class TokenSparseWork(AttentionFloor):
    """:class:`AttentionFloor` of a per-token selection's executed work, with its ``pairs`` (selected (token, key
    block) pairs, summed over rows and query heads) and ``kv_tiles`` ((row, KV head, key block) tiles read)."""

    pairs: int = 0
    kv_tiles: int = 0


def token_sparse_work(
    counts: torch.Tensor,
    block_size: int,
    head_dim: int,
    dtype_bytes: int,
    n_keys: int,
    q_offset: int = 0,
    kv_heads: int | None = None,
    heads: int | None = None,
    *,
    indices: torch.Tensor | None = None,
) -> TokenSparseWork:
    """FLOPs and bytes of the key-block-major execution of a per-token selection.

    The selection is ``counts (B, Hs, Nq)`` int (how many key blocks query token ``t`` keeps; the queries sit at
    positions ``q_offset …`` of ``n_keys`` keys) and, optionally, ``indices (B, Hs, Nq, W)`` (the kept block ids,
    the first ``counts`` of each row valid). ``Hs`` is the query heads ``heads`` (default ``Hs``), or ``kv_heads``
    when one selection serves each KV group (each row of ``counts`` then stands for ``heads // kv_heads`` heads).

    The model, per (row, query head):

    * **FLOPs**: ``4 · D`` per attended (query, key) pair (``2 · D`` for ``q · k``, ``2 · D`` for ``p · v``; no
      exponentials), over the keys of each selected block that the token may see (key position ``<= p`` and
      ``< n_keys``).
    * **bytes**, per selected (token, block) pair: the token's query row read (``D`` elements of ``dtype_bytes``),
      its partial output (``D`` float32) and log-sum-exp (one float32) written by the block's pass and read back by
      the merge. Per token with at least one pair: its output written once (``D`` elements of ``dtype_bytes``). Per
      (row, KV head, key block) with at least one pair from any head of the group: the block's K and V tiles read
      once (``2 · keys · D`` elements of ``dtype_bytes``).
    * **compulsory bytes**: q read once, the output written once and the K / V tiles read once, without the
      per-pair partial outputs: what a fused kernel that merged in registers would move.

    Without ``indices`` the kept blocks are not known: they are taken as CAB's rule guarantees them, the token's
    own block (partly visible) plus ``counts - 1`` complete blocks before it; and every key block from the first
    query's block to the last query's is counted as read per KV head (exact for prefill, where every block holds
    queries that keep their own block; ``indices`` makes every count exact).

    >>> counts = torch.tensor([[[1, 1, 2, 1]]])  # 4 tokens, blocks of 2: token 2 keeps block 0 and its own
    >>> work = token_sparse_work(counts, block_size=2, head_dim=1, dtype_bytes=2, n_keys=4)
    >>> work.pairs, work.flops  # keys seen: 1, 2, 2 + 1, 2
    (5, 32.0)
    """
    if not isinstance(counts, torch.Tensor) or counts.dim() != 3 or counts.dtype.is_floating_point:
        raise ValueError(f"counts must be an integer (B, H, Nq) tensor, got {describe(counts)}")
    _check_ints(block_size=block_size, head_dim=head_dim, dtype_bytes=dtype_bytes, n_keys=n_keys)
    _check_ints(0, q_offset=q_offset)
    batch, rows, n_q = counts.shape
    if q_offset + n_q > n_keys:
        raise ValueError(f"the queries must lie inside the keys: q_offset + Nq = {q_offset + n_q} > n_keys = {n_keys}")
    heads = rows if heads is None else heads
    kv_heads = heads if kv_heads is None else kv_heads
    _check_positive_int("heads", heads)
    _check_positive_int("kv_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(f"kv_heads must divide heads={heads}, got {kv_heads}")
    if rows not in (heads, kv_heads):
        raise ValueError(f"counts has {rows} heads; expected heads={heads} or kv_heads={kv_heads}")
    per_row = heads // rows  # query heads each selection row stands for
    m_k = math.ceil(n_keys / block_size)
    device = counts.device
    counts = counts.to(torch.int64)
    positions = q_offset + torch.arange(n_q, device=device, dtype=torch.int64)  # (Nq,)
    seen = torch.minimum(positions + 1, torch.tensor(n_keys, device=device))  # keys a token may see in all

    if indices is None:
        own = positions // block_size
        own_keys = seen - own * block_size  # the partly visible own block
        kept = counts.clamp_min(0)
        keys = torch.where(kept > 0, (kept - 1) * block_size + own_keys, torch.zeros_like(kept))
        first, last = int(own[0]), int(own[-1])
        block_tokens = torch.clamp(n_keys - torch.arange(m_k, device=device) * block_size, max=block_size)
        tile_tokens = int(block_tokens[first : last + 1].sum()) * batch * kv_heads
        kv_tiles = (last - first + 1) * batch * kv_heads
    else:
        if not isinstance(indices, torch.Tensor) or indices.dim() != 4 or indices.shape[:3] != counts.shape:
            got = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
            raise ValueError(f"indices must be (B, H, Nq, W) matching counts {tuple(counts.shape)}, got {got}")
        valid = torch.arange(indices.shape[-1], device=device) < counts[..., None]
        start = indices.to(torch.int64) * block_size
        visible = (seen[:, None] - start).clamp(0, block_size)  # keys of each listed block the token may see
        keys = (visible * valid).sum(-1)
        # (row, KV head, block) tiles read: any selection row of the group lists the block
        read = torch.zeros(batch, kv_heads, m_k + 1, dtype=torch.bool, device=device)
        group = torch.arange(rows, device=device) // max(rows // kv_heads, 1)  # selection row -> KV head
        target = torch.where(valid, indices.to(torch.int64), m_k)  # invalid slots land in a spare column
        flat = read.view(batch, -1)
        offsets = (group * (m_k + 1))[None, :, None, None]
        flat.scatter_(1, (target + offsets).flatten(1), True)
        read = read[..., :m_k]
        block_tokens = torch.clamp(n_keys - torch.arange(m_k, device=device) * block_size, max=block_size)
        tile_tokens = int((read.to(torch.int64) * block_tokens).sum())
        kv_tiles = int(read.sum())

    pairs = int(counts.clamp_min(0).sum()) * per_row
    attended_keys = int(keys.sum()) * per_row
    tokens = int((counts > 0).sum()) * per_row  # (row, head, token) outputs written
    q_row, out_row, partial = head_dim * dtype_bytes, head_dim * dtype_bytes, 2 * (4 * head_dim + 4)
    kv_bytes = 2 * head_dim * dtype_bytes * tile_tokens
    return TokenSparseWork(
        bytes=float(pairs * (q_row + partial) + tokens * out_row + kv_bytes),
        flops=float(4 * head_dim * attended_keys),
        compulsory_bytes=float(tokens * (q_row + out_row) + kv_bytes),
        pairs=pairs,
        kv_tiles=kv_tiles,
    )
