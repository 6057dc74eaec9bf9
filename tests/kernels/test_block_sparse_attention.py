"""Block-sparse attention forward kernel: Triton vs. the PyTorch reference, lse, dispatch, validation.

The Triton tests run under ``TRITON_INTERPRET=1`` (set by ``make test``) on CPU tensors, or on CUDA. The interpreter
is slow, so shapes stay tiny (B * H <= 2, N <= 96).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import DEVICE, LOOSE, needs_triton, qkv, random_keep

from hf_icl.kernels import block_sparse_attention as bsa_module
from hf_icl.kernels.block_sparse_attention import (
    block_sparse_attention_forward,
    block_sparse_attention_reference,
    block_sparse_attention_triton,
)
from hf_icl.kernels.block_sparse_reference import block_sparse_attention, selected_block_indices, token_mask


def _expected(q, k, v, keep, block_size: int, scaling: float, q_offset: int) -> torch.Tensor:
    """The reference on fp32 copies of the inputs (the ground truth for every dtype)."""
    return block_sparse_attention(
        q.float(), k.float(), v.float(), keep, block_size=block_size, scaling=scaling, q_offset=q_offset
    )


def _run_and_compare(q, k, v, keep, block_size: int, q_offset: int = 0) -> None:
    """Run the kernel (via the dispatcher, backend='triton') and compare output and lse with the references."""
    n_q, n_k = q.shape[2], k.shape[2]
    scaling = q.shape[3] ** -0.5
    out, lse = block_sparse_attention_forward(
        q, k, v, keep, block_size=block_size, scaling=scaling, q_offset=q_offset, return_lse=True, backend="triton"
    )
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    tol = LOOSE[q.dtype]
    expected = _expected(q, k, v, keep, block_size, scaling, q_offset)
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scaling
    allowed = token_mask(keep, block_size, n_q, n_k, q_offset)
    expected_lse = torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    torch.testing.assert_close(lse, expected_lse, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Kernel vs. reference
# ----------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize(("n", "block_size"), [(40, 16), (64, 32)])
def test_kernel_matches_reference_self_attention(dtype: torch.dtype, head_dim: int, n: int, block_size: int) -> None:
    """Self-attention (Nq == Nk), ragged N = 40 with 16-token blocks and N = 64 with 32-token blocks."""
    q, k, v = qkv(1, 2, n, n, head_dim, dtype, seed=head_dim + n)
    keep = random_keep(1, 2, n, n, block_size, seed=n)
    _run_and_compare(q, k, v, keep, block_size)


@needs_triton
def test_kernel_head_dim_128() -> None:
    """The largest head dim, batch 2, ragged N."""
    q, k, v = qkv(2, 1, 50, 50, 128, torch.float32, seed=3)
    keep = random_keep(2, 1, 50, 50, 16, seed=3)
    _run_and_compare(q, k, v, keep, 16)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n_q", "n_k", "q_offset"), [(32, 80, 48), (20, 52, 32)])
def test_kernel_prefill_chunk_with_offset(dtype: torch.dtype, n_q: int, n_k: int, q_offset: int) -> None:
    """A cached prefill chunk: Nq != Nk, queries start at a block-aligned offset (second case ragged in both)."""
    q, k, v = qkv(1, 2, n_q, n_k, 32, dtype, seed=n_q)
    keep = random_keep(1, 2, n_q, n_k, 16, q_offset=q_offset, seed=n_k)
    _run_and_compare(q, k, v, keep, 16, q_offset)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("n_k", "q_offset"), [(45, 44), (45, 21), (96, 95)])
def test_kernel_decode(dtype: torch.dtype, n_k: int, q_offset: int) -> None:
    """Decode (Nq == 1) at any offset; with q_offset < Nk - 1 the later keys are in the future and masked."""
    q, k, v = qkv(1, 2, 1, n_k, 64, dtype, seed=q_offset)
    keep = random_keep(1, 2, 1, n_k, 16, q_offset=q_offset, p=0.4, seed=q_offset)
    _run_and_compare(q, k, v, keep, 16, q_offset)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_diagonal_only(dtype: torch.dtype) -> None:
    """Rows keeping only their diagonal block (local causal attention inside each block)."""
    n, bs = 48, 16
    q, k, v = qkv(1, 2, n, n, 32, dtype, seed=7)
    keep = torch.eye(n // bs, dtype=torch.bool, device=DEVICE).expand(1, 2, -1, -1).contiguous()
    _run_and_compare(q, k, v, keep, bs)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_dense_equals_causal_sdpa(dtype: torch.dtype) -> None:
    """A fully dense keep is plain causal attention."""
    n, bs, d = 56, 16, 32
    q, k, v = qkv(1, 2, n, n, d, dtype, seed=11)
    keep = torch.ones(1, 2, math.ceil(n / bs), math.ceil(n / bs), dtype=torch.bool, device=DEVICE)
    out = block_sparse_attention_forward(q, k, v, keep, block_size=bs, scaling=d**-0.5, backend="triton")
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, scale=d**-0.5)
    tol = LOOSE[dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@needs_triton
def test_kernel_direct_call_strided_int32_and_padded_slots() -> None:
    """The kernel itself: non-contiguous inputs, int32 ids, and junk ids beyond ``counts`` that must be ignored."""
    n, bs, d = 40, 16, 32
    base = torch.randn(1, n, 2, 3 * d, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    q, k, v = (base[..., i * d : (i + 1) * d].transpose(1, 2) for i in range(3))  # (1, 2, n, d), strided
    assert not q.is_contiguous()
    keep = random_keep(1, 2, n, n, bs, seed=5)
    indices, valid = selected_block_indices(keep)
    assert not valid.all()  # some slots past counts hold ids of blocks that were not selected
    counts = valid.sum(-1).to(torch.int32)
    indices = torch.cat([indices, torch.zeros_like(indices[..., :1])], dim=-1).to(torch.int32)  # one more unused
    out = block_sparse_attention_triton(q, k, v, indices, counts, block_size=bs, scaling=0.2)
    expected = block_sparse_attention(q, k, v, keep, block_size=bs, scaling=0.2)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@needs_triton
def test_kernel_row_without_visible_keys_gives_zeros() -> None:
    """A query block whose selection lies wholly in its future sees nothing: zeros and lse = -inf, never NaN."""
    n, bs = 32, 16
    q, k, v = qkv(1, 1, n, n, 32, seed=9)
    keep = torch.tensor([[[[False, True], [False, True]]]], device=DEVICE)
    out, lse = block_sparse_attention_forward(
        q, k, v, keep, block_size=bs, scaling=0.2, return_lse=True, backend="triton"
    )
    assert torch.equal(out[:, :, :bs], torch.zeros_like(out[:, :, :bs]))
    assert torch.isneginf(lse[:, :, :bs]).all()
    expected = _expected(q, k, v, keep, bs, 0.2, 0)
    torch.testing.assert_close(out[:, :, bs:], expected[:, :, bs:], atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Reference path and dispatch
# ----------------------------------------------------------------------------------------------------------------


def test_reference_lse_matches_logsumexp() -> None:
    """The reference path's lse is a plain masked logsumexp; its output is the block-sparse reference."""
    n_q, n_k, bs, offset = 20, 52, 16, 32
    q, k, v = (x.cpu() for x in qkv(1, 2, n_q, n_k, 32, seed=4))
    keep = random_keep(1, 2, n_q, n_k, bs, q_offset=offset, seed=4).cpu()
    out, lse = block_sparse_attention_reference(
        q, k, v, keep, block_size=bs, scaling=0.3, q_offset=offset, return_lse=True
    )
    torch.testing.assert_close(out, block_sparse_attention(q, k, v, keep, block_size=bs, scaling=0.3, q_offset=offset))
    scores = (q @ k.transpose(-1, -2)) * 0.3
    expected = torch.logsumexp(scores.masked_fill(~token_mask(keep, bs, n_q, n_k, offset), float("-inf")), dim=-1)
    torch.testing.assert_close(lse, expected)


