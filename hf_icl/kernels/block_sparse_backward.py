"""Backward of block-sparse causal attention in Triton (dq, dk, dv), and the differentiable op built on it.

Flash-attention-2 style recomputation: the forward saves only ``out`` and the fp32 log-sum-exp, and the backward
rebuilds each kept score tile ``p = exp(q k^T * scale - lse)``. With ``delta = rowsum(dout * out)``:

    dv_j += p^T dout_i        dp = dout_i v_j^T        ds = p * (dp - delta_i)
    dq_i += ds k_j * scale    dk_j += ds^T q_i * scale

Two kernels keep every sum inside one program, so there are no atomics and the result is deterministic:

* ``dq``: one program per (query block, batch * head), walking the forward's key-block list of that query block;
* ``dk / dv``: one program per (key block, batch * head), walking the *transposed* selection, the list of query
  blocks that kept this key block (built from ``keep`` with :func:`selected_block_indices` on ``keep^T``).

Grouped-query attention: each query head writes its own dk / dv rows (fp32), summed over the group afterwards.
Masking matches the forward (causal, ragged N, key padding); rows that saw no key have ``lse = -inf`` and get no
gradient. All operands are made contiguous first, so offsets come from shapes, not strides.
"""

from __future__ import annotations

import torch

from ._common import check_kernel_runnable, check_key_padding_mask, is_interpreted, resolve_backend, tl, triton
from .block_sparse_attention import (
    _key_valid_tensor,
    block_sparse_attention_reference,
    block_sparse_attention_triton,
    launch_config,
    validate_keep,
    validate_qkv,
)
from .block_sparse_reference import selected_block_indices

__all__ = ["block_sparse_attention_backward_triton", "block_sparse_flash_attention"]


