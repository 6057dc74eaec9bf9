"""Block-sparse attention backward kernels: Triton dq / dk / dv vs. autograd through the PyTorch reference.

Every kernel test runs :func:`block_sparse_flash_attention` with ``backend="triton"`` (Triton forward + backward) and
compares the output and the three gradients with autograd through ``backend="torch"`` on fp32 CPU copies of the
same inputs, with the same upstream gradient. Under ``TRITON_INTERPRET=1`` the shapes stay tiny (B * H <= 4,
N <= 80).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import DEVICE, left_padding_mask, needs_triton, qkv, random_keep

from hf_icl.kernels.block_sparse_attention import block_sparse_attention_forward
from hf_icl.kernels.block_sparse_backward import block_sparse_attention_backward_triton, block_sparse_flash_attention
from hf_icl.kernels.block_sparse_reference import token_mask

# by module path: the package's re-exported function names may shadow submodule attributes
bsb_module = importlib.import_module("hf_icl.kernels.block_sparse_backward")

#: gradient tolerance, relative to the largest expected entry (atol) and to each entry (rtol)
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _upstream(q: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A random upstream gradient shaped like the output (drawn in fp32, cast to q's dtype)."""
    return torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 500)).to(q.dtype).to(q.device)


def _out_and_grads(q, k, v, keep, dout, *, backend: str, **kwargs) -> list[torch.Tensor]:
    """``[out, dq, dk, dv]`` of ``block_sparse_flash_attention`` on fresh leaf copies of q / k / v."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = block_sparse_flash_attention(*leaves, keep, backend=backend, **kwargs)
    out.backward(dout)
    return [out.detach()] + [x.grad for x in leaves]


def _expected(q, k, v, keep, dout, key_padding_mask=None, **kwargs) -> list[torch.Tensor]:
    """The ground truth: autograd through the reference on fp32 CPU copies, moved back to the test device."""
    cpu = [x.detach().float().cpu() for x in (q, k, v, dout)]
    mask = None if key_padding_mask is None else key_padding_mask.cpu()
    results = _out_and_grads(*cpu[:3], keep.cpu(), cpu[3], backend="torch", key_padding_mask=mask, **kwargs)
    return [x.to(q.device) for x in results]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """``actual`` (any dtype) ≈ the fp32 ``expected``, within ``GRAD_TOL[dtype]`` scaled by the gradient's size."""
    tol = GRAD_TOL[dtype]
    scale = max(float(expected.abs().max()), 1.0)
    torch.testing.assert_close(actual.float(), expected, atol=tol * scale, rtol=tol)


def _check(q, k, v, keep, *, block_size: int, q_offset: int = 0, key_padding_mask=None, seed: int = 0):
    """Triton out / dq / dk / dv vs. the reference; returns the Triton results (``[out, dq, dk, dv]``)."""
    kwargs = {"block_size": block_size, "scaling": q.shape[3] ** -0.5, "q_offset": q_offset}
    dout = _upstream(q, seed)
    actual = _out_and_grads(q, k, v, keep, dout, backend="triton", key_padding_mask=key_padding_mask, **kwargs)
    expected = _expected(q, k, v, keep, dout, key_padding_mask=key_padding_mask, **kwargs)
    for name, got, want, like in zip(("out", "dq", "dk", "dv"), actual, expected, (q, q, k, v), strict=True):
        assert got.dtype == like.dtype and got.shape == like.shape, name
        assert torch.isfinite(got).all(), name
        _assert_close(got, want, q.dtype)
    return actual


# ----------------------------------------------------------------------------------------------------------------
# Kernels vs. autograd through the reference
# ----------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("n", "block_size"), [(40, 16), (72, 32)])
def test_grads_match_reference_self_attention(dtype: torch.dtype, n: int, block_size: int) -> None:
    """Self-attention with ragged N (40 = 2.5 blocks of 16, 72 = 2.25 blocks of 32), random selections."""
    q, k, v = qkv(1, 2, n, n, 32, dtype, seed=n)
    keep = random_keep(1, 2, n, n, block_size, seed=n)
    _check(q, k, v, keep, block_size=block_size, seed=n)


