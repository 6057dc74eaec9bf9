"""Tests of the angular Nadaraya–Watson kernels (cosine, Cayley, GA), RandomFourierFeatures and OnFeatures,
against per-prefix loops that write the formulas out, the document's own random-feature draw, and at the
numerical edges (parallel, antiparallel and zero inputs)."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

import hf_icl.estimators.features as features_module
import hf_icl.estimators.nadaraya_watson as nadaraya_watson_module
from hf_icl.estimators import (
    InContextEstimator,
    NadarayaWatson,
    OnFeatures,
    RandomFourierFeatures,
    Ridge,
    get_estimator,
)

F64 = torch.float64
CLAMP = 1e-6  # the row kernels' clamp of norms and of cos θ away from ±1


def prompts(batch, n_points, n_dims, seed):
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n_points, n_dims, generator=gen, dtype=F64)
    ys = torch.randn(batch, n_points, generator=gen, dtype=F64)
    return xs, ys


def angular_score(kernel, x_prefix, query, temperature, beta1=4.0, beta2=1.0, wedge_mode="penalty", mu=0.5):
    """Score of ``query`` against each row of ``x_prefix``, written out from θ = arccos(cos θ)."""
    norms = x_prefix.norm(dim=-1).clamp_min(CLAMP) * query.norm().clamp_min(CLAMP)
    cosine = ((x_prefix @ query) / norms).clamp(-1 + CLAMP, 1 - CLAMP)
    theta = torch.arccos(cosine)
    if kernel == "cosine":
        return cosine / temperature
    if kernel == "cayley":
        return -(theta**2) / (2 * temperature**2)
    if wedge_mode == "penalty":
        return (beta1 * cosine - beta2 * torch.sin(theta)) / temperature
    return (beta1 * cosine - beta2 * (torch.sin(theta) - mu) ** 2) / temperature


def per_prefix_nw(xs, ys, kernel, temperature, **ga):
    """Position i of every prompt from the examples j < i by an explicit loop; position 0 predicts 0."""
    out = torch.zeros(ys.shape, dtype=F64)
    for b in range(xs.shape[0]):
        for i in range(1, xs.shape[1]):
            score = angular_score(kernel, xs[b, :i].double(), xs[b, i].double(), temperature, **ga)
            weights = torch.exp(score - score.max())
            out[b, i] = (weights * ys[b, :i].double()).sum() / weights.sum()
    return out


CASES = [
    ("cosine", None, {}),
    ("cosine", 0.5, {}),
    ("cayley", None, {}),
    ("cayley", 0.3, {}),
    ("ga", None, {}),
    ("ga", 0.4, {"beta1": 2.0, "beta2": 3.0}),
    ("ga", None, {"wedge_mode": "well"}),
    ("ga", 0.7, {"beta1": 1.0, "beta2": 2.5, "wedge_mode": "well", "wedge_mu": 0.8}),
]
DEFAULT_T = {"cosine": 0.1, "cayley": 0.1, "ga": 1.0}


def reference_ga_args(ga):
    return {"beta1": ga.get("beta1", 4.0), "beta2": ga.get("beta2", 1.0)} | (
        {"wedge_mode": "well", "mu": ga.get("wedge_mu", 0.5)} if ga.get("wedge_mode") == "well" else {}
    )


@pytest.mark.parametrize(("kernel", "bandwidth", "ga"), CASES)
def test_angular_kernels_match_the_per_prefix_loop(kernel, bandwidth, ga):
    xs, ys = prompts(3, 12, 4, seed=1)
    estimator = NadarayaWatson(kernel, bandwidth, **ga)
    temperature = DEFAULT_T[kernel] if bandwidth is None else bandwidth
    reference_args = reference_ga_args(ga) if kernel == "ga" else {}
    expected = per_prefix_nw(xs, ys, kernel, temperature, **reference_args)
    torch.testing.assert_close(estimator(xs, ys), expected, rtol=1e-10, atol=1e-12)


def edge_prompt():
    """Inputs parallel, antiparallel and zero with respect to earlier ones (every clamp is exercised)."""
    xs, ys = prompts(2, 9, 3, seed=2)
    xs[:, 3] = 2.5 * xs[:, 1]  # parallel to an earlier input (θ = 0)
    xs[:, 4] = -xs[:, 1]  # antiparallel (θ = π)
    xs[:, 5] = 0.0  # a zero input
    xs[:, 6] = xs[:, 2]  # an exact duplicate
    xs[:, 7] = 0.0  # a zero input after a zero input
    xs[0, 0] = 0.0  # a zero first example
    return xs, ys


@pytest.mark.parametrize(("kernel", "bandwidth", "ga"), CASES)
def test_parallel_antiparallel_and_zero_inputs_give_finite_predictions_and_gradients(kernel, bandwidth, ga):
    xs, ys = edge_prompt()
    xs.requires_grad_(True)
    ys.requires_grad_(True)
    preds = NadarayaWatson(kernel, bandwidth, **ga)(xs, ys)
    temperature = DEFAULT_T[kernel] if bandwidth is None else bandwidth
    reference_args = reference_ga_args(ga) if kernel == "ga" else {}
    expected = per_prefix_nw(xs.detach(), ys.detach(), kernel, temperature, **reference_args)
    torch.testing.assert_close(preds.detach(), expected, rtol=1e-9, atol=1e-11)
    (preds * torch.linspace(-1, 1, preds.numel(), dtype=F64).reshape(preds.shape)).sum().backward()
    assert torch.isfinite(xs.grad).all() and torch.isfinite(ys.grad).all()
    assert xs.grad[:, 8].abs().sum() > 0  # a generic input does get a gradient
    assert torch.all(preds[:, 0] == 0)


def test_exp_and_rbf_kernels_also_give_finite_gradients():
    xs, ys = prompts(2, 6, 3, seed=3)
    xs.requires_grad_(True)
    for kernel in ("exp", "rbf"):
        xs.grad = None
        NadarayaWatson(kernel, 0.8)(xs, ys).sum().backward()
        assert torch.isfinite(xs.grad).all()


def test_float32_inputs_give_float32_outputs_computed_in_float64():
    xs, ys = prompts(2, 10, 3, seed=4)
    estimator = NadarayaWatson("cayley", 0.3)
    preds = estimator(xs.float(), ys.float())
    assert preds.dtype == torch.float32
    expected = per_prefix_nw(xs.float().double(), ys.float().double(), "cayley", 0.3)
    torch.testing.assert_close(preds, expected.float(), rtol=1e-6, atol=1e-6)


def test_defaults_names_and_the_registry():
    assert NadarayaWatson("cosine").bandwidth == 0.1
    assert NadarayaWatson("cayley").bandwidth == 0.1
    assert NadarayaWatson("ga").bandwidth == 1.0
    assert NadarayaWatson("rbf").bandwidth == 1.0  # the old kernels keep their default
    assert NadarayaWatson("cosine").name == "nadaraya_watson(cosine, T=0.1)"
    assert NadarayaWatson("cayley", 0.25).name == "nadaraya_watson(cayley, T=0.25)"
    assert NadarayaWatson("ga").name == "nadaraya_watson(ga, T=1, β1=4, β2=1, penalty)"
    well = NadarayaWatson("ga", 0.5, beta1=2, beta2=0.5, wedge_mode="well", wedge_mu=0.3)
    assert well.name == "nadaraya_watson(ga, T=0.5, β1=2, β2=0.5, well μ=0.3)"
    assert well.ga_params == {"beta1": 2.0, "beta2": 0.5, "wedge_mode": "well", "wedge_mu": 0.3}
    built = get_estimator("nadaraya_watson", kernel="ga", wedge_mode="well", wedge_mu=0.3, bandwidth=0.5)
    assert built.name == "nadaraya_watson(ga, T=0.5, β1=4, β2=1, well μ=0.3)"
    xs, ys = prompts(1, 7, 3, seed=5)
    explicit = NadarayaWatson("ga", 1.0, beta1=4.0, beta2=1.0, wedge_mode="penalty")
    assert torch.equal(NadarayaWatson("ga")(xs, ys), explicit(xs, ys))


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda: NadarayaWatson("cosine", beta1=2.0), ["beta1", "2.0", "kernel='ga'", "kernel='cosine'"]),
        (lambda: NadarayaWatson("rbf", wedge_mode="well"), ["wedge_mode", "well", "kernel='ga'", "kernel='rbf'"]),
        (lambda: NadarayaWatson("cayley", beta2=0.0), ["beta2", "kernel='ga'"]),
        (lambda: NadarayaWatson("hilbert", wedge_mu=0.5), ["wedge_mu", "kernel='ga'"]),
        (lambda: NadarayaWatson("ga", wedge_mu=0.3), ["wedge_mu", "0.3", "wedge_mode='well'", "'penalty'"]),
        (lambda: NadarayaWatson("ga", wedge_mode="valley"), ["wedge_mode", "valley", "penalty", "well"]),
        (lambda: NadarayaWatson("ga", beta1=float("nan")), ["beta1", "nan", "finite"]),
        (lambda: NadarayaWatson("ga", beta2="1"), ["beta2", "'1'", "finite number"]),
        (lambda: NadarayaWatson("ga", wedge_mode="well", wedge_mu=math.inf), ["wedge_mu", "inf"]),
        (lambda: NadarayaWatson("cosine", bandwidth=0.0), ["bandwidth", "0.0", "(0.0, +inf)"]),
        (lambda: NadarayaWatson("cayley", bandwidth=-0.1), ["bandwidth", "-0.1", "(0.0, +inf)"]),
        (lambda: NadarayaWatson("angular"), ["kernel", "angular", "cayley"]),
    ],
)
def test_bad_arguments_raise_naming_them(make, fragments):
    with pytest.raises(ValueError) as info:
        make()
    for fragment in fragments:
        assert fragment in str(info.value)


# --------------------------------------------------------------------------- random Fourier features


def test_frequencies_equal_the_documents_global_seed_draw_and_leave_the_global_rng_alone():
    with torch.random.fork_rng():
        torch.manual_seed(42)
        documents = torch.randn(1, 32, dtype=torch.float64) * 2.0  # the document's W_rff on CPU
        state = torch.get_rng_state()
        rff = RandomFourierFeatures(n_dims=1, n_frequencies=32, scale=2.0, seed=42)
        assert torch.equal(torch.get_rng_state(), state)
    assert rff.frequencies.dtype == F64 and rff.frequencies.device.type == "cpu"
    assert torch.equal(rff.frequencies, documents)
    assert torch.equal(RandomFourierFeatures().frequencies, documents)  # the defaults are the document's
    assert not torch.equal(RandomFourierFeatures(seed=43).frequencies, documents)
    assert torch.equal(
        RandomFourierFeatures(n_dims=3, seed=7).frequencies, RandomFourierFeatures(3, seed=7).frequencies
    )


def test_features_are_cos_and_sin_of_the_projection_entry_by_entry():
    rff = RandomFourierFeatures(n_dims=2, n_frequencies=5, scale=1.5, seed=3)
    xs = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(6), dtype=F64)
    out = rff(xs)
    assert out.shape == (3, 4, 10) and out.dtype == F64
    w = rff.frequencies.tolist()
    for index in range(12):
        x = xs.reshape(12, 2)[index].tolist()
        for f in range(5):
            projection = x[0] * w[0][f] + x[1] * w[1][f]
            assert out.reshape(12, 10)[index, f].item() == pytest.approx(math.cos(projection), abs=1e-14)
            assert out.reshape(12, 10)[index, 5 + f].item() == pytest.approx(math.sin(projection), abs=1e-14)
    single = rff(xs[0, 0])  # a single row (..., n_dims) with no leading axes
    assert torch.equal(single, out[0, 0])
    as_float32 = rff(xs.float())
    assert as_float32.dtype == torch.float32
    torch.testing.assert_close(as_float32, out.float(), rtol=1e-5, atol=1e-5)
    # |φ(x)|² = n_frequencies for every x: the property that makes the angular kernels' unit rows meaningful
    torch.testing.assert_close(out.square().sum(-1), torch.full((3, 4), 5.0, dtype=F64))


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda: RandomFourierFeatures(n_dims=0), ["n_dims", "got 0", "[1, +inf)"]),
        (lambda: RandomFourierFeatures(n_frequencies=2.5), ["n_frequencies", "2.5", "integer"]),
        (lambda: RandomFourierFeatures(n_frequencies=0), ["n_frequencies", "got 0"]),
        (lambda: RandomFourierFeatures(scale=0.0), ["scale", "0.0", "(0.0, +inf)"]),
        (lambda: RandomFourierFeatures(scale=float("nan")), ["scale", "nan", "finite"]),
        (lambda: RandomFourierFeatures(seed=-1), ["seed", "-1", "[0, "]),
        (lambda: RandomFourierFeatures(seed=2**64), ["seed", str(2**64)]),
        (lambda: RandomFourierFeatures(n_dims=2)(torch.zeros(4, 3)), ["xs", "(..., 2)", "(4, 3)"]),
        (lambda: RandomFourierFeatures()(torch.zeros(())), ["xs", "(..., 1)", "()"]),
        (lambda: RandomFourierFeatures()(torch.zeros(4, 1, dtype=torch.int64)), ["xs", "floating-point", "int64"]),
        (lambda: RandomFourierFeatures()([[0.0]]), ["xs", "floating-point", "list"]),
    ],
)
def test_random_fourier_feature_arguments_are_validated(make, fragments):
    with pytest.raises(ValueError) as info:
        make()
    for fragment in fragments:
        assert fragment in str(info.value)


# --------------------------------------------------------------------------- estimators on features


def test_cosine_nw_on_rff_matches_a_loop_over_the_documents_embedding():
    with torch.random.fork_rng():
        torch.manual_seed(42)
        w_rff = torch.randn(1, 32, dtype=F64) * 2.0

    def rff_embed(x):  # the document's rff_embed
        projection = x @ w_rff
        return torch.cat([torch.cos(projection), torch.sin(projection)], dim=1)

    gen = torch.Generator().manual_seed(8)
    xs = 6 * torch.rand(2, 15, 1, generator=gen, dtype=F64) - 3
    ys = torch.sin(xs[..., 0])
    estimator = OnFeatures(NadarayaWatson("cosine"), RandomFourierFeatures())
    assert estimator.name == "nadaraya_watson(cosine, T=0.1) on rff(32, scale=2)"
    embedded = torch.stack([rff_embed(xs[b]) for b in range(2)])
    expected = per_prefix_nw(embedded, ys, "cosine", 0.1)
    torch.testing.assert_close(estimator(xs, ys), expected, rtol=1e-10, atol=1e-12)
    # the smoother on the features fits sin far better than linear ridge on x (checked against the target)
    on_features_error = (estimator(xs, ys) - ys)[:, 5:].square().mean()
    ridge_error = (Ridge(1.0)(xs, ys) - ys)[:, 5:].square().mean()
    assert on_features_error < 0.5 * ridge_error


def test_on_features_validates_its_arguments_and_the_mapped_inputs():
    with pytest.raises(ValueError, match="estimator must be an InContextEstimator, got function"):
        OnFeatures(lambda xs, ys: ys, RandomFourierFeatures())
    with pytest.raises(ValueError, match=r"features must be callable \(a feature map\), got int"):
        OnFeatures(NadarayaWatson(), 3)
    estimator = OnFeatures(NadarayaWatson("cosine"), RandomFourierFeatures(n_dims=2))
    assert isinstance(estimator, InContextEstimator)
    with pytest.raises(ValueError, match=r"xs must have shape \(\.\.\., n_dims\)"):
        estimator(torch.zeros(1, 4, 3), torch.zeros(1, 4))  # the feature map's input check
    with pytest.raises(ValueError, match="ys must have shape"):
        estimator(torch.zeros(1, 4, 2), torch.zeros(1, 5))  # the prompt check runs first
    named_by_type = OnFeatures(NadarayaWatson("cayley"), torch.tanh)
    assert named_by_type.name == "nadaraya_watson(cayley, T=0.1) on builtin_function_or_method"


def test_module_examples_run():
    assert doctest.testmod(nadaraya_watson_module, raise_on_error=True).attempted > 0
    assert doctest.testmod(features_module, raise_on_error=True).attempted > 0
