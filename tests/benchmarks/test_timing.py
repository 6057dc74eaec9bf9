"""The shared timing helper: run counts, the time budget, the median."""

from hf_icl.benchmarks import emit_markdown, median_seconds


class FakeClock:
    """A clock that only moves when a run says it took time: the tests never depend on the machine's speed."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ticking(clock: FakeClock, seconds_per_call):
    """A run that takes ``seconds_per_call(k)`` seconds of the fake clock on its k-th call, and the list of calls."""
    calls = []

    def run():
        clock.now += seconds_per_call(len(calls))
        calls.append(1)

    return run, calls


def test_median_seconds_runs_warmup_plus_repeats_and_returns_the_median():
    clock = FakeClock()
    durations = [9.0, 9.0, 0.3, 0.1, 0.5, 0.2, 0.4]  # two warm-up runs (not timed), then five timed ones
    run, calls = ticking(clock, durations.__getitem__)
    median = median_seconds(run, 5, "cpu", warmup=2, clock=clock)
    assert len(calls) == 7
    assert abs(median - 0.3) < 1e-12  # the median of 0.3, 0.1, 0.5, 0.2, 0.4


def test_time_budget_stops_repeating_early_but_times_at_least_once():
    clock = FakeClock()
    run, calls = ticking(clock, lambda k: 0.02)
    median_seconds(run, 100, "cpu", warmup=0, budget_s=0.05, clock=clock)
    assert len(calls) == 3  # 0.02, 0.04 < 0.05: one more; 0.06 >= 0.05: stop
    run, calls = ticking(clock, lambda k: 0.02)
    median_seconds(run, 100, "cpu", warmup=0, budget_s=0.0, clock=clock)
    assert len(calls) == 1


def test_emit_markdown_appends_each_call(tmp_path, capsys):
    out = tmp_path / "report.md"
    emit_markdown(["| a |"], str(out))
    emit_markdown(["| b |"], str(out))
    assert out.read_text() == "\n| a |\n\n| b |\n"
    assert "| b |" in capsys.readouterr().out
