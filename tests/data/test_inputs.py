"""Tests of ``hf_icl.data.inputs``: moments against closed forms, serialisation, validation.

Sample moments are compared with their targets within five standard errors, computed in closed
form for Gaussian and uniform samples; every draw has a fixed seed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from hf_icl.data.inputs import (
    INPUT_REGISTRY,
    CovarianceGaussianInputs,
    DiagonalGaussianInputs,
    GaussianInputs,
    UniformInputs,
    make_inputs,
)
from hf_icl.data.tasks import get_task

N_SAMPLES = 200_000


def draw(dist, n: int, d: int, seed: int = 0) -> np.ndarray:
    """``n`` i.i.d. inputs as an ``(n, d)`` float64 array (drawn as ``(4, n/4, d)`` prompts)."""
    xs = dist.sample(4, n // 4, d, torch.Generator().manual_seed(seed), "cpu")
    assert xs.shape == (4, n // 4, d) and xs.dtype == torch.float32 and xs.device.type == "cpu"
    return xs.reshape(-1, d).double().numpy()


def assert_gaussian_moments(x: np.ndarray, sigma: np.ndarray):
    """Mean ≈ 0 and sample covariance ≈ Σ, each entry within 5 standard errors.

    For a centred Gaussian, Var(x_i x_j) = Σ_ii Σ_jj + Σ_ij², so the standard error of a
    covariance entry is √((Σ_ii Σ_jj + Σ_ij²) / n).
    """
    n = x.shape[0]
    diag = np.diag(sigma)
    assert np.all(np.abs(x.mean(0)) <= 5 * np.sqrt(diag / n) + 1e-12)
    cov = np.cov(x, rowvar=False)
    se = np.sqrt((np.outer(diag, diag) + sigma**2) / n)
    assert np.all(np.abs(cov - sigma) <= 5 * se + 1e-9), (cov, sigma)


def assert_mean_square_norm(dist, d: int, closed_form: float):
    assert dist.mean_square_norm(d) == pytest.approx(closed_form, rel=1e-9)
    sq = (draw(dist, N_SAMPLES, d, seed=99) ** 2).sum(1)
    se = sq.std() / math.sqrt(sq.size)
    assert se < 0.01 * closed_form
    assert abs(sq.mean() - closed_form) <= 5 * se


# ---------------------------------------------------------------------------------------------
# Gaussian family
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.3, 2.5])
def test_gaussian_moments(scale):
    d = 4
    dist = GaussianInputs(scale=scale)
    x = draw(dist, N_SAMPLES, d)
    assert_gaussian_moments(x, scale**2 * np.eye(d))
    assert stats.kstest(x[:50_000, 0] / scale, "norm").pvalue > 1e-4
    assert_mean_square_norm(dist, d, scale**2 * d)


def test_diagonal_moments():
    variances = (0.5, 1.0, 1.5, 1.0, 1.75)
    dist = DiagonalGaussianInputs(variances=variances)
    x = draw(dist, N_SAMPLES, len(variances))
    assert_gaussian_moments(x, np.diag(variances))
    assert_mean_square_norm(dist, len(variances), sum(variances))


def test_full_covariance_from_spectrum():
    spectrum = (4.0, 2.0, 1.0, 0.25)
    d = len(spectrum)
    dist = CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=3)
    sigma = dist.covariance_matrix().numpy()
    assert sigma.dtype == np.float64
    np.testing.assert_allclose(sigma, sigma.T, atol=1e-12)
    np.testing.assert_allclose(np.linalg.eigvalsh(sigma), sorted(spectrum), atol=1e-10)
    # A genuine rotation: Σ is not diagonal.
    assert np.abs(sigma - np.diag(np.diag(sigma))).max() > 0.1
    # The factor F = Q diag(√λ) has orthogonal columns with norms √λ.
    f = dist.factor().numpy()
    np.testing.assert_allclose(f @ f.T, sigma, atol=1e-12)
    np.testing.assert_allclose(f.T @ f, np.diag(spectrum), atol=1e-10)

    x = draw(dist, N_SAMPLES, d)
    assert_gaussian_moments(x, sigma)
    # Eigenvalues of the sample covariance: sd of λ̂_i ≈ λ_i √(2/n) for distinct eigenvalues.
    eig = np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False)))
    target = np.array(sorted(spectrum))
    assert np.all(np.abs(eig - target) <= 5 * target * math.sqrt(2 / N_SAMPLES)), (eig, target)
    assert_mean_square_norm(dist, d, sum(spectrum))


def test_full_covariance_rotation_seed():
    spectrum = (3.0, 1.0, 0.5)
    a = CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=1).covariance_matrix()
    b = CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=1).covariance_matrix()
    c = CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=2).covariance_matrix()
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3
    # Over many rotation seeds the rotation is isotropic: E[Q Λ Qᵀ] = (tr Λ / d) I.
    mats = np.stack(
        [CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=s).covariance_matrix().numpy() for s in range(400)]
    )
    mean, se = mats.mean(0), mats.std(0) / math.sqrt(len(mats))
    target = sum(spectrum) / 3 * np.eye(3)
    assert np.all(np.abs(mean - target) <= 5 * se + 1e-12)
    assert se.max() < 0.05


def test_full_covariance_singular_spectrum():
    dist = CovarianceGaussianInputs(spectrum=(3.0, 1.0, 0.0), rotation_seed=0)
    x = draw(dist, 20_000, 3)
    eig = np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False)))
    assert eig[0] < 1e-8 and eig[1] > 0.9  # inputs lie on a plane
    assert_mean_square_norm(dist, 3, 4.0)


def test_full_covariance_explicit_matrix():
    cov = ((2.0, 0.5, 0.3), (0.5, 1.0, -0.2), (0.3, -0.2, 0.5))
    dist = CovarianceGaussianInputs(covariance=cov)
    np.testing.assert_allclose(dist.covariance_matrix().numpy(), np.array(cov), atol=1e-10)
    x = draw(dist, N_SAMPLES, 3)
    assert_gaussian_moments(x, np.array(cov))
    assert_mean_square_norm(dist, 3, 3.5)
    # A rank-one covariance [[1, 1], [1, 1]] gives x_1 = x_2.
    ones = CovarianceGaussianInputs(covariance=[[1.0, 1.0], [1.0, 1.0]])
    y = draw(ones, 1000, 2)
    np.testing.assert_allclose(y[:, 0], y[:, 1], rtol=1e-5, atol=1e-6)
    assert abs(y[:, 0].var() - 1) <= 5 * math.sqrt(2 / 1000)


def test_family_inputs_follow_the_distribution():
    spectrum = (2.0, 1.0, 0.5)
    dist = CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=4)
    family = get_task("linear_regression", n_dims=3, inputs=dist.to_dict())
    xs = family.sample(4, N_SAMPLES // 4, seed=0)[0].reshape(-1, 3).double().numpy()
    assert_gaussian_moments(xs, dist.covariance_matrix().numpy())


# ---------------------------------------------------------------------------------------------
# Uniform
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("low, high", [(-1.0, 1.0), (0.5, 3.0), (-3.0, 3.0)])
def test_uniform_bounds_and_moments(low, high):
    d = 3
    dist = UniformInputs(low=low, high=high)
    x = draw(dist, N_SAMPLES, d)
    width = high - low
    assert x.min() >= low and x.max() < high
    assert x.min() < low + 1e-3 * width and x.max() > high - 1e-3 * width
    n = x.shape[0]
    assert np.all(np.abs(x.mean(0) - (low + high) / 2) <= 5 * width / math.sqrt(12 * n))
    # Var((x - μ)²) = width⁴/80 - width⁴/144 = width⁴/180.
    assert np.all(np.abs(x.var(0) - width**2 / 12) <= 5 * width**2 / math.sqrt(180 * n))
    corr = np.corrcoef(x, rowvar=False)
    assert np.all(np.abs(corr - np.eye(d)) <= 5 / math.sqrt(n))
    assert stats.kstest(x[:50_000, 0], "uniform", args=(low, width)).pvalue > 1e-4
    assert_mean_square_norm(dist, d, d * (low**2 + low * high + high**2) / 3)


# ---------------------------------------------------------------------------------------------
# Registry, serialisation, determinism
# ---------------------------------------------------------------------------------------------

DISTRIBUTIONS = {
    "gaussian": (GaussianInputs(scale=1.7), 3),
    "diagonal": (DiagonalGaussianInputs(variances=(1.0, 2.0, 0.25)), 3),
    "full_covariance_spectrum": (CovarianceGaussianInputs(spectrum=(1.0, 2.0), rotation_seed=5), 2),
    "full_covariance_matrix": (CovarianceGaussianInputs(covariance=((1.0, 0.2), (0.2, 3.0))), 2),
    "uniform": (UniformInputs(low=-0.5, high=2.0), 4),
}


def test_registry_names():
    assert set(INPUT_REGISTRY) == {"gaussian", "diagonal", "full_covariance", "uniform"}
    for name, cls in INPUT_REGISTRY.items():
        assert cls.name == name
    assert make_inputs("gaussian") == GaussianInputs(scale=1.0)
    assert make_inputs("uniform") == UniformInputs(low=-1.0, high=1.0)


@pytest.mark.parametrize("key", list(DISTRIBUTIONS))
def test_to_dict_round_trip(key):
    dist, d = DISTRIBUTIONS[key]
    spec = dist.to_dict()
    assert INPUT_REGISTRY[spec["name"]] is type(dist)
    rebuilt = make_inputs(spec)
    assert rebuilt == dist and rebuilt is not dist
    assert make_inputs(dist) is dist
    from_json = make_inputs(json.loads(json.dumps(spec)))
    assert from_json == dist
    a = dist.sample(2, 5, d, torch.Generator().manual_seed(0), "cpu")
    b = from_json.sample(2, 5, d, torch.Generator().manual_seed(0), "cpu")
    assert torch.equal(a, b)
    assert from_json.mean_square_norm(d) == dist.mean_square_norm(d)


@pytest.mark.parametrize("key", list(DISTRIBUTIONS))
def test_determinism_and_dtype(key):
    dist, d = DISTRIBUTIONS[key]
    a = dist.sample(3, 4, d, torch.Generator().manual_seed(1), "cpu")
    b = dist.sample(3, 4, d, torch.Generator().manual_seed(1), torch.device("cpu"))
    c = dist.sample(3, 4, d, torch.Generator().manual_seed(2), "cpu")
    assert a.shape == (3, 4, d) and a.dtype == torch.float32 and a.device.type == "cpu"
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.isfinite(a).all()


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 6),
    points=st.integers(1, 12),
    dims=st.integers(1, 7),
    kind=st.sampled_from(["gaussian", "diagonal", "full_covariance", "uniform"]),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_property_random_shapes(batch, points, dims, kind, seed, data):
    positive = st.floats(0.1, 4.0)
    if kind == "gaussian":
        dist = GaussianInputs(scale=data.draw(positive, label="scale"))
    elif kind == "diagonal":
        dist = DiagonalGaussianInputs(variances=data.draw(st.lists(positive, min_size=dims, max_size=dims)))
    elif kind == "full_covariance":
        spectrum = data.draw(st.lists(st.floats(0.0, 4.0), min_size=dims, max_size=dims), label="spectrum")
        dist = CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=seed % 1000)
        sigma = dist.covariance_matrix().numpy()
        np.testing.assert_allclose(np.linalg.eigvalsh(sigma), sorted(spectrum), atol=1e-9)
        assert dist.mean_square_norm(dims) == pytest.approx(sum(spectrum), abs=1e-9)
    else:
        low = data.draw(st.floats(-5.0, 5.0), label="low")
        dist = UniformInputs(low=low, high=low + data.draw(positive, label="width"))
    xs = dist.sample(batch, points, dims, torch.Generator().manual_seed(seed), "cpu")
    assert xs.shape == (batch, points, dims) and xs.dtype == torch.float32
    assert torch.isfinite(xs).all()
    if kind == "uniform":
        assert (xs >= dist.low).all() and (xs < dist.high).all()
    family = get_task("linear_regression", n_dims=dims, inputs=dist.to_dict())
    assert family.sample(batch, points, seed=seed)[0].shape == (batch, points, dims)


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def test_unknown_distribution_lists_known_names():
    with pytest.raises(ValueError, match="unknown input distribution") as info:
        make_inputs("cauchy")
    for name in INPUT_REGISTRY:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="unknown input distribution"):
        make_inputs({"name": "cauchy", "scale": 1.0})


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"scale": 2.0}, "name"),
        (3, "inputs must be"),
        (None, "inputs must be"),
        ({"name": "gaussian", "sigma": 2.0}, "gaussian"),
        ({"name": "diagonal"}, "diagonal"),
        ({"name": "gaussian", "scale": 0.0}, "scale"),
        ({"name": "gaussian", "scale": -1.0}, "scale"),
        ({"name": "gaussian", "scale": float("nan")}, "scale"),
        ({"name": "diagonal", "variances": ()}, "variances"),
        ({"name": "diagonal", "variances": (1.0, 0.0)}, "variances"),
        ({"name": "diagonal", "variances": (1.0, -2.0)}, "variances"),
        ({"name": "diagonal", "variances": (1.0, float("inf"))}, "variances"),
        ({"name": "uniform", "low": 1.0, "high": 1.0}, "low"),
        ({"name": "uniform", "low": 2.0, "high": 1.0}, "low"),
        ({"name": "uniform", "low": 0.0, "high": float("inf")}, "high"),
        ({"name": "full_covariance"}, "spectrum"),
        ({"name": "full_covariance", "spectrum": (1.0,), "covariance": ((1.0,),)}, "spectrum"),
        ({"name": "full_covariance", "spectrum": ()}, "spectrum"),
        ({"name": "full_covariance", "spectrum": (1.0, -0.5)}, "spectrum"),
        ({"name": "full_covariance", "spectrum": (1.0, float("nan"))}, "spectrum"),
        ({"name": "full_covariance", "covariance": ((1.0, 0.5), (0.2, 1.0))}, "symmetric"),
        ({"name": "full_covariance", "covariance": ((1.0, 2.0), (2.0, 1.0))}, "positive semi-definite"),
        ({"name": "full_covariance", "covariance": ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0))}, "square"),
        ({"name": "full_covariance", "covariance": ((1.0, 0.0), (0.0,))}, "square"),
        ({"name": "full_covariance", "covariance": (1.0, 2.0)}, "covariance"),
        ({"name": "full_covariance", "spectrum": (1.0, 2.0), "rotation_seed": 1.5}, "rotation_seed"),
        ({"name": "diagonal", "variances": 3.0}, "variances"),
    ],
)
def test_bad_specs_raise(spec, match):
    with pytest.raises(ValueError, match=match):
        make_inputs(spec)


def test_direct_construction_validates():
    with pytest.raises(ValueError, match="scale"):
        GaussianInputs(scale=0)
    with pytest.raises(ValueError, match="variances"):
        DiagonalGaussianInputs(variances=[-1.0])
    with pytest.raises(ValueError, match="low"):
        UniformInputs(low=3.0, high=-3.0)
    with pytest.raises(ValueError, match="symmetric"):
        CovarianceGaussianInputs(covariance=[[1.0, 0.3], [0.0, 1.0]])


def test_dimension_mismatch_raises():
    diag = {"name": "diagonal", "variances": (1.0, 2.0, 3.0)}
    with pytest.raises(ValueError, match="variances"):
        get_task("linear_regression", n_dims=4, inputs=diag)
    with pytest.raises(ValueError, match="n_dims"):
        get_task("linear_regression", n_dims=2, inputs={"name": "full_covariance", "spectrum": (1.0, 1.0, 1.0)})
    with pytest.raises(ValueError, match="n_dims"):
        get_task(
            "linear_regression", n_dims=3, inputs={"name": "full_covariance", "covariance": [[1.0, 0.0], [0.0, 1.0]]}
        )
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="variances"):
        make_inputs(diag).sample(2, 3, 4, gen, "cpu")
    with pytest.raises(ValueError, match="n_dims"):
        CovarianceGaussianInputs(spectrum=(1.0, 2.0)).sample(2, 3, 3, gen, "cpu")
    # The matching dimension is accepted.
    assert get_task("linear_regression", n_dims=3, inputs=diag).sample(2, 3, seed=0)[0].shape == (2, 3, 3)
