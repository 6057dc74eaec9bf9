"""Per-token block-sparse causal attention with a backward pass in Triton: the public autograd entry point.

The forward is :mod:`.triton_forward`'s (key-block-major partial attention, then a log-sum-exp merge). The backward
reuses its sorted pair list (:mod:`.triton_pairs`), cut into items of the backward's own ``BLOCK_M``, one program per
item (FlashAttention-2's backward, per KV block instead of per query block):

* ``δ_t = rowsum(dO_t ∘ O_t)`` in float32 (torch), minus the incoming gradient of ``lse`` when the caller used it
  (``∂lse/∂S = P``, so it folds into δ);
* per item: the block's K and V tiles and the item's Q and dO rows are loaded once; ``S = q·kᵀ·scale`` is
  recomputed and ``P = exp(S − LSE_t)`` are the *final* probabilities (the merged LSE, so no per-slot rescaling),
  ``dV_blk += Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ∘ (dP − δ)``, ``dK_blk += scale · dSᵀ Q``, ``dQ_rows += scale · dS K``;
* ``dK`` / ``dV`` accumulate over the items of a block (and, for grouped-query attention, over the group's query
  heads: their pairs share the KV block's key) with ``tl.atomic_add`` into float32 ``(B, Hk, Nk, D)`` buffers, ``dQ``
  with ``tl.atomic_add`` into a float32 ``(B, H, Nq, D)`` buffer (a token's blocks live in different items); the
  buffers are cast to the input dtype at the end. Float32 atomics make the gradients nondeterministic in their
  last bits on a GPU (the summation order varies); memory stays O(input), with no per-slot dQ buffer.

Tokens with no live pair (``counts == 0``, a query at or past its row's length) get zero gradients; so do keys that no
pair sees.
"""

from __future__ import annotations

import torch

from .._common import check_kernel_runnable, tl, triton
from .triton_forward import (
    backward_tiles,
    item_block,
    item_launch,
    item_range,
    item_rows,
    key_block,
    launch_forward,
    load_rows,
    masked_scores,
    tile_dot,
    validate_token_sparse,
)
from .triton_pairs import PairList

__all__ = ["token_sparse_attention_triton", "token_sparse_backward_triton"]

_token_sparse_bwd_kernel = None

if triton is not None:

    @triton.jit
    def _token_sparse_bwd_kernel(
        q, k, v, dout, lse, delta, dq, dk, dv,                             # tensors
        order, item_kvb, item_start, item_end, lengths,                    # the work list (item_launch's operands)
        heads, kv_heads, n_q, width, n_k, mk, q_offset, qk_scale,          # shapes, base-2 scale
        sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sl_b,  # q / k / v / lengths strides
        scaling, sdo_b, sdo_h, sdo_t, sdo_d,                               # the backward's own: scale, dout strides
        BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST_DOT: tl.constexpr,
        HAS_LENGTHS: tl.constexpr,
    ):  # fmt: skip
        """One work item: gradients of up to ``BLOCK_M`` pairs of one KV block, added atomically. The parameters
        from ``order`` to ``sl_b`` are the forward kernel's (:func:`.triton_forward.item_launch` gives both)."""
        start, end = item_range(item_start, item_end)
        if start >= end:  # a surplus program of the upper-bound grid
            return
        b, hk, j, kv_row = item_block(item_kvb, mk, kv_heads)
        row_ok, _, t, h = item_rows(order, start, end, heads, n_q, width, BLOCK_M)
        token = (b * heads + h) * n_q + t  # row of the contiguous (B, H, Nq) lse / delta / dq
        cols = tl.arange(0, BLOCK_D)
        q_tile = load_rows(q + b * sq_b, h * sq_h + t * sq_t, row_ok, cols, sq_d, UPCAST_DOT)
        do_tile = load_rows(dout + b * sdo_b, h * sdo_h + t * sdo_t, row_ok, cols, sdo_d, UPCAST_DOT)
        lse_rows = tl.load(lse + token, mask=row_ok, other=float("-inf"))
        delta_rows = tl.load(delta + token, mask=row_ok, other=0.0)
        k_pos, k_ok = key_block(lengths, b, j, n_k, sl_b, BS, HAS_LENGTHS)
        k_tile = load_rows(k + b * sk_b + hk * sk_h, k_pos * sk_n, k_ok, cols, sk_d, UPCAST_DOT)
        v_tile = load_rows(v + b * sv_b + hk * sv_h, k_pos * sv_n, k_ok, cols, sv_d, UPCAST_DOT)

        s, allowed = masked_scores(q_tile, k_tile, qk_scale, row_ok, k_ok, k_pos, q_offset + t)  # base-2 logits
        allowed = allowed & (lse_rows > float("-inf"))[:, None]
        lse2 = tl.where(lse_rows > float("-inf"), lse_rows * 1.4426950408889634, 0.0)
        p = tl.where(allowed, tl.exp2(s - lse2[:, None]), 0.0)  # final probabilities, float32
        dp = tl.dot(do_tile, tl.trans(v_tile), input_precision="ieee")
        ds = p * (dp - delta_rows[:, None])
        dv_blk = tile_dot(p, do_tile, True)
        dk_blk = tile_dot(ds, q_tile, True) * scaling
        dq_rows = tile_dot(ds, k_tile, False) * scaling

        tl.atomic_add(dq + token[:, None] * BLOCK_D + cols[None, :], dq_rows, mask=row_ok[:, None], sem="relaxed")
        kv_rows = (kv_row * n_k + k_pos)[:, None] * BLOCK_D + cols[None, :]  # contiguous (B, Hk, Nk, D)
        tl.atomic_add(dk + kv_rows, dk_blk, mask=k_ok[:, None], sem="relaxed")
        tl.atomic_add(dv + kv_rows, dv_blk, mask=k_ok[:, None], sem="relaxed")


