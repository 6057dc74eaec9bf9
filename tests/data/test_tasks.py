"""Tests of ``hf_icl.data.tasks``.

Every family is checked against references written here, independently of the library: a
per-example float64 Python re-computation of the targets from the returned parameters, closed-form
moments, and frequency tests. Statistical tolerances are at least five standard errors (computed
in closed form where possible, otherwise from the per-prompt spread, prompts being i.i.d.), and
every draw uses a fixed seed, so the tests are deterministic.
"""

from __future__ import annotations

import json
import math
from itertools import combinations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from hf_icl.data.inputs import DiagonalGaussianInputs, GaussianInputs, UniformInputs
from hf_icl.data.tasks import TaskFamily, available_tasks, get_task, iterate_prompts, make_task

# Small instances of every family (the key is the test id, the value ``(name, kwargs)``).
FAMILIES: dict[str, tuple[str, dict]] = {
    "linear_regression": ("linear_regression", {"n_dims": 4}),
    "linear_regression_scaled": (
        "linear_regression",
        {"n_dims": 5, "weight_prior": "scaled", "scale": 2.0, "inputs": {"name": "gaussian", "scale": 1.5}},
    ),
    "noisy_linear_regression": (
        "noisy_linear_regression",
        {"n_dims": 4, "noise_std": (0.1, 0.5), "noise_probs": (0.3, 0.7)},
    ),
    "noisy_linear_regression_renorm": (
        "noisy_linear_regression",
        {"n_dims": 3, "noise_std": 0.5, "renormalize_ys": True, "scale": 1.5, "inputs": "uniform"},
    ),
    "sparse_linear_regression": ("sparse_linear_regression", {"n_dims": 6, "sparsity": 2}),
    "linear_classification": ("linear_classification", {"n_dims": 4}),
    "quadratic_regression": ("quadratic_regression", {"n_dims": 4, "scale": 0.5}),
    "relu_2nn_regression": ("relu_2nn_regression", {"n_dims": 3, "hidden_size": 7, "scale": 1.3}),
    "decision_tree": ("decision_tree", {"n_dims": 4, "depth": 3}),
    "sinusoid": ("sinusoid", {}),
    "latent_group_sinusoid": ("latent_group_sinusoid", {"n_dims": 6, "group_size": 2}),
    "categorical_linear": ("categorical", {"n_dims": 4, "n_classes": 3, "bias_std": 0.5}),
    "categorical_rbf": (
        "categorical",
        {"n_dims": 3, "n_classes": 4, "function": "rbf", "n_features": 6, "bandwidth": 0.7, "bias_std": 0.3},
    ),
}
FAMILY_IDS = list(FAMILIES)
LINEAR_NAMES = ("linear_regression", "noisy_linear_regression", "sparse_linear_regression", "linear_classification")


def build(key: str, **overrides) -> TaskFamily:
    name, kwargs = FAMILIES[key]
    return get_task(name, **{**kwargs, **overrides})


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float64) if t.is_floating_point() else t.detach().cpu().numpy()


def expected_mean_square_norm(inputs, n_dims: int) -> float:
    """E‖x‖² of an input distribution, in closed form (written here, not taken from the library)."""
    if isinstance(inputs, GaussianInputs):
        return inputs.scale**2 * n_dims
    if isinstance(inputs, DiagonalGaussianInputs):
        return float(sum(inputs.variances))
    if isinstance(inputs, UniformInputs):
        a, b = inputs.low, inputs.high
        return n_dims * ((b - a) ** 2 / 12 + ((a + b) / 2) ** 2)  # variance + squared mean
    raise TypeError(f"no closed-form E‖x‖² in this test for {type(inputs).__name__}")


def weight_variance(family) -> float:
    return 1.0 if family.weight_prior == "standard" else 1.0 / family.n_dims


def renormalization_factor(family) -> float:
    """√(S / (S + E σ²)) for noisy linear regression with renormalize_ys (1 otherwise)."""
    if family.name != "noisy_linear_regression" or not family.renormalize_ys:
        return 1.0
    stds = family.noise_std if isinstance(family.noise_std, (list, tuple)) else (family.noise_std,)
    probs = family.noise_probs if family.noise_probs is not None else [1 / len(stds)] * len(stds)
    s = family.scale**2 * weight_variance(family) * expected_mean_square_norm(family.inputs, family.n_dims)
    noise = sum(p * sd**2 for p, sd in zip(probs, stds, strict=True))
    return math.sqrt(s / (s + noise))


def naive_signal(family, xs: torch.Tensor, params: dict) -> np.ndarray:
    """The noiseless target, recomputed one example at a time with Python loops in float64."""
    x = to_np(xs)
    p = {k: to_np(v) for k, v in params.items()}
    B, N, d = x.shape
    name = family.name
    if name == "categorical":
        out = np.zeros((B, N, family.n_classes))
    else:
        out = np.zeros((B, N))
    for b in range(B):
        for n in range(N):
            xv = x[b, n]
            if name in LINEAR_NAMES:
                value = family.scale * sum(p["w"][b, i] * xv[i] for i in range(d))
                out[b, n] = value * renormalization_factor(family)
            elif name == "quadratic_regression":
                out[b, n] = family.scale * sum(p["w"][b, i] * xv[i] ** 2 for i in range(d)) / math.sqrt(3)
            elif name == "relu_2nn_regression":
                r = family.hidden_size
                total = 0.0
                for j in range(r):
                    pre = sum(xv[i] * p["w1"][b, i, j] for i in range(d))
                    total += p["w2"][b, j] * max(pre, 0.0)
                out[b, n] = family.scale * math.sqrt(2 / r) * total
            elif name == "decision_tree":
                # Heap layout: level l holds nodes 2^l - 1 ... 2^(l+1) - 2; the path's decisions,
                # read as a binary number (right = 1), index the node within its level.
                prefix = 0
                for level in range(family.depth):
                    node = (2**level - 1) + prefix
                    coord = int(p["split_dims"][b, node])
                    prefix = 2 * prefix + (1 if xv[coord] > 0 else 0)
                out[b, n] = p["leaf_values"][b, prefix]
            elif name == "sinusoid":
                out[b, n] = p["amplitude"][b] * math.sin(p["frequency"][b] * xv[0] + p["phase"][b])
            elif name == "latent_group_sinusoid":
                z = p["latent"][b, n]
                out[b, n] = p["amplitude"][b] * math.sin(p["frequency"][b] * z + p["phase"][b])
            elif name == "categorical":
                if family.function == "linear":
                    feats = [xv[i] / math.sqrt(d) for i in range(d)]
                else:
                    F = family.n_features
                    feats = [
                        math.sqrt(2 / F)
                        * math.cos(sum(xv[i] * p["frequencies"][b, i, k] for i in range(d)) + p["phases"][b, k])
                        for k in range(F)
                    ]
                for c in range(family.n_classes):
                    logit = sum(f * p["weights"][b, k, c] for k, f in enumerate(feats)) + p["bias"][b, c]
                    out[b, n, c] = family.logit_scale * logit
            else:
                raise AssertionError(f"no reference for {name}")
    return out


