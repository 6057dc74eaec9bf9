"""Chunked causal linear attention in Triton: forward and backward, with fp32 state accumulation.

The inputs are already feature-mapped: ``q, k (B, H, T, F)`` and ``v (B, H, T, Dv)``. The op is the *unnormalised*
causal linear attention

    o_t = sum_{j <= t} (q_t . k_j) v_j

with no scale, no feature map and no denominator (a caller normalises by appending a ones column to ``v`` and
dividing by the last output column). Quadratic in the chunk, linear in T:

* the sequence is cut into chunks of ``C`` tokens; inside chunk ``c`` the causal quadratic form
  ``tril(Q_c K_c^T) V_c`` (diagonal included) is exact;
* everything before the chunk is summarised by the state ``S = sum_j k_j^T v_j`` (F x Dv), kept in fp32 in
  registers, so ``O_c = tril(Q_c K_c^T) V_c + Q_c S_prev`` and then ``S += K_c^T V_c``.

One kernel does every pass. It computes ``out = mask(A B^T) C + A S`` with ``S = sum B^T C`` over the chunks before
(``REVERSE=False``: causal, ``tril``) or after (``REVERSE=True``: anti-causal, ``triu``) the current one. The forward
is ``(A, B, C) = (q, k, v)``; the gradients of ``o`` are three more launches of the same kernel:

    dq = causal     (dO, v, k)    dq_t = sum_{j <= t} (dO_t . v_j) k_j    state sum v_j^T k_j  (the forward's, S^T)
    dk = anti-causal(v, dO, q)    dk_j = sum_{t >= j} (v_j . dO_t) q_t    state sum dO_t^T q_t (R^T)
    dv = anti-causal(k, q, dO)    dv_j = sum_{t >= j} (k_j . q_t) dO_t    state sum q_t^T dO_t (R)

so dq reuses the forward recurrence on dO and dk / dv walk the chunks backwards with the reverse state
``R = sum_{t later} q_t^T dO_t``. Nothing but q, k, v is saved for the backward (states are recomputed, never
stored per chunk).

One program handles one (batch * head, block of ``BLOCK_V`` output columns); the columns are independent, so the
state is only ``BLOCK_K x BLOCK_V``. The contraction width (F for o / dv, Dv for dq / dk) is padded to a power of two
>= 16 with load masks (``MAX_WIDTH`` at most); the output columns are padded to a multiple of ``BLOCK_V``. Ragged
T is masked too: padded rows load as zero, so they add nothing to the state.

Precision: products of two input tiles (``A B^T`` and the state update ``B^T C``) are native dots accumulating in
fp32; products with an fp32 intermediate (masked scores, the state) take fp32 operands, IEEE for fp32 inputs and
TF32 for bf16 / fp16 inputs (fp32's range, so a long unnormalised sum never overflows fp16 inside the kernel; the
output is still written in the input dtype). Under ``TRITON_INTERPRET=1`` (triton 3.9) ``tl.dot`` on bf16 tiles is
wrong, so every tile is upcast to fp32 there.
"""

from __future__ import annotations

import torch

from ..validation import check_choice
from ._common import check_attention_tensor, check_kernel_runnable, is_interpreted, tl, triton

__all__ = [
    "CHUNK_SIZES",
    "MAX_WIDTH",
    "causal_linear_attention_triton",
    "causal_linear_attention_triton_reference",
]

