"""Block-sparse decode in Triton: one query token against a long KV cache, split-K over the selected blocks.

At decode a head has a single query row, so the prefill kernel's one-program-per-query-block grid would leave most
of the GPU idle. Here each (batch * head) spreads its selected cache blocks over ``num_splits`` programs; each
program runs an online softmax over its share and writes a partial ``(acc, m, l)``. The partials are merged
exactly in PyTorch:

    m = max_s m_s,   l = sum_s exp(m_s - m) l_s,   out = sum_s exp(m_s - m) acc_s / l,   lse = m + log(l)

Masking matches the prefill kernel: keys after the query's position ``q_offset`` (any offset), keys past ``Nk``
and padded keys are ignored; a query that sees no key gets zeros and ``lse = -inf``. As in the prefill kernel,
the blocks wholly at or before the query and inside ``Nk`` (a prefix of the ascending list, found by a binary
search) run without any mask when there is no key padding; only the query's own block, a ragged last block or a
block in its future take the masked path.

Per-row key starts (``row_starts``): in a left-padded batch row b's real keys are the cache rows ``[start_b, Nk)``.
The program for row b reads ``start_b`` from the device, moves its K / V pointers there and takes ``Nk - start_b``
keys with the query at ``q_offset - start_b``: blocks, bounds and causality are laid over the row's real tokens (as
CAB lays them) with no key mask, so whole blocks still run unmasked.

Grouped-query attention: when every query head of a KV group keeps the same blocks (``group_heads``), one program
serves ``heads_per_program`` of them, as the rows of a matrix product padded to 16 rows, and reads each K / V block
once for all of them (decode is bound by those reads). One head per program is a matrix-vector product instead (no
``tl.dot``: a 1-row tile is too small for tensor cores).
"""

from __future__ import annotations

import math

import torch

from ._common import (
    check_attention_tensor,
    check_kernel_runnable,
    is_interpreted,
    resolve_backend,
    tl,
    triton,
)
from .block_sparse_attention import (
    LOG2_E,
    TileConfig,
    block_sparse_attention_reference,
    check_tile_config,
    full_key_blocks,
    key_valid_tensor,
    load_key_tiles,
    online_softmax_step,
    resolve_group_heads,
    resolve_keep_groups,
    selection_lists,
    triton_next_power_of_2,
    validate_keep_call,
    validate_list_call,
)

__all__ = [
    "block_sparse_decode",
    "block_sparse_decode_reference",
    "block_sparse_decode_triton",
    "decode_tile_config",
    "plan_splits",
]

#: programs to aim for per streaming multiprocessor when choosing the split count
PROGRAMS_PER_SM = 4