@needs_triton
@pytest.mark.parametrize(("head_dim", "dtype", "batch"), [(64, torch.float16, 1), (128, torch.float32, 2)])
def test_grads_larger_head_dims(head_dim: int, dtype: torch.dtype, batch: int) -> None:
    """Head dims 64 and 128 (the largest, with batch 2), ragged N."""
    q, k, v = qkv(batch, 1, 40, 40, head_dim, dtype, seed=head_dim)
    keep = random_keep(batch, 1, 40, 40, 16, seed=head_dim)
    _check(q, k, v, keep, block_size=16, seed=head_dim)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n_q", "n_k", "q_offset"), [(32, 80, 48), (20, 52, 32)])
def test_grads_prefill_chunk_with_kv_prefix(dtype: torch.dtype, n_q: int, n_k: int, q_offset: int) -> None:
    """A prefill chunk after a cached prefix: Nk > Nq, block-aligned q_offset (the second case ragged in both)."""
    q, k, v = qkv(1, 2, n_q, n_k, 32, dtype, seed=n_q)
    keep = random_keep(1, 2, n_q, n_k, 16, q_offset=q_offset, seed=n_k)
    _check(q, k, v, keep, block_size=16, q_offset=q_offset, seed=n_k)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_grads_grouped_query_attention(dtype: torch.dtype, kv_heads: int) -> None:
    """4 query heads over 2 or 1 KV heads: dk / dv have k's shape and sum the group's contributions."""
    q, k, v = qkv(1, 4, 40, 40, 32, dtype, seed=kv_heads, kv_heads=kv_heads)
    keep = random_keep(1, 4, 40, 40, 16, seed=kv_heads)  # a different selection per query head
    _, _, dk, dv = _check(q, k, v, keep, block_size=16, seed=kv_heads)
    assert dk.shape == dv.shape == (1, kv_heads, 40, 32)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n_q", "n_k", "q_offset", "lengths"), [(40, 40, 0, [40, 23]), (20, 52, 32, [52, 10])])
def test_grads_key_padding(dtype: torch.dtype, n_q: int, n_k: int, q_offset: int, lengths: list[int]) -> None:
    """Left-padded rows: padded keys get no gradient; queries that see no real key output 0 and get dq = 0."""
    q, k, v = qkv(2, 2, n_q, n_k, 32, dtype, seed=n_k)
    keep = random_keep(2, 2, n_q, n_k, 16, q_offset=q_offset, p=0.6, seed=n_q)
    mask = left_padding_mask(lengths, n_k)
    out, dq, dk, dv = _check(q, k, v, keep, block_size=16, q_offset=q_offset, key_padding_mask=mask, seed=n_k)
    visible = (token_mask(keep, 16, n_q, n_k, q_offset) & mask[:, None, None, :]).sum(-1)  # keys per query
    blind = visible == 0
    assert blind[1].any() and not blind[0].any()  # row 1's first queries see only padding
    assert torch.equal(out[blind], torch.zeros_like(out[blind]))
    assert torch.equal(dq[blind], torch.zeros_like(dq[blind]))
    # every query that sees two or more keys gets a gradient (with a single key p = 1, so ds = 0)
    assert dq.abs().amax(-1)[visible >= 2].gt(0).all()
    padded = ~mask[1]
    for grad in (dk, dv):
        assert torch.equal(grad[1, :, padded], torch.zeros_like(grad[1, :, padded]))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grads_diagonal_only(dtype: torch.dtype) -> None:
    """Rows that keep only their diagonal block (local causal attention inside each block), ragged N."""
    n, bs = 40, 16
    q, k, v = qkv(1, 2, n, n, 32, dtype, seed=7)
    keep = torch.eye(math.ceil(n / bs), dtype=torch.bool, device=DEVICE).expand(1, 2, -1, -1).contiguous()
    _check(q, k, v, keep, block_size=bs, seed=7)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grads_dense_equal_causal_sdpa(dtype: torch.dtype) -> None:
    """With every block kept, the gradients are those of plain causal attention (SDPA, is_causal=True)."""
    n, bs, d = 56, 16, 32
    q, k, v = qkv(1, 2, n, n, d, dtype, seed=11)
    keep = torch.ones(1, 2, math.ceil(n / bs), math.ceil(n / bs), dtype=torch.bool, device=DEVICE)
    dout = _upstream(q, 11)
    actual = _out_and_grads(q, k, v, keep, dout, backend="triton", block_size=bs, scaling=d**-0.5)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True, scale=d**-0.5)
    out.backward(dout.float())
    for got, want in zip(actual, [out.detach()] + [x.grad for x in leaves], strict=True):
        _assert_close(got, want, dtype)


