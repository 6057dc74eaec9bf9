"""The kernel-ICL reproduction (seed 000) at a tiny scale: it runs end to end, its numbers are what its parts
compute, finished groups are reused, and its helpers match independent references."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy.stats import spearmanr

from hf_icl.data.tasks import get_task
from hf_icl.reproduce import kernel_icl, run_experiment
from hf_icl.reproduce.kernel_icl import experiments as kernel_experiments
from hf_icl.reproduce.report import VERDICTS, Report
from hf_icl.training.seed_ensemble import SeedEnsemble

TINY = kernel_icl.Scale(
    seeds=(3, 4),
    hidden_size=8,
    context_points=30,
    query_points=70,  # the weight-profile figure reads query 65
    head_steps=6,
    head_context=8,
    head_queries=4,
    rff_frequencies=8,
    n_dims=4,
    grid_steps=4,
    grid_context=10,
    grid_queries=5,
    eval_tasks=3,
    eval_context=12,
    eval_queries=4,
    curve_every=2,
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernel_icl")
    path = run_experiment("kernel-icl", "all", output_dir=out, scale=TINY, command="test", workers=1)
    return out, path


def test_all_writes_both_tables_every_insight_and_the_figures(finished):
    out, path = finished
    text = path.read_text()
    assert "## Table 1" in text and "## Table 2" in text
    summary = json.loads((path.parent / "results.json").read_text())
    claims = summary["claims"]
    insights = [c for c in claims if c["claim"][:2] in {f"{i}." for i in range(1, 8)}]
    assert [c["claim"][0] for c in insights] == list("1234567")
    assert all(c["verdict"] in VERDICTS for c in claims)
    for name in ("predictions", "weights", "curves", "box_bars"):
        assert (path.parent / f"kernel-icl_all_{name}.png").stat().st_size > 0
    numbers = summary["numbers"]
    assert set(numbers["table1"]) == set(kernel_icl.TABLE1) | {"dual_ridge"}
    assert all(len(v) == len(TINY.seeds) for v in numbers["table1"].values())
    assert len(numbers["table2"]) == 9  # eight models and KRR
    # the learned column parameters are reported for the four column-attention models, one dict per seed
    assert sorted(numbers["learned_column_parameters"]) == sorted(f"col_{k}" for k in kernel_icl.ROW_KERNELS)


def test_the_trivial_predictor_is_written_stored_and_scored_on_the_tables_targets(finished):
    """Both tables carry a zero-predictor row; results.json holds its MSE per seed, which is the mean clean target²
    of Table 1's queries and of Table 2's held-out query points."""
    _, path = finished
    text = path.read_text()
    table1_text, table2_text = text.split("## Table 1")[1].split("## Table 2")
    assert f"| *{kernel_icl.TRIVIAL_LABEL}* |" in table1_text
    assert f"| *{kernel_icl.TRIVIAL_LABEL}* |" in table2_text
    numbers = json.loads((path.parent / "results.json").read_text())["numbers"]
    trivial = numbers["trivial"]
    assert trivial["predictor"] == "zero"
    sine = torch.sin(torch.linspace(-3, 3, TINY.query_points, dtype=torch.float64))
    assert trivial["table1"] == pytest.approx([float(sine.square().mean())] * len(TINY.seeds), rel=1e-12)
    expected = []
    for seed in TINY.seeds:
        task = get_task("latent_group_sinusoid", n_dims=TINY.n_dims)
        generator = torch.Generator().manual_seed(123 + seed)
        n = TINY.eval_context
        _, _, params = task.sample(TINY.eval_tasks, n + TINY.eval_queries, generator=generator, return_params=True)
        expected.append(float(params["signal"][:, n:].double().square().mean()))
    assert trivial["table2"] == pytest.approx(expected, rel=1e-6)
    assert {t: v.tolist() for t, v in kernel_icl.trivial_errors(TINY).items()} == {
        t: trivial[t] for t in ("table1", "table2")
    }
    assert set(numbers["context_mean"]) == {"table1", "table2"}
    # four steps teach the Table-2 models nothing: the rule makes every claim about them not testable
    claims = {c["claim"][:2]: c for c in json.loads((path.parent / "results.json").read_text())["claims"]}
    for key in ("5.", "6.", "7."):
        assert claims[key]["verdict"] == "not testable at this size"
        assert "learned nothing" in claims[key]["measured"]


def test_table1_numbers_are_the_methods_errors_on_the_seed_prompt(finished):
    """Ridge's reported MSE equals ridge written out on the seed's prompt; primal and dual agree."""
    _, path = finished
    numbers = json.loads((path.parent / "results.json").read_text())["numbers"]["table1"]
    for i, seed in enumerate(TINY.seeds):
        data = kernel_icl.sine_prompt(TINY, seed)
        x, y = data["context_x"][0], data["context_y"][0]
        w = torch.linalg.solve(x.T @ x + torch.eye(1, dtype=x.dtype), x.T @ y)
        mse = float((data["query_x"][0] @ w - data["query_y"][0]).square().mean())
        assert numbers["ridge"][i] == pytest.approx(mse, rel=1e-9)
        assert numbers["dual_ridge"][i] == pytest.approx(mse, rel=1e-9)


def test_finished_groups_are_reused_not_retrained(finished, monkeypatch):
    out, _ = finished

    def no_training(*args, **kwargs):
        raise AssertionError("a finished group was retrained")

    monkeypatch.setattr(SeedEnsemble, "step", no_training)
    path = run_experiment("kernel-icl", "table2", output_dir=out, scale=TINY, command="test", workers=1)
    assert "## Table 2" in path.read_text()


def test_a_changed_spec_retrains_and_two_processes_train_what_one_would(finished, tmp_path):
    """3 steps instead of the 6 the head was trained for: retrained, here in two worker processes (one group
    each), and every worker's models equal the ones a single in-process loop trains."""
    out, _ = finished
    groups = [
        kernel_icl.Group("head_1d", kernel_icl.group_model_config(TINY, 1, "softmax", False, 100)),
        kernel_icl.Group("head_cosine", kernel_icl.group_model_config(TINY, 1, "cosine", False, 100)),
    ]
    training = kernel_icl.Training({"name": "sinusoid", "n_dims": 1}, 3, 8, 4)
    runs = out / "kernel-icl" / "runs"
    before = (runs / "head_1d" / "run.json").read_text()
    parallel = kernel_icl.train_groups(TINY, groups, training, runs, workers=2)
    assert (runs / "head_1d" / "run.json").read_text() != before
    single = kernel_icl.train_groups(TINY, groups, training, tmp_path, workers=1)
    xs, ys = torch.randn(2, 9, 1), torch.randn(2, 9)
    for name in ("head_1d", "head_cosine"):
        (models_a, curve_a), (models_b, curve_b) = parallel[name], single[name]
        assert torch.equal(curve_a, curve_b)
        for a, b in zip(models_a, models_b, strict=True):
            assert torch.equal(a(xs, ys).predictions, b(xs, ys).predictions)