def assert_params_equal(a: dict, b: dict):
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def per_prompt_mean_se(values: torch.Tensor) -> tuple[float, float]:
    """Mean over prompts of per-prompt means, and its standard error (prompts are i.i.d.)."""
    v = values.double().mean(dim=1).numpy()
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v)))


def assert_close_stat(estimate: float, target: float, se: float, *, n_se: float = 5.0, max_rel_se: float = 0.03):
    assert se <= max_rel_se * abs(target), f"test has no power: se={se} for target {target}"
    assert abs(estimate - target) <= n_se * se, f"estimate {estimate} vs target {target} (se {se})"


# ---------------------------------------------------------------------------------------------
# Registry, shapes, dtypes, determinism, serialisation
# ---------------------------------------------------------------------------------------------


def test_every_registered_family_is_covered():
    names = available_tasks()
    assert names == sorted(names)
    assert set(names) == {name for name, _ in FAMILIES.values()}


@pytest.mark.parametrize("key", FAMILY_IDS)
def test_shapes_dtypes_device_finite(key):
    family = build(key)
    B, N = 5, 9
    xs, ys, params = family.sample(B, N, seed=0, return_params=True)
    d = family.n_dims
    assert xs.shape == (B, N, d) and xs.dtype == torch.float32 and xs.device.type == "cpu"
    assert ys.shape == (B, N) and ys.device.type == "cpu"
    assert torch.isfinite(xs).all()
    if family.target_kind == "categorical":
        assert ys.dtype == torch.int64
        assert params["signal"].shape == (B, N, family.n_classes)
    else:
        assert ys.dtype == torch.float32
        assert torch.isfinite(ys).all()
        assert params["signal"].shape == (B, N)
    if family.target_kind == "binary":
        assert set(ys.unique().tolist()) <= {-1.0, 1.0}
    for key_, value in params.items():
        assert value.shape[0] == B, key_
        assert value.device.type == "cpu", key_
        if value.is_floating_point():
            assert torch.isfinite(value).all(), key_
    assert "task_id" not in params
    # Without return_params, the same draw without the dict.
    xs2, ys2 = family.sample(B, N, seed=0, device="cpu")
    assert torch.equal(xs, xs2) and torch.equal(ys, ys2)


@pytest.mark.parametrize("key", FAMILY_IDS)
def test_determinism(key):
    family = build(key)
    a = family.sample(4, 6, seed=11, return_params=True)
    b = family.sample(4, 6, seed=11, return_params=True)
    c = family.sample(4, 6, generator=torch.Generator().manual_seed(11), return_params=True)
    for other in (b, c):
        assert torch.equal(a[0], other[0]) and torch.equal(a[1], other[1])
        assert_params_equal(a[2], other[2])
    d = family.sample(4, 6, seed=12, return_params=True)
    assert not torch.equal(a[0], d[0])
    assert any(not torch.equal(a[2][k], d[2][k]) for k in a[2] if k != "signal" and a[2][k].is_floating_point())
    # A generator advances: two successive draws from one generator differ.
    g = torch.Generator().manual_seed(11)
    first, second = family.sample(4, 6, generator=g), family.sample(4, 6, generator=g)
    assert torch.equal(first[0], a[0]) and not torch.equal(second[0], a[0])


@pytest.mark.parametrize("key", FAMILY_IDS)
def test_to_dict_make_task_round_trip(key):
    family = build(key)
    spec = family.to_dict()
    assert spec["name"] == family.name
    rebuilt = make_task(spec)
    assert rebuilt == family and rebuilt is not family
    assert type(rebuilt) is type(family)
    assert make_task(family) is family
    # Through JSON (what configs carry): the description is stable and the numbers identical.
    from_json = make_task(json.loads(json.dumps(spec)))
    assert json.dumps(from_json.to_dict()) == json.dumps(spec)
    xa, ya = family.sample(3, 5, seed=1)
    xb, yb = from_json.sample(3, 5, seed=1)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # A changed hyperparameter breaks equality.
    assert make_task({**spec, "pool_seed": spec["pool_seed"] + 1}) != family


def test_list_hyperparameters_from_json_equal_tuples():
    as_tuple = make_task(
        {"name": "noisy_linear_regression", "n_dims": 3, "noise_std": (0.1, 0.5), "noise_probs": (0.3, 0.7)}
    )
    as_list = make_task(
        {"name": "noisy_linear_regression", "n_dims": 3, "noise_std": [0.1, 0.5], "noise_probs": [0.3, 0.7]}
    )
    assert as_list == as_tuple


def test_make_task_by_name_and_bad_specs():
    assert make_task("sinusoid") == get_task("sinusoid")
    with pytest.raises(ValueError, match="n_dims"):
        make_task("linear_regression")
    with pytest.raises(ValueError, match="name"):
        make_task({"n_dims": 3})
    with pytest.raises(ValueError, match="name"):
        make_task(42)


@pytest.mark.parametrize("key", FAMILY_IDS)
def test_signal_matches_naive_recomputation(key):
    family = build(key)
    xs, ys, params = family.sample(3, 7, seed=5, return_params=True)
    reference = naive_signal(family, xs, params)
    np.testing.assert_allclose(to_np(params["signal"]), reference, rtol=1e-4, atol=1e-5)
    name = family.name
    if name in (
        "linear_regression",
        "sparse_linear_regression",
        "quadratic_regression",
        "relu_2nn_regression",
        "decision_tree",
    ):
        assert torch.equal(ys, params["signal"])  # noiseless families observe the signal itself
    elif name == "linear_classification":
        clear = np.abs(reference) > 1e-5
        assert clear.mean() > 0.9
        np.testing.assert_array_equal(to_np(ys)[clear], np.where(reference[clear] > 0, 1.0, -1.0))
    elif name == "categorical":
        assert ((ys >= 0) & (ys < family.n_classes)).all()