@needs_triton
def test_unselected_key_block_gets_zero_grads() -> None:
    """Key block 0 of the prefix is selected by no query block: its dk and dv are exactly 0, the rest are not."""
    n_q, n_k, bs, offset = 32, 64, 16, 32
    q, k, v = qkv(1, 2, n_q, n_k, 32, seed=13)
    # query blocks sit at key blocks 2 and 3; block 0 is never kept, block 1 only by query block 0
    keep = torch.tensor([[False, True, True, False], [False, False, True, True]], device=DEVICE)
    keep = keep.expand(1, 2, -1, -1).contiguous()
    _, _, dk, dv = _check(q, k, v, keep, block_size=bs, q_offset=offset, seed=13)
    for grad in (dk, dv):
        assert torch.equal(grad[:, :, :bs], torch.zeros_like(grad[:, :, :bs]))
        assert grad[:, :, bs:].abs().amax(-1).gt(0).all()


@needs_triton
def test_rows_whose_selection_is_all_future_get_no_gradient() -> None:
    """A query block keeping only a future key block sees nothing: output 0, dq 0, and it adds nothing to dk / dv."""
    n, bs = 32, 16
    q, k, v = qkv(1, 1, n, n, 32, seed=9)
    keep = torch.tensor([[[[False, True], [False, True]]]], device=DEVICE)
    out, dq, dk, dv = _check(q, k, v, keep, block_size=bs, seed=9)
    assert torch.equal(out[:, :, :bs], torch.zeros_like(out[:, :, :bs]))
    assert torch.equal(dq[:, :, :bs], torch.zeros_like(dq[:, :, :bs]))
    assert torch.equal(dk[:, :, :bs], torch.zeros_like(dk[:, :, :bs]))  # key block 0 is kept by nobody