def test_sine_prompt_is_the_documents_construction():
    """Context on linspace(−3, 3) with σ-scaled noise from the seed, queries with clean sin targets."""
    scale = kernel_icl.Scale(context_points=200, query_points=100)
    data = kernel_icl.sine_prompt(scale, 42)
    generator = torch.Generator().manual_seed(42)
    x = torch.linspace(-3, 3, 200, dtype=torch.float64)
    expected = torch.sin(x) + 0.2 * torch.randn(200, generator=generator, dtype=torch.float64)
    assert torch.equal(data["context_y"][0], expected)
    assert torch.equal(data["query_y"][0], torch.sin(torch.linspace(-3, 3, 100, dtype=torch.float64)))


def test_context_query_batch_has_noisy_context_and_clean_query_targets():
    task = get_task("latent_group_sinusoid", n_dims=5)
    xs, targets = kernel_icl.context_query_batch(task, 6, 7, 3, torch.Generator().manual_seed(0))
    xs2, ys2, params = task.sample(6, 10, generator=torch.Generator().manual_seed(0), return_params=True)
    assert torch.equal(xs, xs2)
    assert torch.equal(targets[:, :7], ys2[:, :7])
    assert torch.equal(targets[:, 7:], params["signal"][:, 7:])
    assert not torch.equal(targets[:, 7:], ys2[:, 7:])  # the noise is real (σ = 0.1)


def _documents_context(tmp_path, **overrides) -> kernel_icl.ExperimentState:
    """A context whose tables hold the document's numbers in both of two seeds (``overrides`` replace a method's
    MSE), with trivial errors 0.5 (Table 1) and 0.9 (Table 2): no training, only the claim code."""
    scale = kernel_icl.Scale(seeds=(1, 2))
    report = Report(kernel_icl.PAPER, "test", "test", "test", "test", tmp_path)
    ctx = kernel_icl.ExperimentState(scale, tmp_path, tmp_path / "runs", report)
    table1 = {name: document for name, (_, _, document) in kernel_icl.TABLE1.items()} | {"dual_ridge": 0.1713}
    table2 = {kernel_icl.grid_name(k, c): v for (k, c), v in kernel_icl.TABLE2.items()} | {"krr": kernel_icl.TABLE2_KRR}
    ctx.table1 = {k: torch.full((2,), overrides.get(k, v), dtype=torch.float64) for k, v in table1.items()}
    ctx.table2 = {k: torch.full((2, 3), overrides.get(k, v), dtype=torch.float64) for k, v in table2.items()}
    ctx.trivial = {
        "table1": torch.full((2,), 0.5, dtype=torch.float64),
        "table2": torch.full((2,), 0.9, dtype=torch.float64),
    }
    return ctx


def _verdicts(ctx) -> dict[str, str]:
    kernel_experiments._ranking_claim(ctx)
    kernel_icl.insights(ctx)
    return {c.claim.split(" ")[0] if c.claim[0].isdigit() else "ranking": c.verdict for c in ctx.report.claims}


