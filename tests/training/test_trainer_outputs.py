"""What a training run leaves behind and where it goes: metrics.json, the per-position CSV, TensorBoard's
curves and window-averaged loss, a card whose snippet runs, training from a saved dataset, and the Hub push."""

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_helpers import install_fake_hub
from training_helpers import tiny_args

from hf_icl.data.builders import ICLTasks
from hf_icl.evaluation.runs import read_metrics
from hf_icl.training import ICLTrainer, train
from hf_icl.training.hub import HubAccessError


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tb") / "run"
    result = train(tiny_args(out, max_steps=6, logging_steps=3, save_steps=0, report_to="tensorboard"))
    return out, result


def test_metrics_json_and_csv_hold_the_final_curves(tensorboard_run):
    out, result = tensorboard_run
    document = read_metrics(out / "metrics.json")
    assert document["model"] == "gpt2_icl" and document["task"] == "linear_regression"
    assert document["scalars"]["steps"] == 6
    assert document["scalars"]["eval/loss"] == pytest.approx(result.final_metrics["eval/loss"])
    entry = document["evaluations"]["standard"]
    scaling = result.context_scaling
    assert set(entry["predictors"]) == set(scaling.predictors)
    for name in scaling.predictors:
        assert entry["predictors"][name]["mean"] == pytest.approx(scaling.values[name].tolist())
    with (out / "context_scaling.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert len(rows) == len(scaling.predictors) * scaling.n_points
    for row in rows:
        expected = scaling.values[row["predictor"]][int(row["n_examples"])].item()
        assert float(row["mean"]) == pytest.approx(expected)


def _scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for events in out.glob("hf_icl/**/events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return found


def test_tensorboard_gets_every_predictor_s_per_position_curve(tensorboard_run):
    out, result = tensorboard_run
    scalars = _scalars(out)
    scaling = result.context_scaling
    for name in scaling.predictors:
        curve = sorted(scalars[f"context_scaling/{name}"])
        assert [step for step, _ in curve] == list(range(scaling.n_points))
        assert [value for _, value in curve] == pytest.approx(scaling.values[name].tolist(), rel=1e-6)
    logged = sorted(scalars["train/loss"])
    assert [step for step, _ in logged] == [3, 6]


def test_logged_loss_is_the_mean_over_the_logging_window(tmp_path):
    every_step = train(tiny_args(tmp_path / "a", max_steps=6, logging_steps=1, save_steps=0))
    windowed = train(tiny_args(tmp_path / "b", max_steps=6, logging_steps=3, save_steps=0))
    losses = [r["train/loss"] for r in every_step.history if "train/loss" in r]
    means = [r["train/loss"] for r in windowed.history if "train/loss" in r]
    assert len(losses) == 6 and len(means) == 2
    assert means == pytest.approx([sum(losses[:3]) / 3, sum(losses[3:]) / 3], rel=1e-6)


def test_the_card_snippet_of_a_freshly_trained_model_runs_as_written(tensorboard_run):
    out, _ = tensorboard_run
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: hf_icl" in card and "model-index" in card
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert str(out) in snippet  # it loads the folder it describes
    ran = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    line = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"squared_error/d with 5 examples: model \d+\.\d{4}, least squares \d+\.\d{4}", line), line


def _saved_dataset(root: Path, n_dims: int = 3, n_points: int = 6, family: str = "linear_regression") -> Path:
    builder = ICLTasks(
        config_name=family, n_dims=n_dims, n_points=n_points, n_prompts={"train": 24}, cache_dir=str(root / "c")
    )
    builder.download_and_prepare()
    target = root / f"data-{family}-{n_dims}"
    builder.as_dataset().save_to_disk(str(target))
    return target


def test_training_from_a_saved_dataset_draws_only_its_prompts(tmp_path):
    data = _saved_dataset(tmp_path)
    trainer = ICLTrainer(tiny_args(tmp_path / "run", train_dataset=str(data), max_steps=3, save_steps=0))
    pool = trainer.saved_prompts.xs
    generator = torch.Generator().manual_seed(0)
    xs, ys = trainer.draw_batch(0, generator)
    assert xs.shape == (8, 6, 3)
    for x, y in zip(xs, ys, strict=True):  # every drawn prompt is a row of the dataset, labels included
        row = int(torch.nonzero((pool == x).flatten(1).all(1))[0])
        assert torch.equal(trainer.saved_prompts.ys[row], y)
    result = trainer.train()
    assert result.step == 3
    card = (tmp_path / "run" / "README.md").read_text()
    assert "datasets:" in card and str(data.name) in card


def test_a_saved_dataset_of_another_task_is_refused_before_training(tmp_path):
    data = _saved_dataset(tmp_path, n_dims=4)
    with pytest.raises(ValueError, match="n_dims: dataset 4 vs arguments 3"):
        ICLTrainer(tiny_args(tmp_path / "run", train_dataset=str(data)))
    noisy = _saved_dataset(tmp_path, family="noisy_linear_regression")
    with pytest.raises(ValueError, match="name: dataset 'noisy_linear_regression' vs arguments 'linear_regression'"):
        ICLTrainer(tiny_args(tmp_path / "run", train_dataset=str(noisy)))
    with pytest.raises(ValueError, match="is not a dataset saved with save_to_disk"):
        ICLTrainer(tiny_args(tmp_path / "run", train_dataset=str(tmp_path)))
    with pytest.raises(ValueError, match="train_dataset_split='validation' is not a split"):
        ICLTrainer(tiny_args(tmp_path / "run", train_dataset=str(noisy), train_dataset_split="validation"))
    with pytest.raises(ValueError, match="n_points=8 is more than the 6 examples"):
        ICLTrainer(tiny_args(tmp_path / "run", train_dataset=str(_saved_dataset(tmp_path)), n_points=8))
    with pytest.raises(ValueError, match="curriculum_dims_start=2 with train_dataset"):
        tiny_args(tmp_path / "run", train_dataset=str(data), curriculum_dims_start=2)


def test_a_mismatched_saved_dataset_is_refused_from_its_metadata_before_any_work(tmp_path):
    """The prompt length and the task are read from the dataset's JSON metadata: `hf-icl train` refuses a mismatch
    before importing `datasets` or reading a prompt (it took 18 s of CPU before)."""
    import subprocess
    import sys

    from hf_icl.data.saved_prompts import check_saved_dataset_early

    data = _saved_dataset(tmp_path)
    family = {"name": "linear_regression", "n_dims": 3, "inputs": {"name": "gaussian", "scale": 1.0}}
    family.update({"n_tasks": None, "pool_seed": 0, "weight_prior": "standard", "scale": 1.0})
    check_saved_dataset_early(data, "train", family, 6)  # the dataset's own task and length: accepted
    code = (
        "import sys\n"
        "from hf_icl.cli import main\n"
        f"code = main(['train', '--output_dir', {str(tmp_path / 'run')!r}, '--model_size', 'tiny', '--max_steps', '3',"
        f" '--n_dims', '3', '--n_points', '8', '--train_dataset', {str(data)!r}])\n"
        "print(code, 'datasets' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr  # datasets never imported
    assert "--n_points 8 is more than the 6 examples" in result.stderr


@pytest.fixture
def fake_hub(monkeypatch):
    return install_fake_hub(monkeypatch)


def test_push_to_hub_uploads_the_model_folder_without_checkpoints(tmp_path, fake_hub):
    out = tmp_path / "run"
    args = tiny_args(out, max_steps=4, save_steps=2, push_to_hub=True, hub_model_id="me/tiny-icl")
    train(args)
    names = [name for name, _ in fake_hub.calls]
    assert names[0] == "whoami" and names[-2:] == ["create_repo", "upload_folder"]
    upload = fake_hub.calls[-1][1]
    assert upload["repo_id"] == "me/tiny-icl" and Path(upload["folder_path"]) == out
    files = upload["files"]
    for expected in ("config.json", "model.safetensors", "README.md", "training_args.json", "metrics.json"):
        assert expected in files
    assert "context_scaling.png" in files and "context_scaling.csv" in files
    assert not [f for f in files if f.startswith("checkpoints/") or "lock" in f]
    assert (out / "checkpoints").is_dir()  # checkpoints exist, and stayed home
    assert 'model_id = "me/tiny-icl"' in (out / "README.md").read_text()


def test_push_to_hub_offline_or_logged_out_fails_before_any_work(tmp_path, fake_hub, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubAccessError, match="offline"):
        ICLTrainer(tiny_args(out, push_to_hub=True, hub_model_id="me/x"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr("hf_icl.training.hub.get_token", lambda: None)
    with pytest.raises(HubAccessError, match="not logged in"):
        ICLTrainer(tiny_args(out, push_to_hub=True, hub_model_id="me/x"))
    assert not out.exists() and fake_hub.calls == []
