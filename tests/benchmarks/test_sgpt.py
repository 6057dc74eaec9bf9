"""`hf-icl bench sgpt` at tiny sizes: the result's structure, a real equality check, the CLI and its flag errors."""

import json
import runpy
import sys

import pytest
import torch
from repo_paths import REPO

from hf_icl.benchmarks import sgpt as bench
from hf_icl.cli import main as cli_main

SCRIPT = REPO / "scripts" / "bench_sgpt.py"
TINY = ["--n-embd", "16", "--n-layer", "2", "--n-head", "2", "--n-points", "8", "--batch", "4", "--repeats", "2"]


def test_tiny_run_reports_every_model_and_both_sections(tmp_path):
    report_path, json_path = tmp_path / "sgpt.md", tmp_path / "sgpt.json"
    report = bench.main([*TINY, "--warmup", "1", "--output", str(report_path), "--json", str(json_path)])
    result = json.loads(json_path.read_text())
    assert report_path.read_text().strip() == report.strip()

    train = result["train_step"]
    assert list(train["rows"]) == ["gpt2_interleaved", "gpt2_concatenated", "sgpt_concatenated"]
    rows = train["rows"]
    for row in rows.values():
        assert row["tokens"] == 16 and row["ms_per_step"] > 0 and row["saved_for_backward_mib"] > 0
        assert row["cuda_step_peak_mib"] is None  # CPU: no peak memory, said in the report
        assert row["label"] in report
    assert rows["gpt2_interleaved"]["speedup_vs_baseline"] == 1.0
    ratio = rows["gpt2_interleaved"]["ms_per_step"] / rows["sgpt_concatenated"]["ms_per_step"]
    assert train["speedup_sgpt_vs_gpt2_interleaved"] == pytest.approx(ratio)
    assert train["target_met"] == (ratio >= bench.TRAIN_STEP_TARGET)
    assert rows["sgpt_concatenated"]["parameters"] < rows["gpt2_interleaved"]["parameters"]

    prefix = result["all_prefix"]
    assert prefix["speedup"] == pytest.approx(prefix["ms_per_prefix"] / prefix["ms_one_pass"])
    assert prefix["max_abs_diff"] < 1e-4 and prefix["outputs_equal"]
    assert prefix["max_abs_prediction"] > 1e-2  # 1e-4 is a real bound, not one that tiny outputs meet anyway
    assert f"{prefix['max_abs_diff']:.2e}" in report
    assert result["config"]["n_embd"] == 16 and result["environment"]["torch"] == torch.__version__


def test_the_equality_check_catches_a_different_function(monkeypatch):
    """The reported difference is computed from the loop's outputs: a loop off by 1e-2 is reported as different."""
    loop = bench.per_prefix_predictions
    monkeypatch.setattr(bench, "per_prefix_predictions", lambda model, xs, ys: loop(model, xs, ys) + 1e-2)
    prefix = bench.all_prefix_section(bench.parse_args([*TINY, "--repeats", "1", "--warmup", "0"]))
    assert prefix["max_abs_diff"] == pytest.approx(1e-2, rel=1e-3)
    assert not prefix["outputs_equal"]


def test_bfloat16_runs_under_autocast_and_still_checks_equality_in_float32():
    report = bench.main([*TINY, "--repeats", "1", "--warmup", "0", "--dtype", "bfloat16"])
    assert "bfloat16 (autocast)" in report
    assert "equal to 0.0001); in the timed bfloat16:" in report


def test_cli_help_and_listing(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "sgpt", "--help"])
    assert exit_info.value.code == 0
    assert "usage: hf-icl bench sgpt" in capsys.readouterr().out
    assert cli_main(["bench"]) == 0
    assert "  sgpt " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "tpu"], "invalid choice: 'tpu'"),
        (["--dtype", "float16"], "invalid choice: 'float16'"),
        (["--n-embd", "0"], "--n-embd must be a positive integer, got 0"),
        (["--n-points", "-3"], "--n-points must be a positive integer, got -3"),
        (["--repeats", "0"], "--repeats must be a positive integer, got 0"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--n-embd", "30", "--n-head", "8"], "--n-embd (30) must be divisible by --n-head (8)"),
    ],
)
def test_bad_flags_exit_with_a_clear_error(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "sgpt", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_an_error(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda"])
    assert "--device cuda: CUDA is not available on this machine" in capsys.readouterr().err


def test_script_is_the_cli_benchmark(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_sgpt.py", "--help"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "usage: hf-icl bench sgpt" in capsys.readouterr().out
