"""Garg et al.'s prompt strategies: each one's defining property, and position-by-position scoring against a
per-prefix loop written out here (least squares) and against Garg et al.'s full-length prompts (a model)."""

import pytest
import torch

from hf_icl.data.tasks import get_task
from hf_icl.estimators import get_estimator
from hf_icl.evaluation import evaluate_prompt_strategy
from hf_icl.evaluation.metrics import metric_for_task
from hf_icl.evaluation.prompt_strategies import (
    PROMPT_STRATEGIES,
    orthogonal_prompts,
    overlapping_prompts,
    random_quadrants_prompts,
    score_by_position,
    strategy_prompts,
)
from hf_icl.modeling import GPT2ForInContextRegression, GPT2ICLConfig


def gaussian_inputs(batch, n_points, n_dims, seed=0, dtype=torch.float32):
    return torch.randn(batch, n_points, n_dims, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# -- random quadrants ------------------------------------------------------------------------------------


def test_quadrant_context_shares_one_orthant_and_the_query_sits_in_the_opposite_one():
    xs = gaussian_inputs(500, 7, 4)
    context, query = random_quadrants_prompts(xs, torch.Generator().manual_seed(1), query_orthant="opposite")
    assert context.shape == query.shape == xs.shape
    torch.testing.assert_close(context.abs(), xs.abs(), rtol=0, atol=0)
    torch.testing.assert_close(query.abs(), xs.abs(), rtol=0, atol=0)
    pattern = torch.sign(context[:, :1])  # (B, 1, d): the orthant of the first example
    assert (torch.sign(context) == pattern).all(), "every context input of a prompt lies in one orthant"
    assert (torch.sign(query) == -pattern).all(), "every query lies in the opposite orthant"
    # the orthant is drawn per prompt and coordinate: each sign is +1 about half the time (500 prompts · 4)
    positive = (pattern > 0).double().mean()
    assert 0.45 < float(positive) < 0.55
    assert len({tuple(p.flatten().tolist()) for p in pattern}) == 16  # all 2⁴ orthants occur


def test_quadrants_with_random_queries_keep_the_original_inputs_and_a_seed_fixes_the_signs():
    xs = gaussian_inputs(20, 5, 3)
    context, query = random_quadrants_prompts(xs, torch.Generator().manual_seed(3), query_orthant="random")
    torch.testing.assert_close(query, xs, rtol=0, atol=0)
    again, _ = random_quadrants_prompts(xs, torch.Generator().manual_seed(3))
    torch.testing.assert_close(context, again, rtol=0, atol=0)


# -- orthogonal queries ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_orthogonal_queries_are_orthogonal_to_every_earlier_input_and_keep_the_norm(dtype):
    n_dims = 6
    xs = gaussian_inputs(40, 9, n_dims, dtype=dtype)
    context, query = orthogonal_prompts(xs)
    torch.testing.assert_close(context, xs, rtol=0, atol=0)
    for i in range(1, n_dims):
        dots = torch.einsum("bjd,bd->bj", xs[:, :i].double(), query[:, i].double())
        assert dots.abs().max() < 1e-5, f"position {i}: query not orthogonal to the context"
    torch.testing.assert_close(query[:, :n_dims].norm(dim=-1), xs[:, :n_dims].norm(dim=-1))
    torch.testing.assert_close(query[:, 0], xs[:, 0], rtol=0, atol=0)
    assert (query[:, n_dims:] == 0).all(), "from position d on nothing is orthogonal to the context"


def test_orthogonal_query_is_the_rescaled_residual_of_the_projection():
    # Garg et al.'s formula written out: x_i − P x_i with P the projector onto span(x_<i), rescaled to ‖x_i‖
    xs = gaussian_inputs(10, 5, 5, dtype=torch.float64)
    _, query = orthogonal_prompts(xs)
    for b in range(10):
        for i in range(1, 5):
            earlier = xs[b, :i]  # (i, d)
            projector = earlier.T @ torch.linalg.pinv(earlier.T)
            residual = xs[b, i] - projector @ xs[b, i]
            expected = residual * xs[b, i].norm() / residual.norm()
            torch.testing.assert_close(query[b, i], expected, rtol=1e-9, atol=1e-9)


def test_orthogonal_query_never_divides_by_zero_when_an_input_lies_in_the_earlier_span():
    xs = gaussian_inputs(2, 4, 4, dtype=torch.float64)
    xs[:, 2] = 2 * xs[:, 0] - xs[:, 1]  # in span(x_0, x_1)
    _, query = orthogonal_prompts(xs)
    assert torch.isfinite(query).all()
    dots = torch.einsum("bjd,bd->bj", xs[:, :2], query[:, 2])
    assert dots.abs().max() < 1e-9
    torch.testing.assert_close(query[:, 2].norm(dim=-1), xs[:, 2].norm(dim=-1))


# -- overlapping queries -------------------------------------------------------------------------------------


def test_overlapping_query_repeats_an_earlier_input_chosen_uniformly():
    n_prompts, n_points = 4000, 5
    xs = gaussian_inputs(n_prompts, n_points, 3)
    context, query = overlapping_prompts(xs, torch.Generator().manual_seed(2))
    torch.testing.assert_close(context, xs, rtol=0, atol=0)
    torch.testing.assert_close(query[:, 0], xs[:, 0], rtol=0, atol=0)
    for i in range(1, n_points):
        matches = (query[:, i, None, :] == xs).all(dim=-1)  # (B, N): which inputs equal the query
        assert (matches.sum(dim=1) == 1).all(), "each query equals exactly one input (continuous inputs)"
        picked = matches.float().argmax(dim=1)
        assert (picked < i).all(), f"position {i}: the query must be an earlier context input"
        frequencies = torch.bincount(picked, minlength=i).double() / n_prompts
        # uniform on 0 … i−1: each frequency is 1/i, binomial sd ≤ 0.008 for 4000 prompts (tolerance 4-5 sd)
        torch.testing.assert_close(frequencies, torch.full((i,), 1.0 / i, dtype=torch.float64), rtol=0, atol=0.035)


def test_prompt_builders_refuse_bad_inputs_with_the_argument_named():
    with pytest.raises(ValueError, match="xs must be a float tensor of shape \\(B, N, d\\)"):
        orthogonal_prompts(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="xs must be a float tensor"):
        overlapping_prompts(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="query_orthant must be one of \\['random', 'opposite'\\], got 'same'"):
        random_quadrants_prompts(torch.zeros(2, 3, 4), query_orthant="same")
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        random_quadrants_prompts(torch.zeros(2, 3, 4), 0)
    with pytest.raises(ValueError, match="strategy must be one of .*'random_quadrants'.*got 'standard'"):
        evaluate_prompt_strategy({"ls": get_estimator("least_squares")}, get_task("linear_regression", n_dims=2),
                                 "standard", n_prompts=4, n_points=3)  # fmt: skip
    with pytest.raises(
        ValueError, match="bad strategy_options \\{'query_orthant': 'random'\\} for strategy 'orthogonal"
    ):
        evaluate_prompt_strategy({"ls": get_estimator("least_squares")}, get_task("linear_regression", n_dims=2),
                                 "orthogonal_train_test", n_prompts=4, n_points=3,
                                 strategy_options={"query_orthant": "random"})  # fmt: skip
    with pytest.raises(ValueError, match="draws its own inputs"):
        evaluate_prompt_strategy({"knn": get_estimator("knn")}, get_task("latent_group_sinusoid"),
                                 "overlapping_train_test", n_prompts=4, n_points=3)  # fmt: skip


# -- scoring position by position ------------------------------------------------------------------------


def reference_prompts(strategy, n_dims, n_prompts, n_points, seed):
    """The documented stream: inputs and weights from family.sample on a generator seeded ``seed``, then the
    strategy's draws on the same generator; labels y = wᵀx written out here."""
    family = get_task("linear_regression", n_dims=n_dims)
    generator = torch.Generator().manual_seed(seed)
    xs, _, params = family.sample(n_prompts, n_points, generator=generator, return_params=True)
    context, query = PROMPT_STRATEGIES[strategy](xs, generator)
    w = params["w"]
    return context, torch.einsum("bnd,bd->bn", context, w), query, torch.einsum("bnd,bd->bn", query, w)


@pytest.mark.parametrize("strategy", list(PROMPT_STRATEGIES))
def test_least_squares_curve_equals_a_per_prefix_loop(strategy):
    n_dims, n_prompts, n_points, seed = 3, 50, 7, 4
    result = evaluate_prompt_strategy(
        {"least_squares": get_estimator("least_squares")},
        get_task("linear_regression", n_dims=n_dims),
        strategy,
        n_prompts=n_prompts,
        seed=seed,
        n_points=n_points,
    )
    context, context_ys, query, query_ys = reference_prompts(strategy, n_dims, n_prompts, n_points, seed)
    n_positions = n_dims if strategy == "orthogonal_train_test" else n_points
    errors = torch.zeros(n_prompts, n_positions, dtype=torch.float64)
    for b in range(n_prompts):
        for i in range(n_positions):
            x, y = context[b, :i].double(), context_ys[b, :i].double()
            w_hat = torch.linalg.pinv(x) @ y if i > 0 else torch.zeros(n_dims, dtype=torch.float64)
            errors[b, i] = (query[b, i].double() @ w_hat - query_ys[b, i].double()) ** 2 / n_dims
    torch.testing.assert_close(result.curves["least_squares"], errors.mean(0), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(result.trivial, (query_ys[:, :n_positions].double() ** 2 / n_dims).mean(0))
    assert result.metric.name == "squared_error/d" and result.n_prompts == n_prompts
    assert bool((result.lower["least_squares"] <= result.curves["least_squares"] + 1e-12).all())
    assert bool((result.curves["least_squares"] <= result.upper["least_squares"] + 1e-12).all())


def test_what_least_squares_must_do_on_each_strategy():
    task, ls = get_task("linear_regression", n_dims=3), {"least_squares": get_estimator("least_squares")}

    def curve(strategy):
        result = evaluate_prompt_strategy(ls, task, strategy, n_prompts=64, n_points=8)
        return result.curves["least_squares"], result.trivial

    overlapping, _ = curve("overlapping_train_test")
    assert overlapping[1:].max() < 1e-8, "a repeated context point is interpolated exactly"
    orthogonal, trivial = curve("orthogonal_train_test")
    torch.testing.assert_close(orthogonal, trivial)  # min-norm least squares predicts 0 off the span
    quadrants, trivial = curve("random_quadrants")
    assert quadrants[4:].max() < 1e-8 < float(trivial[4]), "once d examples pin w, any query is exact"


def test_model_scores_equal_garg_full_length_prompts():
    # Garg et al. score position i on [context_<i, queries_≥i] at full length; a causal model must give the
    # same prediction at i on our length-(i + 1) prompt
    torch.manual_seed(0)
    model = GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=3, n_points=6)).eval()
    family = get_task("linear_regression", n_dims=3)
    context, context_ys, query, query_ys = strategy_prompts(family, "random_quadrants", 16, 6, seed=1)
    metric = metric_for_task(family)
    ours = score_by_position(model, context, context_ys, query, query_ys, metric, name="gpt2", batch_size=5)
    garg = torch.zeros(16, 6, dtype=torch.float64)
    with torch.no_grad():
        for i in range(6):
            xs = torch.cat([context[:, :i], query[:, i:]], dim=1)
            ys = torch.cat([context_ys[:, :i], query_ys[:, i:]], dim=1)
            garg[:, i] = (model(xs, ys).predictions[:, i].double() - ys[:, i].double()) ** 2 / 3
    torch.testing.assert_close(ours, garg, rtol=1e-5, atol=1e-6)
    assert not model.training
