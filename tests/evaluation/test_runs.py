"""The metrics.json format (write_metrics / read_metrics / evaluation_entry / write_curve_csv) and read_runs over a
tree of runs, checked against rows built by hand from the files' contents; and read_runs tying an hf-icl evaluate
output to the training run of the model it evaluated."""

import csv
import json
import shutil

import pytest
import torch
from training_helpers import tiny_args

from hf_icl.cli import main
from hf_icl.data.tasks import get_task
from hf_icl.estimators import get_estimator
from hf_icl.evaluation import (
    evaluate_context_scaling,
    evaluation_entry,
    read_metrics,
    read_runs,
    result_from_entry,
    write_curve_csv,
    write_metrics,
)
from hf_icl.evaluation.runs import METRICS_FORMAT, RUN_COLUMNS, model_identity
from hf_icl.training import train


def entry(curves, *, metric="squared_error/d", n_prompts=10, seed=0):
    """A hand-made evaluation entry: ``curves`` maps predictors to mean values; the band is mean ± 0.1."""
    return {
        "metric": metric,
        "n_prompts": n_prompts,
        "seed": seed,
        "predictors": {
            name: {"mean": list(means), "lower": [m - 0.1 for m in means], "upper": [m + 0.1 for m in means]}
            for name, means in curves.items()
        },
    }


@pytest.fixture
def two_runs(tmp_path):
    write_metrics(
        tmp_path / "linear" / "metrics.json",
        {"standard": entry({"gpt2_icl": [1.0, 0.5, 0.25], "trivial": [1.0, 1.0, 1.0]})},
        model="gpt2_icl",
        task="linear_regression",
        scalars={"final_loss": 0.125, "steps": 400},
        n_dims=3,
    )
    write_metrics(
        tmp_path / "sweep" / "seed_1" / "metrics.json",
        {
            "scale-x=2": entry({"sgpt": [0.9, 0.8]}, n_prompts=20, seed=1),
            "accuracy_eval": entry({"sgpt": [0.5, 0.75]}, metric="accuracy", n_prompts=20, seed=1),
        },
        model="sgpt",
        task="linear_classification",
    )
    (tmp_path / "linear" / "notes.txt").write_text("not a metrics file")
    return tmp_path


def test_read_runs_has_one_row_per_run_evaluation_predictor_and_position(two_runs):
    table = read_runs(two_runs)
    assert list(table.columns[: len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    expected = []  # built from the same numbers the fixture wrote
    for run, model, task, evaluations in [
        (
            "linear",
            "gpt2_icl",
            "linear_regression",
            {"standard": ({"gpt2_icl": [1.0, 0.5, 0.25], "trivial": [1.0, 1.0, 1.0]}, "squared_error/d", 10, 0)},
        ),
        (
            "sweep/seed_1",
            "sgpt",
            "linear_classification",
            {
                "scale-x=2": ({"sgpt": [0.9, 0.8]}, "squared_error/d", 20, 1),
                "accuracy_eval": ({"sgpt": [0.5, 0.75]}, "accuracy", 20, 1),
            },
        ),
    ]:
        for evaluation, (curves, metric, n_prompts, seed) in evaluations.items():
            for predictor, means in curves.items():
                for i, mean in enumerate(means):
                    expected.append(
                        (
                            run,
                            evaluation,
                            predictor,
                            i,
                            mean,
                            mean - 0.1,
                            mean + 0.1,
                            metric,
                            n_prompts,
                            seed,
                            model,
                            task,
                        )
                    )
    columns = [*RUN_COLUMNS, "n_prompts", "seed", "model", "task"]
    got = [tuple(row) for row in table[columns].itertuples(index=False)]
    assert sorted(got) == sorted(expected)
    linear = table[table.run == "linear"]
    assert set(linear.final_loss) == {0.125} and set(linear.steps) == {400} and set(linear.n_dims) == {3}
    assert table[table.run == "sweep/seed_1"].final_loss.isna().all()  # no such scalar in that run
    assert "format" not in table.columns


def test_read_runs_reads_a_run_at_the_root_and_an_empty_tree(tmp_path):
    assert list(read_runs(tmp_path).columns) == list(RUN_COLUMNS) and read_runs(tmp_path).empty
    write_metrics(tmp_path / "metrics.json", {"standard": entry({"knn": [0.3]})})
    table = read_runs(tmp_path)
    assert table.run.tolist() == ["."] and table.value.tolist() == [0.3]
    assert table.model.isna().all()  # model=None is kept as a missing value


def test_bad_directories_and_foreign_files_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="directory '.*missing' is not a directory"):
        read_runs(tmp_path / "missing")
    a_file = tmp_path / "file.json"
    a_file.write_text("{}")
    with pytest.raises(ValueError, match="file.json' is not a directory"):
        read_runs(a_file)
    garg = tmp_path / "runs" / "garg_run" / "metrics.json"  # Garg et al.'s own metrics.json layout
    garg.parent.mkdir(parents=True)
    garg.write_text(json.dumps({"standard": {"Transformer": {"mean": [1.0], "bootstrap_low": [0.9]}}}))
    with pytest.raises(ValueError, match=f"metrics file {garg} has format None, expected '{METRICS_FORMAT}'"):
        read_runs(tmp_path / "runs")
    garg.write_text("{not json")
    with pytest.raises(ValueError, match=f"metrics file {garg} is not valid JSON"):
        read_metrics(garg)


def test_write_metrics_validates_and_read_metrics_round_trips(tmp_path):
    path = tmp_path / "out" / "metrics.json"
    evaluations = {"standard": entry({"a": [1.0, 2.0]})}
    assert write_metrics(path, evaluations, model="m", task="t", scalars={"steps": 3}, note="x") == path
    document = read_metrics(path)
    assert document == {
        "format": METRICS_FORMAT,
        "model": "m",
        "task": "t",
        "note": "x",
        "evaluations": evaluations,
        "scalars": {"steps": 3},
    }
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]  # the temporary file is gone
    with pytest.raises(ValueError, match="predictor 'a' has curves of different lengths"):
        bad = entry({"a": [1.0, 2.0]})
        bad["predictors"]["a"]["upper"] = [1.0]
        write_metrics(path, {"standard": bad})
    with pytest.raises(ValueError, match="evaluation 'standard' needs 'n_prompts' of type int"):
        write_metrics(path, {"standard": {**entry({"a": [1.0]}), "n_prompts": "ten"}})
    with pytest.raises(ValueError, match="not plain finite JSON values"):
        write_metrics(path, {"standard": entry({"a": [float("nan")]})})
    with pytest.raises(ValueError, match="metadata must not use the reserved keys \\['format'\\]"):
        write_metrics(path, evaluations, format="other")
    assert read_metrics(path) == document  # failed writes left the file as it was