_block_sparse_decode_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _decode_key_block(
        acc, m_i, l_i, q_tile, block,  # the running softmax state, the query rows, the key block
        k_base, v_base, ks_n, ks_d, vs_n, vs_d, cols, n_k, q_pos, key_valid_row, kvs_n, qk_scale,
        BS: tl.constexpr, USE_DOT: tl.constexpr, UPCAST_DOT: tl.constexpr, MASKED: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):  # fmt: skip
        """One online-softmax step of the stacked query rows over key block ``block``; ``MASKED=False`` is the
        full-block path (no bounds, causal or padding masks, no ``-inf`` guards)."""
        k_pos = block * BS + tl.arange(0, BS)
        k_tile, v_tile, k_ok = load_key_tiles(
            k_base, v_base, k_pos, (k_pos < n_k) & (k_pos <= q_pos), ks_n, ks_d, vs_n, vs_d, cols, key_valid_row,
            kvs_n, MASKED, HAS_KEY_MASK,
        )  # fmt: skip
        if USE_DOT:  # a KV group's query heads as the rows of one matrix product
            if UPCAST_DOT:
                k_tile = k_tile.to(tl.float32)
                v_tile = v_tile.to(tl.float32)
            s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * qk_scale
        else:  # a single row: matrix-vector work, too small for tensor cores
            s = tl.sum(q_tile[:, None, :] * k_tile.to(tl.float32)[None, :, :], axis=2) * qk_scale
        if MASKED:
            s = tl.where(k_ok[None, :], s, float("-inf"))
        m_new, p, alpha = online_softmax_step(s, m_i, MASKED)
        if USE_DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v_tile.to(tl.float32)[None, :, :], axis=1)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        return acc, m_new, l_i

    @triton.jit
    def _block_sparse_decode_kernel(
        q, k, v, part_acc, part_m, part_l, indices, counts, key_valid, row_starts,  # tensors
        heads, kv_group, n_k, q_pos, qk_scale, blocks_per_split, num_splits,        # shapes, base-2 scale, splits
        qs_b, qs_h, qs_d, ks_b, ks_h, ks_n, ks_d, vs_b, vs_h, vs_n, vs_d,           # q / k / v strides
        is_b, is_h, is_k, cs_b, cs_h, kvs_b, kvs_n, rs_b,  # indices / counts / key_valid / row_starts strides
        BS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr,
        UPCAST_DOT: tl.constexpr, HAS_KEY_MASK: tl.constexpr, HAS_ROW_STARTS: tl.constexpr,
    ):  # fmt: skip
        """One program per (split, batch, GROUP query heads sharing a selection): online softmax of the heads'
        query rows over list entries [split * bps, (split + 1) * bps), full blocks first, then masked ones.
        ``HAS_ROW_STARTS``: row b's keys begin at cache row ``row_starts[b]`` (read here, no host sync); its K / V
        (and key-mask) bases move there, and its key count and query position become ``n_k - start`` and
        ``q_pos - start``, so block ids, bounds and causality are over the row's own keys."""
        split = tl.program_id(0)
        pid = tl.program_id(1)
        program_heads = heads // GROUP
        b = (pid // program_heads).to(tl.int64)
        h0 = (pid % program_heads).to(tl.int64) * GROUP
        g = tl.arange(0, BLOCK_G)
        g_ok = g < GROUP
        row_head = h0 + g
        cols = tl.arange(0, BLOCK_D).to(tl.int64)

        q_tile = tl.load(q + b * qs_b + row_head[:, None] * qs_h + cols[None, :] * qs_d, mask=g_ok[:, None], other=0.0)
        if UPCAST_DOT or not USE_DOT:
            q_tile = q_tile.to(tl.float32)
        kv_head = h0 // kv_group
        k_base = k + b * ks_b + kv_head * ks_h
        v_base = v + b * vs_b + kv_head * vs_h
        key_valid_row = key_valid + b * kvs_b
        if HAS_ROW_STARTS:  # the row's keys are cache rows [start, n_k): shift the bases, count from there
            row_start = tl.load(row_starts + b * rs_b).to(tl.int64)
            k_base += row_start * ks_n
            v_base += row_start * vs_n
            key_valid_row += row_start * kvs_n
            n_k = (n_k - row_start).to(tl.int32)
            q_pos = (q_pos - row_start).to(tl.int32)
        entries = indices + b * is_b + h0 * is_h
        count = tl.load(counts + b * cs_b + h0 * cs_h).to(tl.int32)
        n_full = full_key_blocks(entries, is_k, count, q_pos, n_k, BS, HAS_KEY_MASK)
        start = split * blocks_per_split
        stop = tl.minimum(start + blocks_per_split, count)

        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        for j in range(start, tl.minimum(stop, n_full)):
            acc, m_i, l_i = _decode_key_block(
                acc, m_i, l_i, q_tile, tl.load(entries + j * is_k), k_base, v_base, ks_n, ks_d, vs_n, vs_d, cols,
                n_k, q_pos, key_valid_row, kvs_n, qk_scale, BS, USE_DOT, UPCAST_DOT, False, HAS_KEY_MASK,
            )  # fmt: skip
        for j in range(tl.maximum(start, n_full), stop):
            acc, m_i, l_i = _decode_key_block(
                acc, m_i, l_i, q_tile, tl.load(entries + j * is_k), k_base, v_base, ks_n, ks_d, vs_n, vs_d, cols,
                n_k, q_pos, key_valid_row, kvs_n, qk_scale, BS, USE_DOT, UPCAST_DOT, True, HAS_KEY_MASK,
            )  # fmt: skip

        slot = (b * heads + row_head) * num_splits + split
        tl.store(part_acc + slot[:, None] * BLOCK_D + cols[None, :], acc, mask=g_ok[:, None])
        # partials in natural-log units, as the merge expects
        tl.store(part_m + slot, m_i * 0.6931471805599453, mask=g_ok)
        tl.store(part_l + slot, l_i, mask=g_ok)


def plan_splits(width: int, programs: int, device: torch.device) -> int:
    """Blocks per split so that ``programs`` (batch * heads) × splits fills the GPU about ``PROGRAMS_PER_SM`` deep."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4  # the interpreter: any small number exercises the merge
    wanted = max(1, math.ceil(PROGRAMS_PER_SM * sms / max(programs, 1)))
    return max(1, math.ceil(width / wanted))


def decode_tile_config(block_size: int, heads_per_group: int = 1) -> TileConfig:
    """The decode kernel's tiling: as many heads of a group as fit 16 rows per program (a divisor of
    ``heads_per_group``), 4 warps, 2 stages; ``block_n`` is the block size (a program reads whole blocks).
    Untuned guesses until a GPU run.

    >>> decode_tile_config(64, heads_per_group=3).heads_per_program
    3
    """
    heads = max(d for d in range(1, min(heads_per_group, 16) + 1) if heads_per_group % d == 0)
    return TileConfig(block_n=block_size, heads_per_program=heads, num_warps=4, num_stages=2)


def _merge_splits(
    part_acc: torch.Tensor, part_m: torch.Tensor, part_l: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax merge of per-split partials ``(…, S, D)``, ``(…, S)``, ``(…, S)`` → ``out (…, D)``, ``lse (…)``."""
    m = part_m.amax(-1, keepdim=True)
    weights = torch.exp(part_m - m.nan_to_num(0.0, neginf=0.0))  # splits that saw nothing weigh exp(-inf) = 0
    total = (weights * part_l).sum(-1)
    seen = total > 0
    out = (weights.unsqueeze(-1) * part_acc).sum(-2) / torch.where(seen, total, 1.0).unsqueeze(-1)
    lse = torch.where(seen, m.squeeze(-1) + torch.log(torch.where(seen, total, 1.0)), float("-inf"))
    return out, lse