@settings(max_examples=25, deadline=None)
@given(
    key=st.sampled_from(FAMILY_IDS),
    batch=st.integers(1, 5),
    points=st.integers(1, 8),
    dims=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_property_random_shapes(key, batch, points, dims, seed, data):
    name, kwargs = FAMILIES[key]
    kwargs = dict(kwargs)
    if name != "sinusoid":
        kwargs["n_dims"] = dims
        kwargs.pop("inputs", None)
    if name == "sparse_linear_regression":
        kwargs["sparsity"] = data.draw(st.integers(1, dims), label="sparsity")
    if name == "latent_group_sinusoid":
        kwargs["group_size"] = data.draw(st.integers(1, dims), label="group_size")
    family = get_task(name, **kwargs)
    d = family.n_dims
    fewest = kwargs.get("sparsity", kwargs.get("group_size", 1))  # subsets are drawn among active dims
    k = data.draw(st.integers(fewest, d), label="n_dims_truncated")
    xs, ys, params = family.sample(batch, points, seed=seed, n_dims_truncated=k, return_params=True)
    assert xs.shape == (batch, points, d) and xs.dtype == torch.float32
    assert ys.shape == (batch, points)
    assert ys.dtype == (torch.int64 if name == "categorical" else torch.float32)
    assert torch.isfinite(xs).all() and torch.isfinite(params["signal"]).all()
    assert (xs[..., k:] == 0).all()
    np.testing.assert_allclose(to_np(params["signal"]), naive_signal(family, xs, params), rtol=1e-4, atol=1e-4)
    if name == "sparse_linear_regression":
        assert ((params["w"][:, :k] != 0).sum(-1) == kwargs["sparsity"]).all() and not params["w"][:, k:].any()
    if name == "latent_group_sinusoid":
        assert (params["group"][:, :k].sum(-1) == kwargs["group_size"]).all() and not params["group"][:, k:].any()


# ---------------------------------------------------------------------------------------------
# Linear families: moments
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "weight_prior, scale, input_scale, d",
    [("standard", 1.0, 1.0, 5), ("scaled", 2.0, 1.0, 8), ("standard", 0.5, 2.0, 3)],
)
def test_linear_regression_target_variance(weight_prior, scale, input_scale, d):
    family = get_task(
        "linear_regression",
        n_dims=d,
        weight_prior=weight_prior,
        scale=scale,
        inputs={"name": "gaussian", "scale": input_scale},
    )
    xs, ys, params = family.sample(4000, 32, seed=0, return_params=True)
    tau2 = 1.0 if weight_prior == "standard" else 1.0 / d
    target = scale**2 * tau2 * input_scale**2 * d  # E[y²] = scale² E[wᵀ E[xxᵀ] w] = scale² τ² s² d
    mean_sq, se = per_prompt_mean_se(ys.square())
    assert_close_stat(mean_sq, target, se)
    mean, se_mean = per_prompt_mean_se(ys)
    assert abs(mean) <= 5 * se_mean
    # The weights themselves follow N(0, τ² I).
    w = params["w"].double()
    n = w.numel()
    assert abs(w.var().item() - tau2) <= 5 * tau2 * math.sqrt(2 / n)
    assert abs(w.mean().item()) <= 5 * math.sqrt(tau2 / n)


def test_quadratic_regression_matches_linear_second_moment():
    d, scale = 6, 1.5
    family = get_task("quadratic_regression", n_dims=d, scale=scale)
    ys = family.sample(5000, 32, seed=1)[1]
    # E[y²] = scale²/3 · Σ_i τ² E[x_i⁴] = scale² τ² d for x ~ N(0, I): the linear task's value.
    mean_sq, se = per_prompt_mean_se(ys.square())
    assert_close_stat(mean_sq, scale**2 * d, se)
    linear = get_task("linear_regression", n_dims=d, scale=scale).sample(5000, 32, seed=2)[1]
    lin_sq, lin_se = per_prompt_mean_se(linear.square())
    assert abs(mean_sq - lin_sq) <= 5 * math.hypot(se, lin_se)


def test_noisy_linear_regression_single_noise_level():
    sigma = 0.7
    family = get_task("noisy_linear_regression", n_dims=4, noise_std=sigma)
    xs, ys, params = family.sample(2000, 40, seed=3, return_params=True)
    assert torch.equal(params["noise_std"], torch.full((2000,), sigma))
    np.testing.assert_allclose(
        to_np(params["signal"]), to_np(torch.einsum("bnd,bd->bn", xs, params["w"])), rtol=1e-5, atol=1e-5
    )
    residual = (ys - params["signal"]).double().flatten()
    n = residual.numel()
    assert abs(residual.mean().item()) <= 5 * sigma / math.sqrt(n)
    assert abs(residual.var().item() - sigma**2) <= 5 * sigma**2 * math.sqrt(2 / n)
    # Independent of the signal, and Gaussian.
    corr = np.corrcoef(residual.numpy(), params["signal"].double().flatten().numpy())[0, 1]
    assert abs(corr) <= 5 / math.sqrt(n)
    assert stats.kstest(residual.numpy()[:20000] / sigma, "norm").pvalue > 1e-4


def test_noisy_linear_regression_noise_mixture():
    levels, probs = (0.1, 0.4, 1.6), (0.2, 0.3, 0.5)
    family = get_task("noisy_linear_regression", n_dims=3, noise_std=levels, noise_probs=probs)
    B, N = 8000, 50
    xs, ys, params = family.sample(B, N, seed=4, return_params=True)
    assert set(params["noise_std"].tolist()) <= {torch.tensor(v).item() for v in levels}
    # Per-task residual variance (mean known to be 0): σ_b² χ²_N / N, relative sd √(2/N) = 0.2.
    per_task_var = (ys - params["signal"]).double().square().mean(dim=1).numpy()
    level_var = np.array(levels) ** 2
    # Clusters: nearest σ² on a log scale. Neighbouring σ²'s are 16x apart, so a task is
    # misassigned only if χ²_50/50 is off by a factor 4: P(χ²_50 < 12.5) ≈ 1e-8, P(χ²_50 > 200) ≈ 1e-19.
    nearest = np.abs(np.log(per_task_var)[:, None] - np.log(level_var)[None, :]).argmin(axis=1)
    np.testing.assert_allclose(np.array(levels)[nearest], to_np(params["noise_std"]), rtol=1e-6)
    ratio = per_task_var / level_var[nearest]
    assert 0.25 < ratio.min() and ratio.max() < 4
    assert abs(ratio.mean() - 1) <= 5 * math.sqrt(2 / N) / math.sqrt(B)
    for i, p in enumerate(probs):
        frac = (nearest == i).mean()
        assert abs(frac - p) <= 5 * math.sqrt(p * (1 - p) / B), (levels[i], frac, p)


