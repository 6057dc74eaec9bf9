"""Checkpoints and resume: no pickle, integrity, changed arguments, one run per output directory."""

import hashlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import tiny_args as shared_tiny_args
from training_helpers import weights
from transformers import AutoModel, get_scheduler

import hf_icl  # noqa: F401  (registers the architectures with the Auto classes)
from hf_icl.cli import main
from hf_icl.training import ICLTrainer, ICLTrainingArguments, latest_checkpoint
from hf_icl.training.manifest import CheckpointError
from hf_icl.training.run_lock import LOCK_FILE, OutputDirError
from hf_icl.training.trainer import build_task


def tiny_args(output_dir, **kw) -> ICLTrainingArguments:
    return shared_tiny_args(output_dir, **{"logging_steps": 1, **kw})


def same_weights(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite_manifest(checkpoint) -> None:
    """Recompute the manifest's file list from what is on disk (what an attacker would do)."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"] = {
        p.relative_to(checkpoint).as_posix(): {"sha256": sha256(p), "bytes": p.stat().st_size}
        for p in sorted(checkpoint.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 10-step run with checkpoints at steps 5 and 10, and its final weights."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = ICLTrainer(tiny_args(out)).train()
    return out, weights(result.model)


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A private copy of the finished run's output directory (tests may damage it)."""
    out = tmp_path / "run"
    shutil.copytree(finished_run[0], out)
    return out


def step_dir(out, step):
    return out / "checkpoints" / f"step-{step:08d}"


# -- the format ---------------------------------------------------------------------------------------------
def test_checkpoint_holds_safetensors_and_json_with_a_verified_manifest(finished_run):
    out, _ = finished_run
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step-00000005", "step-00000010"]
    checkpoint = step_dir(out, 5)
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == sorted(
        [
            "config.json",
            "model.safetensors",
            "optimizer.json",
            "optimizer.safetensors",
            "scheduler.json",
            "trainer_state.json",
            "rng_state_0.json",
            "rng_state_0.safetensors",
            "manifest.json",
        ]
    )
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["format"] == "hf_icl-checkpoint" and manifest["format_version"] == 1
    assert manifest["step"] == 5
    assert manifest["training_args"] == tiny_args(out).to_dict()
    on_disk = {p.name: (sha256(p), p.stat().st_size) for p in checkpoint.iterdir() if p.name != "manifest.json"}
    assert {k: (v["sha256"], v["bytes"]) for k, v in manifest["files"].items()} == on_disk
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 5 and state["seed"] == 0 and state["curriculum"] == {"dims": 3, "points": 6}
    assert [h["step"] for h in state["history"]] == [1, 2, 3, 4, 5]
    # the optimizer: AdamW's moments as tensors, its step counters and hyperparameters in JSON
    tensors = load_file(checkpoint / "optimizer.safetensors")
    structure = json.loads((checkpoint / "optimizer.json").read_text())
    assert structure["param_groups"][0]["lr"] == 3e-3
    first = structure["state"]["__dict__"][0]
    assert first[0] == 0 and tensors[first[1]["step"]["__tensor__"]].item() == 5.0
    assert tensors[first[1]["exp_avg"]["__tensor__"]].abs().sum() > 0
    rng = load_file(checkpoint / "rng_state_0.safetensors")
    assert rng["torch_cpu"].dtype == torch.uint8


def test_every_checkpoint_loads_with_automodel_and_predicts_as_the_training_model(finished_run, tmp_path):
    out, final = finished_run
    at_five = ICLTrainer(tiny_args(tmp_path / "five", max_steps=5, save_steps=0)).train().model.eval()
    args = tiny_args(out)
    xs, ys = build_task(args).sample(16, args.n_points, seed=123)
    for step, reference in ((5, at_five), (10, None)):
        loaded = AutoModel.from_pretrained(step_dir(out, step)).eval()
        if reference is None:  # the final checkpoint holds the final weights
            assert same_weights(weights(loaded), final)
            reference = AutoModel.from_pretrained(out).eval()
        with torch.no_grad():
            assert torch.equal(loaded(xs, ys).predictions, reference(xs, ys).predictions)


def test_save_total_limit_keeps_the_newest_checkpoints(tmp_path):
    ICLTrainer(tiny_args(tmp_path / "run", save_steps=2, save_total_limit=2)).train()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-00000008", "step-00000010"]
    with pytest.raises(ValueError, match="save_total_limit"):
        tiny_args(tmp_path / "x", save_total_limit=0)


# -- no pickle -----------------------------------------------------------------------------------------------
class WritesMarker:
    """Unpickling this creates ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


PICKLED_NAMES = (
    "custom_checkpoint_0.pkl",
    "random_states_0.pkl",
    "optimizer.bin",
    "pytorch_model.bin",
    "scheduler.bin",
)


def test_crafted_pickles_in_a_checkpoint_never_run(run_copy, tmp_path):
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(WritesMarker(probe)))
    assert probe.exists()  # the payload does run when unpickled
    marker = tmp_path / "marker"
    checkpoint = step_dir(run_copy, 5)
    for name in PICKLED_NAMES:
        (checkpoint / name).write_bytes(pickle.dumps(WritesMarker(marker)))
    # not in the manifest: ignored, with a warning
    with pytest.warns(UserWarning, match="custom_checkpoint_0.pkl"):
        resumed = ICLTrainer(tiny_args(run_copy, resume_from_checkpoint=str(checkpoint))).train()
    assert resumed.step == 10 and not marker.exists()
    # listed in a regenerated manifest: still never opened
    rewrite_manifest(checkpoint)
    resumed = ICLTrainer(tiny_args(run_copy, resume_from_checkpoint=str(checkpoint))).train()
    assert resumed.step == 10 and not marker.exists()
    # an accelerate-style checkpoint (pickles, no manifest): a clear error naming the manifest
    legacy = run_copy / "legacy"
    legacy.mkdir()
    for name in PICKLED_NAMES:
        (legacy / name).write_bytes(pickle.dumps(WritesMarker(marker)))
    with pytest.raises(CheckpointError, match="manifest.json is missing"):
        ICLTrainer(tiny_args(run_copy, resume_from_checkpoint=str(legacy))).train()
    # ... and with a forged manifest: the files it needs are missing
    (legacy / "manifest.json").write_text((checkpoint / "manifest.json").read_text())
    rewrite_manifest(legacy)
    with pytest.raises(CheckpointError, match="config.json"):
        ICLTrainer(tiny_args(run_copy, resume_from_checkpoint=str(legacy))).train()
    assert not marker.exists()


# -- integrity -----------------------------------------------------------------------------------------------
def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def rewritten(path, data):
    path.write_bytes(data)
    rewrite_manifest(path.parent)


def zero_bytes_inside(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))


DAMAGE = [
    ("optimizer.safetensors", truncate, "optimizer.safetensors has"),
    ("model.safetensors", zero_bytes_inside, "model.safetensors is corrupted"),
    ("scheduler.json", lambda p: p.unlink(), "scheduler.json listed in manifest.json is missing"),
    ("rng_state_0.json", lambda p: p.write_text("{}"), "rng_state_0.json has"),
    ("manifest.json", lambda p: p.unlink(), "manifest.json is missing"),
    ("manifest.json", lambda p: p.write_text('{"format": "hf_icl-checkpoint", '), "manifest.json is not valid JSON"),
    ("manifest.json", lambda p: p.write_text('{"format": "hf_icl-checkpoint", "format_version": 1}'), "manifest.json"),
    # altered and re-hashed (the manifest matches): still a clear error, never a crash or a silent load
    ("model.safetensors", lambda p: rewritten(p, b"not safetensors"), "model.safetensors is not a valid safetensors"),
    ("optimizer.json", lambda p: rewritten(p, b"[]"), "optimizer or scheduler state does not fit"),
]


@pytest.mark.parametrize("name, damage, message", DAMAGE, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(DAMAGE)])
def test_a_damaged_checkpoint_is_refused_naming_the_file(run_copy, name, damage, message):
    checkpoint = step_dir(run_copy, 5)
    model_before = (run_copy / "model.safetensors").read_bytes()
    damage(checkpoint / name)
    trainer = ICLTrainer(tiny_args(run_copy, resume_from_checkpoint=str(checkpoint)))
    with pytest.raises(CheckpointError, match=message) as caught:
        trainer.train()
    assert "\n" not in str(caught.value)
    assert trainer.progress.step == 0  # nothing was resumed or trained
    assert (run_copy / "model.safetensors").read_bytes() == model_before
    assert not (run_copy / LOCK_FILE).exists()  # released on error


def test_cli_reports_a_corrupted_checkpoint_in_one_line(run_copy, capsys):
    checkpoint = step_dir(run_copy, 10)
    zero_bytes_inside(checkpoint / "optimizer.safetensors")
    argv = ["train", "--n_dims", "3", "--n_points", "6", "--model_size", "tiny", "--max_steps", "12"]
    argv += ["--per_device_train_batch_size", "8", "--learning_rate", "3e-3", "--eval_steps", "0"]
    argv += ["--eval_prompts", "32"]
    argv += ["--save_steps", "5", "--logging_steps", "1", "--report_to", "none", "--disable_tqdm"]
    argv += ["--output_dir", str(run_copy), "--resume_from_checkpoint", "latest"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-icl train: error: checkpoint ") and "\n" not in err
    assert "optimizer.safetensors is corrupted" in err


# -- resuming with changed arguments ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes",
    [
        {"n_dims": 4},
        {"task": "noisy_linear_regression"},
        {"per_device_train_batch_size": 16},
        {"seed": 1, "weight_decay": 0.1},
    ],
    ids=["n_dims", "task", "batch_size", "seed+weight_decay"],
)
def test_resume_refuses_changed_arguments(run_copy, changes):
    saved = tiny_args(run_copy).to_dict()
    trainer = ICLTrainer(tiny_args(run_copy, resume_from_checkpoint="latest", **changes))
    with pytest.raises(ValueError, match="differ from the checkpoint") as caught:
        trainer.train()
    for name, value in changes.items():
        assert f"{name} {saved[name]!r} → {value!r}" in str(caught.value)
    assert "max_steps" in str(caught.value)  # says what may change
    assert trainer.progress.step == 0


def test_extending_train_steps_continues_like_an_uninterrupted_run(run_copy, tmp_path):
    with pytest.warns(UserWarning, match="max_steps 10 → 15"):
        extended = ICLTrainer(tiny_args(run_copy, max_steps=15, resume_from_checkpoint="latest")).train()
    straight = ICLTrainer(tiny_args(tmp_path / "straight", max_steps=15)).train()
    assert extended.step == 15
    assert same_weights(weights(extended.model), weights(straight.model))
    assert [h["step"] for h in extended.history if "train/loss" in h] == list(range(1, 16))  # history carried over
    assert latest_checkpoint(run_copy).name == "step-00000015"


def test_new_learning_rate_and_train_steps_reshape_the_schedule(tmp_path):
    schedule = dict(lr_scheduler_type="linear", warmup_steps=2)
    ICLTrainer(tiny_args(tmp_path / "run", max_steps=6, save_steps=3, **schedule)).train()

    class Recording(ICLTrainer):
        used: list = []

        def _optimizer_step(self, step, generator):
            self.used.append((step, self.optimizer.param_groups[0]["lr"]))
            return super()._optimizer_step(step, generator)

    args = tiny_args(tmp_path / "run", max_steps=12, learning_rate=1e-3, resume_from_checkpoint="latest", **schedule)
    with pytest.warns(UserWarning) as caught:
        Recording(args).train()
    message = " ".join(str(w.message) for w in caught)
    assert "learning_rate 0.003 → 0.001" in message and "max_steps 6 → 12" in message
    # reference: a fresh optimizer with the new rate under the schedule for the new total
    reference = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = get_scheduler("linear", reference, num_warmup_steps=2, num_training_steps=12)
    expected = []
    for step in range(12):
        expected.append((step, reference.param_groups[0]["lr"]))
        reference.step()
        scheduler.step()
    assert [s for s, _ in Recording.used] == list(range(6, 12))
    assert [lr for _, lr in Recording.used] == pytest.approx([lr for _, lr in expected[6:]], rel=1e-12, abs=0)
    assert Recording.used[0][1] != 0 and Recording.used[-1][1] < Recording.used[0][1]


# -- one run per output directory ------------------------------------------------------------------------------
def test_reused_output_dir_is_refused_and_overwrite_replaces_it(run_copy, tmp_path):
    (run_copy / "notes.txt").write_text("mine")
    (run_copy / "hf_icl" / "0").mkdir(parents=True)  # the old run's tensorboard logs
    (run_copy / "hf_icl" / "0" / "events.out.tfevents.1.host").write_bytes(b"old")
    manifest = (step_dir(run_copy, 5) / "manifest.json").read_bytes()
    with pytest.raises(OutputDirError, match="holds another run .*overwrite_output_dir"):
        ICLTrainer(tiny_args(run_copy, max_steps=3)).train()
    assert (step_dir(run_copy, 5) / "manifest.json").read_bytes() == manifest
    with pytest.warns(UserWarning, match="removed the previous run"):
        ICLTrainer(tiny_args(run_copy, max_steps=3, save_steps=0, overwrite_output_dir=True)).train()
    assert [p.name for p in (run_copy / "checkpoints").iterdir()] == ["step-00000003"]
    assert (run_copy / "notes.txt").read_text() == "mine" and not (run_copy / "hf_icl").exists()
    # only what hf_icl writes is removed: a folder named like the log folder but holding code stays
    code = tmp_path / "repo"
    (code / "hf_icl").mkdir(parents=True)
    (code / "hf_icl" / "module.py").write_text("x = 1")
    (code / "config.json").write_text("{}")
    (code / "checkpoints").mkdir()
    (code / "checkpoints" / "keep.txt").write_text("keep")
    ICLTrainer(tiny_args(code, max_steps=2, save_steps=0, overwrite_output_dir=True)).train()
    assert (code / "hf_icl" / "module.py").exists() and (code / "checkpoints" / "keep.txt").exists()
    assert json.loads((run_copy / "training_args.json").read_text())["max_steps"] == 3
    with pytest.raises(ValueError, match="overwrite_output_dir"):
        tiny_args(run_copy, overwrite_output_dir=True, resume_from_checkpoint="latest")


def write_lock(out, pid, host=None):
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "token": "other"}))


def test_a_live_lock_refuses_a_concurrent_run(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        out = tmp_path / "run"
        write_lock(out, sleeper.pid)
        lock_before = (out / LOCK_FILE).read_text()
        with pytest.raises(OutputDirError, match=f"in use by another training run \\(PID {sleeper.pid}"):
            ICLTrainer(tiny_args(out)).train()
        assert (out / LOCK_FILE).read_text() == lock_before and not (out / "checkpoints").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    write_lock(tmp_path / "remote", 1, host="another-host.invalid")  # cannot check a PID elsewhere: refused
    with pytest.raises(OutputDirError, match="another-host.invalid"):
        ICLTrainer(tiny_args(tmp_path / "remote")).train()


def test_a_stale_lock_is_taken_over_and_the_lock_is_held_during_the_run(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    out = tmp_path / "run"
    write_lock(out, finished.pid)

    class Watching(ICLTrainer):
        holders: list = []

        def _optimizer_step(self, step, generator):
            self.holders.append(json.loads((out / LOCK_FILE).read_text())["pid"])
            return super()._optimizer_step(step, generator)

    with pytest.warns(UserWarning, match=f"stale lock .* PID {finished.pid}"):
        result = Watching(tiny_args(out, max_steps=3)).train()
    assert result.step == 3 and set(Watching.holders) == {os.getpid()}
    assert not (out / LOCK_FILE).exists()


# -- random state -------------------------------------------------------------------------------------------
def test_resume_restores_the_random_state_of_dropout(tmp_path):
    dropout = dict(model_overrides='{"resid_pdrop": 0.2, "embd_pdrop": 0.2}', max_steps=8, save_steps=4)
    straight = ICLTrainer(tiny_args(tmp_path / "straight", **dropout)).train()

    class Interrupted(ICLTrainer):
        def _optimizer_step(self, step, generator):
            if step == 6:
                raise KeyboardInterrupt
            return super()._optimizer_step(step, generator)

    with pytest.raises(KeyboardInterrupt):
        Interrupted(tiny_args(tmp_path / "run", **dropout)).train()
    shutil.copytree(tmp_path / "run", tmp_path / "no_rng")
    resumed = ICLTrainer(tiny_args(tmp_path / "run", resume_from_checkpoint="latest", **dropout)).train()
    assert same_weights(weights(resumed.model), weights(straight.model))
    # control: without the saved random state, dropout draws other masks and the run ends elsewhere
    checkpoint = step_dir(tmp_path / "no_rng", 4)
    for path in checkpoint.glob("rng_state_0.*"):
        path.unlink()
    rewrite_manifest(checkpoint)
    with pytest.warns(UserWarning, match="no random state for process 0"):
        blind = ICLTrainer(tiny_args(tmp_path / "no_rng", resume_from_checkpoint="latest", **dropout)).train()
    assert blind.step == 8 and not same_weights(weights(blind.model), weights(straight.model))
