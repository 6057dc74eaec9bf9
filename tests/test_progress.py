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


def test_library_bars_are_off_in_a_log_file_and_restored_after(capsys):
    from tqdm import std
    from tqdm.auto import tqdm

    from hf_icl.progress import quiet_library_bars

    original = vars(std.tqdm)["__init__"]
    with quiet_library_bars():  # pytest's captured stderr is no terminal
        for _ in tqdm(range(3), desc="a library's bar"):
            pass
    assert capsys.readouterr().err == ""
    assert vars(std.tqdm)["__init__"] is original
    for _ in tqdm(range(3), desc="outside", mininterval=0):
        pass
    assert "outside" in capsys.readouterr().err


def test_a_command_writes_no_carriage_return_into_a_log_file(tmp_path):
    """``hf-icl dataset`` drives datasets' split and save bars: with stderr a file they stay off."""
    import subprocess
    import sys

    log = tmp_path / "log.txt"
    code = (
        "import sys; from hf_icl.cli import main\n"
        "sys.exit(main(['dataset', '--n-dims', '2', '--n-points', '4', '--n-train', '16', '--n-validation', '0', "
        f"'--n-test', '0', '--cache-dir', {str(tmp_path / 'cache')!r}, '--save-to-disk', {str(tmp_path / 'ds')!r}]))"
    )
    with log.open("w") as stderr:
        subprocess.run([sys.executable, "-c", code], stderr=stderr, stdout=subprocess.DEVNULL, check=True)
    assert (tmp_path / "ds" / "dataset_dict.json").is_file()
    assert b"\r" not in log.read_bytes()  # bytes: read_text would turn \\r into \\n