def test_noisy_linear_regression_default_noise_probs_uniform():
    family = get_task("noisy_linear_regression", n_dims=2, noise_std=[0.2, 0.4, 0.8, 1.6])
    noise = family.sample(20000, 1, seed=5, return_params=True)[2]["noise_std"]
    for level in (0.2, 0.4, 0.8, 1.6):
        frac = (noise == torch.tensor(level)).double().mean().item()
        assert abs(frac - 0.25) <= 5 * math.sqrt(0.25 * 0.75 / 20000)


def test_noisy_linear_regression_renormalize_ys():
    variances = (1.0, 2.0, 0.5, 1.5)
    common = dict(n_dims=4, scale=1.5, noise_std=(0.5, 1.5), inputs={"name": "diagonal", "variances": variances})
    plain = get_task("noisy_linear_regression", **common)
    renorm = get_task("noisy_linear_regression", renormalize_ys=True, **common)
    signal_power = 1.5**2 * 1.0 * sum(variances)  # scale² τ² E‖x‖² = 11.25
    noise_power = (0.5**2 + 1.5**2) / 2
    r = math.sqrt(signal_power / (signal_power + noise_power))
    xs, ys_plain, p_plain = plain.sample(6000, 32, seed=6, return_params=True)
    xs2, ys_renorm, p_renorm = renorm.sample(6000, 32, seed=6, return_params=True)
    # Same random stream, so renormalisation is an exact rescaling of y and of the signal by r.
    assert torch.equal(xs, xs2)
    torch.testing.assert_close(ys_renorm, r * ys_plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(p_renorm["signal"], r * p_plain["signal"], rtol=1e-5, atol=1e-5)
    mean_sq, se = per_prompt_mean_se(ys_renorm.square())
    assert_close_stat(mean_sq, signal_power, se)
    plain_sq, plain_se = per_prompt_mean_se(ys_plain.square())
    assert_close_stat(plain_sq, signal_power + noise_power, plain_se)


def test_sparse_linear_regression_support():
    d, k, B = 8, 3, 20000
    family = get_task("sparse_linear_regression", n_dims=d, sparsity=k, weight_prior="scaled")
    w = family.sample(B, 1, seed=7, return_params=True)[2]["w"]
    nonzero = w != 0
    assert (nonzero.sum(-1) == k).all()
    # Each coordinate is in the support with probability k/d, independently across prompts.
    p = k / d
    counts = nonzero.sum(0).double().numpy()
    assert np.all(np.abs(counts - B * p) <= 5 * math.sqrt(B * p * (1 - p))), counts
    # Every one of the C(d, k) supports is equally likely.
    index = {s: i for i, s in enumerate(combinations(range(d), k))}
    support_counts = np.zeros(len(index))
    for row in nonzero.numpy():
        support_counts[index[tuple(np.flatnonzero(row))]] += 1
    assert stats.chisquare(support_counts).pvalue > 1e-4
    # The kept weights follow N(0, τ²) with τ² = 1/d.
    kept = w[nonzero].double()
    n = kept.numel()
    assert abs(kept.var().item() - 1 / d) <= 5 * (1 / d) * math.sqrt(2 / n)


@pytest.mark.parametrize("n_tasks", [None, 16])
def test_sparse_support_lies_in_the_active_coordinates_at_every_curriculum_stage(n_tasks):
    # Garg et al.'s curriculum (5 of 20 dims active at first): drawn among all 20 coordinates, the
    # support missed every active one in C(15,3)/C(20,3) ≈ 40 % of prompts, whose y were then ≡ 0.
    family = get_task("sparse_linear_regression", n_dims=20, sparsity=3, n_tasks=n_tasks)
    for active in range(3, 21):
        xs, ys, params = family.sample(500, 11, seed=active, n_dims_truncated=active, return_params=True)
        effective = params["w"][:, :active] != 0
        assert (effective.sum(-1) == 3).all() and not params["w"][:, active:].any()
        assert (ys.abs().amax(-1) > 0).all()  # no prompt is all zeros
        torch.testing.assert_close(ys, torch.einsum("bnd,bd->bn", xs, params["w"]))
    # every support among the active coordinates stays equally likely (5 active: C(5, 3) = 10 supports)
    w = get_task("sparse_linear_regression", n_dims=20, sparsity=3).sample(
        20000, 1, seed=1, n_dims_truncated=5, return_params=True
    )[2]["w"]
    index = {s: i for i, s in enumerate(combinations(range(5), 3))}
    counts = np.zeros(len(index))
    for row in (w[:, :5] != 0).numpy():
        counts[index[tuple(np.flatnonzero(row))]] += 1
    assert stats.chisquare(counts).pvalue > 1e-4
    with pytest.raises(ValueError, match="sparsity needs at least 3 active input dimensions, got n_dims_truncated=2"):
        family.sample(4, 5, seed=0, n_dims_truncated=2)


def test_batch_renormalization_is_gargs_rule():
    # Garg et al.: ys_noisy * sqrt(d) / ys_noisy.std(), the std taken over the whole batch
    common = dict(n_dims=6, noise_std=0.7)
    plain = get_task("noisy_linear_regression", **common)
    batch = get_task("noisy_linear_regression", renormalize_ys="batch", **common)
    xs, ys_plain, p_plain = plain.sample(50, 9, seed=3, return_params=True)
    xs2, ys_batch, p_batch = batch.sample(50, 9, seed=3, return_params=True)
    assert torch.equal(xs, xs2)
    expected = ys_plain.double() * math.sqrt(6) / ys_plain.double().std()
    torch.testing.assert_close(ys_batch.double(), expected, rtol=1e-5, atol=1e-5)
    assert abs(ys_batch.double().std().item() - math.sqrt(6)) < 1e-4
    factor = (ys_batch / ys_plain).mean()
    torch.testing.assert_close(p_batch["signal"], factor * p_plain["signal"], rtol=1e-5, atol=1e-5)
    assert get_task("noisy_linear_regression", renormalize_ys="fixed", **common).renormalization < 1
    with pytest.raises(ValueError, match="renormalize_ys must be one of"):
        get_task("noisy_linear_regression", renormalize_ys="per_prompt", **common)


def test_linear_classification_signs():
    family = get_task("linear_classification", n_dims=5, scale=0.3)
    xs, ys, params = family.sample(3000, 20, seed=8, return_params=True)
    assert set(ys.unique().tolist()) == {-1.0, 1.0}
    margin = torch.einsum("bnd,bd->bn", xs.double(), params["w"].double())
    clear = margin.abs() > 1e-5
    assert clear.double().mean() > 0.99
    assert torch.equal(ys[clear], torch.where(margin[clear] > 0, 1.0, -1.0).float())
    frac = (ys > 0).double().mean(dim=1)  # per prompt, prompts i.i.d.
    assert abs(frac.mean().item() - 0.5) <= 5 * frac.std().item() / math.sqrt(3000)
    # sign(0) is +1.
    observed = family.observe(torch.tensor([[0.0, -2.0, 3.0, -0.0]]), {}, None)
    assert observed.tolist() == [[1.0, -1.0, 1.0, 1.0]]


# ---------------------------------------------------------------------------------------------
# Nonlinear families
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inputs", ["gaussian", {"name": "uniform", "low": -1.0, "high": 2.0}])
def test_relu_2nn_second_moment(inputs):
    # y = s √(2/r) Σ_j a_j ReLU(w_jᵀx): E[y²] = s² (2/r) Σ_j E[ReLU(w_jᵀx)²] and, given x,
    # w_jᵀx ~ N(0, ‖x‖²), E[ReLU(g)²] = ‖x‖²/2, so E[y²] = s² E‖x‖².
    d, r, s = 4, 16, 1.3
    family = get_task("relu_2nn_regression", n_dims=d, hidden_size=r, scale=s, inputs=inputs)
    xs, ys = family.sample(5000, 32, seed=9)
    target = s**2 * expected_mean_square_norm(family.inputs, d)
    mean_sq, se = per_prompt_mean_se(ys.square())
    assert_close_stat(mean_sq, target, se)


def test_relu_2nn_second_moment_monte_carlo_numpy():
    # The same moment against a Monte-Carlo estimate drawn with numpy, outside torch entirely.
    d, r = 3, 5
    rng = np.random.default_rng(0)
    m = 200_000
    x = rng.standard_normal((m, d))
    w1 = rng.standard_normal((m, d, r))
    w2 = rng.standard_normal((m, r))
    y = math.sqrt(2 / r) * (np.maximum(np.einsum("md,mdr->mr", x, w1), 0) * w2).sum(-1)
    mc, mc_se = (y**2).mean(), (y**2).std() / math.sqrt(m)
    family = get_task("relu_2nn_regression", n_dims=d, hidden_size=r)
    mean_sq, se = per_prompt_mean_se(family.sample(8000, 25, seed=10)[1].square())
    assert abs(mean_sq - mc) <= 5 * math.hypot(se, mc_se)


def test_decision_tree_piecewise_constant():
    depth, d = 2, 3
    family = get_task("decision_tree", n_dims=d, depth=depth)
    xs, ys, params = family.sample(50, 300, seed=11, return_params=True)
    for b in range(50):
        values = set(ys[b].tolist())
        assert len(values) <= 2**depth
        assert values <= set(params["leaf_values"][b].tolist())
    assert max(len(set(ys[b].tolist())) for b in range(50)) > 1
    # Same signs on every coordinate -> same leaf, whatever the magnitudes.
    g = torch.Generator().manual_seed(0)
    magnitudes = 0.01 + 5 * torch.rand(xs.shape, generator=g)
    moved = torch.sign(xs) * magnitudes
    assert torch.equal(family.signal(moved, params), ys)
    # Flipping the sign of the root's split coordinate changes the leaf of every sample.
    root = params["split_dims"][:, 0]
    flipped = xs.clone()
    flipped[torch.arange(50)[:, None], torch.arange(300)[None, :], root[:, None]] *= -1
    assert (family.leaf_index(flipped, params) != family.leaf_index(xs, params)).all()
    assert params["split_dims"].shape == (50, 2**depth - 1)
    assert params["leaf_values"].shape == (50, 2**depth)


def test_decision_tree_parameter_distribution():
    depth, d, B = 4, 5, 3000
    family = get_task("decision_tree", n_dims=d, depth=depth)
    params = family.sample(B, 1, seed=12, return_params=True)[2]
    leaves = params["leaf_values"].double().flatten().numpy()
    n = leaves.size
    assert abs(leaves.mean()) <= 5 / math.sqrt(n)
    assert abs(leaves.var() - 1) <= 5 * math.sqrt(2 / n)
    assert stats.kstest(leaves, "norm").pvalue > 1e-4
    splits = params["split_dims"].flatten()
    assert splits.dtype == torch.int64 and splits.min() >= 0 and splits.max() < d
    counts = torch.bincount(splits, minlength=d).double().numpy()
    m = splits.numel()
    assert np.all(np.abs(counts - m / d) <= 5 * math.sqrt(m * (1 / d) * (1 - 1 / d)))


def test_sinusoid_ranges_and_noise():
    family = get_task(
        "sinusoid", amplitude_range=(0.2, 1.0), frequency_range=(1.0, 4.0), phase_range=(-1.0, 1.0), noise_std=0.3
    )
    B, N = 4000, 50
    xs, ys, params = family.sample(B, N, seed=13, return_params=True)
    assert xs.shape == (B, N, 1)
    assert xs.min() >= -3 and xs.max() < 3 and xs.min() < -2.99 and xs.max() > 2.99
    x = xs.double().flatten()
    assert abs(x.mean().item()) <= 5 * math.sqrt(3 / x.numel())  # U[-3, 3): variance 36/12 = 3
    assert abs(x.var().item() - 3) <= 5 * math.sqrt((36**2 / 80 - 9) / x.numel())  # Var(x²) = E x⁴ - 9
    for key, (lo, hi) in {"amplitude": (0.2, 1.0), "frequency": (1.0, 4.0), "phase": (-1.0, 1.0)}.items():
        v = params[key].double()
        assert v.min() >= lo and v.max() < hi, key
        assert abs(v.mean().item() - (lo + hi) / 2) <= 5 * (hi - lo) / math.sqrt(12 * B), key
    residual = (ys - params["signal"]).double().flatten()
    n = residual.numel()
    assert abs(residual.var().item() - 0.09) <= 5 * 0.09 * math.sqrt(2 / n)
    assert abs(residual.mean().item()) <= 5 * 0.3 / math.sqrt(n)


def test_sinusoid_default_parameter_ranges():
    params = get_task("sinusoid").sample(2000, 1, seed=14, return_params=True)[2]
    for key, (lo, hi) in {"amplitude": (0.5, 2.0), "frequency": (0.5, 2.5), "phase": (0.0, 2 * math.pi)}.items():
        assert params[key].min() >= lo and params[key].max() < hi, key


def test_sinusoid_requires_one_dimension():
    with pytest.raises(ValueError, match="n_dims"):
        get_task("sinusoid", n_dims=2)
    assert get_task("sinusoid").n_dims == 1


def test_latent_group_sinusoid_features():
    d, g, B, N = 7, 3, 300, 200
    family = get_task("latent_group_sinusoid", n_dims=d, group_size=g)
    xs, ys, params = family.sample(B, N, seed=15, return_params=True)
    group = params["group"]
    assert group.dtype == torch.bool and (group.sum(-1) == g).all()
    # Group membership is uniform over coordinates.
    p = g / d
    counts = group.sum(0).double().numpy()
    assert np.all(np.abs(counts - B * p) <= 5 * math.sqrt(B * p * (1 - p)))
    z = params["latent"].double()
    x = xs.double()
    in_group = group[:, None, :].expand(B, N, d)
    z_full = z[..., None].expand(B, N, d)
    # Group features: x = z + 0.3 ε, so Var x = 1.09 and corr(x, z) = 1/√1.09.
    gx, gz = x[in_group].numpy(), z_full[in_group].numpy()
    n = gx.size
    rho = 1 / math.sqrt(1 + 0.3**2)
    assert abs(np.corrcoef(gx, gz)[0, 1] - rho) <= 5 * (1 - rho**2) / math.sqrt(n)
    assert abs(gx.var() - 1.09) <= 5 * 1.09 * math.sqrt(2 / n)
    # The noise of the copies is exactly the gap to the latent: N(0, 0.3²).
    assert abs((gx - gz).var() - 0.09) <= 5 * 0.09 * math.sqrt(2 / n)
    # Distractors: N(0, 0.5²), uncorrelated with z.
    dx, dz = x[~in_group].numpy(), z_full[~in_group].numpy()
    m = dx.size
    assert abs(dx.std() - 0.5) <= 5 * 0.5 / math.sqrt(2 * m)
    assert abs(np.corrcoef(dx, dz)[0, 1]) <= 5 / math.sqrt(m)
    assert abs(z.var().item() - 1) <= 5 * math.sqrt(2 / z.numel())
    residual = (ys - params["signal"]).double()
    assert abs(residual.var().item() - 0.01) <= 5 * 0.01 * math.sqrt(2 / residual.numel())


def test_latent_group_sinusoid_rejects_inputs():
    with pytest.raises(ValueError, match="inputs"):
        get_task("latent_group_sinusoid", inputs="gaussian")
    with pytest.raises(ValueError, match="inputs"):
        get_task("latent_group_sinusoid", inputs=GaussianInputs())


def test_categorical_uniform_labels_at_zero_logit_scale():
    C = 5
    family = get_task("categorical", n_dims=3, n_classes=C, logit_scale=0.0, bias_std=1.0)
    xs, ys, params = family.sample(200, 100, seed=16, return_params=True)
    assert (params["signal"] == 0).all()
    assert ys.dtype == torch.int64 and ys.min() >= 0 and ys.max() < C
    counts = torch.bincount(ys.flatten(), minlength=C).double().numpy()
    n = ys.numel()
    assert np.all(np.abs(counts - n / C) <= 5 * math.sqrt(n * (1 / C) * (1 - 1 / C)))
    assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"function": "linear", "n_classes": 4, "bias_std": 0.5, "logit_scale": 2.0},
        {"function": "rbf", "n_classes": 3, "n_features": 16, "bandwidth": 0.8, "bias_std": 0.2},
    ],
    ids=["linear", "rbf"],
)
def test_categorical_label_frequencies_match_softmax(kwargs):
    family = get_task("categorical", n_dims=3, **kwargs)
    C = family.n_classes
    xs, ys, params = family.sample(1, 60000, seed=17, return_params=True)  # one task, many points
    logits = params["signal"][0].double()
    np.testing.assert_allclose(logits[:50].numpy(), naive_signal(family, xs[:, :50], params)[0], rtol=1e-4, atol=1e-5)
    probs = torch.softmax(logits, dim=-1)
    labels = ys[0]
    assert labels.min() >= 0 and labels.max() < C
    onehot = torch.nn.functional.one_hot(labels, C).double()
    # Count of class c minus Σ_n p_nc is a sum of independent zero-mean terms with variance
    # Σ_n p_nc (1 - p_nc); check it overall and within groups defined by the logits alone.
    groups = [torch.ones_like(labels, dtype=torch.bool)] + [logits.argmax(-1) == c for c in range(C)]
    checked = 0
    for mask in groups:
        if mask.sum() < 1000:
            continue
        checked += 1
        observed = onehot[mask].sum(0)
        expected = probs[mask].sum(0)
        sd = (probs[mask] * (1 - probs[mask])).sum(0).sqrt()
        assert ((observed - expected).abs() <= 5 * sd).all(), (observed, expected, sd)
    assert checked >= 3
    assert (probs.mean(0) < 0.95).all()  # the task is not degenerate


