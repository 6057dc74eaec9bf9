"""hf_icl.progress: a bar at a terminal, plain lines (no carriage returns) in a log file, nothing when off."""

import io

from hf_icl.progress import PlainProgress, progress_bar


def test_plain_progress_prints_a_line_per_tenth_and_the_last_without_carriage_returns():
    stream = io.StringIO()
    bar = PlainProgress(25, "niah", stream=stream)
    for done in range(25):
        bar.set_postfix(method="magnitude@0.9", acc=f"{done / 25:.2f}", refresh=False)
        bar.update(1)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert [line.split(",")[0] for line in lines] == [f"niah: {n}/25" for n in (3, 6, 9, 12, 15, 18, 21, 24, 25)]
    assert lines[-1] == "niah: 25/25, method magnitude@0.9, acc 0.96"


def test_a_log_file_gets_plain_lines_and_off_means_silent(capsys):
    bar = progress_bar(4, "perplexity", enabled=True)  # pytest's captured stderr is no terminal
    assert isinstance(bar, PlainProgress)
    for _ in range(4):
        bar.update(1)
    quiet = progress_bar(4, "judge", enabled=False)
    for _ in range(4):
        quiet.update(1)
    quiet.close()
    err = capsys.readouterr().err
    assert "\r" not in err and "perplexity: 4/4" in err and "judge" not in err
