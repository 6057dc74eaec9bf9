"""Tests of context/query prediction (InContextEstimator.predict_queries) and of Ridge's primal form: every
closed-form override against the chunked all-prefix default, the kernel-regression document's own estimators
written out as in its cells on its sin(x) data, scikit-learn, and pinv."""

from __future__ import annotations

import doctest

import pytest
import torch

import hf_icl.estimators.base as base_module
import hf_icl.estimators.kernel_ridge as kernel_ridge_module
import hf_icl.estimators.ridge as ridge_module
from hf_icl.estimators import (
    Averaging,
    InContextEstimator,
    KernelRidge,
    LeastSquares,
    NadarayaWatson,
    OnFeatures,
    RandomFourierFeatures,
    Ridge,
)

F64 = torch.float64


def prompts(batch, n_points, n_dims, seed, noise=0.3):
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n_points, n_dims, generator=gen, dtype=F64)
    w = torch.randn(batch, n_dims, generator=gen, dtype=F64)
    ys = torch.einsum("bnd,bd->bn", xs, w) + noise * torch.randn(batch, n_points, generator=gen, dtype=F64)
    return xs, ys


def context_and_queries(batch=3, n_context=9, n_queries=5, n_dims=3, seed=0):
    xs, ys = prompts(batch, n_context + n_queries, n_dims, seed)
    return xs[:, :n_context], ys[:, :n_context], xs[:, n_context:]


def default_predict_queries(estimator, context_xs, context_ys, query_xs):
    """The base class's reference implementation, bypassing any override."""
    return InContextEstimator._predict_queries(estimator, context_xs, context_ys, query_xs)


# --------------------------------------------------------------------------- ridge: primal and dual forms


@pytest.mark.parametrize(("n_points", "n_dims"), [(5, 9), (8, 8), (25, 3), (2, 1)])
@pytest.mark.parametrize("lam", [0.05, 1.0])
def test_ridge_primal_equals_dual_and_sklearn_on_every_prefix(n_points, n_dims, lam):
    from sklearn.linear_model import Ridge as SkRidge

    xs, ys = prompts(3, n_points, n_dims, seed=n_points * 10 + n_dims)
    primal = Ridge(lam, form="primal")(xs, ys)
    dual = Ridge(lam, form="dual")(xs, ys)
    torch.testing.assert_close(primal, dual, rtol=1e-9, atol=1e-9)
    expected = torch.zeros(3, n_points, dtype=F64)  # position 0 predicts 0
    for b in range(3):
        for i in range(1, n_points):
            model = SkRidge(alpha=lam, fit_intercept=False).fit(xs[b, :i].numpy(), ys[b, :i].numpy())
            expected[b, i] = float(model.predict(xs[b, i : i + 1].numpy())[0])
    torch.testing.assert_close(primal, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dual, expected, rtol=1e-9, atol=1e-9)
    assert torch.all(primal[:, 0] == 0) and torch.all(dual[:, 0] == 0)


def test_ridge_primal_solves_in_float64_and_returns_the_input_dtype():
    xs, ys = prompts(2, 30, 4, seed=1)
    preds = Ridge(0.2, form="primal")(xs.float(), ys.float())
    assert preds.dtype == torch.float32
    expected = Ridge(0.2, form="dual")(xs.float().double(), ys.float().double())
    torch.testing.assert_close(preds, expected.float(), rtol=1e-6, atol=1e-6)


def test_ridge_form_is_validated_and_named():
    assert Ridge(0.1).name == "ridge(λ=0.1)" and Ridge(0.1).form == "dual"
    assert Ridge(0.1, form="primal").name == "ridge(λ=0.1, primal)"
    with pytest.raises(ValueError, match=r"form must be one of \['dual', 'primal'\], got 'woodbury'"):
        Ridge(0.1, form="woodbury")


# --------------------------------------------------------------------------- overrides vs the default


def override_cases(n_dims):
    return [
        Ridge(0.3),
        Ridge(0.3, form="primal"),
        KernelRidge(0.1, kernel="rbf", bandwidth=0.7),
        KernelRidge(0.2, kernel="linear"),
        NadarayaWatson("exp", 0.8),
        NadarayaWatson("softmax", 1.5),
        NadarayaWatson("rbf", 0.6),
        NadarayaWatson("hilbert"),
        NadarayaWatson("cosine"),
        NadarayaWatson("cayley", 0.4),
        NadarayaWatson("ga"),
        NadarayaWatson("ga", 0.5, beta1=2.0, beta2=3.0, wedge_mode="well", wedge_mu=0.7),
        OnFeatures(NadarayaWatson("cayley"), RandomFourierFeatures(n_dims=n_dims, n_frequencies=8)),
        OnFeatures(KernelRidge(0.1), RandomFourierFeatures(n_dims=n_dims, n_frequencies=4, scale=0.5)),
    ]


