"""The Accelerate trainer: curriculum, arguments, learning, bit-identical resume, NaN safety, two ranks."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from accelerate.state import AcceleratorState
from safetensors.torch import load_file
from training_helpers import tiny_args, weights
from transformers import AutoModel, get_scheduler

from hf_icl.training import Curriculum, ICLTrainer, ICLTrainingArguments, TrainingDivergedError, latest_checkpoint
from hf_icl.training.trainer import build_task, step_seed


def small_args(tmp_path, **kw) -> ICLTrainingArguments:
    """20 steps with a curriculum over dims (2 → 3) and points (4 → 6), evaluated and saved every 10."""
    curriculum = dict(
        curriculum_dims_start=2, curriculum_dims_interval=5, curriculum_points_start=4, curriculum_points_interval=5
    )
    return tiny_args(tmp_path / "run", **{"max_steps": 20, "eval_steps": 10, "save_steps": 10, **curriculum, **kw})


def test_curriculum_follows_garg_schedule():
    garg = ICLTrainingArguments(curriculum_dims_start=5, curriculum_points_start=11)
    curriculum = Curriculum.from_args(garg)  # dims 5→20 +1, points 11→41 +2, every 2000
    assert curriculum.at(0) == (5, 11)
    assert curriculum.at(1999) == (5, 11)
    assert curriculum.at(2000) == (6, 13)
    assert curriculum.at(2000 * 15) == (20, 41)
    assert curriculum.at(10**7) == (20, 41)
    off = Curriculum.from_args(ICLTrainingArguments())
    assert off.at(0) == (20, 41)


def test_each_step_draws_truncated_prompts_of_the_stage(tmp_path):
    trainer = ICLTrainer(small_args(tmp_path))
    generator = torch.Generator()
    xs, ys = trainer.draw_batch(0, generator)
    assert xs.shape == (8, 4, 3) and not xs[..., 2:].any() and xs[..., :2].abs().sum() > 0
    xs, ys = trainer.draw_batch(5, generator)
    assert xs.shape == (8, 6, 3) and xs[..., 2].abs().sum() > 0  # points 4 → 6 (inc 2), dims 2 → 3
    assert len({step_seed(s, r, t) for s in range(3) for r in range(4) for t in range(50)}) == 600


def test_yaml_arguments_and_validation(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "task: noisy_linear_regression\ntask_params: {noise_std: 0.25}\nn_dims: 4\nper_device_train_batch_size: 16\n"
    )
    args = ICLTrainingArguments.from_yaml(path, per_device_train_batch_size=32)
    assert args.task == "noisy_linear_regression" and args.per_device_train_batch_size == 32
    assert args.task_kwargs() == {"noise_std": 0.25}
    (tmp_path / "bad.yaml").write_text("task: linear_regression\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match="learning_rat"):
        ICLTrainingArguments.from_yaml(tmp_path / "bad.yaml")
    for field, value in [
        ("learning_rate", 0.0),
        ("bf16", "yes"),
        ("per_device_train_batch_size", 0),
        ("task_params", "[1]"),
        ("curriculum_dims_start", 50),
        ("model_size", "huge"),
        ("report_to", "mlflow"),
    ]:
        with pytest.raises(ValueError, match=field):
            ICLTrainingArguments(**{field: value})


def test_training_fits_a_single_task_pool(tmp_path):
    # one fixed linear task: learnable by the weights alone, so a short run must cut the training loss
    args = small_args(
        tmp_path,
        max_steps=150,
        per_device_train_batch_size=32,
        curriculum_dims_start=None,
        curriculum_points_start=None,
        eval_steps=0,
        save_steps=0,
        n_tasks=1,
        logging_steps=10,
    )
    result = ICLTrainer(args).train()
    losses = [h["train/loss"] for h in result.history if "train/loss" in h]
    assert len(losses) == 15
    assert sum(losses[-3:]) / 3 < 0.3 * losses[0]
    card = (tmp_path / "run" / "README.md").read_text()
    assert "library_name: hf_icl" in card and "n_tasks: 1" in card and "eval/loss" in card
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_resume_continues_bit_identically(tmp_path):
    args = dict(lr_scheduler_type="cosine", warmup_steps=4)
    straight = ICLTrainer(small_args(tmp_path / "a", **args)).train()

    class Interrupted(ICLTrainer):
        def _optimizer_step(self, step, generator):
            if step == 13:
                raise KeyboardInterrupt
            return super()._optimizer_step(step, generator)

    with pytest.raises(KeyboardInterrupt):
        Interrupted(small_args(tmp_path / "b", **args)).train()
    assert latest_checkpoint(tmp_path / "b" / "run").name == "step-00000010"
    resumed = ICLTrainer(small_args(tmp_path / "b", resume_from_checkpoint="latest", **args)).train()
    assert resumed.step == straight.step == 20
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_nan_loss_stops_and_keeps_last_checkpoint(tmp_path):
    class Diverging(ICLTrainer):
        def draw_batch(self, step, generator):
            xs, ys = super().draw_batch(step, generator)
            return xs, ys * float("nan") if step >= 15 else ys

    trainer = Diverging(small_args(tmp_path))
    with pytest.raises(TrainingDivergedError, match="step 15"):
        trainer.train()
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint.name == "step-00000010"
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp"))
    saved = load_file(checkpoint / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    resumed = ICLTrainer(small_args(tmp_path, resume_from_checkpoint=str(checkpoint), max_steps=12))
    assert resumed.train().step == 12


def test_huge_learning_rate_stops_at_a_checkpoint_that_still_trains(tmp_path):
    ICLTrainer(small_args(tmp_path, max_steps=10, save_steps=5)).train()
    huge = small_args(tmp_path, learning_rate=1e20, save_steps=1, resume_from_checkpoint="latest")
    with pytest.raises(TrainingDivergedError, match="step 11: the loss is nan") as caught:
        ICLTrainer(huge).train()
    message = str(caught.value)
    assert "learning_rate (now 1e+20)" in message and "max_grad_norm" in message
    named = re.search(r"resume_from_checkpoint='([^']+)'", message).group(1)
    assert named == str(latest_checkpoint(tmp_path / "run"))  # the 1e20 update after step 10 was never saved
    assert named.endswith("step-00000010")
    model = AutoModel.from_pretrained(named)
    assert max(p.abs().max().item() for p in model.parameters()) < 100
    args = small_args(tmp_path)
    xs, ys = build_task(args).sample(32, args.n_points, seed=5)
    with torch.no_grad():
        assert torch.isfinite(model(xs, ys).loss)
    # the advice works: a lower learning rate from the named checkpoint trains to the end
    recovered = ICLTrainer(small_args(tmp_path, learning_rate=1e-3, resume_from_checkpoint=named)).train()
    assert recovered.step == 20
    assert all(torch.isfinite(p).all() for p in recovered.model.parameters())


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0], ids=["clipped", "unclipped"])
def test_an_infinite_gradient_is_never_applied(tmp_path, max_grad_norm):
    class Poisoned(ICLTrainer):
        def _optimizer_step(self, step, generator):
            if step == 7:  # the loss stays finite; one parameter's gradient becomes infinite
                self.before = weights(self.model)
                next(self.model.parameters()).register_hook(lambda grad: torch.full_like(grad, float("inf")))
            return super()._optimizer_step(step, generator)

    trainer = Poisoned(small_args(tmp_path, save_steps=5, max_grad_norm=max_grad_norm))
    with pytest.raises(TrainingDivergedError, match=r"step 7: the gradient norm is (inf|nan)") as caught:
        trainer.train()
    assert "step-00000005" in str(caught.value)
    after = weights(trainer.model)
    assert all(torch.equal(trainer.before[k], after[k]) for k in after)
    assert latest_checkpoint(tmp_path / "run").name == "step-00000005"


def test_non_finite_parameters_are_never_saved(tmp_path):
    class Corrupted(ICLTrainer):
        def _optimizer_step(self, step, generator):
            if step == 10:  # the unused token table: the loss and the gradients stay finite
                with torch.no_grad():
                    self.accelerator.unwrap_model(self.model).model.backbone.wte.weight.fill_(float("nan"))
            return super()._optimizer_step(step, generator)

    with pytest.raises(TrainingDivergedError, match="step 10: the parameters are non-finite") as caught:
        Corrupted(small_args(tmp_path, save_steps=5)).train()
    assert "step-00000005" in str(caught.value)
    assert latest_checkpoint(tmp_path / "run").name == "step-00000005"


def test_environment_checks_come_before_any_work(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="fp16=True needs a GPU.*CPU.*drop fp16"):
        ICLTrainer(small_args(tmp_path, fp16=True))
    real_find_spec = importlib.util.find_spec
    missing = {"wandb", "tensorboard", "tensorboardX"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **kw: None if name in missing else real_find_spec(name, *a, **kw)
    )
    for tracker in ("wandb", "tensorboard"):
        with pytest.raises(
            ValueError, match=f"report_to='{tracker}' needs the {tracker}.*pip install {tracker}.*'none'"
        ):
            ICLTrainer(small_args(tmp_path, report_to=tracker))
    assert not out.exists()
    monkeypatch.undo()
    AcceleratorState._reset_state()  # accelerate keeps one precision per process: earlier tests set "no"
    try:
        with pytest.warns(UserWarning, match="bf16=True on a CPU.*slower"):
            ICLTrainer(small_args(tmp_path, bf16=True))
    finally:
        AcceleratorState._reset_state()  # and later tests use "no" again


def test_resume_from_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="resume_from_checkpoint"):
        ICLTrainer(small_args(tmp_path, resume_from_checkpoint="latest")).train()


RANK_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys, torch
    from accelerate import Accelerator, PartialState
    from hf_icl.training import ICLTrainer, ICLTrainingArguments
    Accelerator.end_training = lambda self: None  # several runs in one process: keep the process group
    out = sys.argv[1]
    args = ICLTrainingArguments(n_dims=3, n_points=5, model_size="tiny", max_steps=4, per_device_train_batch_size=4,
        curriculum_dims_start=None, curriculum_points_start=None, eval_steps=0, save_steps=0,
        report_to="none", disable_tqdm=True, output_dir=out)
    trainer = ICLTrainer(args)
    xs, _ = trainer.draw_batch(0, torch.Generator().manual_seed(
        __import__("hf_icl.training.trainer", fromlist=["x"]).step_seed(0, trainer.accelerator.process_index, 0)))
    result = trainer.train()
    total = sum(p.double().sum().item() for p in result.model.parameters())
    rank = trainer.accelerator.process_index

    # resume on two ranks (dropout on, so each rank's random state matters): interrupted at step 3 after
    # the checkpoint at step 2, resumed; an uninterrupted run is the reference
    class Interrupted(ICLTrainer):
        def _optimizer_step(self, step, generator):
            if step == 3:
                raise KeyboardInterrupt
            return super()._optimizer_step(step, generator)

    def digest(model):
        return hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.state_dict().values())).hexdigest()

    common = dict(n_dims=3, n_points=5, model_size="tiny", max_steps=6, per_device_train_batch_size=4, eval_steps=0,
        eval_prompts=16, save_steps=2, logging_steps=1, lr_scheduler_type="cosine", warmup_steps=2,
        model_overrides='{"resid_pdrop": 0.2, "embd_pdrop": 0.2}', report_to="none", disable_tqdm=True)
    try:
        Interrupted(ICLTrainingArguments(**common, output_dir=f"{out}/b")).train()
    except KeyboardInterrupt:
        pass
    resumed = ICLTrainer(ICLTrainingArguments(**common, output_dir=f"{out}/b", resume_from_checkpoint="latest")).train()
    straight = ICLTrainer(ICLTrainingArguments(**common, output_dir=f"{out}/c")).train()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"world": trainer.accelerator.num_processes, "weights": total, "batch": xs.sum().item(),
                   "resumed": digest(resumed.model), "straight": digest(straight.model),
                   "lrs": [h["train/lr"] for h in straight.history if "train/lr" in h]}, f)
    PartialState().destroy_process_group()
    """
)


