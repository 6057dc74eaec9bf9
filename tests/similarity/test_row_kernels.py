"""Tests of hf_icl.similarity.row_kernels (and its re-export hf_icl.similarity): every score against
its formula written out one (query, key) pair at a time with Python's math module, argument validation,
numerics at θ ≈ 0, θ ≈ π and zero rows, and gradients reaching tensor (learnable) parameters."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import hf_icl.similarity as public_kernels
from hf_icl.similarity import row_kernels
from hf_icl.similarity.row_kernels import (
    EPS,
    ROW_KERNELS,
    WEDGE_MODES,
    cayley_scores,
    clamped_cosine,
    cosine_scores,
    dot_product_scores,
    ga_scores,
    rbf_scores,
    row_kernel_scores,
    sine_of,
    unit_rows,
)

F64 = torch.float64


def rows(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# --------------------------------------------------------------------------- reference: one pair at a time


def pair_cosine(q: list[float], k: list[float]) -> float:
    """cos θ of two rows, a zero row counting as the zero vector, clamped to [-1 + EPS, 1 - EPS]."""
    dot = sum(a * b for a, b in zip(q, k, strict=True))
    norm_q = max(math.sqrt(sum(a * a for a in q)), EPS)
    norm_k = max(math.sqrt(sum(b * b for b in k)), EPS)
    return min(max(dot / (norm_q * norm_k), -1 + EPS), 1 - EPS)


def pair_score(kernel: str, q: list[float], k: list[float], **params) -> float:
    if kernel == "softmax":
        return params.get("scale", 1.0) * sum(a * b for a, b in zip(q, k, strict=True))
    if kernel == "rbf":
        return -sum((a - b) ** 2 for a, b in zip(q, k, strict=True)) / (2 * params["bandwidth"] ** 2)
    cosine = pair_cosine(q, k)
    temperature = params["temperature"]
    if kernel == "cosine":
        return cosine / temperature
    theta = math.acos(cosine)
    if kernel == "cayley":
        return -(theta**2) / (2 * temperature**2)
    sine = math.sin(theta)
    wedge = sine if params["wedge_mode"] == "penalty" else (sine - params["wedge_mu"]) ** 2
    return (params["beta1"] * cosine - params["beta2"] * wedge) / temperature


def loop_scores(kernel: str, q: torch.Tensor, k: torch.Tensor, **params) -> torch.Tensor:
    """Scores (..., M, N) by a double loop over the rows of every leading index."""
    out = torch.empty(*q.shape[:-1], k.shape[-2], dtype=F64)
    flat_q, flat_k, flat_out = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), out.view(-1, *out.shape[-2:])
    for b in range(flat_q.shape[0]):
        for m in range(flat_q.shape[1]):
            for n in range(flat_k.shape[1]):
                flat_out[b, m, n] = pair_score(kernel, flat_q[b, m].tolist(), flat_k[b, n].tolist(), **params)
    return out


CASES = [
    ("softmax", dot_product_scores, {"scale": 0.7}),
    ("rbf", rbf_scores, {"bandwidth": 0.8}),
    ("cosine", cosine_scores, {"temperature": 0.1}),
    ("cosine", cosine_scores, {"temperature": 2.5}),
    ("cayley", cayley_scores, {"temperature": 0.1}),
    ("cayley", cayley_scores, {"temperature": 0.7}),
    ("ga", ga_scores, {"beta1": 4.0, "beta2": 1.0, "temperature": 1.0, "wedge_mode": "penalty", "wedge_mu": 0.5}),
    ("ga", ga_scores, {"beta1": 2.0, "beta2": -0.5, "temperature": 0.3, "wedge_mode": "penalty", "wedge_mu": 0.5}),
    ("ga", ga_scores, {"beta1": 4.0, "beta2": 1.0, "temperature": 1.0, "wedge_mode": "well", "wedge_mu": 0.5}),
    ("ga", ga_scores, {"beta1": 1.5, "beta2": 3.0, "temperature": 0.5, "wedge_mode": "well", "wedge_mu": 0.9}),
]


@pytest.mark.parametrize(("kernel", "function", "params"), CASES)
def test_scores_match_the_formula_pair_by_pair(kernel, function, params):
    q, k = rows(2, 5, 4, seed=1), rows(2, 7, 4, seed=2)
    expected = loop_scores(kernel, q, k, **params)
    torch.testing.assert_close(function(q, k, **params), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(row_kernel_scores(q, k, kernel, **params), expected, rtol=1e-12, atol=1e-12)


def test_leading_dimensions_broadcast_like_matmul():
    q, k = rows(3, 2, 4, 5, seed=3), rows(2, 6, 5, seed=4)  # keys shared over the first axis
    scores = cayley_scores(q, k, temperature=0.4)
    assert scores.shape == (3, 2, 4, 6)
    torch.testing.assert_close(scores[1], loop_scores("cayley", q[1], k, temperature=0.4), rtol=1e-12, atol=1e-12)


def test_helpers_unit_rows_clamped_cosine_and_sine():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-9, 0.0]], dtype=F64)
    torch.testing.assert_close(unit_rows(x), torch.tensor([[0.6, 0.8], [0.0, 0.0], [1e-3, 0.0]], dtype=F64))
    cosine = clamped_cosine(x, x)
    assert cosine[0, 0].item() == 1 - EPS  # parallel: clamped below 1
    assert cosine[1, 1].item() == 0.0  # the zero row is orthogonal to everything
    torch.testing.assert_close(sine_of(cosine), (1 - cosine**2).sqrt())
    assert sine_of(torch.tensor([1.0, -1.0, 0.0])).tolist() == [0.0, 0.0, 1.0]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("call", "fragments"),
    [
        (lambda q: row_kernel_scores(q, q, "laplace"), ["kernel", "laplace", "cayley"]),
        (lambda q: ga_scores(q, q, wedge_mode="valley"), ["wedge_mode", "valley", "penalty", "well"]),
        (lambda q: cosine_scores(q, q, temperature=0.0), ["temperature", "0.0", "(0.0, +inf)"]),
        (lambda q: cayley_scores(q, q, temperature=-1.0), ["temperature", "-1.0", "(0.0, +inf)"]),
        (lambda q: ga_scores(q, q, temperature=0), ["temperature", "got 0"]),
        (lambda q: cosine_scores(q, q, temperature=float("nan")), ["temperature", "nan", "finite"]),
        (lambda q: rbf_scores(q, q, bandwidth=0.0), ["bandwidth", "0.0", "(0.0, +inf)"]),
        (lambda q: row_kernel_scores(q, q, "cayley", temperature=0.0), ["temperature", "0.0"]),
    ],
)
def test_bad_arguments_are_rejected_naming_them(call, fragments):
    with pytest.raises(ValueError) as info:
        call(rows(1, 3, 2))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_kernel_and_wedge_mode_lists():
    assert ROW_KERNELS == ("softmax", "cosine", "cayley", "ga")
    assert WEDGE_MODES == ("penalty", "well")


# --------------------------------------------------------------------------- numerics at the edges


ANGULAR = [
    (cosine_scores, {"temperature": 0.1}),
    (cayley_scores, {"temperature": 0.1}),
    (ga_scores, {"wedge_mode": "penalty"}),
    (ga_scores, {"wedge_mode": "well", "wedge_mu": 0.5}),
]


def edge_rows():
    """Queries and keys with parallel (θ = 0), antiparallel (θ = π), nearly parallel, orthogonal and zero rows."""
    q = torch.tensor([[1.0, 2.0, -1.0], [0.0, 0.0, 0.0], [0.3, -0.2, 0.9]], dtype=F64)
    k = torch.stack([2 * q[0], -3 * q[0], q[0] + 1e-9, torch.zeros(3, dtype=F64), q[2], torch.tensor([2.0, -1, 0])])
    return q, k.to(F64)


@pytest.mark.parametrize(("function", "params"), ANGULAR)
def test_parallel_antiparallel_and_zero_rows_give_the_clamped_formula_and_finite_gradients(function, params):
    q, k = edge_rows()
    q.requires_grad_(True)
    k.requires_grad_(True)
    scores = function(q, k, **params)
    kernel = {cosine_scores: "cosine", cayley_scores: "cayley", ga_scores: "ga"}[function]
    full = {"temperature": 1.0, "beta1": 4.0, "beta2": 1.0, "wedge_mu": 0.5} | params
    expected = loop_scores(kernel, q.detach(), k.detach(), **full)
    torch.testing.assert_close(scores.detach(), expected, rtol=1e-9, atol=1e-9)
    # θ = 0 and θ = π are clamped to cos θ = ±(1 - EPS); the zero row has cos θ = 0 with every key
    assert pair_cosine(q[0].tolist(), k[0].tolist()) == 1 - EPS
    assert pair_cosine(q[0].tolist(), k[1].tolist()) == -1 + EPS
    (scores * rows(*scores.shape, seed=5)).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert q.grad[2].abs().sum() > 0  # a generic row does get a gradient


def test_tensor_parameters_receive_the_analytic_gradients():
    q, k = rows(4, 3, seed=6), rows(5, 3, seed=7)
    cosine = clamped_cosine(q, k)
    sine = sine_of(cosine)
    theta = torch.acos(cosine)

    temperature = torch.tensor(0.4, dtype=F64, requires_grad=True)
    cosine_scores(q, k, temperature=temperature).sum().backward()
    torch.testing.assert_close(temperature.grad, -cosine.sum() / 0.4**2)

    temperature = torch.tensor(0.4, dtype=F64, requires_grad=True)
    cayley_scores(q, k, temperature=temperature).sum().backward()
    torch.testing.assert_close(temperature.grad, theta.square().sum() / 0.4**3)

    beta1, beta2, mu, temperature = (torch.tensor(v, dtype=F64, requires_grad=True) for v in (3.0, 0.7, 0.4, 0.8))
    ga_scores(q, k, beta1=beta1, beta2=beta2, temperature=temperature, wedge_mode="well", wedge_mu=mu).sum().backward()
    torch.testing.assert_close(beta1.grad, cosine.sum() / 0.8)
    torch.testing.assert_close(beta2.grad, -(sine - 0.4).square().sum() / 0.8)
    torch.testing.assert_close(mu.grad, (2 * 0.7 * (sine - 0.4)).sum() / 0.8)
    score_sum = (3.0 * cosine - 0.7 * (sine - 0.4).square()).sum()
    torch.testing.assert_close(temperature.grad, -score_sum / 0.8**2)

    scale, bandwidth = (torch.tensor(v, dtype=F64, requires_grad=True) for v in (0.5, 1.3))
    dot_product_scores(q, k, scale=scale).sum().backward()
    torch.testing.assert_close(scale.grad, (q @ k.T).sum())
    rbf_scores(q, k, bandwidth=bandwidth).sum().backward()
    torch.testing.assert_close(bandwidth.grad, torch.cdist(q, k).square().sum() / 1.3**3)


def test_public_module_re_exports_the_same_functions():
    from hf_icl.similarity import cayley_scores as public_cayley

    assert public_cayley is cayley_scores
    for name in row_kernels.__all__:
        assert getattr(public_kernels, name) is getattr(row_kernels, name)
    assert doctest.testmod(public_kernels, raise_on_error=True).attempted > 0


@pytest.mark.parametrize("old_module", ["hf_icl.kernels.row_kernels", "hf_icl.attention.kernels"])
def test_old_paths_still_serve_the_row_kernels_with_a_deprecation_warning(old_module):
    import importlib

    old = importlib.import_module(old_module)
    for name in row_kernels.__all__:
        with pytest.warns(DeprecationWarning, match=rf"{old_module}\.{name} moved to hf_icl\.similarity"):
            assert getattr(old, name) is getattr(row_kernels, name)