@pytest.mark.parametrize("estimator", override_cases(3), ids=lambda e: e.name)
def test_every_closed_form_equals_the_all_prefix_default(estimator):
    context_xs, context_ys, query_xs = context_and_queries(batch=3, n_context=9, n_queries=5, n_dims=3)
    query_xs[:, 1] = context_xs[:, 4]  # a query that repeats a context input (Hilbert's duplicate rule)
    query_xs[:, 2] = -2 * context_xs[:, 0]  # antiparallel to a context input
    query_xs[0, 3] = 0.0  # a zero query
    override = estimator.predict_queries(context_xs, context_ys, query_xs)
    default = default_predict_queries(estimator, context_xs, context_ys, query_xs)
    assert override.shape == (3, 5) and override.dtype == F64
    assert type(estimator)._predict_queries is not InContextEstimator._predict_queries  # really an override
    torch.testing.assert_close(override, default, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("estimator", override_cases(2), ids=lambda e: e.name)
def test_queries_do_not_see_each_other(estimator):
    context_xs, context_ys, query_xs = context_and_queries(batch=2, n_context=7, n_queries=4, n_dims=2, seed=3)
    together = estimator.predict_queries(context_xs, context_ys, query_xs)
    one_at_a_time = torch.cat(
        [estimator.predict_queries(context_xs, context_ys, query_xs[:, q : q + 1]) for q in range(4)], dim=1
    )
    torch.testing.assert_close(together, one_at_a_time, rtol=1e-12, atol=1e-13)
    order = torch.tensor([2, 0, 3, 1])
    permuted = estimator.predict_queries(context_xs, context_ys, query_xs[:, order])
    torch.testing.assert_close(permuted, together[:, order], rtol=1e-12, atol=1e-13)


def test_default_for_estimators_without_a_closed_form_matches_independent_references():
    context_xs, context_ys, query_xs = context_and_queries(batch=2, n_context=6, n_queries=3, n_dims=4, seed=4)
    least_squares = LeastSquares().predict_queries(context_xs, context_ys, query_xs)
    averaging = Averaging().predict_queries(context_xs, context_ys, query_xs)
    for b in range(2):
        weights = torch.linalg.pinv(context_xs[b]) @ context_ys[b]
        torch.testing.assert_close(least_squares[b], query_xs[b] @ weights, rtol=1e-9, atol=1e-10)
        mean_moment = (context_ys[b, :, None] * context_xs[b]).mean(0)
        torch.testing.assert_close(averaging[b], query_xs[b] @ mean_moment, rtol=1e-12, atol=1e-12)


class CountingRidge(Ridge):
    """Ridge that records how many prompts each all-prefix call receives, and uses the default path."""

    def __init__(self, lam):
        super().__init__(lam)
        self.calls = []

    def _predict(self, xs, ys):
        self.calls.append(tuple(xs.shape))
        return super()._predict(xs, ys)

    _predict_queries = InContextEstimator._predict_queries


def test_default_runs_in_chunks_of_query_chunk_size_prompts():
    context_xs, context_ys, query_xs = context_and_queries(batch=2, n_context=6, n_queries=7, n_dims=3, seed=5)
    chunked = CountingRidge(0.4)
    chunked.query_chunk_size = 5
    preds = chunked.predict_queries(context_xs, context_ys, query_xs)
    assert chunked.calls == [(5, 7, 3), (5, 7, 3), (4, 7, 3)]  # 14 prompts [6 context points, 1 query]
    assert InContextEstimator.query_chunk_size == 64
    torch.testing.assert_close(preds, Ridge(0.4).predict_queries(context_xs, context_ys, query_xs))


def test_kernel_ridge_predict_queries_matches_sklearn_fitted_on_the_context():
    from sklearn.kernel_ridge import KernelRidge as SkKernelRidge

    context_xs, context_ys, query_xs = context_and_queries(batch=2, n_context=12, n_queries=6, n_dims=2, seed=6)
    preds = KernelRidge(0.05, kernel="rbf", bandwidth=0.9).predict_queries(context_xs, context_ys, query_xs)
    for b in range(2):
        model = SkKernelRidge(alpha=0.05, kernel="rbf", gamma=1 / (2 * 0.9**2))
        expected = model.fit(context_xs[b].numpy(), context_ys[b].numpy()).predict(query_xs[b].numpy())
        torch.testing.assert_close(preds[b], torch.from_numpy(expected), rtol=1e-8, atol=1e-10)


def test_float32_inputs_give_float32_predictions():
    context_xs, context_ys, query_xs = context_and_queries(seed=7)
    for estimator in (Ridge(0.3, form="primal"), NadarayaWatson("ga"), LeastSquares()):
        preds = estimator.predict_queries(context_xs.float(), context_ys.float(), query_xs.float())
        assert preds.dtype == torch.float32
        expected = estimator.predict_queries(context_xs.float().double(), context_ys.float().double(), query_xs)
        torch.testing.assert_close(preds, expected.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        (lambda c, y, q: ([c.tolist(), y, q]), ["context_xs must be a torch.Tensor", "list"]),
        (lambda c, y, q: (c, y[:, :-1], q), ["context_ys must have shape (B, N) = (3, 9)", "(3, 8)"]),
        (lambda c, y, q: (c[:, :0], y[:, :0], q), ["context_xs must have shape (B, N, d)", "(3, 0, 3)"]),
        (lambda c, y, q: (c, y.float(), q), ["context_ys must have the dtype and device of context_xs"]),
        (lambda c, y, q: (c, y, q[..., :2]), ["query_xs must have shape (B, Q, d) = (3, Q, 3)", "(3, 5, 2)"]),
        (lambda c, y, q: (c, y, q[:2]), ["query_xs", "(3, Q, 3)", "(2, 5, 3)"]),
        (lambda c, y, q: (c, y, q[:, :0]), ["query_xs", "Q >= 1", "(3, 0, 3)"]),
        (lambda c, y, q: (c, y, q[:, 0]), ["query_xs", "(3, 3)"]),
        (lambda c, y, q: (c, y, q.float()), ["query_xs must have the dtype and device of context_xs", "float32"]),
        (lambda c, y, q: (c, y, q.index_fill(1, torch.tensor([2]), float("nan"))), ["query_xs", "finite", "nan"]),
        (lambda c, y, q: (c, y.index_fill(1, torch.tensor([0]), float("inf")), q), ["context_ys", "finite", "inf"]),
        (lambda c, y, q: (c, y, "queries"), ["query_xs must be a torch.Tensor", "str"]),
    ],
)
@pytest.mark.parametrize("estimator", [Ridge(0.1), NadarayaWatson("cosine"), Averaging()], ids=lambda e: e.name)
def test_bad_inputs_raise_naming_the_argument(estimator, arguments, fragments):
    with pytest.raises(ValueError) as info:
        estimator.predict_queries(*arguments(*context_and_queries()))
    for fragment in fragments:
        assert fragment in str(info.value)


