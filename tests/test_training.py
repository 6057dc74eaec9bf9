"""The Accelerate trainer: curriculum, arguments, learning, bit-identical resume, NaN safety, two ranks."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from hf_icl.training import Curriculum, ICLTrainer, ICLTrainingArguments, TrainingDivergedError, latest_checkpoint
from hf_icl.training.trainer import step_seed


def small_args(tmp_path, **kw) -> ICLTrainingArguments:
    values = dict(
        n_dims=3,
        n_points=6,
        model_size="tiny",
        train_steps=20,
        batch_size=8,
        learning_rate=3e-3,
        curriculum_dims_start=2,
        curriculum_dims_interval=5,
        curriculum_points_start=4,
        curriculum_points_interval=5,
        eval_every=10,
        eval_prompts=32,
        save_every=10,
        report_to="none",
        progress_bar=False,
        output_dir=str(tmp_path / "run"),
    )
    values.update(kw)
    return ICLTrainingArguments(**values)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


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
    path.write_text("task: noisy_linear_regression\ntask_params: {noise_std: 0.25}\nn_dims: 4\nbatch_size: 16\n")
    args = ICLTrainingArguments.from_yaml(path, batch_size=32)
    assert args.task == "noisy_linear_regression" and args.batch_size == 32
    assert args.task_kwargs() == {"noise_std": 0.25}
    (tmp_path / "bad.yaml").write_text("task: linear_regression\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match="learning_rat"):
        ICLTrainingArguments.from_yaml(tmp_path / "bad.yaml")
    for field, value in [
        ("learning_rate", 0.0),
        ("mixed_precision", "fp8"),
        ("batch_size", 0),
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
        train_steps=150,
        batch_size=32,
        curriculum_dims_start=None,
        curriculum_points_start=None,
        eval_every=0,
        save_every=0,
        n_tasks=1,
        logging_every=10,
    )
    result = ICLTrainer(args).train()
    losses = [h["train/loss"] for h in result.history if "train/loss" in h]
    assert len(losses) == 15
    assert sum(losses[-3:]) / 3 < 0.3 * losses[0]
    card = (tmp_path / "run" / "README.md").read_text()
    assert "library_name: hf_icl" in card and "n_tasks: 1" in card and "eval/loss" in card
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_resume_continues_bit_identically(tmp_path):
    args = dict(lr_scheduler="cosine", warmup_steps=4)
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
    resumed = ICLTrainer(small_args(tmp_path, resume_from_checkpoint=str(checkpoint), train_steps=12))
    assert resumed.train().step == 12


def test_resume_from_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="resume_from_checkpoint"):
        ICLTrainer(small_args(tmp_path, resume_from_checkpoint="latest")).train()


RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from hf_icl.training import ICLTrainer, ICLTrainingArguments
    out = sys.argv[1]
    args = ICLTrainingArguments(n_dims=3, n_points=5, model_size="tiny", train_steps=4, batch_size=4,
        curriculum_dims_start=None, curriculum_points_start=None, eval_every=0, save_every=0,
        report_to="none", progress_bar=False, output_dir=out)
    trainer = ICLTrainer(args)
    xs, _ = trainer.draw_batch(0, torch.Generator().manual_seed(
        __import__("hf_icl.training.trainer", fromlist=["x"]).step_seed(0, trainer.accelerator.process_index, 0)))
    result = trainer.train()
    total = sum(p.double().sum().item() for p in result.model.parameters())
    rank = trainer.accelerator.process_index
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"world": trainer.accelerator.num_processes, "weights": total, "batch": xs.sum().item()}, f)
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
