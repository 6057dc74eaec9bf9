"""The hf-icl console script: quickstart table, task listing, dataset building, clear errors."""

import datasets
import pytest
import torch

from hf_icl.cli import build_parser, main
from hf_icl.data.tasks import available_tasks


def test_quickstart_prints_one_row_per_context_length(capsys):
    assert main(["quickstart", "--n-dims", "3", "--n-points", "8", "--n-prompts", "200"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| examples"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == [
        "least_squares",
        "optimal_ridge",
        "averaging",
        "knn",
        "zero",
    ]
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8
    last = [float(c) for c in rows[-1].strip("|").split("|")[1:]]
    # with 7 examples in 3 dimensions least squares and Bayes ridge beat the zero predictor clearly
    assert last[0] < 0.5 * last[-1] and last[1] < 0.5 * last[-1]


def test_tasks_lists_every_family(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name in available_tasks():
        assert f"{name}:" in out


def test_dataset_saves_to_disk(tmp_path, capsys):
    target = tmp_path / "saved"
    argv = ["dataset", "--config", "linear_regression", "--n-dims", "2", "--n-points", "4", "--n-train", "6"]
    argv += ["--n-validation", "0", "--n-test", "3", "--cache-dir", str(tmp_path / "c"), "--save-to-disk", str(target)]
    assert main(argv) == 0
    loaded = datasets.load_from_disk(str(target)).with_format("torch")
    assert set(loaded) == {"train", "test"}
    assert loaded["train"][:]["xs"].shape == torch.Size([6, 4, 2])


def test_bad_configuration_is_one_clear_line(capsys):
    assert main(["dataset", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert "family must be one of" in err and "nope" in err


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["quickstart", "--help"])
    assert "(default: 1280)" in capsys.readouterr().out
