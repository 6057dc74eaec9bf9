"""Checkpoints of the seed-stacked trainer (hf_icl.training.seed_checkpoints): resuming retraces an uninterrupted run
bit for bit, a damaged, altered, non-finite or foreign checkpoint is refused before anything changes, a failed write
leaves no checkpoint, rotation keeps the newest, and a divergence names the newest finite checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_icl.data.tasks import get_task
from hf_icl.reproduce import linear_attention as la
from hf_icl.training import TrainingDivergedError
from hf_icl.training.checkpoints import CheckpointSaveError, list_checkpoints
from hf_icl.training.manifest import CheckpointError, write_manifest
from hf_icl.training.seed_checkpoints import resumable_checkpoint
from hf_icl.training.seed_ensemble import SeedEnsemble

FIELDS = {"n_dims": 5, "n_points": 10, "target_kind": "regression", "n_embd": 16, "n_layer": 2, "n_head": 4}
SEEDS = (3, 4)
SPEC = {"run": "toy", "steps": 6}


def ensemble(seeds=SEEDS) -> SeedEnsemble:
    return SeedEnsemble("linear_gpt", FIELDS, seeds, 3e-3)


def train(model: SeedEnsemble, steps: range) -> list[torch.Tensor]:
    task = get_task("linear_regression", n_dims=5)
    return [model.step(*la.draw_batches(task, None, 8, model.seeds, step)) for step in steps]


def checkpointed(tmp_path, steps: int = 3, extra=None):
    model = ensemble()
    losses = train(model, range(steps))
    return model, losses, model.save_checkpoint(tmp_path, extra, spec=SPEC)


def test_a_resumed_ensemble_retraces_the_uninterrupted_one_bit_for_bit(tmp_path):
    generator = torch.Generator().manual_seed(5)
    extra = {"generator": generator.get_state(), "curve": [1.5, 2.5], "note": ("a", 1)}
    first, _, folder = checkpointed(tmp_path, extra=extra)
    losses_a = train(first, range(3, 6))
    second = ensemble()
    restored = second.load_checkpoint(folder, spec=SPEC)
    assert second.steps_done == 3 and second.checkpoint_root == tmp_path
    assert torch.equal(restored["generator"], generator.get_state()) and restored["curve"] == [1.5, 2.5]
    assert restored["note"] == ("a", 1)
    losses_b = train(second, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b, strict=True))
    for group, tensors in first.stacked_tensors().items():
        for name, tensor in tensors.items():
            assert torch.equal(tensor, second.stacked_tensors()[group][name]), (group, name)
    state_a, state_b = first.optimizer.state_dict()["state"], second.optimizer.state_dict()["state"]
    assert all(torch.equal(state_a[i][k], state_b[i][k]) for i in state_a for k in state_a[i])


def test_the_checkpoint_folder_holds_safetensors_json_and_a_manifest(tmp_path):
    _, _, folder = checkpointed(tmp_path, extra={"curve": torch.ones(2)})
    assert folder.name == "step-00000003" and not list(tmp_path.glob("checkpoints/*.tmp"))
    names = {p.name for p in folder.iterdir()}
    assert names == {
        "model.safetensors", "model.json", "optimizer.safetensors", "optimizer.json", "extra.safetensors",
        "extra.json", "trainer_state.json", "manifest.json",
    }  # fmt: skip
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["step"] == 3 and manifest["training_args"] == SPEC
    assert json.loads((folder / "trainer_state.json").read_text())["seeds"] == list(SEEDS)
    assert load_file(folder / "model.safetensors")["params.read_in.weight"].shape[0] == len(SEEDS)


def refused(folder, model=None, spec=SPEC) -> str:
    model = model or ensemble()
    before = {k: v.clone() for k, v in model.params.items()}
    with pytest.raises(CheckpointError) as info:
        model.load_checkpoint(folder, spec=spec)
    assert model.steps_done == 0 and all(torch.equal(before[k], v) for k, v in model.params.items())
    message = str(info.value)
    assert str(folder) in message and "\n" not in message
    return message


def test_a_truncated_or_edited_checkpoint_is_refused(tmp_path):
    _, _, folder = checkpointed(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-8])
    assert "truncated" in refused(folder)
    (folder / "model.safetensors").write_bytes(data[:-8] + b"\0" * 8)
    assert "corrupted" in refused(folder)
    (folder / "model.safetensors").write_bytes(data)
    (folder / "optimizer.json").unlink()
    assert "optimizer.json" in refused(folder)


def test_a_nan_checkpoint_is_refused_even_with_a_matching_manifest(tmp_path):
    _, _, folder = checkpointed(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["params.read_in.weight"][1, 0, 0] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    write_manifest(folder, 3, SPEC)  # the manifest agrees: only the finiteness check stands in the way
    assert "params.read_in.weight holds non-finite values" in refused(folder)


def test_other_seeds_another_model_or_another_spec_are_refused(tmp_path):
    _, _, folder = checkpointed(tmp_path)
    assert "seeds" in refused(folder, ensemble(seeds=(3, 5)))
    assert "another spec (differs in ['steps'])" in refused(folder, spec={**SPEC, "steps": 7})
    wider = SeedEnsemble("linear_gpt", {**FIELDS, "n_embd": 8, "n_head": 2}, SEEDS, 3e-3)
    assert "this model's is" in refused(folder, wider)
    assert resumable_checkpoint(tmp_path, SPEC) == folder
    assert resumable_checkpoint(tmp_path, {**SPEC, "steps": 7}) is None


def test_a_failed_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    model, _, folder = checkpointed(tmp_path)
    train(model, range(3, 4))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("hf_icl.training.seed_checkpoints.write_manifest", full_disk)
    with pytest.raises(CheckpointSaveError, match="step 4 .*No space left on device"):
        model.save_checkpoint(tmp_path, spec=SPEC)
    assert [path for _, path in list_checkpoints(tmp_path)] == [folder]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_rotation_keeps_the_newest_checkpoints(tmp_path):
    model = ensemble()
    for step in range(4):
        train(model, range(step, step + 1))
        model.save_checkpoint(tmp_path, spec=SPEC, keep=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [3, 4]


def test_a_divergence_names_the_newest_finite_checkpoint(tmp_path):
    model, _, folder = checkpointed(tmp_path)
    with torch.no_grad():
        model.params["read_in.weight"][0] = float("nan")
    with pytest.raises(TrainingDivergedError, match=f"newest checkpoint with finite weights is {folder}"):
        train(model, range(3, 4))
    with pytest.raises(TrainingDivergedError, match="keeps no checkpoints"):
        bad = ensemble()
        with torch.no_grad():
            bad.params["read_in.weight"][0] = float("nan")
        train(bad, range(1))
