"""Max-L2 coarsening: reference vs. a per-block loop, Triton kernel vs. reference (bit-exact), dispatch, validation.

The Triton tests run under ``TRITON_INTERPRET=1`` (set by ``make test``) on CPU tensors, or on CUDA.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_icl.kernels import coarsen as coarsen_module
from hf_icl.kernels import coarsen_max_l2, coarsen_max_l2_reference, coarsen_max_l2_triton, triton_available

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

needs_triton = pytest.mark.skipif(
    not triton_available() or not (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()),
    reason="Triton kernels need CUDA or TRITON_INTERPRET=1 (set before triton is imported)",
)


def _qk(
    b: int, h: int, n_q: int, n_k: int, d: int, dtype: torch.dtype = torch.float32, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``q`` (b, h, n_q, d) and ``k`` (b, h, n_k, d), drawn in fp32 then cast (same values on any device)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=gen).to(dtype)
    k = torch.randn(b, h, n_k, d, generator=gen).to(dtype)
    return q.to(device), k.to(device)


def _with_ties(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Copy of ``x`` where later rows of some blocks tie exactly with an earlier row (copy or sign flip)."""
    x = x.clone()
    n = x.shape[2]
    for start in range(0, n, block_size):
        first, later = start + 1, start + block_size // 2
        if later < n:
            x[:, :, first] = x[:, :, first] * 4  # a clear winner...
            x[:, :, later] = -x[:, :, first]  # ...tied by its sign flip, later in the block
            if later + 1 < n:
                x[:, :, later + 1] = x[:, :, first]  # ...and by an exact copy
    if n > 1:
        x[:, :, n - 1] = 0  # a zero row, often alone in a partial block
    return x


def _loop_coarsen(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Independent per-block Python loop: first row of largest ``vector_norm`` among the block's real rows."""
    b, h, n, d = x.shape
    out = torch.empty(b, h, math.ceil(n / block_size), d, dtype=x.dtype)
    for i in range(b):
        for j in range(h):
            for blk, start in enumerate(range(0, n, block_size)):
                rows = range(start, min(start + block_size, n))
                norms = [torch.linalg.vector_norm(x[i, j, r].float()).item() for r in rows]
                best = norms.index(max(norms))  # list.index returns the first occurrence
                out[i, j, blk] = x[i, j, start + best]
    return out


def _assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    """Same dtype, shape and bits."""
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu(), w.cpu())


# ----------------------------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n_q", "n_k", "block_size"), [(16, 16, 16), (37, 70, 16), (5, 3, 16), (1, 1, 32), (100, 65, 32)]
)
def test_reference_matches_loop(n_q, n_k, block_size, dtype):
    q, k = _qk(2, 2, n_q, n_k, 32, dtype, seed=n_q + n_k)
    q, k = _with_ties(q, block_size), _with_ties(k, block_size)
    q_c, k_c = coarsen_max_l2_reference(q, k, block_size)
    assert q_c.shape == (2, 2, math.ceil(n_q / block_size), 32)
    assert k_c.shape == (2, 2, math.ceil(n_k / block_size), 32)
    _assert_same((q_c, k_c), (_loop_coarsen(q, block_size), _loop_coarsen(k, block_size)))


def test_reference_ties_pick_lowest_index():
    # Rows differ only by signs, so every row has exactly the same norm: each block's first row must win.
    signs = torch.tensor([[1.0 if (i >> bit) & 1 else -1.0 for bit in range(5)] for i in range(20)])
    q = torch.zeros(1, 1, 20, 32)
    q[0, 0, :, :5] = signs
    q_c, k_c = coarsen_max_l2_reference(q, q.flip(2), 16)
    assert torch.equal(q_c[0, 0, 0], q[0, 0, 0]) and torch.equal(q_c[0, 0, 1], q[0, 0, 16])
    assert torch.equal(k_c[0, 0, 0], q[0, 0, 19]) and torch.equal(k_c[0, 0, 1], q[0, 0, 3])


def test_reference_partial_block_ignores_padding():
    # The tail block's real rows are all zero: padding (-inf) must not win, the first real row must.
    q = torch.randn(1, 1, 18, 32)
    q[0, 0, 16:] = 0
    q_c, _ = coarsen_max_l2_reference(q, q, 16)
    assert torch.equal(q_c[0, 0, 1], q[0, 0, 16])


# ----------------------------------------------------------------------------------------------------------------
# Triton vs. reference (bit-exact)
# ----------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (7, 130), (129, 33), (300, 256)])
def test_triton_matches_reference_ragged(block_size, n_q, n_k):
    q, k = _qk(1, 2, n_q, n_k, 64, seed=block_size + n_q, device=DEVICE)
    _assert_same(coarsen_max_l2_triton(q, k, block_size), coarsen_max_l2_reference(q, k, block_size))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256])
