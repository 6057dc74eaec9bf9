"""Backward of block-sparse causal attention in Triton (dq, dk, dv), and the differentiable op built on it.

Flash-attention-2 style recomputation: the forward saves only ``out`` and the fp32 log-sum-exp, and the backward
rebuilds each kept score tile ``p = exp(q k^T * scale - lse)``. With ``delta = rowsum(dout * out)``:

    dv_j += p^T dout_i        dp = dout_i v_j^T        ds = p * (dp - delta_i)
    dq_i += ds k_j * scale    dk_j += ds^T q_i * scale

Two kernels keep every sum inside one program, so there are no atomics and the result is deterministic:

* ``dq``: one program per query block (and head, or group of heads), walking the forward's key-block list;
* ``dk / dv``: one program per key block (and head, or group of heads), walking the *transposed* selection, the
  list of query blocks that kept this key block (built from ``keep`` with :func:`selected_block_indices` on
  ``keep^T``).

As in the forward, a (query block, key block) pair whose key block lies wholly at or before the query block's first
query and inside ``Nk`` (with no key padding mask) is *full*: it runs without per-element masks. In the dq kernel
the full blocks are a prefix of the ascending key list; in the dk / dv kernel they are a suffix of the ascending
query list (later query blocks see all of an earlier key block). A binary search finds the split.

Grouped-query attention: when the query heads of a KV group keep the same blocks, one program stacks
``heads_per_program`` of them as rows. The dk / dv program then sums the group's contributions itself and, when it
holds the whole group, writes dk / dv straight in k's shape and dtype; otherwise each program (one per query head,
or per part of a group) writes fp32 rows that are summed over the group afterwards. Masking matches the forward
(causal, ragged N, key padding); rows that saw no key have ``lse = -inf`` and get no gradient. All operands are
made contiguous first, so offsets come from shapes, not strides.
"""

from __future__ import annotations

import torch

from ._common import check_kernel_runnable, describe, is_interpreted, resolve_backend, tl, triton
from .block_sparse_attention import (
    LOG2_E,
    TileConfig,
    block_sparse_attention_reference,
    block_sparse_attention_triton,
    check_tile_config,
    count_below,
    full_key_blocks,
    key_valid_tensor,
    resolve_keep_groups,
    selection_lists,
    stacked_heads,
    validate_keep_call,
)

__all__ = ["backward_tile_config", "block_sparse_attention_backward_triton", "block_sparse_flash_attention"]


def backward_tile_config(block_size: int, head_dim: int, heads_per_group: int = 1) -> TileConfig:
    """The backward kernels' tiling: stacked heads within 128 rows for ``head_dim`` <= 64 and 64 rows for 128
    (a program holds q, dout, k, v, two accumulators and three score tiles), 8 warps from 128 × 64 stacked elements
    on, 2 stages; ``block_n`` is the block size (tiles are whole blocks). Untuned guesses until a GPU run.

    >>> backward_tile_config(32, 64, heads_per_group=4).heads_per_program
    4
    """
    heads = stacked_heads(block_size, heads_per_group, row_cap=128 if head_dim <= 64 else 64)
    rows = heads * block_size
    return TileConfig(
        block_n=block_size, heads_per_program=heads, num_warps=8 if rows * head_dim >= 128 * 64 else 4, num_stages=2
    )