def block_sparse_decode_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, key_padding_mask: torch.Tensor | None = None,
    blocks_per_split: int | None = None, return_lse: bool = False, validate: bool = True,
    group_heads: bool | None = None, tiles: TileConfig | None = None, row_starts: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Split-K decode of ``q (B, H, 1, D)`` at absolute position ``q_offset`` over ``k`` / ``v (B, H / g, Nk, D)``.

    ``indices (B, H, 1, K)`` / ``counts (B, H, 1)`` list each head's cache blocks (the selection layout);
    ``blocks_per_split`` (default: :func:`plan_splits`) sets how many blocks one program reads. ``validate=False``
    skips the input checks (and their device syncs) for selections valid by construction. ``group_heads`` and
    ``tiles`` are those of :func:`hf_icl.kernels.block_sparse_attention.block_sparse_attention_triton` (default
    tiling: :func:`decode_tile_config`). Returns ``out`` (B, H, 1, D) in q's dtype, and the fp32 ``lse``
    (B, H, 1) if asked.

    ``row_starts`` (B,) integer tensor on q's device (None: every row starts at 0): row b's keys are the cache rows
    ``[row_starts[b], Nk)`` (a left-padded batch: its real tokens), so block ``j`` of ``indices`` is cache rows
    ``row_starts[b] + [j * block_size, (j + 1) * block_size)``, the row holds ``Nk - row_starts[b]`` keys and its
    query sits at position ``q_offset - row_starts[b]`` among them. The kernel reads the starts itself (no host
    sync). A ``key_padding_mask`` still indexes cache positions. ``validate`` checks ``0 <= row_starts <= Nk``
    (a device read).
    """
    if validate:
        if q.dim() == 4 and q.shape[2] != 1:
            raise ValueError(f"q must hold one token per head for decode (q.shape[2] == 1), got {tuple(q.shape)}")
        validate_list_call(
            q, k, v, indices, counts, key_padding_mask, block_size=block_size, q_offset=q_offset, scaling=scaling
        )
        _check_row_starts(row_starts, q, k)
    check_kernel_runnable(_block_sparse_decode_kernel, q, "block_sparse_decode_triton")
    batch, heads, _, head_dim = q.shape
    kv_group = heads // k.shape[1]
    grouped = resolve_group_heads(group_heads, indices, counts, kv_group, check=validate)
    if tiles is None:
        tiles = decode_tile_config(block_size, kv_group if grouped else 1)
    tiles = check_tile_config(tiles, kv_group, grouped)
    programs = batch * heads // tiles.heads_per_program
    width = indices.shape[-1]
    if blocks_per_split is None:
        blocks_per_split = plan_splits(width, programs, q.device)
    elif isinstance(blocks_per_split, bool) or not isinstance(blocks_per_split, int) or blocks_per_split < 1:
        raise ValueError(f"blocks_per_split must be an int >= 1 or None, got {blocks_per_split!r}")
    num_splits = math.ceil(width / blocks_per_split)
    part_acc = torch.empty(batch, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    part_m = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    key_valid = key_valid_tensor(key_padding_mask, q)
    if batch * heads > 0:
        stacked = tiles.heads_per_program
        _block_sparse_decode_kernel[(num_splits, programs)](
            q, k, v, part_acc, part_m, part_l, indices, counts, key_valid,
            key_valid if row_starts is None else row_starts,  # a placeholder (unread) without row starts
            heads, kv_group, k.shape[2], q_offset, float(scaling) * LOG2_E, blocks_per_split, num_splits,
            q.stride(0), q.stride(1), q.stride(3), *k.stride(), *v.stride(),
            indices.stride(0), indices.stride(1), indices.stride(3), counts.stride(0), counts.stride(1),
            *key_valid.stride(), 0 if row_starts is None else row_starts.stride(0),
            BS=block_size, GROUP=stacked, BLOCK_G=1 if stacked == 1 else max(16, triton_next_power_of_2(stacked)),
            BLOCK_D=head_dim, USE_DOT=stacked > 1, UPCAST_DOT=is_interpreted(_block_sparse_decode_kernel),
            HAS_KEY_MASK=key_padding_mask is not None, HAS_ROW_STARTS=row_starts is not None,
            **tiles.launch(),
        )  # fmt: skip
    out, lse = _merge_splits(part_acc, part_m, part_l)
    out = out.to(q.dtype).unsqueeze(2)
    return (out, lse.unsqueeze(2)) if return_lse else out


def _check_row_starts(row_starts: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> None:
    """``row_starts``: None or a (B,) integer tensor on q's device with every start in [0, Nk] (reads it)."""
    if row_starts is None:
        return
    if not isinstance(row_starts, torch.Tensor):
        raise ValueError(f"row_starts must be a (B,) integer tensor or None, got {type(row_starts).__name__}")
    if row_starts.shape != (q.shape[0],):
        raise ValueError(f"row_starts must have shape (B,) = ({q.shape[0]},), got {tuple(row_starts.shape)}")
    if row_starts.dtype.is_floating_point or row_starts.dtype.is_complex or row_starts.dtype == torch.bool:
        raise ValueError(f"row_starts must hold integers, got dtype {row_starts.dtype}")
    if row_starts.device != q.device:
        raise ValueError(f"row_starts must be on q's device {q.device}, got {row_starts.device}")
    if row_starts.numel() and not bool(((row_starts >= 0) & (row_starts <= k.shape[2])).all()):
        raise ValueError(f"row_starts must lie in [0, Nk] = [0, {k.shape[2]}], got {row_starts.tolist()}")


