"""The causal-LM loop on packed token blocks (hf_icl.training.lm_training): it learns, its curves and schedule, the
batch order, bit-identical resume, divergence, the checkpoints and the final folder."""

from __future__ import annotations

import doctest
import json

import pytest
import torch
from tiny_models import tiny_gpt2
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, get_cosine_schedule_with_warmup

from hf_icl.training import TrainingDivergedError, lm_training, train_causal_lm
from hf_icl.training.checkpoints import list_checkpoints
from hf_icl.training.lm_training import batch_indices

VOCAB, CONTEXT = 11, 12


def tiny_lm(seed: int = 0, dropout: float = 0.0) -> GPT2LMHeadModel:
    """GPT-2: vocabulary 11, 1 layer, width 8, 2 heads, 12 positions."""
    return tiny_gpt2(VOCAB, seed, dropout=dropout, n_layer=1, n_embd=8, n_positions=CONTEXT)


def pattern_blocks(n: int, seed: int = 0) -> torch.Tensor:
    """``(n, CONTEXT)`` blocks of one repeated sequence 0..10 at random phases: learnable from the previous token."""
    phases = torch.randint(VOCAB, (n, 1), generator=torch.Generator().manual_seed(seed))
    return (phases + torch.arange(CONTEXT)).remainder(VOCAB)


def random_blocks(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(VOCAB, (n, CONTEXT), generator=torch.Generator().manual_seed(seed))


def train(out, model=None, **options):
    kwargs = dict(steps=12, batch_size=4, learning_rate=1e-2, warmup_steps=2, seed=3, log=None, output_dir=out)
    blocks = options.pop("blocks", random_blocks(10))
    return train_causal_lm(
        model if model is not None else tiny_lm(), blocks, random_blocks(3, seed=1), **kwargs | options
    )


def test_the_loss_falls_on_a_learnable_pattern(tmp_path):
    blocks = pattern_blocks(32)
    model, curve = train(tmp_path, blocks=blocks, steps=60, learning_rate=3e-2, log_every=10, eval_every=30)
    first, last = curve["train"][0][1], curve["train"][-1][1]
    assert last < 0.5 * first, (first, last)
    validation = pattern_blocks(4, seed=5)
    with torch.no_grad():
        assert model(input_ids=validation, labels=validation).loss.item() < 0.5 * first


def test_curve_shapes_and_progress_lines(tmp_path):
    lines = []
    _, curve = train(tmp_path, steps=12, log_every=5, eval_every=4, log=lines.append)
    assert [step for step, _ in curve["train"]] == [5, 10, 12]  # every 5 steps and the last (partial) window
    assert [step for step, _ in curve["validation"]] == [4, 8, 12]
    assert all(isinstance(loss, float) and loss > 0 for _, loss in curve["train"] + curve["validation"])
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == [f"{s}/12" for s in range(1, 13)]  # a tenth of 12 steps: 1
    lines.clear()
    _, curve = train(tmp_path / "b", steps=30, log=lines.append)  # defaults: curves and progress every steps // 10
    assert [step for step, _ in curve["train"]] == [3 * k for k in range(1, 11)]
    assert [line.split()[1] for line in lines] == [f"{3 * k}/30" for k in range(1, 11)]


def test_the_train_curve_is_the_mean_loss_of_each_window(tmp_path, monkeypatch):
    losses = []
    original = lm_training._CausalLMRun._optimizer_step

    def recording(self):
        losses.append(original(self))
        return losses[-1]

    monkeypatch.setattr(lm_training._CausalLMRun, "_optimizer_step", recording)
    _, curve = train(tmp_path, steps=7, log_every=3)
    assert curve["train"] == [[3, sum(losses[:3]) / 3], [6, sum(losses[3:6]) / 3], [7, losses[6]]]


def test_the_learning_rate_follows_transformers_cosine_schedule_with_warmup(tmp_path, monkeypatch):
    seen = []
    original = lm_training._CausalLMRun._optimizer_step

    def recording(self):
        seen.append(self.optimizer.param_groups[0]["lr"])
        return original(self)

    monkeypatch.setattr(lm_training._CausalLMRun, "_optimizer_step", recording)
    train(tmp_path, steps=15, warmup_steps=4, learning_rate=2e-3)
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2e-3)
    schedule = get_cosine_schedule_with_warmup(reference, num_warmup_steps=4, num_training_steps=15)
    expected = []
    for _ in range(15):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        schedule.step()
    assert seen == expected
    assert seen[0] == 0.0 and seen[4] == pytest.approx(2e-3)