def test_auto_backend_uses_reference_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' never calls the kernel for CPU tensors (even under the interpreter)."""

    def _fail(*args, **kwargs):
        raise AssertionError("the Triton kernel must not run for CPU tensors with backend='auto'")

    monkeypatch.setattr(bsa_module, "block_sparse_attention_triton", _fail)
    q, k, v = (x.cpu() for x in qkv(1, 1, 24, 24, 32, seed=2))
    keep = random_keep(1, 1, 24, 24, 16, seed=2).cpu()
    out = block_sparse_attention_forward(q, k, v, keep, block_size=16, scaling=0.2)
    torch.testing.assert_close(out, block_sparse_attention(q, k, v, keep, block_size=16, scaling=0.2))
    out_ref = block_sparse_attention_forward(q, k, v, keep, block_size=16, scaling=0.2, backend="torch")
    torch.testing.assert_close(out, out_ref)


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


#: a (B, Nk / 2) key padding mask for the (1, 2, 32, 32) inputs below: a wrong shape on either backend
_SHORT_KEY_MASK = {"key_padding_mask": torch.ones(1, 16, dtype=torch.bool)}


def _valid_inputs():
    q, k, v = (x.cpu() for x in qkv(1, 2, 32, 32, 32, seed=1))
    keep = random_keep(1, 2, 32, 32, 16, seed=1).cpu()
    return q, k, v, keep


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda q, k, v, keep: (q.double(), k, v, keep, {}), "q.dtype must be one of"),
        (lambda q, k, v, keep: (q, k.half(), v, keep, {}), "q.dtype and k.dtype must be equal"),
        (lambda q, k, v, keep: (q[0], k, v, keep, {}), "q must be 4-D"),
        (lambda q, k, v, keep: (q, k, v[:, :, :16], keep, {}), "k and v must have equal shapes"),
        (lambda q, k, v, keep: (q[..., :16], k[..., :16], v[..., :16], keep, {}), "head_dim"),
        (lambda q, k, v, keep: (q, k, v, keep, {"block_size": 24}), "block_size must be one of"),
        (lambda q, k, v, keep: (q, k, v, keep, {"q_offset": 8}), "q_offset must be a multiple"),
        (lambda q, k, v, keep: (q, k, v, keep, {"q_offset": -16}), "q_offset must be an int >= 0"),
        (lambda q, k, v, keep: (q, k, v, keep.int(), {}), "keep.dtype must be torch.bool"),
        (lambda q, k, v, keep: (q, k, v, keep[:, :, :1], {}), "keep must have shape"),
        (lambda q, k, v, keep: (q, k, v, torch.zeros_like(keep), {}), "at least one key block"),
        (lambda q, k, v, keep: (q, k, v, keep, {"backend": "cuda"}), "backend"),
        (lambda q, k, v, keep: (q, k, v, keep, _SHORT_KEY_MASK), r"key_padding_mask must have shape \(B, Nk\)"),
        (
            lambda q, k, v, keep: (q, k, v, keep, {**_SHORT_KEY_MASK, "backend": "triton"}),
            r"key_padding_mask must have shape \(B, Nk\)",
        ),
    ],
)
def test_dispatcher_validation(change, match: str) -> None:
    """Clear ValueErrors from the dispatcher, on either backend."""
    q, k, v, keep, extra = change(*_valid_inputs())
    kwargs = {"block_size": 16, "scaling": 0.2, **extra}
    with pytest.raises(ValueError, match=match):
        block_sparse_attention_forward(q, k, v, keep, **kwargs)


