"""Tests of hf_icl.estimators against independent references: closed forms, scikit-learn,
XGBoost and naive per-prefix loops written out plainly here."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import multivariate_normal

from hf_icl.estimators import (
    KNN,
    Averaging,
    DecisionTree,
    InContextEstimator,
    KernelRidge,
    Lasso,
    LeastSquares,
    NadarayaWatson,
    OneStepGD,
    OptimalRidge,
    Ridge,
    TwoLayerNN,
    XGBoost,
    available_estimators,
    get_estimator,
)
from hf_icl.estimators._cholesky_prefix import prefix_posterior

F64 = torch.float64


def linear_prompts(batch, n_points, n_dims, noise_std=0.0, seed=0, dtype=F64):
    """xs ~ N(0, I), w ~ N(0, I), ys = xs @ w + noise_std * N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n_points, n_dims, generator=gen, dtype=F64)
    w = torch.randn(batch, n_dims, generator=gen, dtype=F64)
    ys = torch.einsum("bnd,bd->bn", xs, w) + noise_std * torch.randn(batch, n_points, generator=gen, dtype=F64)
    return xs.to(dtype), ys.to(dtype)


def per_prefix(predict_one, xs, ys):
    """Reference loop: predict_one(X_prefix, y_prefix, x_query) for each prompt and i >= 1."""
    xs, ys = xs.double(), ys.double()
    out = torch.zeros(ys.shape, dtype=F64)
    for b in range(xs.shape[0]):
        for i in range(1, xs.shape[1]):
            out[b, i] = float(predict_one(xs[b, :i], ys[b, :i], xs[b, i]))
    return out


def pinv_prediction(x_prefix, y_prefix, x_query):
    return x_query @ (torch.linalg.pinv(x_prefix) @ y_prefix)


def assert_close(actual, expected, rtol=1e-6, atol=1e-8):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


# Cheap settings for every registered estimator, used by the protocol tests.
PROTOCOL_KWARGS = {
    "optimal_ridge": {"noise_std": 0.5},
    "two_layer_nn": {"hidden": 8, "steps": 20},
    "xgboost": {"n_estimators": 5},
    # a pool {w, -w} of mean 0, so dMMSE's position-0 prediction (the pool's mean weight times x_0) is 0 too
    "dmmse": {"weights": torch.tensor([[1.0, -0.5, 2.0], [-1.0, 0.5, -2.0]]), "noise_std": 0.5},
}
#: Estimators that read ±1 labels: the protocol tests give them the signs of the regression targets.
CLASSIFIERS = {"logistic_regression"}


def build(name):
    return get_estimator(name, **PROTOCOL_KWARGS.get(name, {}))


def protocol_labels(name, ys):
    return torch.sign(ys) if name in CLASSIFIERS else ys


# --------------------------------------------------------------------------- protocol


@pytest.mark.parametrize("name", available_estimators())
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_shape_dtype_and_zero_at_position_zero(name, dtype):
    xs, ys = linear_prompts(2, 7, 3, noise_std=0.1, seed=1, dtype=dtype)
    preds = build(name)(xs, protocol_labels(name, ys))
    assert preds.shape == (2, 7)
    assert preds.dtype == dtype
    assert torch.isfinite(preds).all()
    assert (preds[:, 0] == 0).all()


