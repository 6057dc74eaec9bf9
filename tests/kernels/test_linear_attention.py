"""Causal linear attention (hf_icl.kernels.linear_attention) against float64 references written from the definition.

The references below never call the code under test: φ is written out per map, and the output is a loop over t of
S_t = Σ_{j≤t} φ(k_j) v_jᵀ, z_t = Σ_{j≤t} φ(k_j), o_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps).
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import sys
import types

import pytest
import torch

from hf_icl.kernels import linear_attention as la
from hf_icl.kernels.linear_attention import (
    BACKENDS,
    FEATURE_MAPS,
    MODES,
    QUADRATIC_MAPS,
    QUADRATIC_MAX_HEAD_DIM,
    apply_feature_map,
    causal_linear_attention,
    feature_dim,
    linear_attention_state,
    linear_attention_step,
)

EPS = 1e-6
TRITON_MODULE = "hf_icl.kernels.linear_attention_triton"


# ----------------------------------------------------------------------------------------------------------------
# Independent references
# ----------------------------------------------------------------------------------------------------------------


def phi_reference(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "squared_relu":
        return x.clamp(min=0) ** 2
    if name == "relu":
        return x.clamp(min=0)
    if name == "elu_plus_one":  # elu(x) + 1 = x + 1 above 0, exp(x) below
        return torch.where(x > 0, x + 1, torch.exp(x))
    if name == "identity":
        return x
    dim = x.shape[-1]
    if name == "quadratic":  # the study's appendix: [1, x_1, …, x_D, x_1², x_1x_2, …, x_1x_D, x_2², …, x_D²]
        products = [x[..., i] * x[..., j] for i in range(dim) for j in range(i, dim)]
    else:
        assert name == "quadratic_full"  # every ordered product x_i x_j
        products = [x[..., i] * x[..., j] for i in range(dim) for j in range(dim)]
    return torch.cat([torch.ones_like(x[..., :1]), x, torch.stack(products, dim=-1)], dim=-1)


ELEMENTWISE_MAPS = [name for name in FEATURE_MAPS if name not in QUADRATIC_MAPS]


def reference(q, k, v, feature_map, *, normalize=True, eps=EPS, scale=None, key_mask=None) -> torch.Tensor:
    """float64 loop over (b, t), each S_t and z_t summed afresh over the real keys j ≤ t."""
    q, k, v = (x.detach().double() for x in (q, k, v))
    batch, heads, tokens, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    fq, fk = phi_reference(q * scale, feature_map), phi_reference(k * scale, feature_map)
    real = torch.ones(batch, tokens, dtype=torch.bool) if key_mask is None else key_mask
    out = torch.zeros(batch, heads, tokens, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for t in range(tokens):
            if not real[b, t]:
                continue
            keys = [j for j in range(t + 1) if real[b, j]]
            s = torch.einsum("hjf,hjd->hfd", fk[b][:, keys], v[b][:, keys])
            z = fk[b][:, keys].sum(dim=1)
            numerator = torch.einsum("hf,hfd->hd", fq[b, :, t], s)
            denominator = (fq[b, :, t] * z).sum(dim=-1, keepdim=True) + eps
            out[b, :, t] = numerator / denominator if normalize else numerator
    return out


def reference_state(k, v, feature_map, *, scale=None, key_mask=None):
    k, v = k.double(), v.double()
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    fk = phi_reference(k * scale, feature_map)
    if key_mask is not None:
        fk = fk * key_mask[:, None, :, None]
        v = v * key_mask[:, None, :, None]
    return torch.einsum("bhjf,bhjd->bhfd", fk, v), fk.sum(dim=2)


def make_qkv(batch=2, heads=2, tokens=13, head_dim=4, value_dim=3, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, heads, tokens, head_dim, generator=generator, dtype=dtype) for _ in range(2))
    v = torch.randn(batch, heads, tokens, value_dim, generator=generator, dtype=dtype)
    return q, k, v


def unnormalised_torch(phi_q, phi_k, v):
    """Σ_{j≤t} (φq_t·φk_j) v_j, written as a causal mask on the full score matrix (for fake backends)."""
    tokens = phi_q.shape[-2]
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    return ((phi_q @ phi_k.transpose(-1, -2)) * causal) @ v


# ----------------------------------------------------------------------------------------------------------------
# Forward values
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_matches_definition(feature_map, normalize, mode):
    q, k, v = make_qkv()
    out = causal_linear_attention(q, k, v, feature_map=feature_map, normalize=normalize, mode=mode, chunk_size=4)
    expected = reference(q, k, v, feature_map, normalize=normalize)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("tokens", [1, 7, 64, 100])
@pytest.mark.parametrize("feature_map", ["elu_plus_one", "squared_relu"])
def test_ragged_lengths_chunked(feature_map, tokens, chunk_size):
    # elu_plus_one has φ(0) = 1: zero-padding the last chunk before φ instead of after would show.
    q, k, v = make_qkv(batch=1, tokens=tokens, seed=tokens)
    out = causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=chunk_size)
    torch.testing.assert_close(out, reference(q, k, v, feature_map), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", MODES)
def test_explicit_scale_and_eps(mode):
    q, k, v = make_qkv(seed=3)
    out = causal_linear_attention(q, k, v, feature_map="relu", scale=0.7, eps=0.5, mode=mode, chunk_size=5)
    torch.testing.assert_close(out, reference(q, k, v, "relu", scale=0.7, eps=0.5), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_auto_and_torch_backends_agree(backend):
    q, k, v = make_qkv(seed=4)
    out = causal_linear_attention(q, k, v, backend=backend)
    torch.testing.assert_close(out, reference(q, k, v, "squared_relu"), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(dtype, mode):
    q, k, v = make_qkv(heads=2, tokens=40, head_dim=8, value_dim=8, dtype=torch.float32, seed=5)
    out = causal_linear_attention(q.to(dtype), k.to(dtype), v.to(dtype), mode=mode, chunk_size=16)
    assert out.dtype == dtype
    full = causal_linear_attention(q, k, v, mode=mode, chunk_size=16)
    # inputs rounded to 8 (bf16) or 11 (fp16) mantissa bits, accumulation in fp32, output rounded once more
    torch.testing.assert_close(out.float(), full, rtol=2e-2, atol=2e-2)


# ----------------------------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------------------------


def grads(mode, q, k, v, upstream, **kwargs):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = causal_linear_attention(q, k, v, mode=mode, chunk_size=4, **kwargs)
    return torch.autograd.grad((out * upstream).sum(), (q, k, v))


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_gradients_match_parallel(feature_map, normalize, mode):
    q, k, v = make_qkv(tokens=11, seed=6)
    upstream = torch.randn(2, 2, 11, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    key_mask = torch.ones(2, 11, dtype=torch.bool)
    key_mask[1, :3] = False  # one left-padded row
    kwargs = {"feature_map": feature_map, "normalize": normalize, "key_mask": key_mask}
    expected = grads("parallel", q, k, v, upstream, **kwargs)
    torch.testing.assert_close(grads(mode, q, k, v, upstream, **kwargs), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("feature_map", ["elu_plus_one", "quadratic", "quadratic_full"])
def test_gradcheck_chunked(feature_map):
    q, k, v = (x.requires_grad_() for x in make_qkv(batch=1, heads=1, tokens=5, head_dim=2, value_dim=2, seed=7))

    def op(q, k, v):
        return causal_linear_attention(q, k, v, feature_map=feature_map, chunk_size=2)

    assert torch.autograd.gradcheck(op, (q, k, v))


# ----------------------------------------------------------------------------------------------------------------
# key_mask
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("feature_map", ["elu_plus_one", "quadratic", "quadratic_full", "squared_relu"])
def test_padded_rows_equal_unpadded(feature_map, mode):
    tokens, real_len = 10, 6
    q, k, v = make_qkv(batch=2, tokens=tokens, seed=8)
    key_mask = torch.zeros(2, tokens, dtype=torch.bool)
    key_mask[0, tokens - real_len :] = True  # left-padded
    key_mask[1, :real_len] = True  # right-padded
    for x in (q, k, v):  # garbage in the padding must not leak
        x[~key_mask[:, None, :].expand(-1, x.shape[1], -1)] = float("nan")
    out = causal_linear_attention(q, k, v, feature_map=feature_map, mode=mode, key_mask=key_mask, chunk_size=4)
    for b in range(2):
        row = [x[b : b + 1, :, key_mask[b]] for x in (q, k, v)]
        alone = causal_linear_attention(*row, feature_map=feature_map, mode=mode, chunk_size=4)
        torch.testing.assert_close(out[b : b + 1, :, key_mask[b]], alone, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(alone, reference(*row, feature_map), rtol=1e-9, atol=1e-9)
    padded = ~key_mask[:, None, :, None].expand_as(out)
    assert torch.equal(out[padded], torch.zeros_like(out[padded]))  # padded queries output exactly 0


def test_padding_gets_no_gradient_and_no_nan():
    q, k, v = (x.requires_grad_() for x in make_qkv(tokens=8, seed=9))
    key_mask = torch.ones(2, 8, dtype=torch.bool)
    key_mask[0, :3] = False
    out = causal_linear_attention(q, k, v, feature_map="elu_plus_one", key_mask=key_mask)
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    for g in (gq, gk, gv):
        assert torch.isfinite(g).all()
        assert torch.equal(g[0, :, :3], torch.zeros_like(g[0, :, :3]))


# ----------------------------------------------------------------------------------------------------------------
# Generation: step and state
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_step_iterated_equals_full_op(feature_map, normalize):
    q, k, v = make_qkv(tokens=9, seed=10)
    full = causal_linear_attention(q, k, v, feature_map=feature_map, normalize=normalize, chunk_size=4)
    state, outputs = None, []
    for t in range(9):
        token = [x[:, :, t : t + 1] for x in (q, k, v)]
        out, state = linear_attention_step(*token, state, feature_map=feature_map, normalize=normalize, eps=EPS)
        outputs.append(out)
    torch.testing.assert_close(torch.cat(outputs, dim=2), full, rtol=1e-9, atol=1e-9)
    expected_s, expected_z = reference_state(k, v, feature_map)
    torch.testing.assert_close(state[0], expected_s, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(state[1], expected_z, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_prompt_state_equals_final_recurrent_state(feature_map):
    q, k, v = make_qkv(tokens=7, seed=11)
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[0, :2] = False
    s, z = linear_attention_state(k, v, feature_map=feature_map, key_mask=key_mask)
    expected_s, expected_z = reference_state(k, v, feature_map, key_mask=key_mask)
    torch.testing.assert_close(s, expected_s, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(z, expected_z, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("feature_map", ["squared_relu", "elu_plus_one"])
def test_prefill_then_steps_continue_the_sequence(feature_map):
    # the generation use: seed the cache from a (left-padded) prompt, then decode token by token
    q, k, v = make_qkv(tokens=10, dtype=torch.float32, seed=12)
    key_mask = torch.ones(2, 10, dtype=torch.bool)
    key_mask[1, :2] = False
    full = causal_linear_attention(q, k, v, feature_map=feature_map, key_mask=key_mask)
    state = linear_attention_state(k[:, :, :6], v[:, :, :6], feature_map=feature_map, key_mask=key_mask[:, :6])
    assert state[0].dtype == state[1].dtype == torch.float32
    for t in range(6, 10):
        out, state = linear_attention_step(*(x[:, :, t : t + 1] for x in (q, k, v)), state, feature_map=feature_map)
        torch.testing.assert_close(out, full[:, :, t : t + 1], rtol=1e-5, atol=1e-5)


def test_step_keeps_a_float32_state_for_bfloat16():
    q, k, v = (x.to(torch.bfloat16) for x in make_qkv(tokens=1, dtype=torch.float32, seed=13))
    out, (s, z) = linear_attention_step(q, k, v, None)
    assert out.dtype == torch.bfloat16 and s.dtype == z.dtype == torch.float32
    assert s.shape == (2, 2, 4, 3) and z.shape == (2, 2, 4)


# ----------------------------------------------------------------------------------------------------------------
# Feature maps
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [1, 3, QUADRATIC_MAX_HEAD_DIM])
def test_feature_dim(head_dim):
    assert feature_dim("quadratic", head_dim) == 1 + head_dim + head_dim * (head_dim + 1) // 2
    assert feature_dim("quadratic_full", head_dim) == 1 + head_dim + head_dim**2
    for name in ELEMENTWISE_MAPS:
        assert feature_dim(name, head_dim) == head_dim
    for name in FEATURE_MAPS:  # the width feature_dim promises is the width the map returns
        assert apply_feature_map(torch.zeros(2, head_dim), name).shape == (2, feature_dim(name, head_dim))


def test_quadratic_map_is_the_studys_upper_triangle():
    """The appendix's φ(x) = [1, x_1, …, x_d, x_1², x_1x_2, …, x_1x_d, x_2², x_2x_3, …, x_d²], written out."""
    generator = torch.Generator().manual_seed(3)
    for dim in (1, 2, 4, 7):
        x = torch.randn(3, 5, dim, dtype=torch.float64, generator=generator)
        expected = torch.empty(3, 5, 1 + dim + dim * (dim + 1) // 2, dtype=torch.float64)
        expected[..., 0] = 1.0
        expected[..., 1 : 1 + dim] = x
        column = 1 + dim
        for i in range(dim):
            for j in range(i, dim):  # every i ≤ j once, row by row
                expected[..., column] = x[..., i] * x[..., j]
                column += 1
        assert column == expected.shape[-1]
        assert torch.equal(apply_feature_map(x, "quadratic"), expected)
    x = torch.tensor([[2.0, -3.0, 5.0]])
    assert apply_feature_map(x, "quadratic").tolist() == [[1.0, 2.0, -3.0, 5.0, 4.0, -6.0, 10.0, 9.0, -15.0, 25.0]]


def test_quadratic_full_map_is_one_x_and_all_ordered_products():
    x = torch.tensor([[2.0, -3.0, 5.0]])
    products = [x[0, i] * x[0, j] for i in range(3) for j in range(3)]
    expected = torch.tensor([[1.0, 2.0, -3.0, 5.0, *products]])
    assert torch.equal(apply_feature_map(x, "quadratic_full"), expected)
    assert apply_feature_map(torch.zeros(2, 4, 5, 6), "quadratic_full").shape == (2, 4, 5, 1 + 6 + 36)


def test_quadratic_kernels_closed_forms():
    """φ(x)·φ(y): the study's map counts each off-diagonal product once, the full outer product twice."""
    generator = torch.Generator().manual_seed(4)
    x, y = (torch.randn(50, 6, dtype=torch.float64, generator=generator) for _ in range(2))
    dot = (x * y).sum(-1)
    upper = sum(x[:, i] * x[:, j] * y[:, i] * y[:, j] for i in range(6) for j in range(i, 6))
    kernel = (apply_feature_map(x, "quadratic") * apply_feature_map(y, "quadratic")).sum(-1)
    torch.testing.assert_close(kernel, 1 + dot + upper, rtol=1e-12, atol=1e-12)
    # the same sum in closed form: Σ_{i≤j} = ((x·y)² + Σ_i x_i² y_i²) / 2
    torch.testing.assert_close(kernel, 1 + dot + (dot**2 + (x**2 * y**2).sum(-1)) / 2, rtol=1e-12, atol=1e-12)
    full = (apply_feature_map(x, "quadratic_full") * apply_feature_map(y, "quadratic_full")).sum(-1)
    torch.testing.assert_close(full, 1 + dot + dot**2, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(kernel, full)  # the two maps are different kernels


@pytest.mark.parametrize("feature_map", ELEMENTWISE_MAPS)
def test_elementwise_maps(feature_map):
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    torch.testing.assert_close(apply_feature_map(x, feature_map), phi_reference(x, feature_map))


@pytest.mark.parametrize("feature_map", QUADRATIC_MAPS)
def test_quadratic_head_dim_limit(feature_map):
    too_wide = QUADRATIC_MAX_HEAD_DIM + 1
    width = 1 + too_wide + (too_wide * (too_wide + 1) // 2 if feature_map == "quadratic" else too_wide**2)
    with pytest.raises(
        ValueError,
        match=rf"feature_map='{feature_map}' supports head_dim <= 32 .*would be {width}\), got head_dim={too_wide}",
    ):
        feature_dim(feature_map, too_wide)
    q, k, v = make_qkv(batch=1, heads=1, tokens=2, head_dim=too_wide)
    with pytest.raises(ValueError, match="head_dim <= 32"):
        causal_linear_attention(q, k, v, feature_map=feature_map)


def test_unknown_feature_map_names_the_allowed_ones():
    q, k, v = make_qkv(batch=1, heads=1, tokens=2)
    with pytest.raises(ValueError, match=r"feature_map must be one of .*'quadratic', 'quadratic_full'.*'cubic'"):
        causal_linear_attention(q, k, v, feature_map="cubic")


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ({"feature_map": "softmax"}, r"feature_map must be one of .*'squared_relu'.*got 'softmax'"),
    ({"mode": "fast"}, r"mode must be one of .*'chunked'.*got 'fast'"),
    ({"backend": "cuda"}, r"backend must be one of .*'fla'.*got 'cuda'"),
    ({"eps": 0.0}, r"eps must be a number in \(0.0, \+inf\), got 0.0"),
    ({"eps": float("nan")}, r"eps must be a finite number, got nan"),
    ({"normalize": 1}, r"normalize must be a bool, got 1"),
    ({"scale": -1.0}, r"scale must be a number in \(0.0, \+inf\), got -1.0"),
    ({"chunk_size": 0}, r"chunk_size must be an integer in \[1, \+inf\), got 0"),
    ({"chunk_size": 8.0}, r"chunk_size must be an integer, got 8.0"),
    ({"mode": "parallel", "backend": "triton"}, r"backend='triton' only supports mode='chunked', got mode='parallel'"),
    ({"mode": "recurrent", "backend": "fla"}, r"backend='fla' only supports mode='chunked', got mode='recurrent'"),
    ({"key_mask": torch.ones(2, 13)}, r"key_mask must be None or a torch.bool tensor"),
    ({"key_mask": torch.ones(2, 12, dtype=torch.bool)}, r"key_mask must have shape \(B, T\)=\(2, 13\), got \(2, 12\)"),
]


@pytest.mark.parametrize("kwargs, match", BAD_OPTIONS)
def test_bad_options(kwargs, match):
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=match):
        causal_linear_attention(q, k, v, **kwargs)


def _replace(index: int, value):
    q, k, v = make_qkv()
    args = [q, k, v]
    args[index] = value(args[index])
    return args


BAD_TENSORS = [
    (0, lambda x: x.numpy(), r"q must be a torch.Tensor, got ndarray"),
    (1, lambda x: x[0], r"k must be 4-D \(batch, heads, tokens, dim\), got shape \(2, 13, 4\)"),
    (2, lambda x: x.long(), r"v.dtype must be one of .*got torch.int64"),
    (0, lambda x: x[:, :, :0], r"q needs at least 1 token"),
    (0, lambda x: x.float(), r"q.dtype and k.dtype must be equal, got torch.float32 and torch.float64"),
    (1, lambda x: x[:, :, :5], r"k and v must have equal sizes in dims \[0, 1, 2\]"),
    (1, lambda x: x[..., :3], r"q and k must have equal sizes in dims \[0, 1, 2, 3\]"),
]


@pytest.mark.parametrize("index, change, match", BAD_TENSORS)
def test_bad_tensors(index, change, match):
    with pytest.raises(ValueError, match=match):
        causal_linear_attention(*_replace(index, change))


def test_step_validation():
    q, k, v = make_qkv(tokens=2)
    with pytest.raises(ValueError, match=r"takes one token \(dim 2 of size 1\)"):
        linear_attention_step(q, k, v, None)
    one = [x[:, :, :1] for x in (q, k, v)]
    with pytest.raises(ValueError, match=r"state must be None or a pair \(S, z\)"):
        linear_attention_step(*one, torch.zeros(2, 2, 4, 3))
    with pytest.raises(ValueError, match=r"state's S must have shape \(2, 2, 4, 3\)"):
        linear_attention_step(*one, (torch.zeros(2, 2, 4, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(ValueError, match=r"state's z must have shape \(2, 2, 4\)"):
        linear_attention_step(*one, (torch.zeros(2, 2, 4, 3), torch.zeros(2, 2, 5)))
    with pytest.raises(ValueError, match=r"feature_map must be one of"):
        linear_attention_state(k, v, feature_map="exp")


# ----------------------------------------------------------------------------------------------------------------
# Accelerated backends: the ones-column wrapper around an unnormalised kernel
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
def test_triton_backend_wraps_an_unnormalised_kernel(monkeypatch, normalize):
    calls = []

    def fake_kernel(phi_q, phi_k, v, *, chunk_size):
        calls.append((phi_q.shape, phi_k.shape, v.shape, chunk_size))
        return unnormalised_torch(phi_q, phi_k, v)

    fake = types.ModuleType(TRITON_MODULE)
    fake.causal_linear_attention_triton = fake_kernel
    monkeypatch.setitem(sys.modules, TRITON_MODULE, fake)
    q, k, v = make_qkv(head_dim=3, seed=14)
    key_mask = torch.ones(2, 13, dtype=torch.bool)
    key_mask[0, :4] = False
    kwargs = {"feature_map": "quadratic", "normalize": normalize, "key_mask": key_mask}
    out = causal_linear_attention(q, k, v, backend="triton", chunk_size=8, **kwargs)
    torch.testing.assert_close(out, reference(q, k, v, **kwargs), rtol=1e-9, atol=1e-9)
    # feature-mapped q/k (1 + 3 + 6 wide) and v with the denominator's ones column when normalising
    assert calls == [((2, 2, 13, 10), (2, 2, 13, 10), (2, 2, 13, 3 + normalize), 8)]


def test_triton_backend_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, TRITON_MODULE, None)  # makes the import fail
    with pytest.raises(ImportError, match=r"backend='triton' needs hf_icl.kernels.linear_attention_triton"):
        causal_linear_attention(*make_qkv(), backend="triton")


def _real_triton_kernel_runnable() -> bool:
    try:
        importlib.import_module(TRITON_MODULE)
    except ImportError:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not _real_triton_kernel_runnable(), reason="linear_attention_triton absent or no CUDA/interpreter")
@pytest.mark.parametrize("normalize", [True, False])
def test_real_triton_kernel_matches_torch(normalize):
    # the other side of the contract: the real unnormalised kernel, ones column (Dv + 1 = 17) and padding included
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = {"batch": 2, "heads": 2, "tokens": 20, "head_dim": 16, "value_dim": 16, "dtype": torch.float32}
    q, k, v = (x.to(device) for x in make_qkv(**shapes))
    key_mask = torch.ones(2, 20, dtype=torch.bool, device=device)
    key_mask[0, :5] = False
    upstream = torch.randn(v.shape, generator=torch.Generator().manual_seed(1)).to(device)

    def run(backend):
        inputs = [x.detach().requires_grad_() for x in (q, k, v)]
        out = causal_linear_attention(
            *inputs, backend=backend, normalize=normalize, key_mask=key_mask, chunk_size=16, feature_map="elu_plus_one"
        )
        return (out, *torch.autograd.grad((out * upstream).sum(), inputs))

    torch.testing.assert_close(run("triton"), run("torch"), rtol=1e-4, atol=1e-4)


def _install_fake_fla(monkeypatch, chunk_linear_attn) -> None:
    for name in ("fla", "fla.ops", "fla.ops.linear_attn"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["fla.ops.linear_attn"].chunk_linear_attn = chunk_linear_attn


@pytest.mark.parametrize("tokens", [3, 13])  # 3 < heads: recent fla rejects T < H, so the wrapper pads
def test_fla_backend_wraps_chunk_linear_attn(monkeypatch, tokens):
    seen = {}

    def fake_chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True,
                               head_first=True):  # fmt: skip
        seen.update(scale=scale, normalize=normalize, head_first=head_first, shape=tuple(q.shape))
        assert q.shape[1] >= q.shape[2], "fla expects (B, T, H, K) with T >= H"
        return unnormalised_torch(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2), None

    _install_fake_fla(monkeypatch, fake_chunk_linear_attn)
    q, k, v = make_qkv(heads=4, tokens=tokens, seed=15)
    out = causal_linear_attention(q, k, v, backend="fla", feature_map="elu_plus_one")
    torch.testing.assert_close(out, reference(q, k, v, "elu_plus_one"), rtol=1e-9, atol=1e-9)
    assert seen == {"scale": 1.0, "normalize": False, "head_first": False, "shape": (2, max(tokens, 4), 4, 4)}


def test_fla_backend_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)
    with pytest.raises(ImportError, match=r"backend='fla' needs flash-linear-attention.*pip install hf-icl\[fla\]"):
        causal_linear_attention(*make_qkv(), backend="fla")


# ----------------------------------------------------------------------------------------------------------------
# Packaging
# ----------------------------------------------------------------------------------------------------------------


def test_module_docstring_example_runs():
    assert doctest.testmod(la, raise_on_error=True).attempted > 0


def test_public_names():
    import hf_icl.kernels as kernels

    assert BACKENDS == ("auto", "torch", "triton", "fla")
    for name in ("causal_linear_attention", "linear_attention_step", "linear_attention_state", "apply_feature_map"):
        assert getattr(kernels, name) is getattr(la, name) and name in kernels.__all__


@pytest.mark.skipif(
    importlib.util.find_spec("fla") is None or not torch.cuda.is_available(),
    reason="needs flash-linear-attention and CUDA (its kernels do not run under the Triton interpreter)",
)
@pytest.mark.parametrize("normalize", [True, False])
def test_fla_backend_equals_the_parallel_form_on_cuda(normalize):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 200, 32, device="cuda", generator=g, requires_grad=True) for _ in range(3))
    reference = causal_linear_attention(q, k, v, mode="parallel", normalize=normalize)
    out = causal_linear_attention(q, k, v, backend="fla", normalize=normalize)
    torch.testing.assert_close(out, reference, atol=2e-3, rtol=2e-3)
    weights = torch.randn(out.shape, device="cuda", generator=g)
    for a, b in zip(
        torch.autograd.grad((out * weights).sum(), (q, k, v)),
        torch.autograd.grad((reference * weights).sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
