"""hf-icl reproduce: every SGPT experiment's plumbing end to end at a toy scale, reuse of finished runs, the CLI."""

import json
import re
from dataclasses import fields

import pytest
from repo_paths import REPO
from toy_scales import SGPT_TOY as TOY

from hf_icl.cli import main
from hf_icl.reproduce import experiments, reproduce
from hf_icl.reproduce.engine import PAPERS
from hf_icl.reproduce.report import VERDICTS, Claim, Report, RunOptions, comparable, improves
from hf_icl.reproduce.sgpt import EXPERIMENTS


def run_toy(tmp_path, name, capsys=None):
    path = reproduce("sgpt", name, output_dir=tmp_path, scale=TOY, command=f"test {name}")
    return path, json.loads((path.parent / "results.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_a_figure_runs_end_to_end_and_reports_a_verdict_per_claim(tmp_path, name):
    path, summary = run_toy(tmp_path, name)
    text = path.read_text()
    assert summary["claims"] and all(claim["verdict"] in VERDICTS for claim in summary["claims"])
    assert text.count("| **") == len(summary["claims"])  # one table row per claim, verdict in bold
    assert "size: toy" in text and "command: `test " + name in text and "hardware:" in text
    images = re.findall(r"^!\[.*\]\((\S+\.png)\)$", text, flags=re.MULTILINE)
    assert images and all((path.parent / image).is_file() for image in images)
    assert summary["numbers"]


def test_finished_runs_are_reused_with_the_same_numbers(tmp_path, capsys):
    _, first = run_toy(tmp_path, "fig6")
    capsys.readouterr()
    _, second = run_toy(tmp_path, "fig6")
    out = capsys.readouterr().out
    assert out.count("reusing") == 2 and "training" not in out  # the two MLPs; the linear fits are closed-form
    assert second["numbers"] == first["numbers"]


def test_every_figure_is_registered_with_a_runner():
    figures = {f"fig{i}" for i in range(1, 8)}
    assert set(experiments("sgpt")) == figures | {"hilbert", "lengths"} == set(EXPERIMENTS)


def test_claims_and_criteria():
    assert improves([1.0, 0.5]) and not improves([1.0, 0.9]) and not improves([1.0, 1.2])
    assert comparable(1.0, 1.4) and not comparable(1.0, 1.6) and comparable(2.0, 1.5)
    with pytest.raises(ValueError, match="verdict must be one of"):
        Claim("c", "d", "m", "mostly")


def test_cli_rejects_unknown_experiments_and_bad_steps(capsys):
    assert main(["reproduce", "sgpt", "fig9"]) == 2
    assert "experiment must be one of" in capsys.readouterr().err
    assert main(["reproduce", "sgpt", "fig1", "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reproduce", "nopaper", "fig1"])


def test_the_script_is_the_cli_command(monkeypatch, capsys):
    import runpy

    script = REPO / "scripts" / "reproduce_sgpt.py"
    monkeypatch.setattr("sys.argv", [str(script), "fig9"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 2 and "experiment must be one of" in capsys.readouterr().err


@pytest.mark.parametrize("per_position", [False, True])
def test_linear_fit_on_the_scalar_estimate_is_least_squares(per_position):
    import numpy as np
    import torch

    from hf_icl.estimators import get_estimator
    from hf_icl.reproduce.sgpt import LinearOnEstimate

    g = torch.Generator().manual_seed(0)
    xs, ys = (
        torch.randn(200, 6, 3, generator=g, dtype=torch.float64),
        torch.randn(200, 6, generator=g, dtype=torch.float64),
    )
    fit = LinearOnEstimate("exponential", per_position=per_position).fit(xs, ys)
    estimate = get_estimator("nadaraya_watson", kernel="exp")(xs, ys).numpy()  # ψ_exp's label entry
    if per_position:
        # position 0's estimate is constantly 0: the minimum-norm fit is slope 0 and the mean label
        expected = [(0.0, float(ys[:, 0].mean()))] + [
            np.polyfit(estimate[:, i], ys[:, i].numpy(), 1) for i in range(1, 6)
        ]
    else:
        expected = [np.polyfit(estimate.ravel(), ys.numpy().ravel(), 1)] * 6
    slope = fit.slope.expand(6).numpy()
    intercept = fit.intercept.expand(6).numpy()
    for i, (a, b) in enumerate(expected):
        np.testing.assert_allclose([slope[i], intercept[i]], [a, b], rtol=1e-6, atol=1e-9)
    preds = fit(xs.float(), ys.float())
    np.testing.assert_allclose(preds.numpy(), slope * estimate + intercept, rtol=1e-5, atol=1e-5)


def test_a_model_that_learned_nothing_makes_its_claim_untestable():
    from hf_icl.reproduce.report import Subject, judge

    nothing = Subject("SGPT", error=0.95, trivial=1.0)  # above 0.9 × the trivial error
    something = Subject("GPT-2", error=0.85, trivial=1.0)
    for holds in (True, False, None):  # whatever the direction
        verdict, reason = judge(holds, [something, nothing])
        assert verdict == "not testable at this size" and reason.startswith("SGPT learned nothing (0.95")
    assert judge(True, [something]) == ("holds", "") and judge(False, [something]) == ("does not hold", "")
    assert judge(None) == ("not testable at this size", "")
    # a baseline must beat the trivial predictor itself (not 0.9 × it); a NaN error is never testable
    assert judge(True, [Subject("XGBoost", 0.99, 1.0, kind="baseline")])[0] == "holds"
    assert judge(True, [Subject("XGBoost", 1.2, 1.0, kind="baseline")])[0] == "not testable at this size"
    assert judge(True, [Subject("GPT-2", float("nan"), 1.0)])[0] == "not testable at this size"


def test_report_appends_the_reason_to_the_measurement(tmp_path):
    from hf_icl.reproduce.report import Subject

    report = Report("p", "e", "t", "tiny", "cmd", tmp_path)
    claim = report.claim("SGPT beats XGBoost", "yes", "0.86 vs 1.3", True, [Subject("XGBoost", 1.3, 1.0, "baseline")])
    assert claim.verdict == "not testable at this size"
    assert claim.measured == "0.86 vs 1.3 — XGBoost is worse than the trivial predictor (1.3 vs 1)"
    with pytest.raises(ValueError, match="kind must be"):
        Subject("x", 1.0, 1.0, kind="estimator")
    with pytest.raises(ValueError, match="holds must be True, False or None"):
        report.claim("c", "d", "m", "holds")


def test_mlp_steps_apply_to_the_mlp_runs_only(tmp_path, capsys):
    reproduce("sgpt", "fig1", output_dir=tmp_path, scale=TOY, mlp_steps=3)
    out = capsys.readouterr().out
    assert out.count("mlp_icl, 3 steps") == 4 and out.count("gpt2_icl, 2 steps") == 4


@pytest.mark.parametrize("paper", ["sgpt", "linear-attention", "kernel-icl", "gd-icl"])
def test_every_paper_state_carries_the_run_options_it_was_started_with(tmp_path, paper):
    """The options a user passes reach the experiments: each paper's start copies every RunOptions field onto its
    state (the kernel study has the seeds shifted into its scale instead), and the paths and report as given."""
    spec = PAPERS[paper]
    options = RunOptions(seed=3, retrain=True, steps=7, mlp_steps=11 if spec.trains_mlps else None, workers=1)
    report = Report(paper, "x", "t", "toy", "c", tmp_path)
    state = spec.start(spec.cpu, tmp_path / "out", tmp_path / "runs", report, options)
    assert state.output_dir == tmp_path / "out" and state.report is report
    for field in fields(RunOptions):
        assert getattr(state, field.name) == getattr(options, field.name), field.name
    if paper != "sgpt":  # SGPT's runs live in each figure's folder
        assert state.runs_dir == tmp_path / "runs"