@pytest.mark.parametrize("name", available_estimators())
def test_position_i_ignores_later_examples(name):
    xs, ys = linear_prompts(2, 8, 3, noise_std=0.1, seed=2)
    cut = 4
    changed_xs, changed_ys = xs.clone(), ys.clone()
    changed_xs[:, cut + 1 :] = torch.randn(2, 8 - cut - 1, 3, dtype=F64)
    changed_ys[:, cut:] += 10.0
    estimator = build(name)
    before = estimator(xs, protocol_labels(name, ys))
    after = estimator(changed_xs, protocol_labels(name, changed_ys))
    assert_close(after[:, : cut + 1], before[:, : cut + 1], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(after[:, cut + 1 :], before[:, cut + 1 :])


@pytest.mark.parametrize("name", ["least_squares", "ridge", "lasso", "knn", "nadaraya_watson", "kernel_ridge"])
def test_batch_equals_prompt_by_prompt(name):
    xs, ys = linear_prompts(3, 9, 4, noise_std=0.2, seed=3)
    xs[1, :, 2:] = 0.0  # a different rank structure in one prompt
    estimator = build(name)
    together = estimator(xs, ys)
    alone = torch.cat([estimator(xs[b : b + 1], ys[b : b + 1]) for b in range(3)])
    assert_close(together, alone, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    ("xs", "ys", "argument", "fragment"),
    [
        (torch.zeros(4, 3), torch.zeros(4, 3), "xs", "(B, N, d)"),
        (torch.zeros(2, 4, 3), torch.zeros(2, 5), "ys", "(2, 5)"),
        (torch.zeros(2, 4, 3), torch.zeros(2, 4, 1), "ys", "(B, N)"),
        (torch.zeros(2, 4, 3, dtype=torch.int64), torch.zeros(2, 4), "xs", "floating-point"),
        (torch.zeros(2, 4, 3), torch.zeros(2, 4, dtype=F64), "ys", "dtype"),
        (torch.full((2, 4, 3), float("nan")), torch.zeros(2, 4), "xs", "finite"),
        (torch.zeros(2, 4, 3), torch.tensor([[0.0, 1.0, float("inf"), 0.0]] * 2), "ys", "inf"),
        (torch.zeros(2, 0, 3), torch.zeros(2, 0), "xs", "(2, 0, 3)"),
        (np.zeros((2, 4, 3)), torch.zeros(2, 4), "xs", "torch.Tensor"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(xs, ys, argument, fragment):
    with pytest.raises(ValueError) as info:
        Ridge()(xs, ys)
    message = str(info.value)
    assert message.startswith(argument)
    assert fragment in message


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: KNN(k=0), "k must be an integer in [1, +inf), got 0"),
        (lambda: KNN(k=2.5), "k must be an integer"),
        (lambda: Ridge(lam=0.0), "lam must be a number in (0.0, +inf)"),
        (lambda: Lasso(alpha=-1), "alpha"),
        (lambda: NadarayaWatson(kernel="laplace"), "kernel must be one of"),
        (lambda: KernelRidge(bandwidth=0), "bandwidth"),
        (lambda: OptimalRidge(noise_std=[0.1, -0.2]), "noise_std[1]"),
        (lambda: OptimalRidge(noise_std=[0.1, 0.2], noise_probs=[0.5]), "noise_probs must be 2"),
        (lambda: OptimalRidge(noise_std=0.1, weight_var="1/n"), "weight_var"),
        (lambda: TwoLayerNN(hidden=0), "hidden"),
        (lambda: DecisionTree(max_depth=0), "max_depth"),
    ],
)
def test_bad_constructor_arguments_raise(make, fragment):
    with pytest.raises(ValueError) as info:
        make()
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- registry


def test_registry_names_and_construction():
    assert set(available_estimators()) == {
        "least_squares", "ridge", "optimal_ridge", "lasso", "knn", "averaging", "one_step_gd",
        "nadaraya_watson", "kernel_ridge", "two_layer_nn", "decision_tree", "xgboost", "dmmse",
        "logistic_regression",
    }  # fmt: skip
    knn = get_estimator("knn", k=5)
    assert isinstance(knn, KNN) and knn.k == 5 and knn.name == "knn(k=5)"
    assert isinstance(get_estimator("least_squares"), InContextEstimator)
    assert Ridge(0.1).name == "ridge(λ=0.1)"


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ValueError) as info:
        get_estimator("gradient_boosting")
    message = str(info.value)
    assert "gradient_boosting" in message
    assert all(name in message for name in available_estimators())


def test_missing_or_unknown_estimator_arguments_are_value_errors():
    with pytest.raises(ValueError, match="noise_std"):
        get_estimator("optimal_ridge")
    with pytest.raises(ValueError, match="knn"):
        get_estimator("knn", neighbours=3)


# --------------------------------------------------------------------------- shared Cholesky helper