def test_categorical_rbf_features_approximate_the_rbf_kernel():
    # Random Fourier features: E_task[ψ(x)ᵀψ(x')] = exp(-‖x - x'‖² / (2 h²)) for bandwidth h.
    h, F, B = 0.8, 16, 6000
    family = get_task("categorical", n_dims=3, function="rbf", n_features=F, bandwidth=h)
    xs, _, params = family.sample(B, 2, seed=23, return_params=True)
    freqs = params["frequencies"].double()
    assert abs(freqs.var().item() - 1 / h**2) <= 5 * (1 / h**2) * math.sqrt(2 / freqs.numel())
    phases = params["phases"].double()
    assert phases.min() >= 0 and phases.max() < 2 * math.pi
    assert abs(phases.mean().item() - math.pi) <= 5 * (2 * math.pi) / math.sqrt(12 * phases.numel())
    feats = family.features(xs, params).double()  # (B, 2, F)
    gram = (feats[:, 0] * feats[:, 1]).sum(-1)
    kernel = torch.exp(-(xs[:, 0] - xs[:, 1]).double().square().sum(-1) / (2 * h**2))
    diff = gram - kernel
    se = diff.std().item() / math.sqrt(B)
    assert se < 0.01 and abs(diff.mean().item()) <= 5 * se
    self_similarity = feats.square().sum(-1).flatten()  # k(x, x) = 1
    se_self = self_similarity.std().item() / math.sqrt(self_similarity.numel())
    assert abs(self_similarity.mean().item() - 1) <= 5 * se_self