def test_the_documents_numbers_hold_every_claim_and_subjects_are_typed(tmp_path):
    ctx = _documents_context(tmp_path)
    assert set(_verdicts(ctx).values()) == {"holds"}
    kinds = {s.name: s.kind for s in kernel_icl.subjects(ctx, "pretrained", "ridge", "cosine", "row_ga", "krr")}
    assert kinds == {
        "Pre-trained attention head": "model",
        "Ridge (λ = 1)": "baseline",
        "Cosine ICL": "baseline",
        "Row GA": "model",
        "KRR (Table 2)": "baseline",
    }


@pytest.mark.parametrize(
    "override, untestable",
    [
        ({"row_softmax": 0.82}, {"5.", "6.", "7."}),  # a model above 0.9 × trivial learned nothing
        ({"ridge": 0.6, "dual_ridge": 0.6}, {"ranking"}),  # a baseline worse than the zero predictor
        ({"pretrained": 0.46}, {"ranking", "3.", "4."}),  # whatever the direction: claim 3 would not hold here
    ],
)
def test_a_subject_that_fails_the_rule_makes_its_claims_not_testable(tmp_path, override, untestable):
    ctx = _documents_context(tmp_path, **override)
    verdicts = _verdicts(ctx)
    assert {k for k, v in verdicts.items() if v == "not testable at this size"} == untestable
    assert all(verdicts[k] == "holds" for k in verdicts.keys() - untestable)
    reasons = [c.measured for c in ctx.report.claims if c.verdict == "not testable at this size"]
    assert all("trivial predictor" in r for r in reasons)


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 0, 3, 2, 4]])
def test_spearman_matches_scipy(order):
    assert kernel_experiments._spearman(list(range(5)), order) == pytest.approx(spearmanr(range(5), order).statistic)


def test_pm_formats_a_missing_interval_without_nan():
    assert kernel_experiments._pm(0.5, math.nan) == "0.5000"
    assert kernel_experiments._pm(0.5, 0.01) == "0.5000 ± 0.0100"


def test_mlp_steps_is_refused():
    with pytest.raises(ValueError, match="mlp_steps"):
        run_experiment("kernel-icl", "table1", mlp_steps=3, scale=TINY)


def test_a_stopped_loop_resumes_to_the_uninterrupted_curves_and_weights(tmp_path, monkeypatch, capsys):
    """Two groups in one loop, stopped in step 5 and run again: they resume from their step-4 checkpoints (the
    shared generators restored) and end with the curves, weights and metrics.json of a loop never stopped."""
    from safetensors.torch import load_file

    from hf_icl.evaluation.runs import read_metrics
    from hf_icl.reproduce.kernel_icl.training import _train_loop
    from hf_icl.training.checkpoints import list_checkpoints
    from hf_icl.training.run_cache import read_run

    groups = [
        kernel_icl.Group("head_1d", kernel_icl.group_model_config(TINY, 1, "softmax", False, 100)),
        kernel_icl.Group("head_cosine", kernel_icl.group_model_config(TINY, 1, "cosine", False, 100)),
    ]
    training = kernel_icl.Training({"name": "sinusoid", "n_dims": 1}, 7, 8, 4)
    _train_loop(TINY, groups, training, tmp_path / "whole", checkpoint_every=2)
    original, calls = SeedEnsemble.step, [0]

    def stopping_step(self, xs, ys):
        if calls[0] == 9:  # the first group's step 5
            raise KeyboardInterrupt("stopped")
        calls[0] += 1
        return original(self, xs, ys)

    with monkeypatch.context() as patch:
        patch.setattr(SeedEnsemble, "step", stopping_step)
        with pytest.raises(KeyboardInterrupt):
            _train_loop(TINY, groups, training, tmp_path / "stopped", checkpoint_every=2)
    assert [step for step, _ in list_checkpoints(tmp_path / "stopped" / "head_cosine")] == [2, 4]
    capsys.readouterr()
    _train_loop(TINY, groups, training, tmp_path / "stopped", checkpoint_every=2)
    assert "head_cosine: resumed from" in capsys.readouterr().out
    for group in groups:
        spec = training.spec(TINY, group)
        whole, stopped = (read_run(tmp_path / run / group.name, spec) for run in ("whole", "stopped"))
        assert torch.equal(whole.tensors["losses"], stopped.tensors["losses"])
        for seed in TINY.seeds:
            a, b = (
                load_file(tmp_path / run / group.name / f"seed{seed}" / "model.safetensors")
                for run in ("whole", "stopped")
            )
            assert all(torch.equal(a[key], b[key]) for key in a)
        assert not (tmp_path / "stopped" / group.name / "checkpoints").exists()
        metrics = read_metrics(tmp_path / "stopped" / group.name / "metrics.json")
        assert metrics["curves"]["train"] == whole.tensors["losses"].T.tolist()
        assert metrics["per_seed"][str(TINY.seeds[1])]["final_train_loss"] == float(whole.tensors["losses"][-1, 1])