def test_batches_are_epochs_of_seeded_permutations():
    drawn = torch.cat([batch_indices(10, 4, seed=3, step=step) for step in range(5)])  # 20 = two epochs
    assert sorted(drawn[:10].tolist()) == list(range(10)) and sorted(drawn[10:].tolist()) == list(range(10))
    again = torch.cat([batch_indices(10, 4, seed=3, step=step) for step in range(5)])
    assert torch.equal(drawn, again)
    other = torch.cat([batch_indices(10, 4, seed=4, step=step) for step in range(5)])
    assert not torch.equal(drawn, other)
    assert batch_indices(3, 8, seed=0, step=1).shape == (8,)  # a batch larger than the data spans several epochs


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, monkeypatch):
    options = dict(steps=10, checkpoint_every=3, log_every=2, eval_every=5)
    whole, whole_curve = train(tmp_path / "whole", tiny_lm(dropout=0.1), **options)  # dropout: the RNG state matters

    original = lm_training._CausalLMRun._optimizer_step

    def interrupted(self):
        if self.step == 7:
            raise KeyboardInterrupt("stopped at step 7")
        return original(self)

    monkeypatch.setattr(lm_training._CausalLMRun, "_optimizer_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "cut", tiny_lm(dropout=0.1), **options)
    assert [step for step, _ in list_checkpoints(tmp_path / "cut")] == [3, 6]
    monkeypatch.setattr(lm_training._CausalLMRun, "_optimizer_step", original)
    lines = []
    # other initial weights and another global RNG state: everything must come from the checkpoint of step 6
    torch.manual_seed(123)
    resumed, resumed_curve = train(
        tmp_path / "cut", tiny_lm(seed=9, dropout=0.1), **options, resume=True, log=lines.append
    )
    assert any("resumed from" in line and "step-00000006" in line for line in lines)
    assert resumed_curve == whole_curve
    whole_state, resumed_state = whole.state_dict(), resumed.state_dict()
    assert whole_state.keys() == resumed_state.keys()
    assert all(torch.equal(whole_state[key], resumed_state[key]) for key in whole_state)


def test_resume_refuses_other_settings_and_a_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        train(tmp_path / "none", resume=True)
    train(tmp_path / "run", steps=4, checkpoint_every=2)
    with pytest.raises(ValueError, match=r"learning_rate 0\.01 → 0\.02"):
        train(tmp_path / "run", steps=4, checkpoint_every=2, learning_rate=2e-2, resume=True)
    with pytest.raises(ValueError, match="train_blocks"):
        train(tmp_path / "run", steps=4, checkpoint_every=2, blocks=random_blocks(10, seed=7), resume=True)
    # the cadence of checkpoints and logs may change; a finished run resumed only writes its final folder again
    model, curve = train(tmp_path / "run", steps=4, checkpoint_every=1, save_total_limit=5, resume=True)
    assert [step for step, _ in curve["train"]][-1] == 4


def test_a_nan_loss_raises_naming_the_step_and_the_newest_finite_checkpoint(tmp_path):
    model = tiny_lm()
    forward, calls = model.forward, []

    def poisoned(*args, **kwargs):
        out = forward(*args, **kwargs)
        if model.training:
            calls.append(1)
            if len(calls) == 4:  # step 3 (0-based): three updates done
                out.loss = out.loss * float("nan")
        return out

    model.forward = poisoned
    with pytest.raises(TrainingDivergedError, match=r"diverged at step 3: the loss is nan") as caught:
        train(tmp_path, model, steps=10, checkpoint_every=2, eval_every=10)
    assert "step-00000002" in str(caught.value) and "resume=True" in str(caught.value)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]


def test_a_huge_learning_rate_diverges_before_any_checkpoint(tmp_path):
    with pytest.raises(TrainingDivergedError, match=r"diverged at step \d+: .*No checkpoint of this run has finite"):
        train(tmp_path, learning_rate=1e39, warmup_steps=0, checkpoint_every=5)
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "train.lock").exists()


def test_checkpoints_rotate_and_a_fresh_run_removes_stale_ones(tmp_path):
    train(tmp_path, steps=10, checkpoint_every=2, save_total_limit=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [8, 10]
    checkpoint = list_checkpoints(tmp_path)[-1][1]
    for name in ("model.safetensors", "optimizer.safetensors", "scheduler.json", "rng_state_0.json", "manifest.json"):
        assert (checkpoint / name).is_file(), name
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 10 and len(state["losses"]) == 10 and state["validation"]
    lines = []
    train(tmp_path, steps=3, checkpoint_every=0, log=lines.append)
    assert list_checkpoints(tmp_path) == [] and any("removed the checkpoints" in line for line in lines)


def test_the_final_folder_loads_bit_exact_with_a_manifest_and_metrics(tmp_path):
    model, curve = train(tmp_path, steps=6, log_every=2, eval_every=3)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert all(torch.equal(tensor, loaded.state_dict()[key]) for key, tensor in model.state_dict().items())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["format"] == "hf_icl-model" and "model.safetensors" in manifest["files"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["format"] == "hf_icl.metrics/1" and metrics["task"] == "causal_lm" and metrics["model"] == "gpt2"
    assert metrics["curves"] == curve and metrics["evaluations"] == {}
    assert metrics["scalars"] == {
        "steps": 6,
        "train_loss": curve["train"][-1][1],
        "validation_loss": curve["validation"][-1][1],
    }
    assert not model.training


@pytest.mark.parametrize(
    "options, match",
    [
        ({"steps": 0}, "steps"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"blocks": torch.zeros(4, 3)}, "train_blocks must be a non-empty"),
        ({"blocks": torch.zeros(4, dtype=torch.int64)}, "train_blocks must be a non-empty"),
        ({"eval_every": 0}, "eval_every"),
    ],
)
def test_bad_arguments(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        train(tmp_path, **options)
    assert not any(tmp_path.iterdir())


def test_docstring_examples_run():
    results = doctest.testmod(lm_training, raise_on_error=True)
    assert results.attempted >= 8