# ---------------------------------------------------------------------------------------------
# Curriculum truncation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [k for k in FAMILY_IDS if FAMILIES[k][0] != "sinusoid"])
def test_n_dims_truncated(key):
    family = build(key)
    k = 2
    xs_full, _, p_full = family.sample(6, 10, seed=18, return_params=True)
    xs, ys, params = family.sample(6, 10, seed=18, n_dims_truncated=k, return_params=True)
    assert (xs[..., k:] == 0).all()
    assert (xs[..., :k] != 0).all()
    # Truncation only zeroes coordinates: the random stream and the kept coordinates are unchanged
    # (but for the latent group, whose copies now sit among the active features).
    if family.name != "latent_group_sinusoid":
        assert torch.equal(xs[..., :k], xs_full[..., :k])
    for name in p_full:
        if name not in ("signal", "w", "group"):
            assert torch.equal(params[name], p_full[name]), name
    # Coordinate subsets (sparse support, feature group) are drawn among the active coordinates only.
    for name, size in (("w", getattr(family, "sparsity", None)), ("group", getattr(family, "group_size", None))):
        if size is not None and name in params:
            chosen = params[name] != 0
            assert (chosen.sum(-1) == size).all() and not chosen[:, k:].any(), name
    # Targets are computed from the truncated inputs.
    np.testing.assert_allclose(to_np(params["signal"]), naive_signal(family, xs, params), rtol=1e-4, atol=1e-5)
    # n_dims_truncated = n_dims is a no-op.
    xs_same = family.sample(6, 10, seed=18, n_dims_truncated=family.n_dims)[0]
    assert torch.equal(xs_same, xs_full)


