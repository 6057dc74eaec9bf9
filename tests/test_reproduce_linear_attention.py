"""hf-icl reproduce linear-attention: the statistics against formulas written out, the samplers, the wiring of the
document's recipes, the seed ensemble against the package trainer, and a toy run end to end."""

import json
import math
import re
import runpy
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hf_icl.cli import main
from hf_icl.data.tasks import get_task
from hf_icl.modeling import build_config
from hf_icl.reproduce import experiments, reproduce
from hf_icl.reproduce import linear_attention as la
from hf_icl.reproduce.runs import VERDICTS
from hf_icl.reproduce.seed_ensemble import SeedEnsemble, clip_per_seed
from hf_icl.training import ICLTrainingArguments, train
from hf_icl.training.trainer import step_seed

TOY = la.Scale("toy", False, 8, (1, 2), 1000, 2, 64, 32, 16)
TINY = {"n_embd": 16, "n_layer": 2, "n_head": 4}
FIELDS = {"n_dims": 5, "n_points": 10, "target_kind": "regression"}


# -- statistics ---------------------------------------------------------------------------------------------------
def test_seed_interval_is_the_t_interval_of_the_mean():
    mean, half = la.seed_interval(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    s = math.sqrt(sum((v - 3.0) ** 2 for v in range(1, 6)) / 4)  # sample std, n - 1 = 4
    t_975_4 = 2.7764451051977987  # Student t, 97.5 % quantile, 4 degrees of freedom (tables)
    assert float(mean) == pytest.approx(3.0)
    assert float(half) == pytest.approx(t_975_4 * s / math.sqrt(5), rel=1e-9)
    # column-wise over seeds (dim 0), e.g. a curve per seed
    mean, half = la.seed_interval(torch.tensor([[1.0, 10.0], [3.0, 10.0], [5.0, 10.0]]))
    t_975_2 = 4.302652729911275
    assert mean.tolist() == pytest.approx([3.0, 10.0])
    assert half.tolist() == pytest.approx([t_975_2 * 2.0 / math.sqrt(3), 0.0])
    assert math.isnan(float(la.seed_interval(torch.tensor([0.5]))[1]))  # one seed: no interval


def test_document_interval_is_196_times_the_population_std_of_all_residuals():
    # the appendix: concatenate every seed's residuals, 1.96 · std (numpy's, divided by n)
    residuals = [torch.tensor([0.0, 2.0]), torch.tensor([4.0])]
    population_std = math.sqrt(((0 - 2) ** 2 + (2 - 2) ** 2 + (4 - 2) ** 2) / 3)
    assert la.document_interval(residuals) == pytest.approx(1.96 * population_std)


def test_samples_to_converge_on_a_hand_computed_curve():
    steps, losses = [0, 100, 200, 300, 400], [1.0, 0.6, 0.25, 0.12, 0.1]
    # gap 0.9; 90 % closed at 1.0 - 0.81 = 0.19: first reached at step 300, 300 × 32 samples
    assert la.samples_to_converge(steps, losses, batch_size=32) == 9600
    # exactly on the target counts: gap 2, 75 % closed at 0.5, reached at step 200 (binary fractions: no rounding)
    assert la.samples_to_converge(steps, [2.0, 1.0, 0.5, 0.25, 0.0], batch_size=64, fraction=0.75) == 200 * 64
    assert la.samples_to_converge(steps, [1.0, 0.2, 0.1, 0.1, 0.1], batch_size=1, fraction=0.5) == 100
    assert la.samples_to_converge(steps, [1.0, 1.2, 1.1, 1.0, 1.3], batch_size=32) is None  # never fell


def test_plateaued_and_separated():
    assert la.plateaued([1.0, 0.5, 0.4, 0.39, 0.38])  # last quarter: 0.39 -> 0.38
    assert not la.plateaued([1.0, 0.8, 0.6, 0.4, 0.2])  # still halving
    assert la.plateaued([1.0, 0.5, 0.4, 0.41, 0.45])  # rising (overfitting) is not improving
    assert la.separated((1.0, 0.1), (1.5, 0.2)) and not la.separated((1.0, 0.3), (1.5, 0.3))


def _fake_result(recipe, depth, curve, final):
    spec = next(s for s in la.group_specs(TOY) if s.recipe == recipe and s.depth == depth)
    curves = torch.tensor([curve, curve], dtype=torch.float64)
    errors = {"test": torch.full((2, 4), final, dtype=torch.float64)}
    return la.GroupResult(spec, list(range(len(curve))), curves, curves, errors, 0.0)


def test_claims_need_models_that_learned_and_stopped_improving():
    results = {
        ("softmax", 6): _fake_result("softmax", 6, [1.0, 0.3, 0.2, 0.2, 0.2], 0.2),  # learned, flat at the end
        ("linear", 6): _fake_result("linear", 6, [1.0, 0.8, 0.6, 0.4, 0.2], 0.2),  # still falling
        ("linear", 1): _fake_result("linear", 1, [1.0, 1.0, 1.0, 1.0, 1.0], 1.0),  # flat at the zero predictor
    }
    assert la.testability(results, [("softmax", 6)]).ok
    still = la.testability(results, [("softmax", 6), ("linear", 6)])
    assert not still.ok and "still improving at the end: linear_L6" in still.note
    nothing = la.testability(results, [("linear", 1)])
    assert not nothing.ok and "learned nothing" in nothing.note
    # a failing shallow model is judged when the deeper one, on the same budget, learned
    assert la.testability(results, [("linear", 1)], learned=[("softmax", 6)]).ok


# -- data -----------------------------------------------------------------------------------------------------------
def test_anisotropic_inputs_have_the_documents_covariance():
    spec = replace(la.group_specs(la.CPU)[0], test_prompts=20_000, train_pool=64, train_eval_prompts=8)
    xs, ys = la.evaluation_sets(spec)["anisotropic"]
    x = xs.reshape(-1, 5).double()  # 200 000 draws
    covariance = x.T @ x / x.shape[0]
    torch.testing.assert_close(covariance, torch.diag(torch.tensor([0.5, 1, 1.5, 1, 1.75]).double()), atol=0.02, rtol=0)
    # w ~ N(0, I) and y = wᵀx: E[y² | x] = ‖x‖², so E[y²] = tr Σ = 5.75
    assert float(ys.double().square().mean()) == pytest.approx(5.75, rel=0.03)


def test_the_study_codes_shift_puts_the_variances_on_w():
    xs, ys, w = la.anisotropic_weight_prompts(100_000, 2, seed=0, return_w=True)
    covariance = w.double().T @ w.double() / w.shape[0]
    torch.testing.assert_close(covariance, torch.diag(torch.tensor([0.5, 1, 1.5, 1, 1.75]).double()), atol=0.02, rtol=0)
    torch.testing.assert_close(xs.double().var(dim=(0, 1)), torch.ones(5).double(), atol=0.02, rtol=0)
    torch.testing.assert_close(ys, torch.einsum("bnd,bd->bn", xs, w))


def test_batches_come_from_the_fixed_pool_with_replacement_or_are_the_trainers():
    task = la.study_task()
    pool = task.sample(50, 10, seed=0)
    xs, ys = la.draw_batches(task, pool, 8, (3, 4), step=5)
    assert xs.shape == (2, 8, 10, 5) and ys.shape == (2, 8, 10)
    for x in xs.reshape(-1, 10, 5):  # every prompt is one of the pool's
        assert (pool[0] == x).all(dim=(1, 2)).any()
    again = la.draw_batches(task, pool, 8, (3, 4), step=5)
    assert torch.equal(again[0], xs) and not torch.equal(la.draw_batches(task, pool, 8, (3, 4), step=6)[0], xs)
    fresh = la.draw_batches(task, None, 8, (3,), step=5)
    expected = task.sample(8, 10, generator=torch.Generator().manual_seed(step_seed(3, 0, 5)))
    assert torch.equal(fresh[0][0], expected[0]) and torch.equal(fresh[1][0], expected[1])


def test_query_errors_are_the_last_points_squared_error_over_d():
    predictions = torch.zeros(2, 3, 10)
    ys = torch.arange(30.0).reshape(3, 10)
    assert la.query_errors(predictions, ys).tolist() == [[81 / 5, 361 / 5, 841 / 5]] * 2


# -- the document's recipes -------------------------------------------------------------------------------------------
def test_full_scale_trains_the_documents_recipes():
    specs = {(s.recipe, s.depth): s for s in la.group_specs(la.FULL)}
    assert sorted(specs) == sorted((r, d) for r in ("softmax", "linear") for d in (1, 3, 6))
    expected_steps = {"softmax": (30_000, 30_000, 30_000), "linear": (7_500, 8_000, 10_000)}
    for (recipe, depth), spec in specs.items():
        assert spec.steps == expected_steps[recipe][(1, 3, 6).index(depth)]
        assert (spec.learning_rate, spec.batch_size) == ((1e-4, 32) if recipe == "softmax" else (3e-4, 64))
        assert spec.seeds == (42, 100, 7, 10, 2025)
        assert (spec.n_embd, spec.eval_steps, spec.train_pool, spec.test_prompts) == (256, 500, 16_000, 4_000)
        config = build_config(la.RECIPES[recipe].model_type, None, **spec.model_fields())
        assert (config.n_embd, config.n_layer, config.n_head, config.n_dims, config.n_points) == (256, depth, 4, 5, 10)
        assert config.model_type == ("gpt2_icl" if recipe == "softmax" else "linear_gpt")
        assert config.prompt_format == "interleaved" and config.n_positions == 20
        if recipe == "linear":  # φ = ReLU² after the 1/√d_head scaling, eps 1e-6, normalised; exact GELU
            assert config.linear_attention_feature_map == "squared_relu" and config.linear_attention_eps == 1e-6
            assert config.linear_attention_normalize and config.activation_function == "gelu"


def test_cpu_scale_and_overrides():
    specs = {(s.recipe, s.depth): s for s in la.group_specs(la.CPU)}
    assert specs["softmax", 6].steps == 6_000 and specs["linear", 1].steps == 1_500
    assert specs["linear", 6].seeds == (42, 100, 7) and specs["linear", 6].n_embd == 64
    shifted = la.group_specs(la.CPU, seed=1, steps=10)
    assert all(s.steps == 10 and s.eval_steps == 2 and s.data_seed == 43 for s in shifted)
    assert shifted[0].seeds == (43, 101, 8)
    assert set(experiments("linear-attention")) == {"table1", "table2", "table3", "all", "engines"}


def test_parameter_counts_reproduce_the_documents_from_gpt2s_unused_token_table():
    counts = la.parameter_counts()
    for recipe, by_depth in counts.items():
        for depth, count in by_depth.items():
            documented = la.DOCUMENT[recipe][depth].params / 1e6
            decimals = 1 if documented >= 10 or documented == 0.8 else 2
            assert round(count["as_the_study_counts"] / 1e6, decimals) == pytest.approx(documented)
    for depth in (1, 3, 6):  # what the models really train is the same size
        assert counts["softmax"][depth]["trainable"] == counts["linear"][depth]["trainable"]


# -- the seed ensemble ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["linear_gpt", "gpt2_icl"])
def test_the_ensemble_follows_the_package_trainer_on_one_seed(tmp_path, model_type):
    """Same seed, same batches: the ensemble's MSE/d clipped at 1 retraces the trainer's MSE clipped at d."""
    attn = "eager" if model_type == "gpt2_icl" else None
    steps, batch, seed, lr = 8, 8, 7, 3e-3
    args = ICLTrainingArguments(
        output_dir=str(tmp_path),
        n_dims=5,
        n_points=10,
        model_type=model_type,
        model_size=None,
        model_overrides=json.dumps(TINY),
        attn_implementation=attn,
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        max_grad_norm=5.0,
        seed=seed,
        logging_steps=1,
        eval_steps=0,
        save_steps=0,
        eval_prompts=8,
        report_to="none",
        disable_tqdm=True,
    )
    trainer_losses = [h["train/loss"] / 5 for h in train(args).history if "train/loss" in h]
    ensemble = SeedEnsemble(model_type, {**FIELDS, **TINY}, (seed,), lr, attn_implementation=attn)
    task = get_task("linear_regression", n_dims=5)
    ours = [float(ensemble.step(*la.draw_batches(task, None, batch, (seed,), step))[0]) for step in range(steps)]
    assert len(trainer_losses) == steps
    assert ours == pytest.approx(trainer_losses, rel=1e-4)


def test_seeds_in_one_ensemble_do_not_touch_each_other():
    fields = {**FIELDS, **TINY, "linear_attention_mode": "parallel"}
    task = la.study_task()
    pair = SeedEnsemble("linear_gpt", fields, (3, 4), 1e-2, max_grad_norm=0.5)
    alone = [SeedEnsemble("linear_gpt", fields, (s,), 1e-2, max_grad_norm=0.5) for s in (3, 4)]
    for step in range(4):
        xs, ys = la.draw_batches(task, None, 8, (3, 4), step)
        together = pair.step(xs, ys)
        separate = [e.step(xs[i : i + 1], ys[i : i + 1]) for i, e in enumerate(alone)]
        torch.testing.assert_close(together, torch.cat(separate), rtol=1e-5, atol=1e-6)
    xs, ys = task.sample(5, 10, seed=1)
    torch.testing.assert_close(
        pair.predict(xs, ys), torch.cat([e.predict(xs, ys) for e in alone]), rtol=1e-4, atol=1e-5
    )
    model = pair.models()[1]  # an ordinary model with seed 4's weights predicts what the ensemble does
    torch.testing.assert_close(model(xs, ys).predictions, pair.predict(xs, ys)[1], rtol=1e-4, atol=1e-5)


def test_clip_per_seed_is_clip_grad_norm_for_each_seed():
    grads = {"a": torch.randn(3, 4, 5), "b": torch.randn(3, 7)}
    expected = []
    for i in range(3):
        params = [torch.nn.Parameter(torch.zeros_like(g[i])) for g in grads.values()]
        for p, g in zip(params, grads.values(), strict=True):
            p.grad = g[i].clone()
        torch.nn.utils.clip_grad_norm_(params, 1.5)
        expected.append([p.grad for p in params])
    clip_per_seed(grads, 1.5)
    for i in range(3):
        for got, want in zip(grads.values(), expected[i], strict=True):
            torch.testing.assert_close(got[i], want)


def test_both_timed_engines_run_in_process():
    spec = replace(la.group_specs(TOY, steps=2)[1], seeds=(1, 2))
    with tempfile.TemporaryDirectory() as scratch:
        for engine in ("trainer", "ensemble"):
            start, end, seed_steps = la._time_worker(engine, spec.to_dict(), 1, 1, 1, scratch)
            assert end >= start and seed_steps == 2


# -- end to end ----------------------------------------------------------------------------------------------------
def test_a_toy_study_runs_end_to_end_and_reuses_its_runs(tmp_path, capsys):
    path = reproduce("linear-attention", "all", output_dir=tmp_path, scale=TOY, steps=4, workers=1, command="test all")
    text, summary = path.read_text(), json.loads((path.parent / "results.json").read_text())
    assert len(summary["claims"]) == 12 and all(c["verdict"] in VERDICTS for c in summary["claims"])
    assert text.count("| **") == len(summary["claims"])  # one row per claim, the verdict in bold
    assert "size: toy" in text and "command: `test all`" in text and "hardware:" in text
    images = re.findall(r"^!\[.*\]\((\S+\.png)\)$", text, flags=re.MULTILINE)
    assert len(images) == 2 and all((path.parent / image).is_file() for image in images)
    assert set(summary["numbers"]["samples_to_90"]) == {f"{r}_L{d}" for r in ("softmax", "linear") for d in (1, 3, 6)}
    assert (tmp_path / "linear-attention" / "runs" / "linear_L6" / "seed2" / "config.json").is_file()
    capsys.readouterr()
    reproduce("linear-attention", "table3", output_dir=tmp_path, scale=TOY, steps=4, workers=1)
    out = capsys.readouterr().out
    assert out.count("reusing") == 6 and "] training " not in out and "to train" not in out


def test_worker_processes_give_the_in_process_numbers(tmp_path):
    specs = [s for s in la.group_specs(TOY, steps=3) if s.depth == 1]
    alone = la.run_groups(specs, tmp_path / "one", workers=1)
    parallel = la.run_groups(specs, tmp_path / "two", workers=2)
    for name, result in alone.items():
        torch.testing.assert_close(parallel[name].test_curve, result.test_curve)


def test_cli_and_script(capsys, monkeypatch):
    assert main(["reproduce", "linear-attention", "table9"]) == 2
    assert "experiment must be one of" in capsys.readouterr().err
    assert main(["reproduce", "linear-attention", "table1", "--mlp-steps", "3"]) == 2
    assert "trains no MLPs" in capsys.readouterr().err
    script = Path(__file__).resolve().parent.parent / "scripts" / "reproduce_linear_vs_softmax.py"
    monkeypatch.setattr("sys.argv", [str(script), "table9"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 2