def _check_single_query(q) -> None:
    """Decode attends ONE query token per head: ``q`` must be ``(B, H, 1, D)``."""
    check_attention_tensor("q", q)
    if q.shape[2] != 1:
        raise ValueError(f"q must hold one token per head for decode (q.shape[2] == 1), got {tuple(q.shape)}")


def block_sparse_decode_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, key_padding_mask: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """PyTorch path: the prefill reference with a single query row (which allows any ``q_offset``)."""
    _check_single_query(q)
    settings = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset, "return_lse": return_lse}
    return block_sparse_attention_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **settings)


def block_sparse_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int, key_padding_mask: torch.Tensor | None = None,
    return_lse: bool = False, backend: str = "auto", validate: bool = True, group_heads: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Decode attention over the cache blocks kept by ``keep (B, H, 1, Mk)``: split-K kernel on CUDA, else PyTorch.

    ``backend``: ``"auto"``, ``"triton"`` or ``"torch"``. ``validate=False`` skips the kernel path's input checks and
    their device syncs (for a caller that built ``keep``).
    ``group_heads`` (None: detect) lets one program serve the query heads of a KV group that share their selection;
    see :func:`hf_icl.kernels.block_sparse_attention.selection_shared_by_groups`.

    >>> q, k, v = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 40, 32), torch.randn(1, 2, 40, 32)
    >>> keep = torch.tensor([True, False, True]).expand(1, 4, 1, 3)  # shared by all heads: one list
    >>> out = block_sparse_decode(q, k, v, keep, block_size=16, scaling=32**-0.5, q_offset=39)
    >>> out.shape
    torch.Size([1, 4, 1, 32])
    """
    kwargs = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset, "return_lse": return_lse}
    _check_single_query(q)
    if resolve_backend(backend, q) == "torch":
        return block_sparse_decode_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **kwargs)
    if validate:  # the kernel call below skips its own checks
        validate_keep_call(q, k, v, keep, key_padding_mask, block_size=block_size, q_offset=q_offset, scaling=scaling)
    grouped = resolve_keep_groups(group_heads, keep, k.shape[1], check=validate)
    indices, counts = selection_lists(keep)
    return block_sparse_decode_triton(
        q, k, v, indices, counts, key_padding_mask=key_padding_mask, validate=False, group_heads=grouped, **kwargs
    )