def test_two_cpu_ranks_agree_on_weights(tmp_path):
    script = tmp_path / "train_ranks.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    subprocess.run([*launcher, str(script), str(tmp_path)], env=env, check=True, timeout=240, capture_output=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP kept the replicas identical
    assert ranks[0]["batch"] != ranks[1]["batch"]  # each rank drew its own prompts
    # resumed on two ranks = uninterrupted, on both ranks
    assert ranks[0]["resumed"] == ranks[0]["straight"] == ranks[1]["resumed"] == ranks[1]["straight"]
    checkpoint = tmp_path / "b" / "checkpoints" / "step-00000002"
    listed = json.loads((checkpoint / "manifest.json").read_text())["files"]
    assert {"rng_state_0.json", "rng_state_1.json", "model.safetensors", "optimizer.safetensors"} <= set(listed)
    assert not list(checkpoint.glob("*.pkl")) and not list(checkpoint.glob("*.bin"))
    # the schedule advances once per optimizer step, not once per process
    reference = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)
    scheduler = get_scheduler("cosine", reference, num_warmup_steps=2, num_training_steps=6)
    expected = []
    for _ in range(6):
        reference.step()
        scheduler.step()
        expected.append(scheduler.get_last_lr()[0])
    assert ranks[0]["lrs"] == ranks[1]["lrs"] == pytest.approx(expected, rel=1e-12, abs=0)


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    """A log file gets one line per logging window and no carriage-return bar redraws."""
    from hf_icl.training import train

    train(tiny_args(tmp_path / "run", disable_tqdm=False, logging_steps=5, save_steps=0))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("training step")]
    assert [line.split(":")[0] for line in lines] == ["training step 5/10", "training step 10/10"]
    assert "\r" not in err


