"""Context-scaling evaluation: per-position metrics, shared prompts, bootstrap bands, models, plots."""

import matplotlib.image
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hf_icl.data.tasks import get_task
from hf_icl.evaluation import bootstrap as bootstrap_module
from hf_icl.evaluation import (
    bootstrap_band,
    bootstrap_indices,
    evaluate_context_scaling,
)
from hf_icl.modeling import GPT2ForInContextRegression, GPT2ICLConfig, ICLOutput

# -- helpers: independent references ------------------------------------------------------------


def prefix_least_squares(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Min-norm least squares fitted on the examples before each position, one prefix at a time."""
    preds = torch.zeros_like(ys)
    for i in range(1, ys.shape[1]):
        w = torch.linalg.pinv(xs[:, :i].double()) @ ys[:, :i, None].double()
        preds[:, i] = (xs[:, i, None, :].double() @ w)[:, 0, 0].to(ys.dtype)
    return preds


class Recorder:
    """A predictor that remembers the prompts it saw and answers with ``answer(xs, ys)``."""

    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def __call__(self, xs, ys):
        self.seen.append((xs.clone(), ys.clone()))
        return self.answer(xs, ys)

    def prompts(self):
        return torch.cat([x for x, _ in self.seen]), torch.cat([y for _, y in self.seen])


class CountingModel(nn.Module):
    """A stand-in ICL model: counts forward calls and notes the mode it was called in."""

    def __init__(self, answer=lambda xs, ys: xs.sum(-1)):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))
        self.answer = answer
        self.calls = []

    def forward(self, xs, ys):
        self.calls.append({"training": self.training, "grad": torch.is_grad_enabled(), "batch": xs.shape[0]})
        return ICLOutput(predictions=self.weight * self.answer(xs, ys))


class DictModel(nn.Module):
    """A module whose output is neither a tensor nor an ICLOutput."""

    def forward(self, xs, ys):
        return {"values": ys}


def loop_mean_squared_error(preds, ys, normalizer):
    n_prompts, n_points = ys.shape
    out = []
    for i in range(n_points):
        total = 0.0
        for p in range(n_prompts):
            total += (float(preds[p, i]) - float(ys[p, i])) ** 2
        out.append(total / n_prompts / normalizer)
    return torch.tensor(out, dtype=torch.float64)


# -- per-position metric ------------------------------------------------------------------------


def test_per_position_error_matches_a_plain_loop_normalised_by_d():
    rec = Recorder(lambda xs, ys: xs.sum(-1))
    result = evaluate_context_scaling({"sum": rec}, get_task("linear_regression", n_dims=3), n_prompts=7, n_points=5)
    xs, ys = rec.prompts()
    assert xs.shape == (7, 5, 3)
    torch.testing.assert_close(result.curves["sum"], loop_mean_squared_error(xs.sum(-1), ys, 3.0))
    torch.testing.assert_close(result.trivial, loop_mean_squared_error(torch.zeros_like(ys), ys, 3.0))
    assert result.metric.normalizer == 3.0 and result.metric.name == "squared_error/d"


def test_sparse_linear_regression_is_normalised_by_the_sparsity():
    rec = Recorder(lambda xs, ys: xs[..., 0])
    task = get_task("sparse_linear_regression", n_dims=8, sparsity=2)
    result = evaluate_context_scaling({"first": rec}, task, n_prompts=9, n_points=4)
    xs, ys = rec.prompts()
    torch.testing.assert_close(result.curves["first"], loop_mean_squared_error(xs[..., 0], ys, 2.0))
    assert result.metric.normalizer == 2.0


def test_normalizer_override_and_its_refusal_for_classification():
    task = get_task("linear_regression", n_dims=4)
    predictors = {"half": lambda xs, ys: 0.5 * ys}
    by_d = evaluate_context_scaling(predictors, task, 50, n_points=3, n_bootstrap=20)
    by_one = evaluate_context_scaling(predictors, task, 50, n_points=3, n_bootstrap=20, normalizer=1.0)
    assert by_one.metric.normalizer == 1.0
    torch.testing.assert_close(by_one.curves["half"], 4 * by_d.curves["half"])
    torch.testing.assert_close(by_one.upper["trivial"], 4 * by_d.upper["trivial"])
    with pytest.raises(ValueError, match="only applies to regression"):
        evaluate_context_scaling(
            {"z": torch.zeros_like}, get_task("linear_classification", n_dims=2), 5, n_points=2, normalizer=2.0
        )


def test_least_squares_is_exact_after_d_examples_and_zero_predictor_scores_one():
    d = 5
    result = evaluate_context_scaling(
        {"least_squares": prefix_least_squares, "zero": lambda xs, ys: torch.zeros_like(ys)},
        get_task("linear_regression", n_dims=d),
        n_prompts=2000,
        n_points=9,
        n_bootstrap=200,
    )
    assert float(result.curves["least_squares"][d:].max()) < 1e-8
    assert float(result.curves["least_squares"][1]) > 0.5  # one example cannot pin down w in 5-D
    # E[y²]/d = E‖w‖²/d = 1; the per-position mean over 2000 prompts has sd ≈ 0.04
    assert torch.allclose(result.curves["zero"], torch.ones(9, dtype=torch.float64), atol=0.2)
    trivial_rows = [row for row in result.rows if row["predictor"] == "trivial"]
    assert [row["n_examples"] for row in trivial_rows] == list(range(9))
    trivial_values = torch.tensor([row["value"] for row in trivial_rows], dtype=torch.float64)
    torch.testing.assert_close(trivial_values, result.curves["zero"])


def test_zero_predictor_scores_one_on_sparse_regression():
    result = evaluate_context_scaling(
        {"zero": lambda xs, ys: torch.zeros_like(ys)},
        get_task("sparse_linear_regression", n_dims=10, sparsity=2),
        n_prompts=2000,
        n_points=6,
        n_bootstrap=50,
    )
    # divided by d = 10 this would be ≈ 0.2; divided by s = 2 it is ≈ 1 (sd of the mean ≈ 0.05)
    assert torch.allclose(result.curves["zero"], torch.ones(6, dtype=torch.float64), atol=0.25)


def test_get_estimator_baselines_run_through_the_evaluation():
    from hf_icl.estimators import get_estimator

    estimators = {name: get_estimator(name) for name in ("least_squares", "knn", "averaging")}
    result = evaluate_context_scaling(estimators, get_task("linear_regression", n_dims=3), 300, n_points=8)
    assert float(result.curves["least_squares"][3:].max()) < 1e-6
    assert result.predictors == ["least_squares", "knn", "averaging", "trivial"]
    assert all(torch.isfinite(curve).all() for curve in result.curves.values())


# -- shared prompts -----------------------------------------------------------------------------


def test_identical_predictors_get_identical_curves_and_the_identity_scores_zero():
    def half(xs, ys):
        return 0.5 * ys

    result = evaluate_context_scaling(
        {"a": half, "b": half, "identity": lambda xs, ys: ys},
        get_task("noisy_linear_regression", n_dims=3),
        200,
        n_points=5,
    )
    assert torch.equal(result.curves["a"], result.curves["b"])
    assert torch.equal(result.lower["a"], result.lower["b"]) and torch.equal(result.upper["a"], result.upper["b"])
    assert float(result.curves["identity"].abs().max()) == 0.0
    # paired: predicting y/2 is exactly a quarter of the zero predictor's error on the same prompts
    torch.testing.assert_close(result.curves["a"], result.trivial / 4)


def test_models_and_estimators_see_the_same_prompts_and_the_seed_fixes_them():
    model, rec = CountingModel(), Recorder(lambda xs, ys: xs.sum(-1))
    task = get_task("linear_regression", n_dims=3)
    first = evaluate_context_scaling({"model": model, "estimator": rec}, task, 40, seed=3, n_points=6)
    torch.testing.assert_close(first.curves["model"], first.curves["estimator"])
    again = evaluate_context_scaling({"estimator": lambda xs, ys: xs.sum(-1)}, task, 40, seed=3, n_points=6)
    other = evaluate_context_scaling({"estimator": lambda xs, ys: xs.sum(-1)}, task, 40, seed=4, n_points=6)
    assert torch.equal(first.curves["estimator"], again.curves["estimator"])
    assert not torch.equal(first.curves["estimator"], other.curves["estimator"])


def test_batch_size_chunks_the_calls_without_changing_the_prompts():
    task = get_task("linear_regression", n_dims=2)
    whole = evaluate_context_scaling({"m": CountingModel()}, task, 250, n_points=4)
    model = CountingModel()
    chunked = evaluate_context_scaling({"m": model}, task, 250, n_points=4, batch_size=100)
    assert [call["batch"] for call in model.calls] == [100, 100, 50]
    torch.testing.assert_close(whole.curves["m"], chunked.curves["m"])
    torch.testing.assert_close(whole.lower["m"], chunked.lower["m"])


# -- models -------------------------------------------------------------------------------------


def test_a_model_runs_one_forward_pass_in_eval_mode_without_grad_and_keeps_its_training_flag():
    model = CountingModel()
    model.train()
    evaluate_context_scaling({"m": model}, get_task("linear_regression", n_dims=3), 300, n_points=7)
    assert model.calls == [{"training": False, "grad": False, "batch": 300}]
    assert model.training
    model.eval()
    evaluate_context_scaling({"m": model}, get_task("linear_regression", n_dims=3), 30, n_points=7)
    assert not model.training


def test_training_flag_is_restored_when_the_forward_pass_fails():
    def fail(xs, ys):
        raise RuntimeError("boom")

    model = CountingModel(answer=fail)
    model.train()
    with pytest.raises(RuntimeError, match="boom"):
        evaluate_context_scaling({"m": model}, get_task("linear_regression", n_dims=2), 10, n_points=3)
    assert model.training


def test_gpt2_model_takes_n_points_from_its_config():
    torch.manual_seed(0)
    model = GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=5, n_points=11))
    model.train()
    result = evaluate_context_scaling(
        {"gpt2": model, "least_squares": prefix_least_squares},
        {"name": "linear_regression", "n_dims": 5},
        64,
        n_bootstrap=100,
    )
    assert result.n_points == 11 and result.curves["gpt2"].shape == (11,)
    assert torch.isfinite(result.curves["gpt2"]).all()
    assert model.training


def test_shortest_model_context_is_used_and_mismatched_target_kinds_are_refused():
    class WithConfig(CountingModel):
        def __init__(self, n_points, target_kind="regression"):
            super().__init__()
            self.config = type("Config", (), {"n_points": n_points, "target_kind": target_kind})()

    result = evaluate_context_scaling(
        {"a": WithConfig(9), "b": WithConfig(6)}, get_task("linear_regression", n_dims=2), 20
    )
    assert result.n_points == 6
    with pytest.raises(ValueError, match="target_kind='binary'"):
        evaluate_context_scaling({"a": WithConfig(6, "binary")}, get_task("linear_regression", n_dims=2), 20)


# -- classification -----------------------------------------------------------------------------


def test_binary_accuracy_uses_the_sign_and_counts_an_exact_zero_as_wrong():
    task = get_task("linear_classification", n_dims=4)
    result = evaluate_context_scaling(
        {
            "scaled": lambda xs, ys: 3.0 * ys,
            "zero_for_plus": lambda xs, ys: 5.0 * (ys - 1) / 2,  # +1 → 0 (no label), −1 → −5
            "zero_for_minus": lambda xs, ys: 5.0 * (ys + 1) / 2,  # −1 → 0 (no label), +1 → +5
            "always_zero": lambda xs, ys: torch.zeros_like(ys),
            "negated": lambda xs, ys: -ys,
        },
        task,
        200,
        n_points=5,
    )
    assert result.metric.name == "accuracy"
    assert torch.equal(result.curves["scaled"], torch.ones(5, dtype=torch.float64))
    # Garg et al.: sign(0) = 0 matches neither label, so each curve is right only on the other label
    both = result.curves["zero_for_plus"] + result.curves["zero_for_minus"]
    torch.testing.assert_close(both, torch.ones(5, dtype=torch.float64))
    assert 0.3 < float(result.curves["zero_for_plus"].mean()) < 0.7
    assert torch.equal(result.curves["always_zero"], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(result.curves["negated"], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(result.trivial, torch.full((5,), 0.5, dtype=torch.float64))
    assert {row["metric"] for row in result.rows} == {"accuracy"}


def test_categorical_accuracy_from_logits_and_from_class_ids():
    class OneHotModel(nn.Module):
        def forward(self, xs, ys):
            assert ys.dtype == torch.int64  # models get the class ids themselves
            return ICLOutput(logits=F.one_hot(ys, 4).float())

    task = get_task("categorical", n_dims=3, n_classes=4)
    result = evaluate_context_scaling(
        {
            "model": OneHotModel(),
            "logits": lambda xs, ys: F.one_hot(ys.long(), 4).float(),
            "ids": lambda xs, ys: ys + 0.3,  # rounds to the true id
            "int_ids": lambda xs, ys: ys.long(),
            "shifted": lambda xs, ys: (ys + 1) % 4,
        },
        task,
        150,
        n_points=6,
    )
    for name in ("model", "logits", "ids", "int_ids"):
        assert torch.equal(result.curves[name], torch.ones(6, dtype=torch.float64)), name
    assert torch.equal(result.curves["shifted"], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(result.trivial, torch.full((6,), 0.25, dtype=torch.float64))


# -- bootstrap ----------------------------------------------------------------------------------


def test_bootstrap_matches_a_slow_per_replicate_loop():
    scores = torch.rand(30, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    indices = bootstrap_indices(200, 30, seed=3)
    assert indices.shape == (200, 30)
    replicate_means = np.stack([scores.numpy()[row].mean(axis=0) for row in indices.numpy()])
    expected = np.quantile(replicate_means, [0.05, 0.95], axis=0)
    lower, upper = bootstrap_band(scores, n_bootstrap=200, confidence=(0.05, 0.95), seed=3)
    np.testing.assert_allclose(lower.numpy(), expected[0], rtol=1e-12)
    np.testing.assert_allclose(upper.numpy(), expected[1], rtol=1e-12)


def test_bootstrap_chunking_gives_the_same_band(monkeypatch):
    scores = torch.rand(50, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    whole = bootstrap_band(scores, n_bootstrap=300, confidence=(0.1, 0.9), seed=0)
    monkeypatch.setattr(bootstrap_module, "MAX_COUNT_ENTRIES", 64 * 50)  # chunks of 64 replicates, the last of 44
    chunked = bootstrap_band(scores, n_bootstrap=300, confidence=(0.1, 0.9), seed=0)
    torch.testing.assert_close(whole, chunked)


def test_evaluation_bands_are_the_bootstrap_of_the_recorded_scores():
    rec = Recorder(lambda xs, ys: xs.mean(-1))
    result = evaluate_context_scaling(
        {"mean": rec},
        get_task("linear_regression", n_dims=2),
        60,
        seed=5,
        n_points=3,
        n_bootstrap=150,
        confidence=(0.1, 0.8),
    )
    xs, ys = rec.prompts()
    scores = ((xs.mean(-1).double() - ys.double()) ** 2 / 2).numpy()
    replicate_means = np.stack([scores[row].mean(axis=0) for row in bootstrap_indices(150, 60, seed=5).numpy()])
    expected = np.quantile(replicate_means, [0.1, 0.8], axis=0)
    np.testing.assert_allclose(result.lower["mean"].numpy(), expected[0], rtol=1e-10)
    np.testing.assert_allclose(result.upper["mean"].numpy(), expected[1], rtol=1e-10)


def test_band_contains_the_mean_and_narrows_with_more_prompts():
    task = get_task("linear_regression", n_dims=3)
    predictors = {"half": lambda xs, ys: 0.5 * ys}

    def width(n_prompts):
        result = evaluate_context_scaling(predictors, task, n_prompts, n_points=5, n_bootstrap=400)
        for name in result.predictors:
            assert (result.lower[name] <= result.curves[name]).all() and (
                result.curves[name] <= result.upper[name]
            ).all()
        return float((result.upper["half"] - result.lower["half"]).mean())

    # the band shrinks like 1/√n: 16× the prompts, about a quarter of the width
    assert width(4000) < 0.5 * width(250)


# -- views --------------------------------------------------------------------------------------


def test_rows_pandas_and_markdown_views():
    result = evaluate_context_scaling(
        {"half": lambda xs, ys: 0.5 * ys}, get_task("linear_regression", n_dims=2), 100, n_points=4, n_bootstrap=50
    )
    rows = result.rows
    assert len(rows) == 2 * 4
    assert set(rows[0]) == {"predictor", "n_examples", "metric", "value", "lower", "upper"}
    frame = result.to_pandas()
    assert list(frame.columns) == ["predictor", "n_examples", "metric", "value", "lower", "upper"]
    assert frame.shape == (8, 6)
    lines = result.to_markdown(positions=[0, 3]).splitlines()
    assert lines[0] == "| examples \\ squared_error/d | half | trivial |"  # the metric and its normaliser named
    assert len(lines) == 4 and lines[3].startswith("| 3 | ")
    value = float(result.curves["half"][3])
    assert f"{value:.3g} [" in lines[3]


def test_context_scaling_plot_is_a_real_png(tmp_path):
    path = tmp_path / "curves" / "context.png"
    result = evaluate_context_scaling(
        {"least_squares": prefix_least_squares, "half": lambda xs, ys: 0.5 * ys},
        get_task("linear_regression", n_dims=3),
        200,
        n_points=8,
        plot_path=path,
        title="linear regression, d=3",
    )
    assert path.stat().st_size > 5_000
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank canvas
    log_path = result.plot(tmp_path / "log.png", log_y=True)
    assert log_path == tmp_path / "log.png" and log_path.stat().st_size > 5_000


# -- bad inputs ---------------------------------------------------------------------------------


def test_n_points_is_required_without_a_model():
    with pytest.raises(ValueError, match="n_points is required"):
        evaluate_context_scaling({"ls": prefix_least_squares}, get_task("linear_regression", n_dims=2), 10)


@pytest.mark.parametrize("bad", [{}, None, [("a", prefix_least_squares)], {"a": 3}, {"trivial": prefix_least_squares}])
def test_bad_predictor_mappings_are_refused(bad):
    with pytest.raises(ValueError):
        evaluate_context_scaling(bad, get_task("linear_regression", n_dims=2), 10, n_points=3)


def test_a_wrong_output_shape_names_the_predictor():
    with pytest.raises(ValueError, match=r"predictor 'flat' returned \(10, 1\)"):
        evaluate_context_scaling(
            {"ok": prefix_least_squares, "flat": lambda xs, ys: ys[:, :1]},
            get_task("linear_regression", n_dims=2),
            10,
            n_points=3,
        )
    with pytest.raises(ValueError, match="predictor 'm' returned dict with neither .predictions nor .logits"):
        evaluate_context_scaling({"m": DictModel()}, get_task("linear_regression", n_dims=2), 10, n_points=3)


def test_unknown_task_and_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown task family 'nope'"):
        evaluate_context_scaling({"ls": prefix_least_squares}, "nope", 10, n_points=3)
    task = get_task("linear_regression", n_dims=2)
    with pytest.raises(ValueError, match="confidence"):
        evaluate_context_scaling({"ls": prefix_least_squares}, task, 10, n_points=3, confidence=(0.9, 0.1))
    with pytest.raises(ValueError, match="n_prompts"):
        evaluate_context_scaling({"ls": prefix_least_squares}, task, 0, n_points=3)
    with pytest.raises(ValueError, match="n_bootstrap"):
        evaluate_context_scaling({"ls": prefix_least_squares}, task, 10, n_points=3, n_bootstrap=0)