def test_prefix_posterior_matches_per_prefix_gaussian_process():
    gen = torch.Generator().manual_seed(4)
    features = torch.randn(3, 9, 4, generator=gen, dtype=F64)
    cov = features @ features.transpose(-1, -2)
    targets = torch.randn(3, 9, generator=gen, dtype=F64)
    noise = torch.rand(3, 9, generator=gen, dtype=F64) + 0.1
    result = prefix_posterior(cov, targets, noise)
    for b in range(3):
        for i in range(9):
            system = cov[b, :i, :i] + torch.diag(noise[b, :i])
            mean = cov[b, i, :i] @ torch.linalg.solve(system, targets[b, :i]) if i else 0.0
            log_evidence = multivariate_normal(np.zeros(i), system.numpy()).logpdf(targets[b, :i]) if i else 0.0
            assert float(result.mean[b, i]) == pytest.approx(float(mean), rel=1e-9, abs=1e-10)
            assert float(result.log_evidence[b, i]) == pytest.approx(float(log_evidence), rel=1e-9, abs=1e-10)


def test_prefix_posterior_rejects_a_singular_system():
    xs = torch.randn(1, 6, 2, dtype=F64)
    with pytest.raises(ValueError, match="not positive definite"):
        prefix_posterior(xs @ xs.transpose(-1, -2), torch.zeros(1, 6, dtype=F64), 0.0)


# --------------------------------------------------------------------------- least squares


@pytest.mark.parametrize(("n_points", "n_dims"), [(14, 5), (6, 9), (21, 20), (1, 3)])
def test_least_squares_matches_pinv_per_prefix(n_points, n_dims):
    xs, ys = linear_prompts(4, n_points, n_dims, noise_std=0.5, seed=5)
    assert_close(LeastSquares()(xs, ys), per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-6)


def test_least_squares_float32_inputs_are_solved_in_float64():
    xs, ys = linear_prompts(8, 31, 10, noise_std=0.3, seed=6, dtype=torch.float32)
    preds = LeastSquares()(xs, ys)
    assert preds.dtype == torch.float32
    assert_close(preds, per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-5)


def test_least_squares_recovers_noiseless_targets_once_determined():
    n_dims = 6
    xs, ys = linear_prompts(16, 20, n_dims, seed=7)
    preds = LeastSquares()(xs, ys)
    assert (preds[:, n_dims:] - ys[:, n_dims:]).abs().max() < 1e-8
    assert (preds[:, 1:n_dims] - ys[:, 1:n_dims]).abs().mean() > 0.1  # underdetermined before


@pytest.mark.parametrize("kept_dims", [0, 1, 3])
def test_least_squares_with_zeroed_trailing_coordinates(kept_dims):
    xs, ys = linear_prompts(4, 16, 8, noise_std=0.5, seed=8)
    xs[..., kept_dims:] = 0.0
    preds = LeastSquares()(xs, ys)
    assert_close(preds, per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-6)
    assert torch.isfinite(preds).all()


def test_least_squares_with_repeated_and_scaled_points():
    xs, ys = linear_prompts(3, 15, 4, noise_std=0.5, seed=9)
    xs[:, 2] = xs[:, 0]  # repeated before the span is full
    xs[:, 5] = -3.0 * xs[:, 1]
    xs[0, 9] = xs[0, 3]
    assert_close(LeastSquares()(xs, ys), per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-6)


def test_least_squares_mixed_rank_structures_in_one_batch():
    xs, ys = linear_prompts(3, 12, 5, noise_std=0.5, seed=10)
    xs[0, :, 2:] = 0.0
    xs[2, 1] = 0.0  # a zero input
    assert_close(LeastSquares()(xs, ys), per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-6)


