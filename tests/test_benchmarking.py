"""The shared timing helper: run counts, the time budget, the median."""

import time

from hf_icl.benchmarks import emit_markdown, median_seconds


def counting_sleeper(seconds: float):
    calls = []

    def run():
        calls.append(1)
        time.sleep(seconds)

    return run, calls


def test_median_seconds_runs_warmup_plus_repeats_and_measures_the_sleep():
    run, calls = counting_sleeper(0.01)
    median = median_seconds(run, 5, "cpu", warmup=2)
    assert len(calls) == 7
    assert 0.009 <= median < 0.05


def test_time_budget_stops_repeating_early_but_times_at_least_once():
    run, calls = counting_sleeper(0.02)
    median_seconds(run, 100, "cpu", warmup=0, budget_s=0.05)
    assert 3 <= len(calls) <= 4  # stops once 0.05 s of timed runs are spent
    run, calls = counting_sleeper(0.02)
    median_seconds(run, 100, "cpu", warmup=0, budget_s=0.0)
    assert len(calls) == 1


def test_emit_markdown_appends_each_call(tmp_path, capsys):
    out = tmp_path / "report.md"
    emit_markdown(["| a |"], str(out))
    emit_markdown(["| b |"], str(out))
    assert out.read_text() == "\n| a |\n\n| b |\n"
    assert "| b |" in capsys.readouterr().out
