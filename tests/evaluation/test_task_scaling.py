"""Task scaling: error against the pretraining pool size T, on fresh tasks, with baselines and a plot."""

import matplotlib.image
import pytest
import torch
from torch import nn

from hf_icl.data.tasks import get_task
from hf_icl.evaluation import evaluate_task_scaling
from hf_icl.modeling import ICLOutput


class ShrinkingModel(nn.Module):
    """A fake model pretrained on T tasks: predicts (1 − q)·y, so its error is q² times the zero
    predictor's on the same prompts."""

    def __init__(self, q: float):
        super().__init__()
        self.q = nn.Parameter(torch.tensor(q), requires_grad=False)

    def forward(self, xs, ys):
        return ICLOutput(predictions=(1 - self.q) * ys)


QUALITY = {64: 0.0, 1: 1.0, 8: 0.5}  # deliberately unordered


def run(**kwargs):
    models = {t: ShrinkingModel(q) for t, q in QUALITY.items()}
    defaults = {"n_prompts": 300, "n_points": 6, "n_bootstrap": 100}
    return evaluate_task_scaling(models, get_task("linear_regression", n_dims=3, n_tasks=2), **defaults | kwargs)


def test_rows_are_ordered_by_pool_size_then_position_then_baselines():
    result = run(positions=[1, 5], baselines={"half": lambda xs, ys: 0.5 * ys})
    assert result.pool_sizes == [1, 8, 64] and result.positions == [1, 5]
    labels = [(row["n_tasks"], row["n_examples"], row["predictor"]) for row in result.rows]
    assert labels == [
        (1, 1, "model"),
        (1, 5, "model"),
        (8, 1, "model"),
        (8, 5, "model"),
        (64, 1, "model"),
        (64, 5, "model"),
        (None, 1, "half"),
        (None, 5, "half"),
        (None, 1, "trivial"),
        (None, 5, "trivial"),
    ]
    assert set(result.rows[0]) == {"n_tasks", "n_examples", "predictor", "value", "lower", "upper"}


def test_values_follow_each_models_quality_on_shared_prompts():
    result = run(positions=[0, 3, 5], baselines={"half": lambda xs, ys: 0.5 * ys})
    trivial = {row["n_examples"]: row["value"] for row in result.rows if row["predictor"] == "trivial"}
    for row in result.rows:
        if row["predictor"] == "model":
            expected = QUALITY[row["n_tasks"]] ** 2 * trivial[row["n_examples"]]
            assert row["value"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
            assert row["lower"] <= row["value"] <= row["upper"]
        elif row["predictor"] == "half":
            assert row["value"] == pytest.approx(0.25 * trivial[row["n_examples"]], rel=1e-9)
    by_t = result.by_pool_size(5)
    assert by_t[0] > by_t[1] > by_t[2] == 0


def test_default_position_is_the_last():
    assert run().positions == [5]


def test_models_are_scored_on_fresh_tasks_not_the_pool():
    seen = []

    def record(xs, ys):
        seen.append((xs, ys))
        return ys

    # the pretraining family has a single task; fresh prompts must nonetheless have different weights
    evaluate_task_scaling(
        {1: record}, get_task("linear_regression", n_dims=3, n_tasks=1), n_prompts=4, n_points=8, n_bootstrap=10
    )
    xs, ys = seen[0]
    weights = torch.linalg.lstsq(xs.double(), ys.double()[..., None]).solution[..., 0]
    assert torch.cdist(weights, weights).fill_diagonal_(1.0).min() > 0.01


def test_markdown_and_plot(tmp_path):
    result = run(positions=[2, 5], baselines={"half": lambda xs, ys: 0.5 * ys}, plot_path=tmp_path / "tasks.png")
    lines = result.to_markdown().splitlines()
    assert lines[0] == "| n_tasks | 2 examples | 5 examples |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1", "8", "64", "half", "trivial"]
    path = tmp_path / "tasks.png"
    assert path.stat().st_size > 5_000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300 and image[..., :3].std() > 0.05
    assert result.to_pandas().shape == (10, 6)


def test_bad_arguments_are_refused():
    task = get_task("linear_regression", n_dims=3)
    with pytest.raises(ValueError, match="non-empty mapping"):
        evaluate_task_scaling({}, task, n_points=4)
    with pytest.raises(ValueError, match="pool size T"):
        evaluate_task_scaling({"big": ShrinkingModel(0.0)}, task, n_points=4)
    with pytest.raises(ValueError, match="position must be an integer in"):
        evaluate_task_scaling({4: ShrinkingModel(0.0)}, task, positions=[6], n_prompts=10, n_points=4)
    with pytest.raises(ValueError, match="clash"):
        evaluate_task_scaling({4: ShrinkingModel(0.0)}, task, n_points=4, baselines={"T=4": ShrinkingModel(0.0)})