# --------------------------------------------------------------------------- the document's cells


class DocRidgePrimal:
    """w = (X^T X + λI)^{-1} X^T y"""

    def __init__(self, lam=1.0):
        self.lam = lam

    def fit(self, X, y):
        d = X.shape[1]
        A = X.T @ X + self.lam * torch.eye(d, device=X.device, dtype=X.dtype)
        self.w = torch.linalg.solve(A, X.T @ y)
        return self

    def predict(self, X):
        return X @ self.w


class DocRidgeDual:
    """α = (XX^T + λI)^{-1} y"""

    def __init__(self, lam=1.0):
        self.lam = lam

    def fit(self, X, y):
        self.X_train = X
        n = X.shape[0]
        K = X @ X.T
        self.alpha = torch.linalg.solve(K + self.lam * torch.eye(n, device=X.device, dtype=X.dtype), y)
        return self

    def predict(self, X):
        return (X @ self.X_train.T) @ self.alpha


def doc_rbf_kernel(X1, X2, sigma=1.0):
    """k(x, x') = exp(-||x - x'||^2 / 2σ^2)"""
    sq1 = (X1**2).sum(dim=1, keepdim=True)
    sq2 = (X2**2).sum(dim=1, keepdim=True)
    dist_sq = sq1 - 2.0 * X1 @ X2.T + sq2.T
    return torch.exp(-dist_sq / (2.0 * sigma**2))


class DocKernelRidge:
    """α = (K + λI)^{-1} y  with arbitrary kernel."""

    def __init__(self, kernel_fn=doc_rbf_kernel, lam=1.0, **kw):
        self.kernel_fn, self.lam, self.kw = kernel_fn, lam, kw

    def fit(self, X, y):
        self.X_train = X
        n = X.shape[0]
        K = self.kernel_fn(X, X, **self.kw)
        self.alpha = torch.linalg.solve(K + self.lam * torch.eye(n, device=X.device, dtype=X.dtype), y)
        return self

    def predict(self, X):
        return self.kernel_fn(X, self.X_train, **self.kw) @ self.alpha


