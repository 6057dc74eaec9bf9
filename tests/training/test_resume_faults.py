"""Long jobs that fail cleanly: a full disk during a checkpoint save, a checkpoint with non-finite weights,
divergence, reproduce's arguments checked before any work, task/model mismatches refused before training.
(The killed-reproduce fault test is tests/reproduce/test_workers.py.)

Every CLI failure here is one line ``hf-icl <command>: error: ...`` with exit status 2 and at most one
recovery command.
"""

import dataclasses
import errno
import json
import re
import shlex

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from training_helpers import tiny_args

import hf_icl.training.checkpoints as checkpoints
from hf_icl.cli import main
from hf_icl.reproduce import PAPERS, reproduce
from hf_icl.training import ICLTrainer, ICLTrainingArguments, TrainingDivergedError
from hf_icl.training.checkpoints import CheckpointSaveError, list_checkpoints
from hf_icl.training.manifest import CheckpointError, verify_checkpoint

#: a tiny run: checkpoints at steps 3 and 6 (inside the loop) and 7 (the end)
RUN = dict(max_steps=7, save_steps=3, eval_prompts=16, per_device_train_batch_size=4)
FLAGS = (
    "--n_dims 3 --n_points 6 --model_size tiny --max_steps 7 --save_steps 3 --eval_prompts 16 "
    "--per_device_train_batch_size 4 --learning_rate 0.003 --eval_steps 0 --report_to none --disable_tqdm True"
)


def step_dir(out, step):
    return out / "checkpoints" / f"step-{step:08d}"


def cli(argv: str, capsys) -> tuple[int, list[str]]:
    code = main(shlex.split(argv))
    return code, capsys.readouterr().err.strip().splitlines()


def fail_writes_into(monkeypatch, step: int, error: BaseException) -> None:
    """Every safetensors write into checkpoint ``step`` (weights, optimizer, random state) raises ``error``."""
    import transformers.modeling_utils

    def writer(original):
        def write(tensors, filename, *args, **kwargs):
            if f"step-{step:08d}" in str(filename):
                raise error
            return original(tensors, filename, *args, **kwargs)

        return write

    monkeypatch.setattr(checkpoints, "save_file", writer(checkpoints.save_file))
    monkeypatch.setattr(
        transformers.modeling_utils, "safe_save_file", writer(transformers.modeling_utils.safe_save_file)
    )


def resume_flag(message: str) -> str:
    return re.search(r"--resume_from_checkpoint (\S+)", message).group(1)


# -- disk full during a save --------------------------------------------------------------------------------------
DISK_FULL = OSError(errno.ENOSPC, "No space left on device")
#: what safetensors' Rust writer raises on a full disk (not an OSError)
RUST_DISK_FULL = SafetensorError(
    'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
)


@pytest.mark.parametrize("error", [DISK_FULL, RUST_DISK_FULL], ids=["oserror", "safetensors-error"])
def test_disk_full_at_the_second_checkpoint_keeps_the_first_and_names_it(tmp_path, monkeypatch, error):
    out = tmp_path / "run"
    fail_writes_into(monkeypatch, 6, error)
    with pytest.raises(CheckpointSaveError) as caught:
        ICLTrainer(tiny_args(out, **RUN)).train()
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC and caught.value.step == 6
    assert "step 6" in message and "No space left on device" in message and "after freeing space" in message
    assert message.count("hf-icl train") == 1 and message.count("--resume_from_checkpoint") == 1
    assert resume_flag(message) == str(step_dir(out, 3))
    # the first checkpoint is intact and nothing half-written is left
    assert [step for step, _ in list_checkpoints(out)] == [3]
    assert not list((out / "checkpoints").glob("*.tmp"))
    verify_checkpoint(step_dir(out, 3))
    # the advised command, run as printed, resumes from it and finishes
    monkeypatch.undo()
    command = shlex.split(message[message.index("hf-icl train") :])[1:]
    assert main(command) == 0
    assert [step for step, _ in list_checkpoints(out)] == [3, 6, 7]


