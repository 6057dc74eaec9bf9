"""Tests of the dMMSE estimator (the Bayes predictor of a finite task pool) and of per-prefix logistic regression,
against references written out plainly here: a per-prompt, per-position loop over the pool, scikit-learn's
LogisticRegression fitted on each prefix, and scipy minimising the documented objective."""

from __future__ import annotations

import doctest
import math
import warnings

import numpy as np
import pytest
import torch

import hf_icl.estimators.dmmse as dmmse_module
import hf_icl.estimators.logistic_regression as logistic_module
from hf_icl.data.tasks import get_task
from hf_icl.estimators import (
    DMMSE,
    InContextEstimator,
    LogisticRegression,
    LogisticRegressionConvergenceWarning,
    OnFeatures,
    dmmse_for_task,
    get_estimator,
)
from hf_icl.evaluation import evaluate_context_scaling
from hf_icl.evaluation.baselines import default_baselines, estimator_for_task

F64 = torch.float64


def pool_prompts(pool, batch, n_points, noise_std, seed):
    """Prompts whose weights are drawn uniformly from ``pool (M, d)``, with ``noise_std`` (one σ or one per task)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(pool), (batch,), generator=gen)
    xs = torch.randn(batch, n_points, pool.shape[1], generator=gen, dtype=F64)
    sigma = torch.as_tensor(noise_std, dtype=F64).expand(len(pool))[ids]
    ys = torch.einsum("bnd,bd->bn", xs, pool[ids]) + sigma[:, None] * torch.randn(
        batch, n_points, generator=gen, dtype=F64
    )
    return xs, ys, ids


def dmmse_loop(pool, noise_std, xs, ys):
    """The posterior mean, prompt by prompt and position by position, in plain Python floats."""
    n_tasks = len(pool)
    sigmas = [float(s) for s in torch.as_tensor(noise_std, dtype=F64).expand(n_tasks)]
    out = torch.zeros(ys.shape, dtype=F64)
    for b in range(xs.shape[0]):
        for i in range(xs.shape[1]):
            predictions = [float(pool[m] @ xs[b, i]) for m in range(n_tasks)]
            residuals = [
                sum((float(ys[b, j]) - float(pool[m] @ xs[b, j])) ** 2 for j in range(i)) for m in range(n_tasks)
            ]
            if sigmas[0] == 0:  # the σ → 0 limit: uniform over the best-fitting tasks
                best = min(residuals)
                chosen = [m for m in range(n_tasks) if residuals[m] <= best + 1e-9]
                out[b, i] = sum(predictions[m] for m in chosen) / len(chosen)
                continue
            logs = [-residuals[m] / (2 * sigmas[m] ** 2) - i * math.log(sigmas[m]) for m in range(n_tasks)]
            top = max(logs)
            weights = [math.exp(v - top) for v in logs]
            out[b, i] = sum(w * p for w, p in zip(weights, predictions, strict=True)) / sum(weights)
    return out


def default_predict_queries(estimator, context_xs, context_ys, query_xs):
    return InContextEstimator._predict_queries(estimator, context_xs, context_ys, query_xs)


# --------------------------------------------------------------------------- dMMSE against the loop


@pytest.mark.parametrize("noise_std", [0.5, [0.3, 0.3, 1.0, 0.6, 0.3, 2.0, 0.8]])
@pytest.mark.parametrize("task_chunk_size", [256, 3])
def test_dmmse_equals_the_posterior_mean_loop(noise_std, task_chunk_size):
    pool = torch.randn(7, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    xs, ys, _ = pool_prompts(pool, 4, 9, noise_std, seed=2)
    ys[0] += 3.0  # a prompt no pool task explains well
    estimator = DMMSE(pool, noise_std=noise_std, task_chunk_size=task_chunk_size)
    torch.testing.assert_close(estimator(xs, ys), dmmse_loop(pool, noise_std, xs, ys), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("task_chunk_size", [256, 2])
def test_noiseless_dmmse_is_the_exact_limit_averaging_tied_tasks(task_chunk_size):
    gen = torch.Generator().manual_seed(3)
    pool = torch.randn(6, 4, generator=gen, dtype=F64)
    pool[1] = pool[0]  # a duplicate: always tied with task 0
    pool[3] = pool[2]
    pool[3, 3] += 1.0  # differs from task 2 only where the inputs below are 0: tied until the query sees it
    xs, ys, _ = pool_prompts(pool, 5, 8, 0.0, seed=4)
    xs[:, :-1, 3] = 0.0
    ys = torch.einsum("bnd,bd->bn", xs, pool[torch.tensor([0, 2, 3, 4, 5])])
    preds = DMMSE(pool, noise_std=0.0, task_chunk_size=task_chunk_size)(xs, ys)
    torch.testing.assert_close(preds, dmmse_loop(pool, 0.0, xs, ys), rtol=1e-10, atol=1e-12)
    # the σ → 0 limit is what a small σ approaches (small next to the closest miss, task 5's R = 3e-7 at i = 1)
    torch.testing.assert_close(preds, DMMSE(pool, noise_std=1e-5)(xs, ys), rtol=1e-6, atol=1e-6)
    # prompts 1 and 2 (tasks 2 and 3) cannot be told apart before the last input: the mean of both there
    last = xs[1:3, -1] @ ((pool[2] + pool[3]) / 2)
    torch.testing.assert_close(preds[1:3, -1], last)


@pytest.mark.parametrize("noise_std", [0.0, 0.4])
def test_dmmse_with_one_task_is_that_tasks_predictor(noise_std):
    w = torch.tensor([[0.5, -1.0, 2.0]], dtype=F64)
    xs, ys, _ = pool_prompts(w, 3, 6, noise_std, seed=5)
    torch.testing.assert_close(DMMSE(w, noise_std)(xs, ys), xs @ w[0], rtol=0, atol=1e-14)


def test_dmmse_position_zero_is_the_pool_mean_and_many_pairs_concentrate_on_the_true_task():
    pool = torch.randn(16, 4, generator=torch.Generator().manual_seed(6), dtype=F64)
    xs, ys, ids = pool_prompts(pool, 8, 60, 0.5, seed=7)
    preds = DMMSE(pool, noise_std=0.5)(xs, ys)
    torch.testing.assert_close(preds[:, 0], xs[:, 0] @ pool.mean(0))
    truth = torch.einsum("bnd,bd->bn", xs, pool[ids])
    assert (preds[:, 40:] - truth[:, 40:]).abs().max() < 1e-6


@pytest.mark.parametrize("noise_std", [0.0, 0.7, [0.2, 0.5, 0.5, 1.0, 0.2]])
def test_dmmse_predict_queries_equals_the_all_prefix_default(noise_std):
    pool = torch.randn(5, 3, generator=torch.Generator().manual_seed(8), dtype=F64)
    xs, ys, _ = pool_prompts(pool, 3, 10, 0.0 if noise_std == 0.0 else 0.5, seed=9)
    estimator = DMMSE(pool, noise_std=noise_std, task_chunk_size=2)
    override = estimator.predict_queries(xs[:, :6], ys[:, :6], xs[:, 6:])
    assert override.shape == (3, 4) and override.dtype == F64
    default = default_predict_queries(estimator, xs[:, :6], ys[:, :6], xs[:, 6:])
    torch.testing.assert_close(override, default, rtol=1e-12, atol=1e-12)


def test_dmmse_float32_inputs_give_float32_predictions():
    pool = torch.randn(4, 2, generator=torch.Generator().manual_seed(10), dtype=F64)
    xs, ys, _ = pool_prompts(pool, 2, 5, 0.3, seed=11)
    preds = DMMSE(pool, 0.3)(xs.float(), ys.float())
    assert preds.dtype == torch.float32
    torch.testing.assert_close(preds.double(), DMMSE(pool, 0.3)(xs.float().double(), ys.float().double()))


# --------------------------------------------------------------------------- dMMSE of a task family's pool


def test_dmmse_for_linear_regression_uses_the_scaled_pool_and_recovers_each_prompts_task():
    family = get_task("linear_regression", n_dims=4, n_tasks=8, pool_seed=3, scale=2.0)
    estimator = dmmse_for_task(family)
    assert isinstance(estimator, DMMSE) and estimator.name == "dmmse(T=8, σ=0)"
    torch.testing.assert_close(estimator.weights, 2.0 * family.task_pool()["w"].double(), rtol=0, atol=0)
    xs, ys, params = family.sample(16, 8, seed=0, return_params=True)
    preds = estimator(xs, ys)
    assert preds.dtype == torch.float32
    # one noiseless pair already singles out the task among 8 random ones
    torch.testing.assert_close(preds[:, 1:], params["signal"][:, 1:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        preds[:, 0].double(), xs[:, 0].double() @ estimator.weights.mean(0), rtol=1e-5, atol=1e-5
    )


def test_dmmse_for_noisy_linear_regression_takes_each_pool_tasks_noise_and_the_fixed_renormalisation():
    family = get_task(
        "noisy_linear_regression", n_dims=3, n_tasks=6, noise_std=(0.2, 1.0), renormalize_ys="fixed", pool_seed=1
    )
    pool = family.task_pool()
    estimator = dmmse_for_task(family)
    factor = family.renormalization
    assert factor < 1
    torch.testing.assert_close(estimator.weights, factor * pool["w"].double())
    torch.testing.assert_close(estimator.noise_std, factor * pool["noise_std"].double())
    xs, ys = family.sample(5, 7, seed=3)
    expected = dmmse_loop(factor * pool["w"].double(), factor * pool["noise_std"].double(), xs.double(), ys.double())
    torch.testing.assert_close(estimator(xs.double(), ys.double()), expected, rtol=1e-10, atol=1e-12)


def test_dmmse_for_sparse_and_quadratic_families():
    sparse = get_task("sparse_linear_regression", n_dims=6, sparsity=2, n_tasks=5)
    estimator = dmmse_for_task(sparse, n_dims_truncated=4)
    expected = sparse.restrict_to_active_dims(dict(sparse.task_pool()), 4)["w"].double()
    torch.testing.assert_close(estimator.weights, expected, rtol=0, atol=0)
    assert (estimator.weights[:, 4:] == 0).all() and ((estimator.weights != 0).sum(1) == 2).all()
    xs, ys, params = sparse.sample(8, 6, seed=1, n_dims_truncated=4, return_params=True)
    torch.testing.assert_close(estimator(xs, ys)[:, 1:], params["signal"][:, 1:], rtol=1e-5, atol=1e-5)

    quadratic = get_task("quadratic_regression", n_dims=3, n_tasks=4)
    estimator = dmmse_for_task(quadratic)
    assert isinstance(estimator, OnFeatures) and estimator.name == "dmmse(T=4, σ=0) on x⊙x"
    xs, ys, params = quadratic.sample(6, 5, seed=2, return_params=True)
    torch.testing.assert_close(estimator(xs, ys)[:, 1:], params["signal"][:, 1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("family", "fragments"),
    [
        (get_task("linear_regression", n_dims=3), ["n_tasks=None", "linear_regression"]),
        (get_task("decision_tree", n_dims=3, n_tasks=4), ["decision_tree", "linear_regression"]),
        (get_task("linear_classification", n_dims=3, n_tasks=4), ["linear_classification"]),
        (get_task("noisy_linear_regression", n_dims=3, n_tasks=4, renormalize_ys="batch"), ["renormalize_ys='batch'"]),
        (get_task("noisy_linear_regression", n_dims=3, n_tasks=8, noise_std=(0.0, 0.5)), ["noise_std", "σ = 0"]),
    ],
    ids=["no-pool", "tree", "classification", "batch-renormalised", "mixed-zero-noise"],
)
def test_dmmse_for_task_refuses_families_it_does_not_apply_to(family, fragments):
    with pytest.raises(ValueError) as info:
        dmmse_for_task(family)
    assert all(fragment in str(info.value) for fragment in fragments), str(info.value)


def test_dmmse_for_task_checks_n_dims_truncated():
    with pytest.raises(ValueError, match=r"n_dims_truncated must be an integer in \[1, 3\], got 5"):
        dmmse_for_task(get_task("linear_regression", n_dims=3, n_tasks=2), n_dims_truncated=5)


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda: DMMSE(torch.zeros(3)), ["weights", "(M, d)", "(3,)"]),
        (lambda: DMMSE(torch.zeros(0, 3)), ["weights", "(0, 3)"]),
        (lambda: DMMSE("pool"), ["weights", "str"]),
        (lambda: DMMSE(torch.tensor([[1.0, float("nan")]])), ["weights", "finite", "nan"]),
        (lambda: DMMSE(torch.ones(2, 3), noise_std=-0.5), ["noise_std", ">= 0", "-0.5"]),
        (lambda: DMMSE(torch.ones(2, 3), noise_std=[0.5, 0.5, 0.5]), ["noise_std", "2 numbers", "(3,)"]),
        (lambda: DMMSE(torch.ones(2, 3), noise_std=[0.0, 0.5]), ["noise_std", "all > 0", "all 0"]),
        (lambda: DMMSE(torch.ones(2, 3), noise_std="0.5"), ["noise_std", "'0.5'"]),
        (lambda: DMMSE(torch.ones(2, 3), task_chunk_size=0), ["task_chunk_size", "[1, +inf)", "got 0"]),
        (lambda: DMMSE(torch.ones(2, 3))(torch.zeros(1, 4, 2), torch.zeros(1, 4)), ["xs", "d = 3", "(1, 4, 2)"]),
        (
            lambda: DMMSE(torch.ones(2, 3)).predict_queries(
                torch.zeros(1, 4, 2), torch.zeros(1, 4), torch.zeros(1, 1, 2)
            ),
            ["context_xs", "d = 3"],
        ),
        (lambda: get_estimator("dmmse"), ["dmmse", "weights"]),
    ],
)
def test_dmmse_bad_inputs_name_the_argument(make, fragments):
    with pytest.raises(ValueError) as info:
        make()
    assert all(fragment in str(info.value) for fragment in fragments), str(info.value)


# --------------------------------------------------------------------------- logistic regression


def class_prompts(batch, n_points, n_dims, n_classes, seed, scale=2.0):
    """xs ~ N(0, I); class ids drawn from softmax(scale · W x) (n_classes=None: ±1 signs of a noisy wᵀx)."""
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n_points, n_dims, generator=gen, dtype=F64)
    if n_classes is None:
        w = torch.randn(batch, n_dims, generator=gen, dtype=F64)
        noisy = torch.einsum("bnd,bd->bn", xs, w) + 0.7 * torch.randn(batch, n_points, generator=gen, dtype=F64)
        return xs, torch.where(noisy >= 0, 1.0, -1.0).to(F64)
    w = torch.randn(batch, n_dims, n_classes, generator=gen, dtype=F64)
    logits = scale * torch.einsum("bnd,bdk->bnk", xs, w)
    ys = torch.distributions.Categorical(logits=logits).sample()  # the global RNG, fixed below
    return xs, ys.to(F64)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def sklearn_probabilities(x_prefix, y_prefix, x_query, C):
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression

    model = SkLogisticRegression(C=C, l1_ratio=0.0, fit_intercept=False, tol=1e-12, max_iter=10_000)
    model.fit(x_prefix.numpy(), y_prefix.numpy())
    return torch.from_numpy(model.predict_proba(x_query.numpy()[None])[0]), model.classes_


@pytest.mark.parametrize("C", [0.3, 5.0])
def test_binary_logistic_regression_matches_sklearn_on_every_prefix_with_both_labels(C):
    xs, ys = class_prompts(4, 14, 3, None, seed=1)
    logits = LogisticRegression(C=C)(xs, ys)
    assert logits.shape == (4, 14) and (logits[:, 0] == 0).all()
    compared = 0
    for b in range(4):
        for i in range(1, 14):
            if len(set(ys[b, :i].tolist())) < 2:
                continue
            probabilities, classes = sklearn_probabilities(xs[b, :i], ys[b, :i], xs[b, i], C)
            assert classes.tolist() == [-1.0, 1.0]
            torch.testing.assert_close(torch.sigmoid(logits[b, i]), probabilities[1], rtol=0, atol=1e-6)
            compared += 1
    assert compared >= 30


@pytest.mark.parametrize(("n_classes", "C"), [(3, 1.0), (4, 10.0), (2, 0.5)])
def test_categorical_logistic_regression_matches_sklearn_on_every_prefix_with_every_class(n_classes, C):
    xs, ys = class_prompts(3, 24, 3, n_classes, seed=n_classes)
    log_probs = LogisticRegression(n_classes=n_classes, C=C)(xs, ys)
    assert log_probs.shape == (3, 24, n_classes)
    torch.testing.assert_close(log_probs[:, 0], torch.full((3, n_classes), -math.log(n_classes), dtype=F64))
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 24, dtype=F64))
    compared = 0
    for b in range(3):
        for i in range(1, 24):
            if len(set(ys[b, :i].tolist())) < n_classes:
                continue
            probabilities, _ = sklearn_probabilities(xs[b, :i], ys[b, :i], xs[b, i], C)
            torch.testing.assert_close(log_probs[b, i].exp(), probabilities, rtol=0, atol=1e-6)
            compared += 1
    assert compared >= 20


def scipy_probabilities(x_prefix, y_prefix, x_query, n_labels, C):
    """Minimise ``C Σ CE + ½ ‖W‖²`` over all ``n_labels`` classes (one vector in all for two) with scipy."""
    from scipy.optimize import minimize

    X, y, q = x_prefix.numpy(), y_prefix.long().numpy(), x_query.numpy()
    n_free, n_dims = (1 if n_labels == 2 else n_labels), X.shape[1]

    def logits(W, points):
        free = points @ W.reshape(n_free, n_dims).T
        return np.concatenate([np.zeros((len(points), 1)), free], 1) if n_labels == 2 else free

    def objective(flat):
        z = logits(flat, X)
        top = z.max(1, keepdims=True)
        log_norm = top[:, 0] + np.log(np.exp(z - top).sum(1))
        probs = np.exp(z - log_norm[:, None])
        residual = probs - np.eye(n_labels)[y]
        grad = C * residual[:, n_labels - n_free :].T @ X + flat.reshape(n_free, n_dims)
        return C * (log_norm - z[np.arange(len(y)), y]).sum() + 0.5 * flat @ flat, grad.ravel()

    fit = minimize(
        objective, np.zeros(n_free * n_dims), jac=True, method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 0}
    )
    z = logits(fit.x, q[None])[0]
    return torch.from_numpy(np.exp(z - z.max()) / np.exp(z - z.max()).sum())


@pytest.mark.parametrize("n_classes", [None, 3])
def test_prefixes_missing_labels_are_the_documented_fit_over_the_whole_label_set(n_classes):
    xs, ys = class_prompts(2, 7, 2, n_classes, seed=5)
    if n_classes is None:
        ys[0, :4] = 1.0  # a prompt that starts with one label only
    else:
        ys[0, :4] = 2.0
        ys[1, :5] = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0])  # class 2 unseen for a while
    estimator = LogisticRegression(n_classes=n_classes, C=2.0)
    out = estimator(xs, ys)
    n_labels = 2 if n_classes is None else n_classes
    for b in range(2):
        for i in range(7):
            if n_classes is None:
                expected = torch.full((), 0.5, dtype=F64) if i == 0 else None
                got = torch.sigmoid(out[b, i])
            else:
                expected = torch.full((n_labels,), 1 / n_labels, dtype=F64) if i == 0 else None
                got = out[b, i].exp()
            if expected is None:
                labels = (ys[b, :i] + 1) / 2 if n_classes is None else ys[b, :i]
                probabilities = scipy_probabilities(xs[b, :i], labels, xs[b, i], n_labels, 2.0)
                expected = probabilities[1] if n_classes is None else probabilities
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    assert torch.isfinite(out).all()  # one label seen, or a class never seen: still a finite fit


@pytest.mark.parametrize("n_classes", [None, 4])
def test_logistic_predict_queries_equals_the_last_position_of_context_plus_query(n_classes):
    xs, ys = class_prompts(3, 12, 3, n_classes, seed=7)
    estimator = LogisticRegression(n_classes=n_classes, C=1.5)
    context_xs, context_ys, query_xs = xs[:, :9], ys[:, :9], xs[:, 9:]
    together = estimator.predict_queries(context_xs, context_ys, query_xs)
    dummy = ys[:, :1]  # any valid label: the protocol never reads the query's own label
    one_by_one = torch.stack(
        [
            estimator(torch.cat([context_xs, query_xs[:, q : q + 1]], 1), torch.cat([context_ys, dummy], 1))[:, -1]
            for q in range(3)
        ],
        dim=1,
    )
    assert together.shape == ((3, 3) if n_classes is None else (3, 3, 4))
    torch.testing.assert_close(together, one_by_one, rtol=1e-9, atol=1e-10)


def test_logistic_batch_and_chunking_do_not_change_any_prediction():
    xs, ys = class_prompts(5, 10, 3, 3, seed=8)
    estimator = LogisticRegression(n_classes=3)
    together = estimator(xs, ys)
    alone = torch.cat([estimator(xs[b : b + 1], ys[b : b + 1]) for b in range(5)])
    torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)
    estimator.max_chunk_elements = 1  # one prompt per chunk
    torch.testing.assert_close(estimator(xs, ys), together, rtol=1e-12, atol=1e-12)


def test_logistic_float32_in_float32_out_and_convergence_warning():
    xs, ys = class_prompts(2, 8, 3, None, seed=9)
    preds = LogisticRegression()(xs.float(), ys.float())
    assert preds.dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LogisticRegression(C=100.0)(xs, ys)  # weak regularisation still converges, silently
    with pytest.warns(LogisticRegressionConvergenceWarning, match="max_iter=1"):
        LogisticRegression(max_iter=1)(xs, ys)


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (
            lambda: LogisticRegression()(torch.zeros(1, 3, 2), torch.tensor([[1.0, 0.5, -1.0]])),
            ["ys", "-1.0 or +1.0", "0.5"],
        ),
        (
            lambda: LogisticRegression(n_classes=3)(torch.zeros(1, 3, 2), torch.tensor([[0.0, 3.0, 1.0]])),
            ["ys", "0, 1, ..., 2", "n_classes=3", "3.0"],
        ),
        (
            lambda: LogisticRegression(n_classes=3)(torch.zeros(1, 3, 2), torch.tensor([[0.0, 1.5, 1.0]])),
            ["ys", "whole numbers", "1.5"],
        ),
        (
            lambda: LogisticRegression().predict_queries(
                torch.zeros(1, 2, 2), torch.tensor([[1.0, 2.0]]), torch.zeros(1, 1, 2)
            ),
            ["context_ys", "-1.0 or +1.0", "2.0"],
        ),
        (lambda: LogisticRegression(n_classes=1), ["n_classes", "[2, +inf)", "got 1"]),
        (lambda: LogisticRegression(C=0.0), ["C", "(0.0, +inf)", "0.0"]),
        (lambda: LogisticRegression(tol=-1.0), ["tol", "-1.0"]),
        (lambda: LogisticRegression(max_iter=0), ["max_iter", "[1, +inf)", "got 0"]),
        (lambda: get_estimator("logistic_regression", classes=3), ["logistic_regression", "classes"]),
        (lambda: estimator_for_task("logistic_regression", get_task("linear_regression", n_dims=2)), ["regression"]),
    ],
    ids=[
        "binary-label",
        "class-id-too-large",
        "class-id-fraction",
        "context-label",
        "n-classes",
        "C",
        "tol",
        "max-iter",
        "registry-keyword",
        "regression-family",
    ],  # fmt: skip
)
def test_logistic_bad_inputs_name_the_argument(make, fragments):
    with pytest.raises(ValueError) as info:
        make()
    assert all(fragment in str(info.value) for fragment in fragments), str(info.value)


# --------------------------------------------------------------------------- registry and default baselines


def test_registry_builds_both_estimators():
    estimator = get_estimator("logistic_regression", n_classes=4, C=2.0)
    assert isinstance(estimator, LogisticRegression) and estimator.name == "logistic_regression(C=2, 4 classes)"
    dmmse = get_estimator("dmmse", weights=[[1.0, 0.0]], noise_std=0.25)
    assert isinstance(dmmse, DMMSE) and dmmse.name == "dmmse(T=1, σ=0.25)"


def test_default_baselines_add_dmmse_for_pooled_linear_families_and_logistic_regression_for_classes():
    assert "dmmse" not in default_baselines(get_task("linear_regression", n_dims=3))
    pooled = default_baselines(get_task("linear_regression", n_dims=3, n_tasks=4))
    assert list(pooled) == ["least_squares", "dmmse", "averaging", "knn"]
    noisy = default_baselines(get_task("noisy_linear_regression", n_dims=3, n_tasks=4))
    assert list(noisy) == ["least_squares", "optimal_ridge", "dmmse", "averaging", "knn"]
    assert "dmmse" not in default_baselines(get_task("decision_tree", n_dims=3, n_tasks=4))
    assert "dmmse" not in default_baselines(
        get_task("noisy_linear_regression", n_dims=3, n_tasks=4, renormalize_ys="batch")
    )
    binary = default_baselines(get_task("linear_classification", n_dims=3))
    assert list(binary) == ["least_squares", "logistic_regression", "knn"]
    assert binary["logistic_regression"].n_classes is None
    categorical = default_baselines(get_task("categorical", n_dims=3, n_classes=4))
    assert list(categorical) == ["logistic_regression"] and categorical["logistic_regression"].n_classes == 4


def test_default_baselines_run_in_the_evaluation_of_classification_and_pooled_tasks():
    categorical = get_task("categorical", n_dims=2, n_classes=3, logit_scale=6.0)
    result = evaluate_context_scaling(
        default_baselines(categorical), categorical, n_prompts=64, n_points=16, n_bootstrap=10
    )
    curve = result.curves["logistic_regression"]
    assert curve[-4:].mean() > 0.6  # well above the chance rate 1/3
    binary = get_task("linear_classification", n_dims=2)
    result = evaluate_context_scaling(default_baselines(binary), binary, n_prompts=64, n_points=12, n_bootstrap=10)
    assert result.curves["logistic_regression"][0] == 0  # an exact 0 at position 0 is no label
    assert result.curves["logistic_regression"][-3:].mean() > 0.8
    pooled = get_task("noisy_linear_regression", n_dims=3, n_tasks=4, noise_std=0.1)
    result = evaluate_context_scaling(default_baselines(pooled), pooled, n_prompts=64, n_points=8, n_bootstrap=10)
    # dMMSE is the Bayes predictor on its own pool: it beats every other baseline from the second pair on
    for name in ("least_squares", "optimal_ridge", "averaging", "knn"):
        assert (result.curves["dmmse"][1:] <= result.curves[name][1:] + 1e-12).all(), name


def test_module_examples_run():
    for module in (dmmse_module, logistic_module):
        assert doctest.testmod(module, raise_on_error=True).attempted > 0