# ---------------------------------------------------------------------------------------------
# Finite task pools
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", FAMILY_IDS)
def test_pooled_prompts_use_pool_tasks(key):
    T = 4
    family = build(key, n_tasks=T, pool_seed=7)
    pool = family.task_pool()
    pool_copy = {k: v.clone() for k, v in pool.items()}
    xs, ys, params = family.sample(64, 5, seed=19, return_params=True)
    ids = params["task_id"]
    assert ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < T
    for name, value in pool.items():
        assert value.shape[0] == T
        assert torch.equal(params[name], value[ids]), name
    # The pool is drawn once on the CPU from pool_seed, independently of the sampling generator.
    independent = family.sample_task_params(T, torch.Generator().manual_seed(7), torch.device("cpu"))
    assert_params_equal(pool_copy, independent)
    # Sampling does not write into the pool.
    assert_params_equal(family.task_pool(), pool_copy)
    # Targets of pooled prompts are those of the pooled tasks.
    np.testing.assert_allclose(
        to_np(params["signal"][:3]),
        naive_signal(family, xs[:3], {k: v[:3] for k, v in params.items()}),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("key", FAMILY_IDS)
def test_pool_depends_only_on_pool_seed(key):
    a = build(key, n_tasks=3, pool_seed=5).task_pool()
    b = build(key, n_tasks=3, pool_seed=5).task_pool()
    c = build(key, n_tasks=3, pool_seed=6).task_pool()
    assert_params_equal(a, b)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_pool_uses_exactly_t_tasks_uniformly():
    T, B = 5, 20000
    family = get_task("linear_regression", n_dims=3, n_tasks=T, pool_seed=1)
    params = family.sample(B, 2, seed=20, return_params=True)[2]
    assert torch.unique(params["w"], dim=0).shape[0] == T
    counts = torch.bincount(params["task_id"], minlength=T).double().numpy()
    assert np.all(np.abs(counts - B / T) <= 5 * math.sqrt(B * (1 / T) * (1 - 1 / T))), counts
    # Two different sampling seeds draw from the same pool.
    other = get_task("linear_regression", n_dims=3, n_tasks=T, pool_seed=1).sample(50, 2, seed=21, return_params=True)[
        2
    ]
    pool_rows = {tuple(row) for row in family.task_pool()["w"].tolist()}
    assert {tuple(row) for row in other["w"].tolist()} <= pool_rows


def test_fresh_tasks_are_all_distinct():
    family = get_task("linear_regression", n_dims=3)
    params = family.sample(500, 2, seed=22, return_params=True)[2]
    assert "task_id" not in params
    assert torch.unique(params["w"], dim=0).shape[0] == 500
    with pytest.raises(ValueError, match="n_tasks"):
        family.task_pool()


# ---------------------------------------------------------------------------------------------
# iterate_prompts
# ---------------------------------------------------------------------------------------------


def test_iterate_prompts_chunks_and_stream():
    family = get_task("noisy_linear_regression", n_dims=3, noise_std=(0.1, 0.3))
    chunks = list(iterate_prompts(family, 10, 6, seed=3, batch_size=4))
    assert [c[0].shape[0] for c in chunks] == [4, 4, 2]
    assert all(c[0].shape == (c[0].shape[0], 6, 3) and c[1].shape == (c[0].shape[0], 6) for c in chunks)
    xs = torch.cat([c[0] for c in chunks])
    ys = torch.cat([c[1] for c in chunks])
    assert xs.shape == (10, 6, 3) and ys.shape == (10, 6)
    # The documented stream: successive draws of these sizes from one generator seeded `seed`.
    g = torch.Generator().manual_seed(3)
    manual = [family.sample(size, 6, generator=g, return_params=True) for size in (4, 4, 2)]
    for chunk, ref in zip(chunks, manual, strict=True):
        assert torch.equal(chunk[0], ref[0]) and torch.equal(chunk[1], ref[1])
        assert_params_equal(chunk[2], ref[2])
    again = list(iterate_prompts(family, 10, 6, seed=3, batch_size=4))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(chunks, again, strict=True))
    other = torch.cat([c[0] for c in iterate_prompts(family, 10, 6, seed=4, batch_size=4)])
    assert not torch.equal(other, xs)