def doc_nadaraya_watson(X_ctx, y_ctx, X_query, kernel_fn, **kw):
    K = kernel_fn(X_query, X_ctx, **kw)
    weights = K / K.sum(dim=1, keepdim=True)
    return weights @ y_ctx


def doc_attention_icl(X_ctx, y_ctx, X_query):
    logits = X_query @ X_ctx.T
    weights = torch.softmax(logits, dim=1)
    return weights @ y_ctx


@pytest.fixture(scope="module")
def sine_data():
    """The document's sin(x) demo (float64 on CPU): 200 noisy context points, 100 queries, and its W_rff."""
    with torch.random.fork_rng():
        torch.manual_seed(42)
        w_rff = torch.randn(1, 32, dtype=F64) * 2.0
        torch.manual_seed(42)
        X_ctx = torch.linspace(-3, 3, 200, dtype=F64).unsqueeze(1)
        y_ctx = torch.sin(X_ctx) + 0.2 * torch.randn(200, 1, dtype=F64)
    X_query = torch.linspace(-3, 3, 100, dtype=F64).unsqueeze(1)
    return X_ctx, y_ctx, X_query, w_rff


def ours(estimator, X_ctx, y_ctx, X_query):
    """predict_queries on the document's data as one prompt: (1, 200, 1), (1, 200), (1, 100, 1) -> (100, 1)."""
    return estimator.predict_queries(X_ctx[None], y_ctx[None, :, 0], X_query[None])[0].unsqueeze(1)


def test_document_ridge_kernel_ridge_and_smoothers_are_predict_queries(sine_data):
    X_ctx, y_ctx, X_query, _ = sine_data
    cases = [
        (Ridge(1.0, form="primal"), DocRidgePrimal(lam=1.0).fit(X_ctx, y_ctx).predict(X_query)),
        (Ridge(1.0, form="dual"), DocRidgeDual(lam=1.0).fit(X_ctx, y_ctx).predict(X_query)),
        (
            KernelRidge(0.01, kernel="rbf", bandwidth=0.5),
            DocKernelRidge(kernel_fn=doc_rbf_kernel, lam=0.01, sigma=0.5).fit(X_ctx, y_ctx).predict(X_query),
        ),
        (NadarayaWatson("rbf", 0.5), doc_nadaraya_watson(X_ctx, y_ctx, X_query, doc_rbf_kernel, sigma=0.5)),
        (NadarayaWatson("softmax", bandwidth=1), doc_attention_icl(X_ctx, y_ctx, X_query)),
    ]
    for estimator, expected in cases:
        torch.testing.assert_close(ours(estimator, X_ctx, y_ctx, X_query), expected, rtol=1e-9, atol=1e-10)
    # the closed forms also agree with the all-prefix default at the document's size
    krr = KernelRidge(0.01, kernel="rbf", bandwidth=0.5)
    default = default_predict_queries(krr, X_ctx[None], y_ctx[None, :, 0], X_query[None])
    torch.testing.assert_close(ours(krr, X_ctx, y_ctx, X_query), default[0].unsqueeze(1), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kernel", ["cosine", "cayley", "ga"])
def test_document_angular_kernels_on_random_fourier_features(sine_data, kernel):
    X_ctx, y_ctx, X_query, w_rff = sine_data

    def rff_embed(X):
        proj = X @ w_rff
        return torch.cat([torch.cos(proj), torch.sin(proj)], dim=1)

    z_ctx = rff_embed(X_ctx) / rff_embed(X_ctx).norm(dim=1, keepdim=True).clamp(min=1e-8)
    z_query = rff_embed(X_query) / rff_embed(X_query).norm(dim=1, keepdim=True).clamp(min=1e-8)
    # cos θ is kept 1e-6 away from ±1 (the row kernels' clamp): queries ±3 coincide with context points
    cos = (z_query @ z_ctx.T).clamp(-1 + 1e-6, 1 - 1e-6)
    theta = torch.arccos(cos)
    sin = torch.sqrt(1 - cos**2)
    score = {
        "cosine": cos / 0.1,  # T = 0.1
        "cayley": -(theta**2) / (2 * 0.1**2),  # T = 0.1
        "ga": (4.0 * cos - 1.0 * sin) / 1.0,  # β1 = 4, β2 = 1, penalty, T = 1
    }[kernel]
    expected = torch.softmax(score, dim=1) @ y_ctx
    estimator = OnFeatures(NadarayaWatson(kernel), RandomFourierFeatures())
    torch.testing.assert_close(ours(estimator, X_ctx, y_ctx, X_query), expected, rtol=1e-10, atol=1e-12)


def test_module_examples_run():
    for module in (base_module, ridge_module, kernel_ridge_module):
        assert doctest.testmod(module, raise_on_error=True).attempted > 0