_block_sparse_dq_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _rows(base, row_index, row_ok, cols, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr):
        """Rows ``row_index`` (masked by ``row_ok`` if ``MASKED``) of a contiguous (…, D) tensor."""
        if MASKED:
            x = tl.load(base + row_index[:, None] * BLOCK_D + cols[None, :], mask=row_ok[:, None], other=0.0)
        else:
            x = tl.load(base + row_index[:, None] * BLOCK_D + cols[None, :])
        if UPCAST:
            x = x.to(tl.float32)
        return x

    @triton.jit
    def _key_ok(key_valid, b, k_idx, n_k, HAS_KEY_MASK: tl.constexpr):
        ok = (k_idx >= 0) & (k_idx < n_k)
        if HAS_KEY_MASK:
            ok = ok & (tl.load(key_valid + b * n_k + k_idx.to(tl.int64), mask=ok, other=0) != 0)
        return ok

    @triton.jit
    def _stacked_rows(b, h0, heads, q_blk, n_q, BS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
        """The rows of query block ``q_blk`` for heads ``h0 …`` stacked: (flat row index into (B, H, Nq), query row
        in the block's head, validity). Row r belongs to head ``h0 + r // BS``."""
        r = tl.arange(0, BLOCK_M)
        q_row = q_blk * BS + r % BS
        row_ok = (q_row < n_q) & (r < GROUP * BS)
        row_index = (b * heads + h0 + r // BS) * n_q + q_row.to(tl.int64)
        return row_index, q_row, row_ok

    @triton.jit
    def _row_stats(lse, delta, row_index, row_ok):
        """Row lse (base 2) and ``delta``, both fp32. Padded rows get lse = +inf, so p = exp2(s - lse) = 0 for them
        even in the unmasked path; a row that saw no key (lse = -inf) has no allowed key, only masked tiles."""
        row_lse = tl.load(lse + row_index, mask=row_ok, other=float("inf")) * 1.4426950408889634
        row_delta = tl.load(delta + row_index, mask=row_ok, other=0.0)
        return row_lse, row_delta

    @triton.jit
    def _dq_step(
        dq_acc, q_tile, do_tile, row_lse, row_delta, q_pos,  # the query rows' accumulator, tiles and statistics
        block, k, v, kv_row0, key_valid, b, n_k, cols, qk_scale,  # the key block
        BS: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST_DOT: tl.constexpr, MASKED: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):  # fmt: skip
        k_idx = block * BS + tl.arange(0, BS)
        k_index = kv_row0 + k_idx.to(tl.int64)
        k_ok = _key_ok(key_valid, b, k_idx, n_k, HAS_KEY_MASK)  # unused (dead code) in the full path
        k_tile = _rows(k, k_index, k_ok, cols, BLOCK_D, UPCAST_DOT, MASKED)
        v_tile = _rows(v, k_index, k_ok, cols, BLOCK_D, UPCAST_DOT, MASKED)
        s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * qk_scale
        p = tl.exp2(s - row_lse[:, None])
        if MASKED:
            p = tl.where(k_ok[None, :] & (k_idx[None, :] <= q_pos[:, None]), p, 0.0)
        dp = tl.dot(do_tile, tl.trans(v_tile), input_precision="ieee")
        ds = p * (dp - row_delta[:, None])
        return dq_acc + tl.dot(ds.to(k_tile.dtype), k_tile, input_precision="ieee")

    @triton.jit
    def _block_sparse_dq_kernel(
        q, k, v, dout, lse, delta, dq, indices, counts, key_valid,  # tensors (contiguous)
        heads, kv_group, n_q, n_k, q_blocks, width, q_offset,       # shapes
        qk_scale, scaling,                                          # base-2 and natural scales
        BS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
    ):  # fmt: skip
        blk = q_blocks - 1 - tl.program_id(0)  # the latest query blocks (the most key blocks) first
        pid = tl.program_id(1).to(tl.int64)
        program_heads = heads // GROUP
        b = pid // program_heads
        h0 = (pid % program_heads) * GROUP
        kv_row0 = (b * (heads // kv_group) + h0 // kv_group) * n_k
        row_index, q_row, row_ok = _stacked_rows(b, h0, heads, blk, n_q, BS, GROUP, BLOCK_M)
        q_pos = q_offset + q_row
        cols = tl.arange(0, BLOCK_D).to(tl.int64)

        q_tile = _rows(q, row_index, row_ok, cols, BLOCK_D, UPCAST_DOT, True)
        do_tile = _rows(dout, row_index, row_ok, cols, BLOCK_D, UPCAST_DOT, True)
        row_lse, row_delta = _row_stats(lse, delta, row_index, row_ok)
        dq_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        list_index = (b * heads + h0) * q_blocks + blk
        entries = indices + list_index * width
        count = tl.load(counts + list_index).to(tl.int32)
        n_full = full_key_blocks(entries, 1, count, q_offset + blk * BS, n_k, BS, HAS_KEY_MASK)
        for j in range(n_full):
            dq_acc = _dq_step(
                dq_acc, q_tile, do_tile, row_lse, row_delta, q_pos, tl.load(entries + j), k, v, kv_row0,
                key_valid, b, n_k, cols, qk_scale, BS, BLOCK_D, UPCAST_DOT, False, HAS_KEY_MASK,
            )  # fmt: skip
        for j in range(n_full, count):
            dq_acc = _dq_step(
                dq_acc, q_tile, do_tile, row_lse, row_delta, q_pos, tl.load(entries + j), k, v, kv_row0,
                key_valid, b, n_k, cols, qk_scale, BS, BLOCK_D, UPCAST_DOT, True, HAS_KEY_MASK,
            )  # fmt: skip

        tl.store(dq + row_index[:, None] * BLOCK_D + cols[None, :], (dq_acc * scaling).to(dq.dtype.element_ty),
                 mask=row_ok[:, None])  # fmt: skip

    @triton.jit
    def _dkdv_step(
        dk_acc, dv_acc, k_tile, v_tile, k_idx, k_ok,  # the key block's accumulators and tiles
        q_blk, q, dout, lse, delta, b, h0, heads, n_q, q_offset, cols, qk_scale,  # the query block
        BS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr, MASKED: tl.constexpr,
    ):  # fmt: skip
        row_index, q_row, row_ok = _stacked_rows(b, h0, heads, q_blk, n_q, BS, GROUP, BLOCK_M)
        q_tile = _rows(q, row_index, row_ok, cols, BLOCK_D, UPCAST_DOT, True)
        do_tile = _rows(dout, row_index, row_ok, cols, BLOCK_D, UPCAST_DOT, True)
        row_lse, row_delta = _row_stats(lse, delta, row_index, row_ok)
        s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * qk_scale
        p = tl.exp2(s - row_lse[:, None])
        if MASKED:
            p = tl.where(row_ok[:, None] & k_ok[None, :] & (k_idx[None, :] <= q_offset + q_row[:, None]), p, 0.0)
        dv_acc += tl.dot(tl.trans(p).to(do_tile.dtype), do_tile, input_precision="ieee")
        dp = tl.dot(do_tile, tl.trans(v_tile), input_precision="ieee")
        ds = p * (dp - row_delta[:, None])
        dk_acc += tl.dot(tl.trans(ds).to(q_tile.dtype), q_tile, input_precision="ieee")
        return dk_acc, dv_acc

    @triton.jit
    def _block_sparse_dkdv_kernel(
        q, k, v, dout, lse, delta, dk, dv, t_indices, t_counts, key_valid,  # tensors (contiguous)
        heads, kv_group, n_q, n_k, k_blocks, width, q_offset,               # shapes
        qk_scale, scaling,                                                  # base-2 and natural scales
        BS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
    ):  # fmt: skip
        blk = tl.program_id(0)
        pid = tl.program_id(1).to(tl.int64)
        program_heads = heads // GROUP
        b = pid // program_heads
        h0 = (pid % program_heads) * GROUP
        kv_row0 = (b * (heads // kv_group) + h0 // kv_group) * n_k
        k_idx = blk * BS + tl.arange(0, BS)
        k_ok = _key_ok(key_valid, b, k_idx, n_k, HAS_KEY_MASK)
        cols = tl.arange(0, BLOCK_D).to(tl.int64)
        k_tile = _rows(k, kv_row0 + k_idx.to(tl.int64), k_ok, cols, BLOCK_D, UPCAST_DOT, True)
        v_tile = _rows(v, kv_row0 + k_idx.to(tl.int64), k_ok, cols, BLOCK_D, UPCAST_DOT, True)
        dk_acc = tl.zeros([BS, BLOCK_D], dtype=tl.float32)
        dv_acc = tl.zeros([BS, BLOCK_D], dtype=tl.float32)

        list_index = (b * heads + h0) * k_blocks + blk
        entries = t_indices + list_index * width
        count = tl.load(t_counts + list_index).to(tl.int32)
        # query blocks i whose first query (q_offset + i * BS) is at or after this block's last key see all of it
        first_full = (tl.maximum((blk + 1) * BS - 1 - q_offset, 0) + BS - 1) // BS
        n_masked = count
        if not HAS_KEY_MASK:
            if (blk + 1) * BS <= n_k:
                n_masked = count_below(entries, 1, count, first_full)
        for j in range(n_masked):
            dk_acc, dv_acc = _dkdv_step(
                dk_acc, dv_acc, k_tile, v_tile, k_idx, k_ok, tl.load(entries + j), q, dout, lse, delta, b, h0,
                heads, n_q, q_offset, cols, qk_scale, BS, GROUP, BLOCK_M, BLOCK_D, UPCAST_DOT, True,
            )  # fmt: skip
        for j in range(n_masked, count):
            dk_acc, dv_acc = _dkdv_step(
                dk_acc, dv_acc, k_tile, v_tile, k_idx, k_ok, tl.load(entries + j), q, dout, lse, delta, b, h0,
                heads, n_q, q_offset, cols, qk_scale, BS, GROUP, BLOCK_M, BLOCK_D, UPCAST_DOT, False,
            )  # fmt: skip

        # one row of dk / dv per program: (B, H / GROUP, Nk, D), which is k's shape when GROUP is the whole group
        store_ok = (k_idx < n_k)[:, None]
        ptrs = (pid * n_k + k_idx.to(tl.int64))[:, None] * BLOCK_D + cols[None, :]
        tl.store(dk + ptrs, (dk_acc * scaling).to(dk.dtype.element_ty), mask=store_ok)
        tl.store(dv + ptrs, dv_acc.to(dv.dtype.element_ty), mask=store_ok)


def _validate_backward_inputs(q, k, v, out, lse, dout, keep, block_size, q_offset, key_padding_mask, scaling) -> None:
    validate_keep_call(q, k, v, keep, key_padding_mask, block_size=block_size, q_offset=q_offset, scaling=scaling)
    for name, x, shape, dtype in (
        ("out", out, q.shape, q.dtype),
        ("dout", dout, q.shape, q.dtype),
        ("lse", lse, q.shape[:3], torch.float32),
    ):
        if (
            not isinstance(x, torch.Tensor)
            or tuple(x.shape) != tuple(shape)
            or x.dtype != dtype
            or x.device != q.device
        ):
            expected = f"a {dtype} tensor of shape {tuple(shape)} on {q.device}"
            raise ValueError(f"{name} must be {expected}, got {describe(x)}")


def block_sparse_attention_backward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
    keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, key_padding_mask: torch.Tensor | None = None,
    validate: bool = True, group_heads: bool | None = None, tiles: TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Gradients ``(dq, dk, dv)`` of block-sparse attention given the forward's ``out`` and fp32 ``lse``.

    ``keep (B, H, Mq, Mk)`` is the block selection the forward used; ``dout`` is the gradient of ``out``. dk / dv
    have k's shape (``H / g`` heads under grouped-query attention) and every gradient has the input dtype.
    ``validate=False`` skips the input checks (the autograd op has made them in the forward). ``group_heads``
    (None: detect, one device sync unless ``keep`` is broadcast over heads) lets one program serve the query heads
    of a KV group that share their selection; ``tiles`` defaults to :func:`backward_tile_config`.
    """
    if validate:
        _validate_backward_inputs(q, k, v, out, lse, dout, keep, block_size, q_offset, key_padding_mask, scaling)
    check_kernel_runnable(_block_sparse_dq_kernel, q, "block_sparse_attention_backward_triton")
    batch, heads, n_q, head_dim = q.shape
    n_k, kv_heads = k.shape[2], k.shape[1]
    kv_group = heads // kv_heads
    grouped = resolve_keep_groups(group_heads, keep, kv_heads, check=validate)
    if tiles is None:
        tiles = backward_tile_config(block_size, head_dim, kv_group if grouped else 1)
    tiles = check_tile_config(tiles, kv_group, grouped)
    stacked = tiles.heads_per_program
    indices, counts = (x.contiguous() for x in selection_lists(keep))
    t_indices, t_counts = (x.contiguous() for x in selection_lists(keep.transpose(-1, -2)))  # per key block

    q, k, v, dout = (x.contiguous() for x in (q, k, v, dout))
    delta = (dout.float() * out.float()).sum(-1).contiguous()
    lse = lse.contiguous()
    key_valid = key_valid_tensor(key_padding_mask, q).contiguous()
    dq = torch.empty_like(q)
    # one dk / dv row per program; a program that holds a whole KV group writes k's shape and dtype directly, the
    # others write fp32 parts that are summed over the group below (so the sum rounds once)
    kv_dtype = q.dtype if stacked == kv_group else torch.float32
    dk = torch.empty(batch, heads // stacked, n_k, head_dim, dtype=kv_dtype, device=q.device)
    dv = torch.empty_like(dk)
    if batch * heads == 0:
        return dq, torch.zeros_like(k), torch.zeros_like(v)
    programs = batch * heads // stacked
    shared = (key_valid, heads, kv_group, n_q, n_k)
    meta = {
        "BS": block_size,
        "GROUP": stacked,
        "BLOCK_M": tiles.rows(block_size),
        "BLOCK_D": head_dim,
        "UPCAST_DOT": is_interpreted(_block_sparse_dq_kernel),
        "HAS_KEY_MASK": key_padding_mask is not None,
        **tiles.launch(),
    }
    scales = (float(scaling) * LOG2_E, float(scaling))
    _block_sparse_dq_kernel[(keep.shape[2], programs)](
        q, k, v, dout, lse, delta, dq, indices, counts, *shared, keep.shape[2], indices.shape[-1], q_offset, *scales,
        **meta,
    )  # fmt: skip
    _block_sparse_dkdv_kernel[(keep.shape[3], programs)](
        q, k, v, dout, lse, delta, dk, dv, t_indices, t_counts, *shared, keep.shape[3], t_indices.shape[-1],
        q_offset, *scales, **meta,
    )  # fmt: skip
    if stacked < kv_group:
        dk, dv = (x.unflatten(1, (kv_heads, kv_group // stacked)).sum(2).to(q.dtype) for x in (dk, dv))
    return dq, dk, dv


class _BlockSparseFlashAttention(torch.autograd.Function):
    """Triton forward (saving out + lse) and Triton backward over the same block selection."""

    @staticmethod
    def forward(ctx, q, k, v, keep, key_padding_mask, block_size, scaling, q_offset, group_heads):
        grouped = group_heads  # resolved by block_sparse_flash_attention
        indices, counts = selection_lists(keep)
        ctx.settings = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset, "group_heads": grouped}
        out, lse = block_sparse_attention_triton(
            q, k, v, indices, counts, return_lse=True, key_padding_mask=key_padding_mask,
            validate=False,  # checked by block_sparse_flash_attention
            **ctx.settings,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, keep, key_padding_mask)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, keep, key_padding_mask = ctx.saved_tensors
        dq, dk, dv = block_sparse_attention_backward_triton(
            q, k, v, out, lse, dout.to(q.dtype), keep, key_padding_mask=key_padding_mask, validate=False, **ctx.settings
        )
        return dq, dk, dv, None, None, None, None, None, None


def block_sparse_flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, key_padding_mask: torch.Tensor | None = None,
    backend: str = "auto", validate: bool = True, group_heads: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Differentiable block-sparse causal attention: Triton forward and backward, or the PyTorch path.

    Same arguments as :func:`hf_icl.kernels.block_sparse_attention.block_sparse_attention_forward`; gradients flow
    to ``q``, ``k`` and ``v`` through the same block selection ``keep``. ``backend="auto"`` takes the kernels on
    CUDA tensors, and the PyTorch path (``"torch"``, autograd through PyTorch) otherwise. ``validate=False`` skips
    the kernel path's input checks and their device syncs, for callers that built ``keep`` themselves (CAB does).
    ``group_heads`` (None: detect) lets the kernels serve a KV group's query heads together when they share their
    selection.

    >>> q, k, v = (torch.randn(1, 2, 40, 32, requires_grad=True) for _ in range(3))
    >>> keep = torch.ones(1, 2, 3, 3, dtype=torch.bool).tril()
    >>> block_sparse_flash_attention(q, k, v, keep, block_size=16, scaling=32**-0.5).sum().backward()
    >>> q.grad.shape
    torch.Size([1, 2, 40, 32])
    """
    kwargs = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset}
    if resolve_backend(backend, q) == "torch":
        return block_sparse_attention_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **kwargs)
    if validate:
        validate_keep_call(q, k, v, keep, key_padding_mask, **kwargs)
    grouped = resolve_keep_groups(group_heads, keep, k.shape[1], check=validate)
    return _BlockSparseFlashAttention.apply(q, k, v, keep, key_padding_mask, block_size, scaling, q_offset, grouped)
