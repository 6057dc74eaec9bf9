"""Chunked causal linear-attention Triton kernel (forward + backward) vs. a float64 masked quadratic form.

The ground truth is written out here, independent of the module's reference: ``o = tril(q k^T) v`` in float64 on
the (already rounded) inputs, with gradients from float64 autograd. On CPU the kernels run under
``TRITON_INTERPRET=1``; shapes stay tiny (B * H = 2, T <= 100).
"""

from __future__ import annotations

import importlib

import pytest
import torch
from kernel_helpers import DEVICE, needs_triton

from hf_icl.kernels.linear_attention_triton import (
    causal_linear_attention_triton,
    causal_linear_attention_triton_reference,
)

# by module path, for monkeypatching the launcher and the kernel
lat_module = importlib.import_module("hf_icl.kernels.linear_attention_triton")

#: tolerance relative to the largest expected entry (atol) and to each entry (rtol)
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _inputs(t: int, f: int, dv: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """q, k (1, 2, t, f), v (1, 2, t, dv) and an upstream gradient (1, 2, t, dv): drawn in fp32, cast."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(1, 2, t, f), (1, 2, t, f), (1, 2, t, dv), (1, 2, t, dv)]
    return [torch.randn(shape, generator=gen).to(dtype).to(DEVICE) for shape in shapes]


def _expected(q, k, v, dout) -> list[torch.Tensor]:
    """``[o, dq, dk, dv]`` of ``tril(q k^T) v`` in float64 (diagonal included)."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = (leaves[0] @ leaves[1].transpose(-1, -2)).masked_fill(~causal, 0.0)
    out = scores @ leaves[2]
    out.backward(dout.double())
    return [out.detach()] + [x.grad for x in leaves]


def _kernel(q, k, v, dout, chunk_size: int) -> list[torch.Tensor]:
    """``[o, dq, dk, dv]`` of the Triton op on fresh leaf copies."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = causal_linear_attention_triton(*leaves, chunk_size=chunk_size)
    out.backward(dout)
    return [out.detach()] + [x.grad for x in leaves]


def _assert_close(actual: list[torch.Tensor], expected: list[torch.Tensor], dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected, strict=True):
        assert a.dtype == dtype and a.shape == e.shape, name
        scale = max(float(e.abs().max()), 1.0)
        torch.testing.assert_close(a.double(), e, atol=tol * scale, rtol=tol, msg=name)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("chunk_size", [16, 32])
@pytest.mark.parametrize("t", [1, 5, 16, 40, 100])
def test_forward_and_gradients_match_float64(t, chunk_size, dtype):
    q, k, v, dout = _inputs(t, 17, 9, dtype, seed=t)  # odd widths: F and Dv both padded by masks
    _assert_close(_kernel(q, k, v, dout, chunk_size), _expected(q, k, v, dout), dtype)


@needs_triton
@pytest.mark.parametrize(
    ("f", "dv", "dtype"),
    [
        (16, 16, torch.float32),
        (65, 9, torch.float32),  # 1 + 64 features: padded to 128
        (3, 70, torch.float32),  # 70 value columns: two column blocks of 64, and a 128-wide contraction backward
        (17, 16, torch.float16),
    ],
)
def test_feature_and_value_widths(f, dv, dtype):
    q, k, v, dout = _inputs(40, f, dv, dtype, seed=f + dv)
    _assert_close(_kernel(q, k, v, dout, 16), _expected(q, k, v, dout), dtype)


@needs_triton
def test_chunk_size_does_not_change_the_result():
    q, k, v, dout = _inputs(100, 17, 9, torch.float32, seed=3)
    results = {size: _kernel(q, k, v, dout, size) for size in (16, 32, 64, 128)}
    for size in (32, 64, 128):
        for a, b in zip(results[size], results[16], strict=True):
            scale = max(float(b.abs().max()), 1.0)
            torch.testing.assert_close(a, b, atol=1e-5 * scale, rtol=1e-5)


@needs_triton
def test_strided_inputs_and_broadcast_upstream_gradient():
    """Inputs read in place through their strides: a (B, T, H, F) transpose, and a stride-0 upstream gradient."""
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 21, 2, 16, generator=gen).to(DEVICE).transpose(1, 2) for _ in range(2))
    v = torch.randn(1, 2, 21, 32, generator=gen).to(DEVICE)[..., ::2]  # column stride 2
    assert not (q.is_contiguous() or v.is_contiguous())
    dout = torch.ones(1, 1, 1, 1, device=DEVICE).expand(1, 2, 21, 16)  # what out.sum().backward() sends
    _assert_close(_kernel(q, k, v, dout, 16), _expected(q, k, v, dout), torch.float32)


@needs_triton
def test_backward_runs_three_chunked_kernel_passes(monkeypatch):
    """The gradient comes from Triton passes (dq causal, dk / dv anti-causal), not from autograd through PyTorch."""
    calls = []
    original = lat_module._chunked_pass

    def spy(a, b, c, *, chunk_size, reverse):
        calls.append(reverse)
        return original(a, b, c, chunk_size=chunk_size, reverse=reverse)

    monkeypatch.setattr(lat_module, "_chunked_pass", spy)
    q, k, v, dout = _inputs(20, 16, 16, torch.float32)
    q.requires_grad_()
    out = causal_linear_attention_triton(q, k, v, chunk_size=16)
    assert calls == [False]
    out.backward(dout)  # only q needs a gradient: one causal pass
    assert calls == [False, False]
    _kernel(q, k, v, dout, 16)
    assert calls[2:] == [False, False, True, True]


def test_reference_is_the_masked_quadratic_form():
    q, k, v, dout = _inputs(9, 5, 3, torch.bfloat16)
    out = causal_linear_attention_triton_reference(q, k, v)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _expected(q, k, v, dout)[0], atol=2e-2, rtol=2e-2)


@needs_triton
def test_empty_batch():
    q, k, v = (torch.zeros(0, 2, 5, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out = causal_linear_attention_triton(q, k, v)
    out.sum().backward()
    assert out.shape == (0, 2, 5, 16) and q.grad.shape == q.shape


def _ok(t=4, f=16, dv=8, dtype=torch.float32):
    return (
        torch.zeros(1, 2, t, f, dtype=dtype),
        torch.zeros(1, 2, t, f, dtype=dtype),
        torch.zeros(1, 2, t, dv, dtype=dtype),
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((torch.zeros(2, 4, 16), *_ok()[1:]), {}, r"q must be 4-D"),
        ((*_ok(dtype=torch.float64),), {}, r"q.dtype must be one of"),
        ((_ok()[0], _ok(dtype=torch.float16)[1], _ok()[2]), {}, r"q.dtype and k.dtype must be equal"),
        ((_ok()[0], torch.zeros(1, 2, 4, 16, device="meta"), _ok()[2]), {}, r"q and k must be on the same device"),
        ((_ok()[0], _ok(f=8)[1], _ok()[2]), {}, r"k must have q's shape"),
        ((*_ok()[:2], _ok(t=5)[2]), {}, r"v must have q's \(B, H, T\)"),
        ((*_ok()[:2], torch.zeros(1, 2, 4, 0)), {}, r"v must have a last dimension >= 1"),
        ((*_ok(t=0),), {}, r"q must have at least 1 token"),
        (_ok(), {"chunk_size": 8}, r"chunk_size must be one of \[16, 32, 64, 128\], got 8"),
        (_ok(), {"chunk_size": 48}, r"chunk_size must be one of"),
        (_ok(), {"chunk_size": 256}, r"chunk_size must be one of"),
        (_ok(), {"chunk_size": True}, r"chunk_size must be an int power of two"),
        (_ok(), {"chunk_size": 16.0}, r"chunk_size must be an int power of two"),
        (_ok(f=257), {}, r"F \(q.shape\[3\]\) must be <= 256"),
        (_ok(dv=300), {}, r"Dv \(v.shape\[3\]\) must be <= 256"),
    ],
)
def test_validation_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        causal_linear_attention_triton(*args, **kwargs)


def test_reference_validates_but_has_no_width_limit():
    with pytest.raises(ValueError, match=r"q.dtype and v.dtype must be equal"):
        causal_linear_attention_triton_reference(*_ok()[:2], _ok(dtype=torch.bfloat16)[2])
    assert causal_linear_attention_triton_reference(*_ok(f=300)).shape == (1, 2, 4, 8)


def test_missing_triton_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(lat_module, "_chunked_linear_attention_kernel", None)
    with pytest.raises(RuntimeError, match=r"needs triton, which could not be imported"):
        causal_linear_attention_triton(*_ok())
