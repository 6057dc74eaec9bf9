"""The hf-icl console script: quickstart table, task listing, dataset building, clear errors."""

import datasets
import pytest
import torch

from hf_icl.cli import build_parser, main
from hf_icl.data.tasks import available_tasks, get_task


def test_compare_prints_one_row_per_context_length(capsys):
    argv = ["compare", "--task-params", '{"noise_std": 0.25}', "--n-dims", "3", "--n-points", "8", "--n-prompts", "200"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    head = "squared error / d (= 3), 5–95% bootstrap band, on 200 prompts of noisy_linear_regression (d=3"
    assert out.startswith(head)
    header = next(line for line in out.splitlines() if line.startswith("| examples"))
    # the default baselines of noisy linear regression, as hf-icl evaluate and the trainer use them
    assert [c.strip() for c in header.strip("|").split("|")][1:] == [
        "least_squares",
        "optimal_ridge",
        "averaging",
        "knn",
        "trivial",
    ]
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8
    last = [float(c.split("[")[0]) for c in rows[-1].strip("|").split("|")[1:]]
    # with 7 examples in 3 dimensions least squares and Bayes ridge beat the zero predictor clearly
    assert last[0] < 0.5 * last[-1] and last[1] < 0.5 * last[-1]


@pytest.mark.parametrize("task", [name for name in available_tasks() if name != "categorical"])
def test_compare_runs_every_family_with_its_defaults(task, capsys):
    assert main(["compare", "--task", task, "--n-points", "4", "--n-prompts", "16"]) == 0
    out = capsys.readouterr().out
    assert f"prompts of {task} (d=" in out and "| 3 |" in out


def test_compare_on_categorical_labels_defaults_to_logistic_regression(capsys):
    argv = ["compare", "--task", "categorical", "--n-points", "4", "--n-prompts", "16"]
    assert main(argv) == 0
    assert "logistic_regression" in capsys.readouterr().out
    assert main([*argv, "--estimators", "knn"]) == 0
    assert "accuracy, 5–95% bootstrap band" in capsys.readouterr().out


def test_compare_numbers_are_evaluate_context_scaling_s(capsys):
    from hf_icl.evaluation import evaluate_context_scaling
    from hf_icl.evaluation.baselines import default_baselines

    assert main(["compare", "--task", "decision_tree", "--n-dims", "4", "--n-points", "5", "--n-prompts", "30"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("squared error / 1, ")  # trees' leaves are N(0, 1): the normaliser is 1, not d
    task = get_task("decision_tree", n_dims=4)
    expected = evaluate_context_scaling(default_baselines(task), task, n_prompts=30, n_points=5, seed=0)
    assert expected.to_markdown() in out


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
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--curriculum_dims_start" in capsys.readouterr().out


def test_train_then_evaluate(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("task: noisy_linear_regression\ntask_params: {noise_std: 0.1}\nn_dims: 3\nn_points: 6\n")
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--model_size", "tiny", "--max_steps", "3"]
    argv += ["--per_device_train_batch_size", "4"]
    argv += ["--eval_prompts", "16", "--report_to", "none", "--disable_tqdm", "--output_dir", str(out)]
    assert main(argv) == 0
    assert (out / "model.safetensors").exists() and (out / "training_args.json").exists()
    capsys.readouterr()
    plot = tmp_path / "curve.png"
    argv = ["evaluate", "--model", str(out), "--estimators", "least_squares,optimal_ridge", "--n-prompts", "64"]
    assert main([*argv, "--plot", str(plot)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| examples"))
    assert "gpt2_icl" in header and "optimal_ridge" in header  # the curve is named by its model
    assert plot.stat().st_size > 5_000
    assert main(["evaluate", "--model", str(out), "--ood", "scaled_x", "--n-prompts", "32"]) == 0


def test_quickstart_trains_saves_and_reloads_identically(tmp_path, capsys):
    code = main(["quickstart", "--output-dir", str(tmp_path / "qs"), "--max-steps", "20", "--n-prompts", "64"])
    out = capsys.readouterr().out
    assert "reload gives identical predictions: True" in out
    assert code in (0, 1)  # 20 steps train too little to pass the accuracy checks; the report says which
    assert out.count("PASS") + out.count("FAIL") == 3
    card = (tmp_path / "qs" / "README.md").read_text()
    assert "context_scaling.png" in card and "least_squares" in card
    assert (tmp_path / "qs" / "context_scaling.png").exists()


def test_version_prints_the_package_version(capsys):
    import hf_icl

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"hf-icl {hf_icl.__version__}"


def test_the_quickstart_runs_on_its_own_thread_count_whatever_the_callers(tmp_path):
    """Seeded numbers that do not depend on the machine: the caller's torch thread count neither changes the result
    nor is changed by the run."""
    import torch

    from hf_icl.quickstart import QUICKSTART_THREADS, run_quickstart

    previous = torch.get_num_threads()
    curves = []
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            report = run_quickstart(tmp_path / f"qs{threads}", max_steps=6, eval_prompts=32, logging_steps=3)
            assert torch.get_num_threads() == threads  # restored
            curves.append(report.result.values)
    finally:
        torch.set_num_threads(previous)
    assert QUICKSTART_THREADS == 1
    assert curves[0].keys() == curves[1].keys()
    assert all(torch.equal(curves[0][name], curves[1][name]) for name in curves[0])