def test_iterate_prompts_default_and_large_batch():
    family = get_task("linear_regression", n_dims=2)
    assert [c[0].shape[0] for c in iterate_prompts(family, 1500, 2, seed=0)] == [1024, 476]
    assert [c[0].shape[0] for c in iterate_prompts(family, 7, 2, seed=0, batch_size=100)] == [7]
    assert [c[0].shape[0] for c in iterate_prompts(family, 8, 2, seed=0, batch_size=4)] == [4, 4]
    chunks = list(iterate_prompts(family, 5, 3, seed=0, batch_size=2, n_dims_truncated=1))
    assert all((c[0][..., 1:] == 0).all() and (c[0][..., :1] != 0).all() for c in chunks)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_prompts": 0}, "n_prompts"),
        ({"batch_size": 0}, "batch_size"),
        ({"n_points": 0}, "n_points"),
        ({"seed": -1}, "seed"),
        ({"n_dims_truncated": 3}, "n_dims_truncated"),
    ],
)
def test_iterate_prompts_rejects_bad_arguments(kwargs, match):
    family = get_task("linear_regression", n_dims=2)
    args = {"n_prompts": 4, "n_points": 3, "seed": 0, "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        list(iterate_prompts(family, args.pop("n_prompts"), args.pop("n_points"), **args))


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def test_unknown_family_lists_known_names():
    with pytest.raises(ValueError, match="unknown task family") as info:
        get_task("linear_regresion", n_dims=3)
    for name in available_tasks():
        assert name in str(info.value)


BAD_TASKS = [
    ("linear_regression", {"n_dims": 3, "foo": 1}, "foo"),
    ("linear_regression", {}, "n_dims"),
    ("linear_regression", {"n_dims": 0}, "n_dims"),
    ("linear_regression", {"n_dims": 2.0}, "n_dims"),
    ("linear_regression", {"n_dims": True}, "n_dims"),
    ("linear_regression", {"n_dims": 3, "weight_prior": "wide"}, "weight_prior"),
    ("linear_regression", {"n_dims": 3, "scale": 0.0}, "scale"),
    ("linear_regression", {"n_dims": 3, "scale": float("nan")}, "scale"),
    ("linear_regression", {"n_dims": 3, "n_tasks": 0}, "n_tasks"),
    ("linear_regression", {"n_dims": 3, "pool_seed": -1}, "pool_seed"),
    ("linear_regression", {"n_dims": 3, "inputs": "cauchy"}, "cauchy"),
    ("linear_regression", {"n_dims": 3, "inputs": None}, "inputs"),
    ("linear_regression", {"n_dims": 3, "inputs": {"name": "diagonal", "variances": (1.0, 2.0)}}, "variances"),
    ("sparse_linear_regression", {"n_dims": 3, "sparsity": 4}, "sparsity"),
    ("sparse_linear_regression", {"n_dims": 3, "sparsity": 0}, "sparsity"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": -0.1}, "noise_std"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": (0.1, -0.2)}, "noise_std"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": ()}, "noise_std"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": (0.1, 0.2), "noise_probs": (0.5, 0.6)}, "noise_probs"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": (0.1, 0.2), "noise_probs": (1.0,)}, "noise_probs"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": (0.1, 0.2), "noise_probs": (1.2, -0.2)}, "noise_probs"),
    ("noisy_linear_regression", {"n_dims": 3, "noise_std": 0.1, "noise_probs": (0.5, 0.5)}, "noise_probs"),
    ("relu_2nn_regression", {"n_dims": 3, "hidden_size": 0}, "hidden_size"),
    ("relu_2nn_regression", {"n_dims": 3, "scale": -1.0}, "scale"),
    ("decision_tree", {"n_dims": 3, "depth": 0}, "depth"),
    ("decision_tree", {"n_dims": 3, "depth": 17}, "depth"),
    ("sinusoid", {"n_dims": 2}, "n_dims"),
    ("sinusoid", {"amplitude_range": (2.0, 1.0)}, "amplitude_range"),
    ("sinusoid", {"frequency_range": (1.0, 1.0)}, "frequency_range"),
    ("sinusoid", {"phase_range": (0.0,)}, "phase_range"),
    ("sinusoid", {"amplitude_range": (0.0, float("inf"))}, "amplitude_range"),
    ("sinusoid", {"noise_std": -1.0}, "noise_std"),
    ("latent_group_sinusoid", {"inputs": "gaussian"}, "inputs"),
    ("latent_group_sinusoid", {"n_dims": 4, "group_size": 5}, "group_size"),
    ("latent_group_sinusoid", {"group_size": 0}, "group_size"),
    ("latent_group_sinusoid", {"feature_noise": -0.1}, "feature_noise"),
    ("latent_group_sinusoid", {"distractor_std": -0.1}, "distractor_std"),
    ("categorical", {"n_dims": 3, "n_classes": 1}, "n_classes"),
    ("categorical", {"n_dims": 3, "function": "poly"}, "function"),
    ("categorical", {"n_dims": 3, "n_features": 0}, "n_features"),
    ("categorical", {"n_dims": 3, "bandwidth": 0.0}, "bandwidth"),
    ("categorical", {"n_dims": 3, "logit_scale": -1.0}, "logit_scale"),
    ("categorical", {"n_dims": 3, "bias_std": -1.0}, "bias_std"),
]


@pytest.mark.parametrize("name, kwargs, match", BAD_TASKS, ids=[f"{n}-{m}" for n, _, m in BAD_TASKS])
def test_bad_hyperparameters_raise_naming_the_argument(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_task(name, **kwargs)


BAD_SAMPLES = [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.0}, "batch_size"),
    ({"n_points": 0}, "n_points"),
    ({"n_dims_truncated": 0}, "n_dims_truncated"),
    ({"n_dims_truncated": 4}, "n_dims_truncated"),
    ({"seed": -1}, "seed"),
    ({"seed": 1, "generator": torch.Generator().manual_seed(1)}, "generator"),
    ({"generator": torch.Generator().manual_seed(1), "device": "cuda"}, "device"),
]


@pytest.mark.parametrize("kwargs, match", BAD_SAMPLES, ids=[m for _, m in BAD_SAMPLES])
def test_bad_sample_arguments_raise_naming_the_argument(kwargs, match):
    family = get_task("linear_regression", n_dims=3)
    args = {"batch_size": 2, "n_points": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        family.sample(args.pop("batch_size"), args.pop("n_points"), **args)


def test_matching_generator_and_device_are_accepted():
    family = get_task("linear_regression", n_dims=3)
    xs = family.sample(2, 3, generator=torch.Generator().manual_seed(0), device="cpu")[0]
    assert torch.equal(xs, family.sample(2, 3, seed=0)[0])