def _backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
    dlse: torch.Tensor | None, pairs: PairList,
    *, width: int, block_size: int, scaling: float, q_offset: int, lengths: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(dq, dk, dv)`` in the inputs' dtypes from the forward's pair list (no validation, no device sync)."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    device = q.device
    delta = (dout.float() * out.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    delta = delta.contiguous()
    lse = lse.contiguous()
    dq = torch.zeros(batch, heads, n_q, head_dim, dtype=torch.float32, device=device)
    dk = torch.zeros(batch, kv_heads, n_k, head_dim, dtype=torch.float32, device=device)
    dv = torch.zeros(batch, kv_heads, n_k, head_dim, dtype=torch.float32, device=device)
    grid, operands, options = item_launch(
        _token_sparse_bwd_kernel, backward_tiles, q, k, v, pairs, width, block_size, scaling, q_offset, lengths
    )
    _token_sparse_bwd_kernel[grid](
        q, k, v, dout, lse, delta, dq, dk, dv, *operands, float(scaling), *dout.stride(), **options
    )
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _TokenSparseAttention(torch.autograd.Function):
    """Autograd wrapper: forward kernels, backward kernel; ``lse`` is differentiable too."""

    @staticmethod
    def forward(ctx, q, k, v, indices, counts, lengths, block_size, scaling, q_offset):
        out, lse, pairs = launch_forward(
            q, k, v, indices, counts, block_size=block_size, scaling=scaling, q_offset=q_offset, lengths=lengths
        )
        ctx.save_for_backward(q, k, v, out, lse, pairs.order, pairs.bounds, lengths)
        ctx.n_blocks = pairs.n_blocks
        ctx.width = indices.shape[3]
        ctx.block_size = block_size
        ctx.scaling = scaling
        ctx.q_offset = q_offset
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, order, bounds, lengths = ctx.saved_tensors
        if dout is None and dlse is None:
            return (None,) * 9
        if dout is None:
            dout = torch.zeros_like(out)
        pairs = PairList(order=order, bounds=bounds, n_blocks=ctx.n_blocks)
        settings = {"block_size": ctx.block_size, "scaling": ctx.scaling, "q_offset": ctx.q_offset}
        dq, dk, dv = _backward(q, k, v, out, lse, dout, dlse, pairs, width=ctx.width, lengths=lengths, **settings)
        return dq, dk, dv, None, None, None, None, None, None


def token_sparse_backward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
    indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, lengths: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(dq, dk, dv)`` of the attention that produced ``out`` / ``lse`` (from
    :func:`~hf_icl.kernels.token_sparse.triton_forward.token_sparse_forward_triton` with the same arguments), for
    callers that hold the forward's results themselves; rebuilds the pair list (no validation, no device sync)."""
    from .triton_pairs import build_pair_list

    check_kernel_runnable(_token_sparse_bwd_kernel, q, "token_sparse_backward_triton")
    place = {"block_size": block_size, "q_offset": q_offset, "lengths": lengths}
    pairs = build_pair_list(indices, counts, kv_heads=k.shape[1], n_keys=k.shape[2], **place)
    return _backward(q, k, v, out, lse, dout, dlse, pairs, width=indices.shape[3], scaling=scaling, **place)


def token_sparse_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor,
    *, block_size: int, scaling: float, q_offset: int = 0, lengths: torch.Tensor | None = None,
    return_lse: bool = False, validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per-token block-sparse causal attention (differentiable in q, k, v; and through ``lse``).

    Args:
        q: ``(B, H, Nq, D)`` queries; query ``t`` sits at key position ``q_offset + t``. float32 / float16 /
            bfloat16, ``D`` in {16, 32, 64, 128}; any strides.
        k, v: ``(B, Hk, Nk, D)``, q's dtype, ``Hk`` dividing ``H`` (query head ``h`` reads KV head ``h // (H // Hk)``).
        indices: int32 ``(B, H, Nq, W)``: the key blocks query ``(b, h, t)`` attends, ascending, the first
            ``counts[b, h, t]`` valid (the rest are ignored); block ``j`` covers keys ``[j·block_size,
            (j+1)·block_size) ∩ [0, Nk)``. May be an expanded view.
        counts: int32 ``(B, H, Nq)``, in ``[0, W]``; 0 means the query attends nothing (zeros, ``lse = -inf``).
        block_size: keys per block, one of 16, 32, 64, 128.
        scaling: the softmax scale applied to ``q·k``.
        q_offset: key position of query 0 (``Nk - Nq`` for a call with a cache; 0 for prefill).
        lengths: optional int ``(B,)``: row ``b``'s real keys are ``[0, lengths[b])``; later keys are never attended
            and queries at positions ``>= lengths[b]`` output zeros (zero gradients, ``lse = -inf``).
        return_lse: also return the float32 ``(B, H, Nq)`` natural-log log-sum-exp of the scaled scores.
        validate: check the arguments (``ValueError`` naming the argument); the value-range checks read the
            device once. ``False`` skips every check: no device sync at all.

    Returns ``out (B, H, Nq, D)`` in q's dtype, and ``lse`` with ``return_lse``. CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``.
    """
    if validate:
        validate_token_sparse(
            q, k, v, indices, counts, block_size=block_size, scaling=scaling, q_offset=q_offset, lengths=lengths
        )
    check_kernel_runnable(_token_sparse_bwd_kernel, q, "token_sparse_attention_triton")
    out, lse = _TokenSparseAttention.apply(q, k, v, indices, counts, lengths, block_size, float(scaling), q_offset)
    return (out, lse) if return_lse else out
