"""The reproductions' seed-stacked trainer (hf_icl.training.seed_ensemble): the stacked step follows the package
trainer's step, seeds do not touch each other, per-seed clipping is clip_grad_norm_, a non-finite loss, gradient or
parameter stops training naming the seed, and saved seed folders carry manifests that loading verifies."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModel

from hf_icl.data.tasks import get_task
from hf_icl.modeling.manifest import MODEL_FORMAT_NAME
from hf_icl.modeling.model_folder import ModelFolderError, read_model_manifest, verify_model_folder
from hf_icl.reproduce import linear_attention as la
from hf_icl.training import ICLTrainingArguments, TrainingDivergedError, train
from hf_icl.training.seed_ensemble import (
    SeedEnsemble,
    check_finite_parameters,
    check_finite_step,
    clip_per_seed,
    gradient_norms,
)

TINY = {"n_embd": 16, "n_layer": 2, "n_head": 4}
FIELDS = {"n_dims": 5, "n_points": 10, "target_kind": "regression"}


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


def test_gradient_norms_are_the_norms_clip_per_seed_reports():
    grads = {"a": torch.randn(3, 4, 5), "b": torch.randn(3, 7)}
    norms = gradient_norms(grads)
    torch.testing.assert_close(clip_per_seed({k: v.clone() for k, v in grads.items()}, 0.1), norms)
    for i in range(3):
        torch.testing.assert_close(norms[i], torch.cat([g[i].flatten() for g in grads.values()]).norm())
    # a parameter with one number per seed (kernel-icl's column parameters) is a (S,) tensor
    torch.testing.assert_close(gradient_norms({"s": torch.tensor([3.0, -4.0])}), torch.tensor([3.0, 4.0]))
    check_finite_parameters((1, 2), 1, {"s": torch.tensor([3.0, -4.0])})


# -- the trainer's guarantees -----------------------------------------------------------------------------------------
def ensemble(seeds=(3, 4), **options) -> SeedEnsemble:
    return SeedEnsemble("linear_gpt", {**FIELDS, **TINY}, seeds, 1e-2, **options)


def test_a_nan_in_one_seeds_batch_stops_training_naming_that_seed():
    pair = ensemble()
    xs, ys = la.draw_batches(la.study_task(), None, 8, (3, 4), 0)
    pair.step(xs, ys)
    before = {k: v.clone() for k, v in pair.params.items()}
    xs, ys = la.draw_batches(la.study_task(), None, 8, (3, 4), 1)
    ys[1, 2, 3] = float("nan")  # seed 4's batch
    with pytest.raises(TrainingDivergedError, match=r"at step 2 \(seed 4\): seed 4: the loss is nan") as caught:
        pair.step(xs, ys)
    assert "seed 3" not in str(caught.value)
    assert "no update was applied" in str(caught.value)
    for name, value in pair.params.items():  # neither seed was updated
        assert torch.equal(value, before[name]), name


def test_an_infinite_input_without_clipping_is_caught_too():
    pair = ensemble(max_grad_norm=0.0)
    xs, ys = la.draw_batches(la.study_task(), None, 8, (3, 4), 0)
    xs[0, 0, 0, 0] = float("inf")  # seed 3's batch
    with pytest.raises(TrainingDivergedError, match=r"at step 1 \(seed 3\)"):
        pair.step(xs, ys)


def test_the_checks_name_every_failing_seed_and_what_failed():
    with pytest.raises(
        TrainingDivergedError, match=r"\(seeds 5, 7\): seed 5: the gradient norm is inf; seed 7: the loss"
    ):
        check_finite_step((5, 6, 7), 9, torch.tensor([1.0, 2.0, float("nan")]), torch.tensor([float("inf"), 1.0, 1.0]))
    check_finite_step((5, 6), 1, torch.ones(2), torch.ones(2))
    params = {"w": torch.ones(2, 3, 4), "b": torch.ones(2, 4)}
    check_finite_parameters((5, 6), 3, params)
    params["b"][1, 2] = float("-inf")
    with pytest.raises(TrainingDivergedError, match=r"at step 3 \(seed 6\): seed 6: non-finite b \(after the update\)"):
        check_finite_parameters((5, 6), 3, params)


def test_save_writes_manifested_seed_folders_that_load_as_the_ensemble(tmp_path):
    pair = ensemble()
    for step in range(2):
        pair.step(*la.draw_batches(la.study_task(), None, 8, (3, 4), step))
    folders = pair.save(tmp_path / "run")
    assert folders == [tmp_path / "run" / "seed3", tmp_path / "run" / "seed4"]  # the papers' folder names
    xs, ys = la.study_task().sample(4, 10, seed=2)
    for i, folder in enumerate(folders):
        manifest = read_model_manifest(folder)
        assert {"config.json", "model.safetensors"} <= set(manifest["files"])
        verify_model_folder(folder)
        model = AutoModel.from_pretrained(folder).eval()
        torch.testing.assert_close(model(xs, ys).predictions, pair.predict(xs, ys)[i], rtol=1e-4, atol=1e-5)
    # a changed weight file no longer matches its manifest, and loading refuses it
    weights = folders[1] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelFolderError, match="model.safetensors"):
        verify_model_folder(folders[1])
    with pytest.raises(ModelFolderError):
        AutoModel.from_pretrained(folders[1])
    assert json.loads((folders[0] / "manifest.json").read_text())["format"] == MODEL_FORMAT_NAME  # a model's