#: allowed ``chunk_size`` values: powers of two from tl.dot's 16-row minimum to 128 (C x C scores stay small)
CHUNK_SIZES = (16, 32, 64, 128)
#: largest feature width F and value width Dv: each is the contraction width of some pass (F for o / dv, Dv for
#: dq / dk) and a whole padded row of it sits in one tile with a (width x BLOCK_V) fp32 state
MAX_WIDTH = 256
#: output columns per program
BLOCK_V_MAX = 64


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def _validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ``ValueError`` unless q, k (B, H, T, F) and v (B, H, T, Dv) agree in dtype, device and shape."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_attention_tensor(name, x)
        if x.shape[3] < 1:
            raise ValueError(f"{name} must have a last dimension >= 1, got shape {tuple(x.shape)}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"q.dtype and {name}.dtype must be equal, got {q.dtype} and {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"q and {name} must be on the same device, got {q.device} and {x.device}")
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape (B, H, T, F), got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must have q's (B, H, T) = {tuple(q.shape[:3])} (any Dv), got v.shape={tuple(v.shape)}")


def _validate_kernel_args(q: torch.Tensor, v: torch.Tensor, chunk_size: int) -> None:
    """The kernel's own limits: ``chunk_size`` in :data:`CHUNK_SIZES`, F and Dv at most :data:`MAX_WIDTH`."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"chunk_size must be an int power of two in {list(CHUNK_SIZES)}, got {chunk_size!r}")
    check_choice("chunk_size", chunk_size, CHUNK_SIZES)
    for label, width in (("F (q.shape[3])", q.shape[3]), ("Dv (v.shape[3])", v.shape[3])):
        if width > MAX_WIDTH:
            raise ValueError(
                f"{label} must be <= {MAX_WIDTH} for the Triton kernel, got {width}; "
                "use causal_linear_attention_triton_reference"
            )


# ----------------------------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------------------------

_chunked_linear_attention_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _chunked_linear_attention_kernel(
        a, b, c, out,                  # tensors
        heads, n_tokens, k_dim, v_dim,  # shapes
        as_b, as_h, as_t, as_d, bs_b, bs_h, bs_t, bs_d, cs_b, cs_h, cs_t, cs_d, os_b, os_h, os_t, os_d,  # strides
        BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
        REVERSE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        """``out = mask(A B^T) C + A S`` chunk by chunk, S = sum B^T C over earlier (or, REVERSE, later) chunks."""
        bh = tl.program_id(0)
        v_block = tl.program_id(1)
        # int64 offsets: B * H * T * D can exceed 2**31
        batch = (bh // heads).to(tl.int64)
        head = (bh % heads).to(tl.int64)
        a += batch * as_b + head * as_h
        b += batch * bs_b + head * bs_h
        c += batch * cs_b + head * cs_h
        out += batch * os_b + head * os_h

        steps = tl.arange(0, BLOCK_T)
        k_cols = tl.arange(0, BLOCK_K)
        v_cols = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
        k_ok = k_cols < k_dim
        v_ok = v_cols < v_dim
        if REVERSE:
            visible = steps[None, :] >= steps[:, None]  # row t sees the chunk's tokens at or after t
        else:
            visible = steps[None, :] <= steps[:, None]  # row t sees the chunk's tokens up to t

        state = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
        n_chunks = tl.cdiv(n_tokens, BLOCK_T)
        for i in range(n_chunks):
            if REVERSE:
                chunk = n_chunks - 1 - i
            else:
                chunk = i
            rows = chunk * BLOCK_T + steps
            row_ok = rows < n_tokens
            rows64 = rows.to(tl.int64)[:, None]
            # padded rows and columns load as 0: they add nothing to the scores, the output or the state
            a_tile = tl.load(
                a + rows64 * as_t + k_cols[None, :] * as_d, mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            b_tile = tl.load(
                b + rows64 * bs_t + k_cols[None, :] * bs_d, mask=row_ok[:, None] & k_ok[None, :], other=0.0
            )
            c_tile = tl.load(
                c + rows64 * cs_t + v_cols[None, :] * cs_d, mask=row_ok[:, None] & v_ok[None, :], other=0.0
            )
            if UPCAST:
                a_tile = a_tile.to(tl.float32)
                b_tile = b_tile.to(tl.float32)
                c_tile = c_tile.to(tl.float32)

            scores = tl.dot(a_tile, tl.trans(b_tile), input_precision=PRECISION)  # (BLOCK_T, BLOCK_T) fp32
            scores = tl.where(visible, scores, 0.0)
            acc = tl.dot(scores, c_tile.to(tl.float32), input_precision=PRECISION)
            acc = tl.dot(a_tile.to(tl.float32), state, acc, input_precision=PRECISION)  # the other chunks
            o_ptrs = out + rows64 * os_t + v_cols[None, :] * os_d
            tl.store(o_ptrs, acc.to(out.dtype.element_ty), mask=row_ok[:, None] & v_ok[None, :])

            state = tl.dot(tl.trans(b_tile), c_tile, state, input_precision=PRECISION)


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _chunked_pass(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, chunk_size: int, reverse: bool) -> torch.Tensor:
    """One launch: ``out (B, H, T, c.shape[3])`` in c's dtype, causal (or anti-causal when ``reverse``).

    a / b are (B, H, T, K), c is (B, H, T, V), read in place through their strides (stride 0 is fine).
    """
    batch, heads, n_tokens, k_dim = a.shape
    v_dim = c.shape[3]
    out = torch.empty(batch, heads, n_tokens, v_dim, dtype=c.dtype, device=c.device)
    if batch * heads == 0:
        return out
    # a short sequence needs no chunk longer than itself (same result, less padding)
    block_t = min(chunk_size, max(16, _next_power_of_two(n_tokens)))
    block_k = max(16, _next_power_of_two(k_dim))
    block_v = min(BLOCK_V_MAX, max(16, _next_power_of_two(v_dim)))
    interpreted = is_interpreted(_chunked_linear_attention_kernel)
    grid = (batch * heads, triton.cdiv(v_dim, block_v))
    _chunked_linear_attention_kernel[grid](
        a, b, c, out,
        heads, n_tokens, k_dim, v_dim,
        *a.stride(), *b.stride(), *c.stride(), *out.stride(),
        BLOCK_T=block_t, BLOCK_K=block_k, BLOCK_V=block_v, REVERSE=reverse,
        UPCAST=interpreted and a.dtype != torch.float32, PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        # larger tiles (and a wider fp32 state) get more warps; untuned
        num_warps=4 if block_t * max(block_k, block_v) <= 64 * 64 else 8,
        num_stages=2,
    )  # fmt: skip
    return out


class _CausalLinearAttention(torch.autograd.Function):
    """Triton forward, and a Triton backward of three more chunked passes (dq causal, dk / dv anti-causal)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
        ctx.save_for_backward(q, k, v)
        ctx.chunk_size = chunk_size
        return _chunked_pass(q, k, v, chunk_size=chunk_size, reverse=False)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v = ctx.saved_tensors
        dout = dout.to(q.dtype)
        size = ctx.chunk_size
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq = _chunked_pass(dout, v, k, chunk_size=size, reverse=False) if need_q else None
        dk = _chunked_pass(v, dout, q, chunk_size=size, reverse=True) if need_k else None
        dv = _chunked_pass(k, q, dout, chunk_size=size, reverse=True) if need_v else None
        return dq, dk, dv, None


def causal_linear_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, chunk_size: int = 64
) -> torch.Tensor:
    """Unnormalised causal linear attention ``o_t = sum_{j <= t} (q_t . k_j) v_j``, chunked, in Triton.

    Args:
        q, k: ``(B, H, T, F)`` already feature-mapped queries and keys (no scale or feature map is applied).
        v: ``(B, H, T, Dv)`` values; ``Dv`` may differ from ``F`` (e.g. with a ones column appended).
        chunk_size: tokens per chunk, one of :data:`CHUNK_SIZES` (16, 32, 64, 128); it changes only rounding.

    Same dtype (fp32 / bf16 / fp16) and device for all three; F and Dv at most :data:`MAX_WIDTH`; any T >= 1.
    Returns ``(B, H, T, Dv)`` in the input dtype. Differentiable in q, k and v through Triton backward kernels.
    Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``; raises ``RuntimeError`` without triton.
    """
    if _chunked_linear_attention_kernel is None:
        raise RuntimeError(
            "causal_linear_attention_triton needs triton, which could not be imported; "
            "use causal_linear_attention_triton_reference"
        )
    _validate_qkv(q, k, v)
    _validate_kernel_args(q, v, chunk_size)
    check_kernel_runnable(_chunked_linear_attention_kernel, q, "causal_linear_attention_triton")
    return _CausalLinearAttention.apply(q, k, v, chunk_size)


def causal_linear_attention_triton_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The kernel's PyTorch reference: the masked quadratic form ``tril(q k^T) v`` in fp32, O(T^2) memory.

    Same arguments and checks as :func:`causal_linear_attention_triton` (no width limit); returns the input dtype.
    Differentiable through autograd.
    """
    _validate_qkv(q, k, v)
    scores = (q.float() @ k.float().transpose(-1, -2)).tril()  # diagonal included: token t sees itself
    return (scores @ v.float()).to(q.dtype)