def test_evaluation_entry_and_back_keep_the_curves_metric_and_band():
    result = evaluate_context_scaling(
        {"least_squares": get_estimator("least_squares")},
        get_task("sparse_linear_regression", n_dims=4, sparsity=2),
        n_prompts=40,
        n_points=6,
    )
    stored = evaluation_entry(result, seed=0, evaluated_task="sparse_linear_regression")
    assert (stored["metric"], stored["normalizer"], stored["n_prompts"]) == ("squared_error/s", 2.0, 40)
    back = result_from_entry(json.loads(json.dumps(stored)), "sparse")
    assert back.predictors == result.predictors and back.metric == result.metric
    for name in result.predictors:
        for ours, theirs in ((back.values, result.values), (back.lower, result.lower), (back.upper, result.upper)):
            torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0)
    assert back.to_markdown() == result.to_markdown()


def test_write_curve_csv_writes_every_predictor_and_position(tmp_path):
    stored = entry({"a": [1.0, 0.5], "trivial": [2.0, 2.0]})
    path = write_curve_csv(tmp_path / "curve.csv", stored)
    with path.open() as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == ["n_examples", "predictor", "mean", "lower", "upper"]
    got = [(int(r["n_examples"]), r["predictor"], float(r["mean"]), float(r["lower"]), float(r["upper"])) for r in rows]
    assert got == [(i, name, m, m - 0.1, m + 0.1) for name, ms in [("a", [1.0, 0.5]), ("trivial", [2.0, 2.0])]
                   for i, m in enumerate(ms)]  # fmt: skip
    result = result_from_entry(stored)
    assert write_curve_csv(tmp_path / "from_result.csv", result).read_text() == path.read_text()


def evaluate(model, output_dir) -> None:
    """``hf-icl evaluate`` of a model folder, cheaply (16 prompts, one estimator)."""
    flags = ["--n-prompts", "16", "--estimators", "least_squares", "--output-dir", str(output_dir)]
    assert main(["evaluate", "--model", str(model), *flags]) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny"
    train(tiny_args(out, max_steps=3, save_steps=0))
    return out


def test_read_runs_ties_an_evaluation_to_its_training_run_until_the_model_is_retrained(tmp_path, capsys):
    model, evaluation = tmp_path / "tiny", tmp_path / "a-eval"  # the evaluation's folder sorts first
    train(tiny_args(model, max_steps=3, save_steps=0))
    evaluate(model, evaluation)
    table = read_runs(tmp_path)
    assert table.run.unique().tolist() == ["tiny", "a-eval"]  # the evaluation sits right after its run
    assert set(table.model_run) == {"tiny"}  # the run's own rows too: groupby("model_run") gathers them
    assert set(table[table.run == "a-eval"].model_folder) == {str(model.resolve())}

    with pytest.warns(UserWarning, match="overwrite_output_dir"):  # other weights in the same folder
        train(tiny_args(model, max_steps=3, save_steps=0, seed=1, overwrite_output_dir=True))
    table = read_runs(tmp_path)
    assert set(table[table.run == "a-eval"].model_run) == {"tiny (retrained since)"}
    assert set(table[table.run == "tiny"].model_run) == {"tiny"}

    evaluate(model, evaluation)  # evaluating again records the new model
    assert set(read_runs(tmp_path).model_run) == {"tiny"}


def test_read_runs_says_when_an_evaluated_model_folder_was_not_read(trained, tmp_path, capsys):
    evaluate(trained, tmp_path / "eval")
    table = read_runs(tmp_path)
    assert set(table.model_run) == {f"{trained.resolve()} (not read)"}
    assert set(table.model_identity) == {model_identity(trained)}


def test_model_identity_is_the_same_from_the_manifest_or_from_the_files(trained, tmp_path):
    copy = shutil.copytree(trained, tmp_path / "copy")
    (copy / "manifest.json").unlink()  # hashed from the files now
    assert model_identity(copy) == model_identity(trained)
    (copy / "model.safetensors").write_bytes((copy / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    assert model_identity(copy) != model_identity(trained)
