"""Garg et al.'s evaluation suite on a tiny GPT-2: every evaluation written, numbers that least squares must
produce, the cache (reruns compute only what is missing), figures, the summary table and progress lines."""

import json
import shutil

import pytest
import torch

from hf_icl.data.inputs import CovarianceGaussianInputs, GaussianInputs
from hf_icl.data.tasks import LinearRegression, NoisyLinearRegression, get_task
from hf_icl.estimators import get_estimator
from hf_icl.evaluation import GARG_EVALUATIONS, evaluate_context_scaling, garg_evaluations, read_metrics, run_garg_suite
from hf_icl.evaluation.garg_suite import GargEvaluation
from hf_icl.modeling import GPT2ForInContextRegression, GPT2ICLConfig

N_DIMS, N_POINTS, N_PROMPTS = 3, 8, 32
GARG_NAMES = [
    "standard",
    "random_quadrants",
    "orthogonal_train_test",
    "overlapping_train_test",
    "half_subspace",
    "skewed",
    *(f"scale-x={k}" for k in ("0.333", "0.5", "2", "3")),
    *(f"scale-y={k}" for k in ("0.333", "0.5", "2", "3")),
    "noisyLR",
]


def tiny_model(n_dims=N_DIMS, n_points=N_POINTS):
    torch.manual_seed(0)
    return GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=n_dims, n_points=n_points))


def linear_family():
    return get_task("linear_regression", n_dims=N_DIMS)


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    """One full suite run (model + least squares), shared; tests that change files work on a copy."""
    output_dir = tmp_path_factory.mktemp("garg") / "run"
    metrics = run_garg_suite(
        tiny_model(), linear_family(), output_dir, n_prompts=N_PROMPTS, estimators=["least_squares"], progress=False
    )
    return output_dir, metrics