def test_disk_full_on_the_command_line_is_one_line_with_one_command(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    fail_writes_into(monkeypatch, 6, RUST_DISK_FULL)
    code, lines = cli(f"train {FLAGS} --output_dir {out}", capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hf-icl train: error: could not write the checkpoint of step 6")
    assert lines[0].count("hf-icl train --") == 1 and lines[0].count("--resume_from_checkpoint") == 1
    assert resume_flag(lines[0]) == str(step_dir(out, 3))


def test_disk_full_writing_the_final_model_names_the_final_checkpoint(tmp_path, monkeypatch, capsys):
    import transformers.modeling_utils

    out = tmp_path / "run"
    original = transformers.modeling_utils.safe_save_file

    def write(tensors, filename, *args, **kwargs):
        if str(filename) == str(out / "model.safetensors"):
            raise RUST_DISK_FULL
        return original(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", write)
    code, lines = cli(f"train {FLAGS} --output_dir {out}", capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hf-icl train: error: could not write the final model of step 7")
    assert "No space left on device" in lines[0] and lines[0].count("hf-icl train --") == 1
    assert resume_flag(lines[0]) == str(step_dir(out, 7))
    monkeypatch.undo()
    command = lines[0][lines[0].index("hf-icl train --") :]
    assert main(shlex.split(command)[1:]) == 0
    assert (out / "model.safetensors").is_file() and (out / "metrics.json").is_file()


def test_disk_full_at_the_first_checkpoint_says_start_again(tmp_path, monkeypatch):
    out = tmp_path / "run"
    fail_writes_into(monkeypatch, 3, DISK_FULL)
    with pytest.raises(
        CheckpointSaveError, match="No earlier checkpoint exists; after freeing space, start again"
    ) as e:
        ICLTrainer(tiny_args(out, **RUN)).train()
    assert "--resume_from_checkpoint" not in str(e.value) and str(e.value).count("hf-icl train") == 1
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_permission_denied_advises_making_the_directory_writable(tmp_path, monkeypatch):
    out = tmp_path / "run"
    fail_writes_into(monkeypatch, 6, PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(CheckpointSaveError, match=f"Permission denied.*after making {out} writable") as caught:
        ICLTrainer(tiny_args(out, **RUN)).train()
    assert resume_flag(str(caught.value)) == str(step_dir(out, 3))


def test_a_failed_rotation_never_removes_a_checkpoint_before_the_new_one_is_complete(tmp_path, monkeypatch):
    out = tmp_path / "run"
    fail_writes_into(monkeypatch, 6, DISK_FULL)
    with pytest.raises(CheckpointSaveError):
        ICLTrainer(tiny_args(out, save_total_limit=1, **RUN)).train()
    assert [step for step, _ in list_checkpoints(out)] == [3]  # the limit of 1 did not delete the only good one
    verify_checkpoint(step_dir(out, 3))


# -- non-finite checkpoints and divergence --------------------------------------------------------------------------
def poison(checkpoint, key: str | None = None) -> None:
    """Set one weight of the checkpoint to NaN and rewrite its manifest (so only the finiteness check can tell)."""
    from hf_icl.training.manifest import write_manifest

    tensors = load_file(checkpoint / "model.safetensors")
    key = key or sorted(tensors)[0]
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint, manifest["step"], manifest["training_args"])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    ICLTrainer(tiny_args(out, **RUN)).train()
    assert [step for step, _ in list_checkpoints(out)] == [3, 6, 7]
    return out


@pytest.fixture
def run_copy(finished, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def test_resuming_a_nan_checkpoint_is_refused_naming_the_newest_finite_one(run_copy, capsys):
    poison(step_dir(run_copy, 7))
    verify_checkpoint(step_dir(run_copy, 7))  # the manifest alone cannot tell
    with pytest.raises(CheckpointError, match="non-finite weights") as caught:
        ICLTrainer(tiny_args(run_copy, resume_from_checkpoint="latest", **{**RUN, "max_steps": 9})).train()
    message = str(caught.value)
    assert f"resume_from_checkpoint={str(step_dir(run_copy, 6))!r}" in message
    assert "step-00000007" in message  # the refused one, named as refused
    code, lines = cli(f"train {FLAGS} --max_steps 9 --output_dir {run_copy} --resume_from_checkpoint latest", capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("hf-icl train: error: ")
    assert str(step_dir(run_copy, 6)) in lines[0] and "non-finite" in lines[0]


def test_resuming_when_every_checkpoint_is_nan_says_start_again(run_copy, capsys):
    for step in (3, 6, 7):
        poison(step_dir(run_copy, step))
    target = step_dir(run_copy, 6)
    code, lines = cli(f"train {FLAGS} --max_steps 9 --output_dir {run_copy} --resume_from_checkpoint {target}", capsys)
    assert code == 2 and len(lines) == 1, lines
    assert "non-finite" in lines[0] and "start again" in lines[0] and "resume from it" not in lines[0]


def test_divergence_names_the_newest_checkpoint_whose_weights_are_finite_on_disk(tmp_path):
    """The run saved steps 3 and 6; step 6's file was damaged on disk afterwards (bit rot, a bad copy); the run then
    diverges at step 7. The advice is step 3, checked by reading the weights, not step 6 (the last one it wrote)."""

    class Diverging(ICLTrainer):
        def _optimizer_step(self, step, generator):
            if step == 7:
                poison(step_dir(self.output_dir, 6))
            return super()._optimizer_step(step, generator)

        def draw_batch(self, step, generator):
            xs, ys = super().draw_batch(step, generator)
            return (xs, ys * float("nan")) if step >= 7 else (xs, ys)

    out = tmp_path / "run"
    with pytest.raises(TrainingDivergedError, match="step 7") as caught:
        Diverging(tiny_args(out, **{**RUN, "max_steps": 9})).train()
    message = str(caught.value)
    assert f"resume_from_checkpoint={str(step_dir(out, 3))!r}" in message
    assert "step-00000006" not in message


def test_divergence_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    code, lines = cli(f"train {FLAGS} --learning_rate 1e30 --max_grad_norm 0 --output_dir {out}", capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hf-icl train: error: training diverged at step ")
    assert "start again" in lines[0] or "resume_from_checkpoint=" in lines[0]
    named = re.search(r"resume_from_checkpoint='([^']+)'", lines[0])
    if named:  # a named checkpoint really has finite weights
        assert all(torch.isfinite(t).all() for t in load_file(f"{named.group(1)}/model.safetensors").values())


# -- reproduce checks its arguments before any work -----------------------------------------------------------------
@pytest.fixture
def no_heavy_work(monkeypatch):
    """Every paper's experiments, the trainer and model building fail the test if reached."""
    import hf_icl.modeling
    import hf_icl.training

    def forbidden(*args, **kwargs):
        raise AssertionError("heavy work started before the arguments were validated")

    for name, paper in PAPERS.items():  # starting any paper's experiment state is work
        monkeypatch.setitem(PAPERS, name, dataclasses.replace(paper, start=forbidden))
    monkeypatch.setattr(hf_icl.training, "train", forbidden)
    monkeypatch.setattr(ICLTrainer, "__init__", forbidden)
    monkeypatch.setattr(hf_icl.modeling, "build_model", forbidden)


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("not a directory")
    return path


@pytest.mark.parametrize(
    "options, words",
    [
        ({"output_dir": "{file}"}, ["output_dir", "an existing file"]),
        ({"output_dir": "{file}/below"}, ["output_dir", "is a file"]),
        ({"steps": 0}, ["steps", "got 0"]),
        ({"steps": 2.5}, ["steps", "2.5"]),
        ({"seed": -1}, ["seed", "got -1"]),
        ({"mlp_steps": 0}, ["mlp_steps", "got 0"]),
        ({"workers": 0}, ["workers", "got 0"]),
        ({"full": "yes"}, ["full", "True or False"]),
        ({"stepz": 3}, ["stepz", "steps"]),
    ],
    ids=["output-file", "output-below-file", "steps-0", "steps-float", "seed-negative", "mlp-steps-0", "workers-0",
         "full-str", "unknown-option"],
)  # fmt: skip
def test_reproduce_checks_its_arguments_before_any_work(options, words, a_file, no_heavy_work):
    options = {k: str(v).replace("{file}", str(a_file)) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ValueError) as caught:
        reproduce("linear-attention", "table1", **options)
    for word in words:
        assert word in str(caught.value), caught.value


@pytest.mark.parametrize(
    "argv, words",
    [
        ("reproduce sgpt fig1 --output-dir {file}", ["--output-dir", "an existing file"]),
        ("reproduce gd-icl synthetic --output-dir {file}/runs", ["--output-dir", "is a file"]),
        ("reproduce linear-attention table1 --seed -2", ["--seed", "got -2"]),
    ],
    ids=["file", "below-file", "seed"],
)
def test_reproduce_cli_refuses_before_any_work(argv, words, a_file, no_heavy_work, capsys):
    code, lines = cli(argv.replace("{file}", str(a_file)), capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("hf-icl reproduce: error: ")
    for word in words:
        assert word in lines[0], lines[0]


# -- task and model disagree -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", ["gd_transformer", "gpt2_icl"])
def test_n_classes_mismatch_is_refused_before_training(tmp_path, model_type, no_heavy_work):
    with pytest.raises(ValueError, match=r"n_classes=3 disagrees with the task's n_classes=5"):
        ICLTrainingArguments(
            task="categorical",
            model_type=model_type,
            model_size="tiny",
            model_overrides='{"n_classes": 3}',
            n_dims=3,
            n_points=6,
            output_dir=str(tmp_path),
            report_to="none",
        )


def test_n_classes_on_a_regression_task_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"n_classes=4.*'linear_regression' has regression targets"):
        tiny_args(tmp_path, model_overrides='{"n_classes": 4}')


def test_n_classes_mismatch_on_the_command_line(tmp_path, no_heavy_work, capsys):
    argv = (
        f"train --task categorical --task_params '{{\"n_classes\": 4}}' --model_type gd_transformer --model_size tiny "
        f"--model_overrides '{{\"n_classes\": 6}}' --n_dims 3 --n_points 6 --output_dir {tmp_path} --report_to none"
    )
    code, lines = cli(argv, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert "n_classes=6" in lines[0] and "n_classes=4" in lines[0]


def test_matching_n_classes_is_accepted(tmp_path):
    args = tiny_args(tmp_path, task="categorical", model_type="gd_transformer", model_overrides='{"n_classes": 5}')
    assert args.model_config_fields(args.task_family())["n_classes"] == 5


def test_a_damaged_cached_run_is_a_one_line_error_that_says_retrain(tmp_path):
    """A reproduction reuses finished runs from disk: a truncated tensor file or an edited JSON record is refused
    with the file named and the way out (--retrain), not a raw SafetensorError / JSONDecodeError."""
    from hf_icl.reproduce.linear_attention import GroupResult
    from hf_icl.reproduce.report import DamagedRunError
    from hf_icl.training.run_cache import TENSORS_FILE, write_run

    write_run(tmp_path, {"recipe": "softmax"}, tensors={"softmax": torch.arange(6.0)})
    tensors = tmp_path / TENSORS_FILE
    tensors.write_bytes(tensors.read_bytes()[:-5])
    with pytest.raises(DamagedRunError, match=r"tensors\.safetensors cannot be read .*--retrain"):
        GroupResult.load(tmp_path)
    (tmp_path / "run.json").write_text('{"spec": ')
    with pytest.raises(DamagedRunError, match=r"run\.json cannot be read .*--retrain"):
        GroupResult.load(tmp_path)