def test_the_console_says_what_runs_where_how_long_each_evaluation_and_where_a_resume_starts(tmp_path, capsys):
    """A banner before the first step (model, parameters, task, steps, output folder, device), the time the rest
    should take once the first steps are timed, each periodic evaluation, and the step a resumed run starts at."""
    from hf_icl.training import train

    out = tmp_path / "run"
    result = train(tiny_args(out, disable_tqdm=False, logging_steps=5, eval_steps=5, save_steps=5, max_steps=10))
    lines = capsys.readouterr().err.splitlines()
    parameters = sum(p.numel() for p in result.model.parameters())
    (banner,) = [line for line in lines if line.startswith("hf-icl train: ")]
    for word in ("gpt2_icl", f"{parameters / 1e6:.2f}M parameters", "linear_regression", "10 steps", str(out), "cpu"):
        assert word in banner, (word, banner)
    assert lines.index(banner) < min(i for i, line in enumerate(lines) if line.startswith("training step"))
    evaluations = [line for line in lines if line.startswith("evaluation at step")]
    assert [line.split(":")[0] for line in evaluations] == ["evaluation at step 5/10", "evaluation at step 10/10"]
    assert all("eval/loss" in line for line in evaluations)
    assert [line for line in lines if "ms per step over the first 10 steps" in line]  # 10 < 20: at the last step
    train(tiny_args(out, disable_tqdm=False, max_steps=15, resume_from_checkpoint="latest", save_steps=5))
    lines = capsys.readouterr().err.splitlines()
    assert f"resumed from {out / 'checkpoints' / 'step-00000010'} at step 10" in lines
    assert [line for line in lines if line.startswith("hf-icl train: ") and "steps 10 → 15" in line]


def test_the_estimate_comes_once_after_the_first_steps_on_an_injected_clock():
    from hf_icl.training.console import ESTIMATE_AFTER_STEPS, ProgressClock

    now = [100.0]
    clock = ProgressClock(start_step=40, max_steps=1040, clock=lambda: now[0])
    assert clock.estimate(40 + ESTIMATE_AFTER_STEPS - 1) is None
    now[0] += 0.5 * ESTIMATE_AFTER_STEPS  # half a second per step
    line = clock.estimate(40 + ESTIMATE_AFTER_STEPS)
    assert line.startswith("500 ms per step over the first 20 steps")
    assert "about 8 min for the remaining 980 steps" in line
    assert clock.estimate(40 + ESTIMATE_AFTER_STEPS + 1) is None