def test_decode_accepts_unaligned_offset_on_reference() -> None:
    """Nq == 1 may start at any offset; Nq > 1 may not (checked above)."""
    q, k, v = (x.cpu() for x in qkv(1, 1, 1, 40, 32, seed=6))
    keep = torch.ones(1, 1, 1, 3, dtype=torch.bool)
    out = block_sparse_attention_forward(q, k, v, keep, block_size=16, scaling=0.2, q_offset=37)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("counts_zero", r"counts must be in \[1, K="),
        ("counts_too_big", r"counts must be in \[1, K="),
        ("index_out_of_range", r"indices must be key-block ids in \[0, Mk="),
        ("float_indices", "indices.dtype must be one of"),
        ("indices_shape", "indices must have shape"),
        ("counts_shape", "counts must have shape"),
    ],
)
def test_kernel_selection_validation(kind: str, match: str) -> None:
    """The kernel entry point checks ``indices`` / ``counts`` before launching anything."""
    q, k, v, keep = _valid_inputs()
    indices, valid = selected_block_indices(keep)
    counts = valid.sum(-1)
    if kind == "counts_zero":
        counts = torch.zeros_like(counts)
    elif kind == "counts_too_big":
        counts = counts + indices.shape[-1]
    elif kind == "index_out_of_range":
        indices = indices + 5
    elif kind == "float_indices":
        indices = indices.float()
    elif kind == "indices_shape":
        indices = indices[:, :, :1]
    elif kind == "counts_shape":
        counts = counts[..., None]
    with pytest.raises(ValueError, match=match):
        block_sparse_attention_triton(q, k, v, indices, counts, block_size=16, scaling=0.2)


def test_kernel_entry_points_without_triton_raise_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where triton cannot be imported, the kernel entry points say so (the dispatchers use the reference)."""
    from hf_icl.kernels import _common

    monkeypatch.setattr(_common, "triton", None)
    q, k, v, keep = _valid_inputs()
    indices, valid = selected_block_indices(keep)
    with pytest.raises(RuntimeError, match="block_sparse_attention_triton needs triton"):
        block_sparse_attention_triton(q, k, v, indices, valid.sum(-1), block_size=16, scaling=0.2)
