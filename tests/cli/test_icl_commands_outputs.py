"""``hf-icl evaluate`` writes metrics.json and CSV (and runs Garg's suite), ``hf-icl push`` publishes a folder."""

import csv
import json

import pytest
from hub_helpers import install_fake_hub
from training_helpers import tiny_args

from hf_icl.cli import main
from hf_icl.evaluation import read_runs
from hf_icl.evaluation.garg_suite import GARG_EVALUATIONS
from hf_icl.evaluation.runs import read_metrics
from hf_icl.training import train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny-run"
    train(tiny_args(out, max_steps=3, save_steps=0))
    return out


def test_evaluate_writes_metrics_json_and_csv_and_keeps_earlier_evaluations(trained, tmp_path, capsys):
    out = tmp_path / "eval"
    common = ["evaluate", "--model", str(trained), "--n-prompts", "32", "--output-dir", str(out)]
    assert main([*common, "--estimators", "least_squares"]) == 0
    assert main([*common, "--estimators", "least_squares", "--ood", "scaled_x"]) == 0
    printed = capsys.readouterr().out
    document = read_metrics(out / "metrics.json")
    assert set(document["evaluations"]) == {"standard", "scaled_x"}
    assert document["model"] == "gpt2_icl"
    # the printed table's last row is the stored curve's last position
    last_row = [line for line in printed.split("scaled_x")[0].splitlines() if line.startswith("| 5 ")][0]
    stored = document["evaluations"]["standard"]["predictors"]["least_squares"]["mean"][-1]
    assert f"{stored:.4g}"[:4] in last_row
    with (out / "context_scaling_scaled_x.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    curves = document["evaluations"]["scaled_x"]["predictors"]
    assert len(rows) == sum(len(c["mean"]) for c in curves.values())
    for row in rows:
        assert float(row["mean"]) == pytest.approx(curves[row["predictor"]]["mean"][int(row["n_examples"])])
    table = read_runs(tmp_path)
    assert set(table["evaluation"]) == {"standard", "scaled_x"}


def test_evaluate_default_output_dir_is_named_after_the_model(trained, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--model", str(trained), "--n-prompts", "16", "--estimators", "averaging"]) == 0
    assert (tmp_path / "outputs" / "evaluate" / "tiny-run" / "metrics.json").is_file()


def test_evaluate_suite_garg_runs_every_shift_once_then_reads_the_cache(trained, tmp_path, capsys):
    out = tmp_path / "garg"
    argv = ["evaluate", "--model", str(trained), "--suite", "garg", "--n-prompts", "16", "--output-dir", str(out)]
    assert main([*argv, "--estimators", "least_squares"]) == 0
    document = json.loads((out / "metrics.json").read_text())
    expected = set(GARG_EVALUATIONS)  # test_garg_suite.py checks these names against Garg et al.'s list
    assert set(document["evaluations"]) == expected
    for name in expected:
        assert (out / f"garg_{name}.png").is_file()
    first = (out / "metrics.json").read_text()
    capsys.readouterr()
    assert main([*argv, "--estimators", "least_squares"]) == 0
    assert "computed" not in capsys.readouterr().err  # everything came from metrics.json
    assert (out / "metrics.json").read_text() == first
    assert main([*argv, "--ood", "scaled_x"]) == 2  # a suite already runs every shift


def test_push_publishes_a_trained_folder(trained, monkeypatch, capsys):
    hub = install_fake_hub(monkeypatch)
    assert main(["push", str(trained), "me/tiny", "--private"]) == 0
    assert capsys.readouterr().out.strip() == "https://huggingface.co/me/tiny/commit/abc"
    (name, create), (_, upload) = hub.calls[-2:]
    assert name == "create_repo" and create["private"] is True and create["repo_id"] == "me/tiny"
    assert {"config.json", "model.safetensors", "README.md", "metrics.json"} <= set(upload["files"])


def test_push_fails_in_one_line_offline_or_on_a_bad_folder(trained, tmp_path, monkeypatch, capsys):
    hub = install_fake_hub(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["push", str(trained), "me/tiny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "offline" in err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert main(["push", str(tmp_path), "me/tiny"]) == 2
    assert "lacks" in capsys.readouterr().err
    assert main(["push", str(trained), "not a repo id!"]) == 2
    assert hub.calls == []