def test_least_squares_when_later_points_leave_the_early_span():
    xs, ys = linear_prompts(2, 14, 5, noise_std=0.5, seed=26)
    xs[:, :6, 2:] = 0.0  # the first six points span a plane, later ones all of R^5
    assert_close(LeastSquares()(xs, ys), per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    n_points=st.integers(1, 12),
    n_dims=st.integers(1, 6),
    kept_fraction=st.sampled_from([1.0, 0.5, 0.0]),
    seed=st.integers(0, 2**16),
)
def test_least_squares_property_any_shape(batch, n_points, n_dims, kept_fraction, seed):
    xs, ys = linear_prompts(batch, n_points, n_dims, noise_std=1.0, seed=seed)
    xs[..., int(kept_fraction * n_dims) :] = 0.0
    assert_close(LeastSquares()(xs, ys), per_prefix(pinv_prediction, xs, ys), rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- ridge family


def test_ridge_matches_primal_closed_form():
    lam = 0.3
    xs, ys = linear_prompts(3, 12, 5, noise_std=0.5, seed=11)

    def ridge_one(x, y, query):
        return query @ torch.linalg.solve(x.T @ x + lam * torch.eye(x.shape[1], dtype=F64), x.T @ y)

    assert_close(Ridge(lam)(xs, ys), per_prefix(ridge_one, xs, ys), rtol=1e-8, atol=1e-10)


def test_kernel_ridge_matches_sklearn():
    from sklearn.kernel_ridge import KernelRidge as SkKernelRidge

    lam, bandwidth = 0.2, 1.5
    xs, ys = linear_prompts(2, 10, 3, noise_std=0.3, seed=12)

    def sklearn_one(x, y, query):
        model = SkKernelRidge(alpha=lam, kernel="rbf", gamma=1 / (2 * bandwidth**2))
        return model.fit(x.numpy(), y.numpy()).predict(query.numpy()[None])[0]

    expected = per_prefix(sklearn_one, xs, ys)
    assert_close(KernelRidge(lam, kernel="rbf", bandwidth=bandwidth)(xs, ys), expected, rtol=1e-7, atol=1e-9)


def test_kernel_ridge_linear_kernel_is_ridge():
    xs, ys = linear_prompts(2, 10, 3, noise_std=0.3, seed=13)
    assert_close(KernelRidge(0.4, kernel="linear")(xs, ys), Ridge(0.4)(xs, ys), rtol=1e-10, atol=1e-12)


def test_optimal_ridge_single_noise_level_is_ridge():
    xs, ys = linear_prompts(3, 12, 5, noise_std=0.5, seed=14)
    assert_close(OptimalRidge(noise_std=0.5, weight_var=2.0)(xs, ys), Ridge(0.25 / 2.0)(xs, ys))
    assert_close(OptimalRidge(noise_std=0.5, weight_var="1/d")(xs, ys), Ridge(0.25 * 5)(xs, ys))


def test_optimal_ridge_mixture_matches_direct_posterior():
    sigmas, probs, tau_sq = [0.1, 0.5, 1.0], [0.2, 0.3, 0.5], 1.0
    xs, ys = linear_prompts(3, 10, 3, noise_std=0.5, seed=15)

    def posterior_mean(x, y, query):
        x, y, query = x.numpy(), y.numpy(), query.numpy()
        log_weights, means = [], []
        for sigma, prior in zip(sigmas, probs, strict=True):
            cov = tau_sq * x @ x.T + sigma**2 * np.eye(len(y))
            log_weights.append(np.log(prior) + multivariate_normal(np.zeros(len(y)), cov).logpdf(y))
            means.append(tau_sq * query @ x.T @ np.linalg.solve(cov, y))
        weights = np.exp(np.array(log_weights) - max(log_weights))
        return weights @ np.array(means) / weights.sum()

    estimator = OptimalRidge(noise_std=sigmas, weight_var=tau_sq, noise_probs=probs)
    assert_close(estimator(xs, ys), per_prefix(posterior_mean, xs, ys), rtol=1e-7, atol=1e-9)


def test_optimal_ridge_beats_least_squares_on_noisy_tasks():
    n_dims, noise_std = 5, 0.5
    xs, ys = linear_prompts(2000, 16, n_dims, noise_std=noise_std, seed=16)
    optimal = (OptimalRidge(noise_std=noise_std)(xs, ys) - ys)[:, 1:].square().mean()
    least_squares = (LeastSquares()(xs, ys) - ys)[:, 1:].square().mean()
    mixture = (OptimalRidge(noise_std=[0.1, noise_std, 2.0])(xs, ys) - ys)[:, 1:].square().mean()
    assert optimal < 0.9 * least_squares
    assert optimal <= mixture * 1.02  # knowing the noise level cannot hurt (up to sampling error)


# --------------------------------------------------------------------------- lasso


@pytest.mark.parametrize(("tol", "max_iter", "n_dims"), [(1e-4, 1000, 8), (1e-10, 100_000, 4)])
def test_lasso_matches_sklearn(tol, max_iter, n_dims):
    from sklearn.linear_model import Lasso as SkLasso

    alpha = 0.1
    xs, ys = linear_prompts(3, 12, n_dims, noise_std=0.3, seed=17)

    def sklearn_one(x, y, query):
        model = SkLasso(alpha=alpha, fit_intercept=False, tol=tol, max_iter=max_iter)
        return model.fit(x.numpy(), y.numpy()).predict(query.numpy()[None])[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns if a prefix needs more than max_iter sweeps
        expected = per_prefix(sklearn_one, xs, ys)
    assert_close(Lasso(alpha, max_iter=max_iter, tol=tol)(xs, ys), expected, rtol=1e-3, atol=1e-3)


def test_lasso_warns_about_exactly_the_fits_sklearn_calls_unconverged():
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso as SkLasso

    from hf_icl.estimators.lasso import LassoConvergenceWarning

    xs, ys = linear_prompts(3, 12, 8, noise_std=0.3, seed=21)
    unconverged = 0
    for b in range(3):
        for i in range(1, 12):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                SkLasso(alpha=0.001, fit_intercept=False, max_iter=3).fit(xs[b, :i].numpy(), ys[b, :i].numpy())
            unconverged += any(issubclass(w.category, ConvergenceWarning) for w in caught)
    assert unconverged > 0
    with pytest.warns(
        LassoConvergenceWarning, match=f"{unconverged} of 36 prefix fits did not converge within max_iter=3"
    ):
        Lasso(alpha=0.001, max_iter=3)(xs, ys)


def test_lasso_default_is_gargs_max_iter_and_converges_on_sparse_prompts():
    from sklearn.linear_model import Lasso as SkLasso

    from hf_icl.data.tasks import get_task

    assert Lasso().max_iter == 100_000
    xs, ys = get_task("sparse_linear_regression", n_dims=20, sparsity=3).sample(2, 41, seed=4)
    xs, ys = xs.double(), ys.double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fit may stop unconverged
        ours = Lasso(alpha=0.01)(xs, ys)

    def sklearn_one(x, y, query):
        model = SkLasso(alpha=0.01, fit_intercept=False, max_iter=100_000)
        return model.fit(x.numpy(), y.numpy()).predict(query.numpy()[None])[0]

    assert_close(ours, per_prefix(sklearn_one, xs, ys), rtol=1e-3, atol=1e-3)


def test_lasso_selects_sparse_weights_when_determined():
    gen = torch.Generator().manual_seed(18)
    xs = torch.randn(4, 40, 6, generator=gen, dtype=F64)
    ys = 2.0 * xs[..., 0]  # only the first coordinate matters
    preds = Lasso(alpha=0.01)(xs, ys)
    assert (preds[:, 20:] - ys[:, 20:]).abs().max() < 0.05


# --------------------------------------------------------------------------- k-NN and moments


@pytest.mark.parametrize("k", [1, 3, 20])
def test_knn_matches_loop(k):
    xs, ys = linear_prompts(3, 11, 2, seed=19)
    xs[:, 6] = xs[:, 2]  # an exact tie in distance, broken in favour of the earlier example
    xs[:, 8] = xs[:, 2]

    def knn_one(x, y, query):
        distances = (x - query).norm(dim=-1).tolist()
        order = sorted(range(len(distances)), key=lambda j: (distances[j], j))[:k]
        return y[order].mean()

    assert_close(KNN(k)(xs, ys), per_prefix(knn_one, xs, ys), rtol=1e-12, atol=1e-12)


def test_averaging_and_one_step_gd_match_loops():
    xs, ys = linear_prompts(3, 9, 4, noise_std=0.2, seed=20)

    def average_one(x, y, query):
        return query @ (y[:, None] * x).mean(0)

    def gd_one(x, y, query):
        gradient_at_zero = -(y[:, None] * x).sum(0)  # of ½ Σ (y - wᵀx)² at w = 0
        return query @ (0.0 - 0.3 * gradient_at_zero)

    assert_close(Averaging()(xs, ys), per_prefix(average_one, xs, ys), rtol=1e-10, atol=1e-12)
    assert_close(OneStepGD(lr=0.3)(xs, ys), per_prefix(gd_one, xs, ys), rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- Nadaraya–Watson


def nw_reference(kernel, bandwidth):
    def predict_one(x, y, query):
        if kernel in ("exp", "softmax"):
            weights = torch.exp(x @ query / bandwidth)
        elif kernel == "rbf":
            weights = torch.exp(-((x - query) ** 2).sum(-1) / (2 * bandwidth**2))
        else:
            distances = (x - query).norm(dim=-1)
            weights = (distances == 0).double() if (distances == 0).any() else distances ** -x.shape[1]
        return (weights * y).sum() / weights.sum()

    return predict_one


@pytest.mark.parametrize(("kernel", "bandwidth"), [("exp", 0.7), ("softmax", 2.0), ("rbf", 0.8), ("hilbert", None)])
def test_nadaraya_watson_matches_loop(kernel, bandwidth):
    xs, ys = linear_prompts(3, 10, 3, noise_std=0.2, seed=21)
    xs[:, 7] = xs[:, 3]  # duplicates: the Hilbert estimate concentrates on them
    xs[:, 8] = xs[:, 3]
    expected = per_prefix(nw_reference(kernel, bandwidth), xs, ys)
    assert_close(NadarayaWatson(kernel, bandwidth)(xs, ys), expected, rtol=1e-9, atol=1e-10)
    if kernel == "hilbert":
        assert_close(NadarayaWatson(kernel)(xs, ys)[:, 8], (ys[:, 3] + ys[:, 7]) / 2)


def test_nadaraya_watson_exp_kernel_is_stable_for_large_logits():
    xs, ys = linear_prompts(2, 8, 3, seed=22)
    preds = NadarayaWatson("exp", bandwidth=1e-4)(xs * 30, ys)  # logits ~ 1e7: exp would overflow
    assert torch.isfinite(preds).all()
    nearest = (xs[:, 1:, None] * xs[:, None, :]).sum(-1)  # softmax -> argmax over earlier examples
    for b in range(2):
        for i in range(1, 8):
            assert float(preds[b, i]) == pytest.approx(float(ys[b, nearest[b, i - 1, :i].argmax()]))


# --------------------------------------------------------------------------- two-layer network


def relu_net_prompts(batch, n_points, n_dims, seed):
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n_points, n_dims, generator=gen)
    first = torch.randn(batch, 4, n_dims, generator=gen)
    second = torch.randn(batch, 4, generator=gen)
    ys = torch.einsum("bnh,bh->bn", torch.relu(torch.einsum("bnd,bhd->bnh", xs, first)), second)
    return xs, ys


def test_two_layer_nn_learns_a_relu_net_and_is_seeded():
    xs, ys = relu_net_prompts(4, 30, 2, seed=23)
    estimator = TwoLayerNN(hidden=32, steps=300, lr=0.02, seed=1)
    preds = estimator(xs, ys)
    last = slice(-5, None)
    trained_error = (preds[:, last] - ys[:, last]).square().mean()
    zero_error = ys[:, last].square().mean()
    assert trained_error < 0.25 * zero_error
    assert (preds[:, 0] == 0).all()
    assert torch.equal(preds, TwoLayerNN(hidden=32, steps=300, lr=0.02, seed=1)(xs, ys))
    assert not torch.equal(preds, TwoLayerNN(hidden=32, steps=300, lr=0.02, seed=2)(xs, ys))


# --------------------------------------------------------------------------- tree models


def test_decision_tree_matches_sklearn():
    from sklearn.tree import DecisionTreeRegressor

    xs, ys = linear_prompts(2, 9, 3, noise_std=0.2, seed=24)
    preds = DecisionTree(max_depth=2)(xs, ys)
    for b, i in [(0, 1), (0, 5), (1, 8)]:
        model = DecisionTreeRegressor(max_depth=2, random_state=0).fit(xs[b, :i].numpy(), ys[b, :i].numpy())
        assert float(preds[b, i]) == pytest.approx(model.predict(xs[b, i : i + 1].numpy())[0])
    assert float(preds[0, 1]) == pytest.approx(float(ys[0, 0]))  # one example: a constant tree


def test_xgboost_matches_xgboost():
    from xgboost import XGBRegressor

    params = {"n_estimators": 10, "max_depth": 3}
    xs, ys = linear_prompts(2, 8, 3, noise_std=0.2, seed=25, dtype=torch.float32)
    preds = XGBoost(**params)(xs, ys)
    assert preds.dtype == torch.float32
    for b, i in [(0, 3), (1, 7)]:
        model = XGBRegressor(n_jobs=1, **params).fit(xs[b, :i].double().numpy(), ys[b, :i].double().numpy())
        assert float(preds[b, i]) == pytest.approx(float(model.predict(xs[b, i : i + 1].double().numpy())[0]), rel=1e-5)