@needs_triton
def test_grads_strided_inputs() -> None:
    """q / k / v are strided views of one (B, N, H, 3 * D) leaf and the upstream gradient is strided too."""
    n, bs, d = 40, 16, 32
    base = torch.randn(1, n, 2, 3 * d, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    dout = torch.randn(1, n, 2, d, generator=torch.Generator().manual_seed(6)).to(DEVICE).transpose(1, 2)
    keep = random_keep(1, 2, n, n, bs, seed=5)
    kwargs = {"block_size": bs, "scaling": d**-0.5}

    def base_grad(backend: str) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = base.clone().requires_grad_()
        q, k, v = (leaf[..., i * d : (i + 1) * d].transpose(1, 2) for i in range(3))
        assert not q.is_contiguous() and not dout.is_contiguous()
        out = block_sparse_flash_attention(q, k, v, keep, backend=backend, **kwargs)
        out.backward(dout)
        return out.detach(), leaf.grad

    out, grad = base_grad("triton")
    expected_out, expected_grad = base_grad("torch")
    _assert_close(out, expected_out, torch.float32)
    _assert_close(grad, expected_grad, torch.float32)


@needs_triton
def test_backward_entry_point_matches_autograd_op() -> None:
    """The kernel entry point, fed the forward's out and lse, returns the autograd op's gradients."""
    n, bs = 40, 16
    q, k, v = qkv(1, 2, n, n, 32, torch.float16, seed=17, kv_heads=1)
    keep = random_keep(1, 2, n, n, bs, seed=17)
    kwargs = {"block_size": bs, "scaling": 32**-0.5}
    out, lse = block_sparse_attention_forward(q, k, v, keep, return_lse=True, backend="triton", **kwargs)
    dout = _upstream(q, 17)
    grads = block_sparse_attention_backward_triton(q, k, v, out, lse, dout, keep, **kwargs)
    via_op = _out_and_grads(q, k, v, keep, dout, backend="triton", **kwargs)
    torch.testing.assert_close(out, via_op[0], atol=0, rtol=0)
    for got, want, like in zip(grads, via_op[1:], (q, k, v), strict=True):
        assert got.dtype == like.dtype and got.shape == like.shape
        torch.testing.assert_close(got, want, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Dispatch and validation
# ----------------------------------------------------------------------------------------------------------------


def test_auto_backend_on_cpu_never_calls_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' on CPU tensors differentiates through the reference, even under the interpreter."""

    def _fail(*args, **kwargs):
        raise AssertionError("a Triton kernel must not run for CPU tensors with backend='auto'")

    monkeypatch.setattr(bsb_module._BlockSparseFlashAttention, "apply", _fail)
    monkeypatch.setattr(bsb_module, "block_sparse_attention_triton", _fail)
    monkeypatch.setattr(bsb_module, "block_sparse_attention_backward_triton", _fail)
    q, k, v = (x.cpu() for x in qkv(1, 2, 24, 24, 32, seed=2, kv_heads=1))
    keep = random_keep(1, 2, 24, 24, 16, seed=2).cpu()
    dout = _upstream(q, 2)
    kwargs = {"block_size": 16, "scaling": 0.2}
    auto = _out_and_grads(q, k, v, keep, dout, backend="auto", **kwargs)
    reference = _out_and_grads(q, k, v, keep, dout, backend="torch", **kwargs)
    for got, want in zip(auto, reference, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def _backward_inputs() -> dict:
    """Valid arguments of ``block_sparse_attention_backward_triton`` on CPU (the checks run before any kernel)."""
    q, k, v = (x.cpu() for x in qkv(1, 2, 32, 32, 32, seed=1))
    keep = random_keep(1, 2, 32, 32, 16, seed=1).cpu()
    out = torch.zeros_like(q)
    lse = torch.zeros(1, 2, 32)
    return {"q": q, "k": k, "v": v, "out": out, "lse": lse, "dout": torch.zeros_like(q), "keep": keep}


@pytest.mark.parametrize(
    ("name", "change", "match"),
    [
        (
            "lse",
            lambda x: x.half(),
            r"lse must be a torch\.float32 tensor of shape \(1, 2, 32\) on cpu, got torch\.float16",
        ),
        ("lse", lambda x: x[..., :-1], r"lse must be a torch\.float32 tensor of shape \(1, 2, 32\).*\(1, 2, 31\)"),
        ("lse", lambda x: x[..., None], r"lse must be a torch\.float32 tensor of shape \(1, 2, 32\).*\(1, 2, 32, 1\)"),
        ("dout", lambda x: x[:, :, :16], r"dout must be a torch\.float32 tensor of shape \(1, 2, 32, 32\).*16, 32\)"),
        ("dout", lambda x: x.half(), r"dout must be a torch\.float32 tensor.*got torch\.float16"),
        ("out", lambda x: x[:, :1], r"out must be a torch\.float32 tensor of shape \(1, 2, 32, 32\).*\(1, 1, 32"),
        ("keep", lambda x: x[:, :, :1], r"keep must have shape \(B, H, Mq, Mk\)"),
        ("q", lambda x: x.double(), r"q\.dtype must be one of"),
    ],
)
def test_backward_validation(name: str, change, match: str) -> None:
    """Clear ValueErrors naming the argument, its expected dtype / shape and what it got."""
    inputs = _backward_inputs()
    inputs[name] = change(inputs[name])
    with pytest.raises(ValueError, match=match):
        block_sparse_attention_backward_triton(**inputs, block_size=16, scaling=0.2)


def test_flash_attention_validation_before_any_kernel() -> None:
    """The differentiable op validates its inputs on either backend (here a misaligned chunk offset)."""
    q, k, v = (x.cpu() for x in qkv(1, 1, 32, 48, 32, seed=3))
    keep = torch.ones(1, 1, 2, 3, dtype=torch.bool)
    for backend in ("auto", "triton", "torch"):
        with pytest.raises(ValueError, match="q_offset must be a multiple of block_size=16"):
            block_sparse_flash_attention(q, k, v, keep, block_size=16, scaling=0.2, q_offset=8, backend=backend)
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        block_sparse_flash_attention(
            q, k, v, keep, block_size=16, scaling=0.2, key_padding_mask=torch.ones(1, 32, dtype=torch.bool)
        )
