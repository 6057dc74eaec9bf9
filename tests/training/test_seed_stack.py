"""``hf-icl train --seeds N`` (hf_icl.training.seed_stack): every seed bit-identical to its own run, checkpoints of
all seeds that resume bit-identically, a diverging seed named, and ``seeds=1`` exactly the one-seed trainer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from bad_input_rows import assert_rejects, row
from safetensors.torch import load_file

from hf_icl.cli import main
from hf_icl.training import ICLTrainer, ICLTrainingArguments, SeedStackTrainer, TrainingDivergedError, train
from hf_icl.training.manifest import read_manifest
from hf_icl.training.seed_stack import SeedTrainer

RUN = dict(
    task="linear_regression",
    n_dims=3,
    n_points=6,
    model_size="tiny",
    max_steps=4,
    per_device_train_batch_size=4,
    learning_rate=3e-3,
    eval_prompts=8,
    eval_steps=2,
    save_steps=2,
    logging_steps=1,
    report_to="none",
    disable_tqdm=True,
)
#: the files whose bytes must equal a separate run's (training_args.json, manifest.json and the card name output_dir)
SAME_BYTES = ("config.json", "model.safetensors", "metrics.json", "context_scaling.csv")


def args(out: Path, **changes) -> ICLTrainingArguments:
    return ICLTrainingArguments(output_dir=str(out), **{**RUN, **changes})


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_run(stacked: Path, separate: Path) -> None:
    """Two final model folders of the same seed: the same weights (torch.equal) and metrics, bit for bit."""
    a, b = weights(stacked), weights(separate)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in SAME_BYTES:
        assert (stacked / name).read_bytes() == (separate / name).read_bytes(), name


@pytest.mark.parametrize("model_type", ["gpt2_icl", "linear_gpt"])
def test_every_seed_is_bit_identical_to_its_separate_run(tmp_path, model_type, capsys):
    """3 seeds stacked through `hf-icl train --seeds 3` against 3 separate train() runs with --seed 5, 6, 7."""
    stacked = tmp_path / "stacked"
    flags = [f"--{k}={v}" for k, v in {**RUN, "model_type": model_type, "seed": 5}.items()]
    assert main(["train", *flags, "--seeds", "3", "--output_dir", str(stacked)]) == 0
    reported = capsys.readouterr().out
    for seed in (5, 6, 7):
        folder, separate = stacked / f"seed-{seed}", tmp_path / "separate" / f"seed-{seed}"
        result = train(args(separate, model_type=model_type, seed=seed))
        assert_same_run(stacked / f"seed-{seed}", separate)
        saved = json.loads((stacked / f"seed-{seed}" / "training_args.json").read_text())
        assert saved == {**result_args(separate), "output_dir": str(stacked / f"seed-{seed}")}
        assert saved["seed"] == seed and "seeds" not in saved
        model_files = [json.loads((d / "manifest.json").read_text())["files"].keys() for d in (folder, separate)]
        assert model_files[0] == model_files[1]
        assert f'"seed-{seed}"' in reported and result.final_metrics["eval/loss"] > 0
    # one checkpoint per step holding every seed, with one manifest over all of them
    manifest = read_manifest(stacked / "checkpoints" / "step-00000002")
    assert manifest["training_args"]["seeds"] == 3 and manifest["step"] == 2
    assert {name.split("/")[0] for name in manifest["files"]} == {"seed-5", "seed-6", "seed-7"}


def result_args(folder: Path) -> dict:
    return json.loads((folder / "training_args.json").read_text())


def test_resume_is_bit_identical(tmp_path):
    """A stacked run resumed from its step-2 checkpoint (copied elsewhere) ends exactly where the uninterrupted one
    does, every seed."""
    whole = tmp_path / "whole"
    train(args(whole, seeds=2))
    resumed = tmp_path / "resumed"
    shutil.copytree(whole / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    result = SeedStackTrainer(args(resumed, seeds=2, resume_from_checkpoint="latest")).train()
    assert result.step == 4 and result.seeds == [0, 1]
    for seed in (0, 1):
        assert_same_run(resumed / f"seed-{seed}", whole / f"seed-{seed}")
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]
    with pytest.raises(ValueError, match="seed-2/config.json is missing"):  # the number of seeds is part of the run
        train(args(resumed, seeds=3, resume_from_checkpoint="latest"))


def test_one_seed_is_the_one_seed_trainer(tmp_path, monkeypatch):
    """seeds=1 (the default) writes what ICLTrainer wrote before the field existed: the same files, bytes and
    training_args.json without a "seeds" key (so checkpoints of earlier versions resume)."""
    runs = {}
    for name, make in (("plain", lambda a: ICLTrainer(a).train()), ("seeds1", train)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        make(args(Path("run"), seeds=1, max_steps=2))
        runs[name] = {p.relative_to("run").as_posix(): p.read_bytes() for p in Path("run").rglob("*") if p.is_file()}
    plain, seeds1 = runs["plain"], runs["seeds1"]
    assert plain.keys() == seeds1.keys() and "checkpoints/step-00000002/manifest.json" in plain
    assert [name for name in plain if plain[name] != seeds1[name] and not name.endswith(".png")] == []
    assert "seeds" not in json.loads(plain["training_args.json"])
    assert "seeds" not in ICLTrainingArguments().to_dict() and args(tmp_path, seeds=2).to_dict()["seeds"] == 2


def test_a_diverging_seed_stops_the_run_naming_it(tmp_path, monkeypatch):
    draw = SeedTrainer.draw_batch

    def poisoned(self, step, generator):
        xs, ys = draw(self, step, generator)
        return (xs, ys * float("nan")) if self.args.seed == 1 and step >= 3 else (xs, ys)

    monkeypatch.setattr(SeedTrainer, "draw_batch", poisoned)
    out = tmp_path / "run"
    with pytest.raises(TrainingDivergedError, match=r"at step 3 \(seed 1\)") as caught:
        train(args(out, seeds=3))
    step2 = out / "checkpoints" / "step-00000002"
    assert f"resume_from_checkpoint={str(step2)!r}" in str(caught.value)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000002"]  # no step-4.tmp left


@pytest.mark.parametrize(
    "call, error, words",
    [
        row("seeds-0", lambda: ICLTrainingArguments(seeds=0), ["seeds", "0", "[1, +inf)"]),
        row("seeds-float", lambda: ICLTrainingArguments(seeds=2.5), ["seeds", "2.5"]),
        row("seeds-push", lambda: ICLTrainingArguments(seeds=2, push_to_hub=True), ["push_to_hub", "seeds=2"]),
        row("trainer-seeds", lambda: ICLTrainer(ICLTrainingArguments(seeds=2)), ["ICLTrainer", "seeds=2"]),
        row("stack-one-seed", lambda: SeedStackTrainer(ICLTrainingArguments()), ["SeedStackTrainer", "seeds=1"]),
    ],
)
def test_bad_seeds_are_refused(call, error, words):
    assert_rejects(call, error, words)


def test_cli_refuses_seeds_0(tmp_path, capsys):
    try:
        code = main(["train", "--seeds", "0", "--output_dir", str(tmp_path / "run")])
    except SystemExit as stop:
        code = stop.code
    assert code == 2 and not (tmp_path / "run").exists()
    assert "seeds" in capsys.readouterr().err