def test_triton_matches_reference_dims_dtypes(head_dim, dtype):
    q, k = _qk(2, 1, 45, 70, head_dim, dtype, seed=head_dim, device=DEVICE)
    q, k = _with_ties(q, 16), _with_ties(k, 32)
    for block_size in (16, 32):
        _assert_same(coarsen_max_l2_triton(q, k, block_size), coarsen_max_l2_reference(q, k, block_size))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_ties_and_zero_blocks(dtype):
    q, k = _qk(1, 2, 50, 34, 96, dtype, seed=3, device=DEVICE)
    q, k = _with_ties(q, 16), _with_ties(k, 16)
    q[:, :, 16:32] = 0  # a block where every row ties at norm 0
    q_c, k_c = coarsen_max_l2_triton(q, k, 16)
    _assert_same((q_c, k_c), coarsen_max_l2_reference(q, k, 16))
    assert torch.equal(q_c[:, :, 1].cpu(), q[:, :, 16].cpu())
    _assert_same((q_c.cpu(), k_c.cpu()), (_loop_coarsen(q.cpu(), 16), _loop_coarsen(k.cpu(), 16)))


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_non_contiguous_inputs(dtype):
    # (B, N, H, D) -> (B, H, N, D) by a transpose, as after a head split of a projection.
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 40, 2, 64, generator=gen).to(dtype).to(DEVICE).transpose(1, 2)
    k = torch.randn(1, 70, 2, 64, generator=gen).to(dtype).to(DEVICE).transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous()
    _assert_same(coarsen_max_l2_triton(q, k, 16), coarsen_max_l2_reference(q.contiguous(), k.contiguous(), 16))
    # Strided head dim (every other column) and a token-major view obtained by a double transpose.
    wide = torch.randn(1, 2, 33, 128, generator=gen).to(dtype).to(DEVICE)
    q2 = wide[..., ::2]
    k2 = wide.transpose(2, 3).contiguous().transpose(2, 3)[..., 1::2]
    assert q2.stride(-1) == 2 and k2.stride(-2) == 1
    _assert_same(coarsen_max_l2_triton(q2, k2, 32), coarsen_max_l2_reference(q2.contiguous(), k2.contiguous(), 32))


@needs_triton
@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 2),
    n_q=st.integers(1, 150),
    n_k=st.integers(1, 150),
    head_dim=st.sampled_from([32, 48, 64, 80, 96, 128]),
    block_size=st.sampled_from([16, 32, 64, 128]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_triton_matches_reference_hypothesis(b, h, n_q, n_k, head_dim, block_size, dtype, seed):
    q, k = _qk(b, h, n_q, n_k, head_dim, dtype, seed=seed, device=DEVICE)
    _assert_same(coarsen_max_l2_triton(q, k, block_size), coarsen_max_l2_reference(q, k, block_size))


# ----------------------------------------------------------------------------------------------------------------
# Dispatcher
# ----------------------------------------------------------------------------------------------------------------


def test_dispatcher_auto_uses_reference_on_cpu(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the Triton path must not run for CPU tensors with backend='auto'")

    monkeypatch.setattr(coarsen_module, "coarsen_max_l2_triton", fail)
    q, k = _qk(1, 1, 20, 40, 32)
    _assert_same(coarsen_max_l2(q, k, 16), coarsen_max_l2_reference(q, k, 16))
    _assert_same(coarsen_max_l2(q, k, 16, backend="torch"), coarsen_max_l2_reference(q, k, 16))


@needs_triton
def test_dispatcher_backend_triton_runs_kernel(monkeypatch):
    calls = []
    real = coarsen_module.coarsen_max_l2_triton

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(coarsen_module, "coarsen_max_l2_triton", spy)
    q, k = _qk(1, 1, 20, 40, 32, device=DEVICE)
    _assert_same(coarsen_max_l2(q, k, 16, backend="triton"), coarsen_max_l2_reference(q, k, 16))
    assert len(calls) == 1


def test_dispatcher_rejects_unknown_backend():
    q, k = _qk(1, 1, 4, 4, 32)
    with pytest.raises(ValueError, match="backend"):
        coarsen_max_l2(q, k, 16, backend="cuda")


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------

_Q, _K = _qk(1, 2, 8, 8, 32)


@pytest.mark.parametrize("fn", [coarsen_max_l2_reference, coarsen_max_l2_triton, coarsen_max_l2])
@pytest.mark.parametrize(
    ("q", "k", "block_size", "match"),
    [
        (_Q[0], _K, 16, r"q must be 4-D"),
        (_Q, _K[0, 0], 16, r"k must be 4-D"),
        (_Q.numpy(), _K, 16, r"q must be a torch.Tensor"),
        (_Q, _K.double(), 16, r"k.dtype must be one of"),
        (_Q.int(), _K, 16, r"q.dtype must be one of"),
        (_Q, _K.half(), 16, r"q.dtype and k.dtype must be equal"),
        (_Q, _K[:, :, :0], 16, r"k must have at least 1 token"),
        (_Q, torch.cat([_K, _K]), 16, r"equal batch"),
        (_Q, _K[:, :1], 16, r"equal heads"),
        (_Q, _K[..., :16], 16, r"equal head_dim"),
        (_Q[..., :16], _K[..., :16], 16, r"head_dim \(q.shape\[3\]\) must be in \[32, 256\], got 16"),
        (torch.zeros(1, 1, 4, 512), torch.zeros(1, 1, 4, 512), 16, r"head_dim .* got 512"),
        (_Q, _K, 8, r"block_size must be a power of two in \[16, 128\].*got 8"),
        (_Q, _K, 256, r"block_size .* got 256"),
        (_Q, _K, 48, r"block_size .* got 48"),
        (_Q, _K, 16.0, r"block_size .* got 16.0"),
        (_Q, _K, True, r"block_size .* got True"),
    ],
)
def test_validation_errors(fn, q, k, block_size, match):
    with pytest.raises(ValueError, match=match):
        fn(q, k, block_size)


def test_validation_device_mismatch():
    q, k = _qk(1, 1, 4, 4, 32)
    with pytest.raises(ValueError, match="same device"):
        coarsen_max_l2_reference(q, k.to("meta"), 16)