_block_sparse_dq_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _tile(base, row0, rows, row_ok, cols, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
        """Load rows ``rows`` (masked by ``row_ok``) of a contiguous (…, N, D) tensor whose row 0 is ``row0``."""
        ptrs = base + (row0 + rows.to(tl.int64))[:, None] * BLOCK_D + cols[None, :]
        x = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
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
    def _row_stats(lse, delta, row0, rows, row_ok):
        """Row lse and ``delta``, both fp32. A row that saw no key (lse = -inf) has no allowed key either, so the
        callers' ``where(allowed, exp(s - lse), 0)`` gives it p = 0 without a special case."""
        row_lse = tl.load(lse + row0 + rows.to(tl.int64), mask=row_ok, other=float("inf"))
        row_delta = tl.load(delta + row0 + rows.to(tl.int64), mask=row_ok, other=0.0)
        return row_lse, row_delta

    @triton.jit
    def _block_sparse_dq_kernel(
        q,
        k,
        v,
        dout,
        lse,
        delta,
        dq,
        indices,
        counts,
        key_valid,
        heads,
        kv_group,
        n_q,
        n_k,
        q_blocks,
        width,
        q_offset,
        scaling,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):
        blk = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // heads
        kv_bh = b * (heads // kv_group) + (bh % heads) // kv_group
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_q
        q_pos = q_offset + rows
        cols = tl.arange(0, BLOCK_D).to(tl.int64)
        key_rows = tl.arange(0, BLOCK_N)

        q_tile = _tile(q, bh * n_q, rows, row_ok, cols, BLOCK_D, UPCAST_DOT)
        do_tile = _tile(dout, bh * n_q, rows, row_ok, cols, BLOCK_D, UPCAST_DOT)
        row_lse, row_delta = _row_stats(lse, delta, bh * n_q, rows, row_ok)
        dq_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        sel = indices + (bh * q_blocks + blk) * width
        for j in range(tl.load(counts + bh * q_blocks + blk)):
            k_idx = tl.load(sel + j) * BLOCK_N + key_rows
            k_ok = _key_ok(key_valid, b, k_idx, n_k, HAS_KEY_MASK)
            k_tile = _tile(k, kv_bh * n_k, k_idx, k_ok, cols, BLOCK_D, UPCAST_DOT)
            v_tile = _tile(v, kv_bh * n_k, k_idx, k_ok, cols, BLOCK_D, UPCAST_DOT)
            s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * scaling
            allowed = k_ok[None, :] & (k_idx[None, :] <= q_pos[:, None])
            p = tl.where(allowed, tl.exp(s - row_lse[:, None]), 0.0)
            dp = tl.dot(do_tile, tl.trans(v_tile), input_precision="ieee")
            ds = p * (dp - row_delta[:, None])
            dq_acc += tl.dot(ds.to(k_tile.dtype), k_tile, input_precision="ieee")

        ptrs = dq + (bh * n_q + rows.to(tl.int64))[:, None] * BLOCK_D + cols[None, :]
        tl.store(ptrs, (dq_acc * scaling).to(dq.dtype.element_ty), mask=row_ok[:, None])

    @triton.jit
    def _block_sparse_dkdv_kernel(
        q,
        k,
        v,
        dout,
        lse,
        delta,
        dk,
        dv,
        t_indices,
        t_counts,
        key_valid,
        heads,
        kv_group,
        n_q,
        n_k,
        k_blocks,
        width,
        q_offset,
        scaling,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):
        blk = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // heads
        kv_bh = b * (heads // kv_group) + (bh % heads) // kv_group
        k_idx = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        k_ok = _key_ok(key_valid, b, k_idx, n_k, HAS_KEY_MASK)
        cols = tl.arange(0, BLOCK_D).to(tl.int64)
        query_rows = tl.arange(0, BLOCK_M)

        k_tile = _tile(k, kv_bh * n_k, k_idx, k_ok, cols, BLOCK_D, UPCAST_DOT)
        v_tile = _tile(v, kv_bh * n_k, k_idx, k_ok, cols, BLOCK_D, UPCAST_DOT)
        dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

        sel = t_indices + (bh * k_blocks + blk) * width
        for j in range(tl.load(t_counts + bh * k_blocks + blk)):
            rows = tl.load(sel + j) * BLOCK_M + query_rows
            row_ok = rows < n_q
            q_tile = _tile(q, bh * n_q, rows, row_ok, cols, BLOCK_D, UPCAST_DOT)
            do_tile = _tile(dout, bh * n_q, rows, row_ok, cols, BLOCK_D, UPCAST_DOT)
            row_lse, row_delta = _row_stats(lse, delta, bh * n_q, rows, row_ok)
            s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * scaling
            allowed = row_ok[:, None] & k_ok[None, :] & (k_idx[None, :] <= q_offset + rows[:, None])
            p = tl.where(allowed, tl.exp(s - row_lse[:, None]), 0.0)
            dv_acc += tl.dot(tl.trans(p).to(do_tile.dtype), do_tile, input_precision="ieee")
            dp = tl.dot(do_tile, tl.trans(v_tile), input_precision="ieee")
            ds = p * (dp - row_delta[:, None])
            dk_acc += tl.dot(tl.trans(ds).to(q_tile.dtype), q_tile, input_precision="ieee")

        store_ok = (k_idx < n_k)[:, None]
        ptrs = (bh * n_k + k_idx.to(tl.int64))[:, None] * BLOCK_D + cols[None, :]
        tl.store(dk + ptrs, (dk_acc * scaling).to(dk.dtype.element_ty), mask=store_ok)
        tl.store(dv + ptrs, dv_acc.to(dv.dtype.element_ty), mask=store_ok)


def _validate_backward_inputs(q, k, v, out, lse, dout, keep, block_size, q_offset, key_padding_mask, scaling) -> None:
    validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
    validate_keep(q, k, keep, block_size)
    check_key_padding_mask(key_padding_mask, q, k)
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
            got = f"{x.dtype} {tuple(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a {dtype} tensor of shape {tuple(shape)} on {q.device}, got {got}")


def block_sparse_attention_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int = 0,
    key_padding_mask: torch.Tensor | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of block-sparse attention given the forward's ``out`` and fp32 ``lse``.

    ``keep (B, H, Mq, Mk)`` is the block selection the forward used; ``dout`` is the gradient of ``out``. dk / dv
    have k's shape (``H / g`` heads under grouped-query attention) and every gradient has the input dtype.
    ``validate=False`` skips the input checks (the autograd op has made them in the forward).
    """
    if validate:
        _validate_backward_inputs(q, k, v, out, lse, dout, keep, block_size, q_offset, key_padding_mask, scaling)
    check_kernel_runnable(_block_sparse_dq_kernel, q, "block_sparse_attention_backward_triton")
    indices, valid = selected_block_indices(keep)
    t_indices, t_valid = selected_block_indices(keep.transpose(-1, -2))  # query blocks that kept each key block

    batch, heads, n_q, head_dim = q.shape
    n_k, kv_group = k.shape[2], heads // k.shape[1]
    q, k, v, dout = (x.contiguous() for x in (q, k, v, dout))
    delta = (dout.float() * out.float()).sum(-1).contiguous()
    lse = lse.contiguous()
    key_valid = _key_valid_tensor(key_padding_mask, q).contiguous()
    dq = torch.empty_like(q)
    # per query head; summed over the group below (fp32 so the sum rounds once)
    kv_dtype = q.dtype if kv_group == 1 else torch.float32
    dk = torch.empty(batch, heads, n_k, head_dim, dtype=kv_dtype, device=q.device)
    dv = torch.empty_like(dk)
    if batch * heads == 0:
        return dq, dk[:, : k.shape[1]].to(q.dtype), dv[:, : k.shape[1]].to(q.dtype)
    shared = (key_valid, heads, kv_group, n_q, n_k)
    meta = {
        "BLOCK_M": block_size,
        "BLOCK_N": block_size,
        "BLOCK_D": head_dim,
        "UPCAST_DOT": is_interpreted(_block_sparse_dq_kernel),
        "HAS_KEY_MASK": key_padding_mask is not None,
        **launch_config(block_size, head_dim),
    }
    _block_sparse_dq_kernel[(keep.shape[2], batch * heads)](
        q,
        k,
        v,
        dout,
        lse,
        delta,
        dq,
        indices.contiguous(),
        valid.sum(-1).contiguous(),
        *shared,
        keep.shape[2],
        indices.shape[-1],
        q_offset,
        float(scaling),
        **meta,
    )
    _block_sparse_dkdv_kernel[(keep.shape[3], batch * heads)](
        q,
        k,
        v,
        dout,
        lse,
        delta,
        dk,
        dv,
        t_indices.contiguous(),
        t_valid.sum(-1).contiguous(),
        *shared,
        keep.shape[3],
        t_indices.shape[-1],
        q_offset,
        float(scaling),
        **meta,
    )
    if kv_group > 1:
        dk, dv = (x.unflatten(1, (k.shape[1], kv_group)).sum(2).to(q.dtype) for x in (dk, dv))
    return dq, dk, dv


class _BlockSparseFlashAttention(torch.autograd.Function):
    """Triton forward (saving out + lse) and Triton backward over the same block selection."""

    @staticmethod
    def forward(ctx, q, k, v, keep, key_padding_mask, block_size, scaling, q_offset):
        indices, valid = selected_block_indices(keep)
        out, lse = block_sparse_attention_triton(
            q,
            k,
            v,
            indices,
            valid.sum(-1),
            block_size=block_size,
            scaling=scaling,
            q_offset=q_offset,
            return_lse=True,
            key_padding_mask=key_padding_mask,
            validate=False,  # checked by block_sparse_flash_attention
        )
        ctx.save_for_backward(q, k, v, out, lse, keep, key_padding_mask)
        ctx.settings = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset}
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, keep, key_padding_mask = ctx.saved_tensors
        dq, dk, dv = block_sparse_attention_backward_triton(
            q, k, v, out, lse, dout.to(q.dtype), keep, key_padding_mask=key_padding_mask, validate=False, **ctx.settings
        )
        return dq, dk, dv, None, None, None, None, None


def block_sparse_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int = 0,
    key_padding_mask: torch.Tensor | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """Differentiable block-sparse causal attention: Triton forward and backward, or the PyTorch reference.

    Same arguments as :func:`hf_icl.kernels.block_sparse_attention.block_sparse_attention_forward`; gradients flow
    to ``q``, ``k`` and ``v`` through the same block selection ``keep``. ``backend="auto"`` takes the kernels on
    CUDA tensors, and the reference (autograd through PyTorch) otherwise. ``validate=False`` skips the kernel
    path's input checks and their device syncs, for callers that built ``keep`` themselves (CAB does).
    """
    kwargs = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset}
    if resolve_backend(backend, q) == "reference":
        return block_sparse_attention_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **kwargs)
    if validate:
        validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
        validate_keep(q, k, keep, block_size)
        check_key_padding_mask(key_padding_mask, q, k)
    return _BlockSparseFlashAttention.apply(q, k, v, keep, key_padding_mask, block_size, scaling, q_offset)