def copy_run(suite_run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(suite_run[0], target)
    return target


class EvaluationSpy:
    """Records which (evaluation, predictors) ``GargEvaluation.evaluate`` computes; can fail at one of them."""

    def __init__(self, monkeypatch, fail_at=None):
        self.calls = []
        original = GargEvaluation.evaluate
        spy = self

        def evaluate(evaluation, predictors, family, **kwargs):
            if evaluation.name == fail_at:
                raise KeyboardInterrupt("interrupted")
            spy.calls.append((evaluation.name, sorted(predictors)))
            return original(evaluation, predictors, family, **kwargs)

        monkeypatch.setattr(GargEvaluation, "evaluate", evaluate)


# -- which evaluations, on which families --------------------------------------------------------------


def test_the_suite_of_linear_regression_is_garg_build_evals_in_order():
    assert list(GARG_EVALUATIONS) == GARG_NAMES
    assert list(garg_evaluations(linear_family())) == GARG_NAMES
    assert list(garg_evaluations("relu_2nn_regression")) == ["standard", "linear_regression"]
    for other in ("decision_tree", "sparse_linear_regression", {"name": "noisy_linear_regression", "n_dims": 2}):
        assert list(garg_evaluations(other)) == ["standard"]
    with pytest.raises(ValueError, match="unknown task family 'linear'"):
        garg_evaluations("linear")


def test_each_evaluation_derives_the_family_garg_uses():
    family = get_task("linear_regression", n_dims=4)
    assert GARG_EVALUATIONS["standard"].task(family) == family
    half = GARG_EVALUATIONS["half_subspace"].task(family).inputs
    assert isinstance(half, CovarianceGaussianInputs) and half.spectrum == (2.0, 2.0, 0.0, 0.0)  # E‖x‖² = d
    skewed = GARG_EVALUATIONS["skewed"].task(family).inputs.spectrum
    raw = [1 / i**2 for i in range(1, 5)]
    assert skewed == pytest.approx([4 * v / sum(raw) for v in raw])
    assert GARG_EVALUATIONS["scale-x=0.333"].task(family).inputs == GaussianInputs(scale=0.333)
    assert GARG_EVALUATIONS["scale-y=3"].task(family).scale == 3.0
    noisy = GARG_EVALUATIONS["noisyLR"].task(family)
    assert isinstance(noisy, NoisyLinearRegression)
    assert (noisy.noise_std, noisy.renormalize_ys) == (1.0, "fixed")
    assert noisy.renormalization == pytest.approx((4 / 5) ** 0.5)  # Garg's √d / std(y) with std(y)² = d + 1
    relu = get_task("relu_2nn_regression", n_dims=4, inputs=GaussianInputs(scale=2.0))
    plain = garg_evaluations(relu)["linear_regression"].task(relu)
    assert type(plain) is LinearRegression and plain.n_dims == 4 and plain.inputs == GaussianInputs(scale=2.0)


# -- one full run ---------------------------------------------------------------------------------------


def test_every_evaluation_is_written_with_every_predictor(suite_run):
    output_dir, metrics = suite_run
    stored = read_metrics(output_dir / "metrics.json")
    assert stored == metrics
    assert (stored["model"], stored["task"]) == ("gpt2_icl", "linear_regression")
    assert list(stored["evaluations"]) == GARG_NAMES
    for name, entry in stored["evaluations"].items():
        assert (entry["n_prompts"], entry["seed"], entry["metric"]) == (N_PROMPTS, 0, "squared_error/d")
        expected = {"gpt2_icl", "least_squares", "trivial"}
        assert set(entry["predictors"]) == expected, name
        length = N_DIMS if name == "orthogonal_train_test" else N_POINTS  # Garg: min(n_points, d)
        for curve in entry["predictors"].values():
            assert [len(curve[f]) for f in ("mean", "lower", "upper")] == [length] * 3, name
            assert all(
                lo <= m + 1e-12 and m <= up + 1e-12
                for lo, m, up in zip(curve["lower"], curve["mean"], curve["upper"], strict=True)
            )


def test_least_squares_numbers_are_what_each_shift_implies(suite_run):
    evaluations = suite_run[1]["evaluations"]

    def ls(name):
        return torch.tensor(evaluations[name]["predictors"]["least_squares"]["mean"])

    def trivial(name):
        return torch.tensor(evaluations[name]["predictors"]["trivial"]["mean"])

    beyond_d = slice(N_DIMS + 1, None)  # more examples than dimensions: noiseless w is pinned down
    for name in ["standard", "random_quadrants", "half_subspace", "skewed", "scale-x=2", "scale-y=0.5", "scale-y=3"]:
        assert ls(name)[beyond_d].max() < 1e-6, name
    assert ls("overlapping_train_test")[1:].max() < 1e-6  # the query is an example it interpolates
    torch.testing.assert_close(ls("orthogonal_train_test"), trivial("orthogonal_train_test"))  # predicts 0
    assert ls("noisyLR")[beyond_d].min() > 0.02  # label noise: never exact
    # output scale k multiplies every squared error by k²: the trivial curves show it on shared prompts
    torch.testing.assert_close(trivial("scale-y=3"), 9 * trivial("standard"), rtol=1e-5, atol=0)
    torch.testing.assert_close(trivial("scale-x=0.5"), 0.25 * trivial("standard"), rtol=1e-5, atol=0)


def test_standard_equals_a_direct_context_scaling_evaluation(suite_run):
    direct = evaluate_context_scaling(
        {"gpt2_icl": tiny_model(), "least_squares": get_estimator("least_squares")},
        linear_family(),
        n_prompts=N_PROMPTS,
        seed=0,
    )
    stored = suite_run[1]["evaluations"]["standard"]["predictors"]
    for name in ("gpt2_icl", "least_squares", "trivial"):
        torch.testing.assert_close(torch.tensor(stored[name]["mean"], dtype=torch.float64), direct.curves[name])
        torch.testing.assert_close(torch.tensor(stored[name]["upper"], dtype=torch.float64), direct.upper[name])


def test_figures_and_summary_table_are_written(suite_run):
    output_dir, metrics = suite_run
    for name in GARG_NAMES:
        figure = output_dir / f"garg_{name}.png"
        assert figure.stat().st_size > 1000 and figure.read_bytes()[:4] == b"\x89PNG", name
    summary = (output_dir / "garg_suite.md").read_text().splitlines()
    header = next(line for line in summary if line.startswith("| evaluation"))
    assert header == "| evaluation | last position | gpt2_icl | least_squares | trivial |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in summary if line.startswith("| ") and line != header}
    assert list(rows) == GARG_NAMES
    noisy = metrics["evaluations"]["noisyLR"]["predictors"]["least_squares"]
    assert f"| noisyLR | {N_POINTS - 1} | " in rows["noisyLR"]
    assert f"{noisy['mean'][-1]:.3g} [{noisy['lower'][-1]:.3g}, {noisy['upper'][-1]:.3g}]" in rows["noisyLR"]
    assert rows["orthogonal_train_test"].startswith(f"| orthogonal_train_test | {N_DIMS - 1} |")


# -- the cache --------------------------------------------------------------------------------------------


def test_a_rerun_computes_nothing_and_changes_nothing(suite_run, tmp_path, monkeypatch, capsys):
    output_dir = copy_run(suite_run, tmp_path)
    before = (output_dir / "metrics.json").read_text()
    figure_time = (output_dir / "garg_standard.png").stat().st_mtime_ns
    spy = EvaluationSpy(monkeypatch)
    metrics = run_garg_suite(
        tiny_model(), linear_family(), output_dir, n_prompts=N_PROMPTS, estimators=["least_squares"]
    )
    assert spy.calls == []
    assert metrics == suite_run[1] and (output_dir / "metrics.json").read_text() == before
    assert (output_dir / "garg_standard.png").stat().st_mtime_ns == figure_time
    lines = capsys.readouterr().err.strip().splitlines()  # progress: one line per evaluation
    assert len(lines) == len(GARG_NAMES)
    assert lines[0].startswith("garg suite [1/15] standard: cached")


def test_a_deleted_evaluation_or_predictor_is_all_that_is_recomputed(suite_run, tmp_path, monkeypatch):
    output_dir = copy_run(suite_run, tmp_path)
    path = output_dir / "metrics.json"
    document = json.loads(path.read_text())
    del document["evaluations"]["skewed"]
    del document["evaluations"]["noisyLR"]["predictors"]["gpt2_icl"]
    path.write_text(json.dumps(document))
    (output_dir / "garg_skewed.png").unlink()

    spy = EvaluationSpy(monkeypatch)
    metrics = run_garg_suite(
        tiny_model(), linear_family(), output_dir, n_prompts=N_PROMPTS, estimators=["least_squares"], progress=False
    )
    assert spy.calls == [("skewed", ["gpt2_icl", "least_squares"]), ("noisyLR", ["gpt2_icl"])]
    assert metrics == suite_run[1]  # same prompts and bootstrap: the recomputed curves are the same numbers
    assert (output_dir / "garg_skewed.png").exists()


def test_other_n_prompts_or_seed_recompute_and_other_evaluations_in_the_file_are_kept(suite_run, tmp_path, monkeypatch):
    output_dir = copy_run(suite_run, tmp_path)
    path = output_dir / "metrics.json"
    document = json.loads(path.read_text())
    document["evaluations"]["scaled_x"] = document["evaluations"]["scale-x=2"]  # e.g. written by hf-icl evaluate
    document["scalars"] = {"final_loss": 0.5}
    path.write_text(json.dumps(document))
    spy = EvaluationSpy(monkeypatch)
    metrics = run_garg_suite(
        tiny_model(), linear_family(), output_dir, n_prompts=16, seed=1, estimators=["least_squares"], progress=False
    )
    assert [name for name, _ in spy.calls] == GARG_NAMES
    assert metrics["evaluations"]["standard"]["n_prompts"] == 16 and metrics["evaluations"]["noisyLR"]["seed"] == 1
    assert metrics["evaluations"]["scaled_x"] == suite_run[1]["evaluations"]["scale-x=2"]
    assert metrics["scalars"] == {"final_loss": 0.5}


def test_an_interrupted_run_keeps_the_finished_evaluations(tmp_path, monkeypatch):
    output_dir = tmp_path / "run"
    EvaluationSpy(monkeypatch, fail_at="half_subspace")
    with pytest.raises(KeyboardInterrupt):
        run_garg_suite(
            tiny_model(), linear_family(), output_dir, n_prompts=8, estimators=["least_squares"], progress=False
        )
    assert list(read_metrics(output_dir / "metrics.json")["evaluations"]) == GARG_NAMES[:4]

    monkeypatch.undo()
    spy = EvaluationSpy(monkeypatch)
    metrics = run_garg_suite(
        tiny_model(), linear_family(), output_dir, n_prompts=8, estimators=["least_squares"], progress=False
    )
    assert [name for name, _ in spy.calls] == GARG_NAMES[4:]
    assert list(metrics["evaluations"]) == GARG_NAMES


# -- other families, estimators and bad input ---------------------------------------------------------------


def test_relu_network_model_also_runs_on_plain_linear_regression_with_default_baselines(tmp_path):
    family = get_task("relu_2nn_regression", n_dims=N_DIMS, hidden_size=8)
    metrics = run_garg_suite(tiny_model(), family, tmp_path, n_prompts=8, progress=False)
    assert list(metrics["evaluations"]) == ["standard", "linear_regression"]
    for entry in metrics["evaluations"].values():
        assert set(entry["predictors"]) == {"gpt2_icl", "least_squares", "averaging", "knn", "trivial"}
    assert metrics["evaluations"]["linear_regression"]["evaluated_task"] == "linear_regression"
    ls = metrics["evaluations"]["linear_regression"]["predictors"]["least_squares"]["mean"]
    assert max(ls[N_DIMS + 1 :]) < 1e-6  # really linear regression: least squares is exact beyond d


def test_noisy_evaluation_gets_the_bayes_ridge_by_default(tmp_path, monkeypatch):
    # keep the run short: only the first and last evaluations
    subset = {name: GARG_EVALUATIONS[name] for name in ("standard", "noisyLR")}
    monkeypatch.setattr("hf_icl.evaluation.garg_suite.garg_evaluations", lambda family: subset)
    metrics = run_garg_suite(tiny_model(), linear_family(), tmp_path, n_prompts=8, progress=False)
    assert set(metrics["evaluations"]["standard"]["predictors"]) == {
        "gpt2_icl",
        "least_squares",
        "averaging",
        "knn",
        "trivial",
    }
    assert "optimal_ridge" in metrics["evaluations"]["noisyLR"]["predictors"]


def test_bad_arguments_are_refused_with_the_argument_named(tmp_path):
    model, family = tiny_model(), linear_family()
    with pytest.raises(ValueError, match="n_prompts must be an integer in \\[1, \\+inf\\), got 0"):
        run_garg_suite(model, family, tmp_path, n_prompts=0)
    with pytest.raises(ValueError, match="estimators has unknown names \\['ols'\\]"):
        run_garg_suite(model, family, tmp_path, estimators=["ols"])
    with pytest.raises(ValueError, match="model_name 'least_squares' is also an estimator's name"):
        run_garg_suite(model, family, tmp_path, estimators=["least_squares"], model_name="least_squares")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ValueError, match="output_dir .*file' exists and is not a directory"):
        run_garg_suite(model, family, not_a_dir)
    foreign = tmp_path / "garg_run"
    foreign.mkdir()
    (foreign / "metrics.json").write_text(json.dumps({"standard": {"gpt2": {"mean": [1.0]}}}))  # Garg's own format
    with pytest.raises(ValueError, match="metrics file .*garg_run/metrics.json has format None"):
        run_garg_suite(model, family, foreign, n_prompts=4)


def test_long_titles_wrap_inside_the_figures_and_every_line_is_in_the_legend(tmp_path, monkeypatch, kept_figures):
    from hf_icl.evaluation import context_scaling

    figures = kept_figures(context_scaling)
    subset = {name: GARG_EVALUATIONS[name] for name in ("standard", "overlapping_train_test")}
    monkeypatch.setattr("hf_icl.evaluation.garg_suite.garg_evaluations", lambda family: subset)
    name = "gpt2_icl_trained_on_linear_regression_seed_0"
    run_garg_suite(tiny_model(), linear_family(), tmp_path, n_prompts=8, progress=False, model_name=name)
    assert sorted(figures) == ["garg_overlapping_train_test.png", "garg_standard.png"]
    for file_name, fig in figures.items():
        fig.canvas.draw()
        (ax,) = fig.axes
        box, frame = ax.title.get_window_extent(fig.canvas.get_renderer()), fig.bbox
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, file_name
        assert name in "".join(ax.get_title().split())  # wrapped, nothing dropped
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        for line in ax.get_lines():
            assert not line.get_label().startswith("_") and line.get_label() in legend, (file_name, line)
