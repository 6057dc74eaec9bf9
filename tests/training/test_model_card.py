"""The model card: Hub metadata that parses back to what was passed, a usage snippet that runs as written and
prints the numbers an independent computation gives, the training command, the old call signature."""

import json
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import fields

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModel, HfArgumentParser

import hf_icl  # noqa: F401  (registers the architectures with the Auto classes)
from hf_icl.data.tasks import get_task
from hf_icl.estimators import get_estimator
from hf_icl.evaluation import evaluate_context_scaling
from hf_icl.evaluation.metrics import PositionMetric
from hf_icl.modeling import build_model
from hf_icl.training import ICLTrainingArguments
from hf_icl.training.model_card import (
    card_seeds,
    eval_results_from_context_scaling,
    evaluate_over_seeds,
    prediction_interval,
    read_card_results,
    reconstruct_training_command,
    seed_evaluation_from_curves,
    set_card_model_id,
    usage_snippet,
    write_model_card,
)

N_DIMS, N_POINTS = 3, 6
RESULTS = [
    {"metric": "squared_error/d", "value": 0.8125, "n_examples": 1, "lower": 0.75, "upper": 0.875},
    {"metric": "squared_error/d", "value": 0.25, "n_examples": 2, "lower": None, "upper": None},
    {"metric": "squared_error/d", "value": 0.03125, "n_examples": 5, "lower": 0.015625, "upper": 0.0625},
]


def training_config(output_dir, **overrides) -> dict:
    values = dict(
        task="noisy_linear_regression",
        task_params=json.dumps({"noise_std": 0.1}),
        n_dims=N_DIMS,
        n_points=N_POINTS,
        model_size="tiny",
        report_to="none",
        output_dir=str(output_dir),
    )
    values.update(overrides)
    return ICLTrainingArguments(**values).to_dict()


def saved_model(folder, target_kind="regression", **config):
    torch.manual_seed(0)
    model = build_model("gpt2_icl", "tiny", n_dims=N_DIMS, n_points=N_POINTS, target_kind=target_kind, **config)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def regression_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cards") / "linreg-run"
    saved_model(folder)
    return folder


def python_block(card_text: str) -> str:
    """The code of the usage section's python block."""
    usage = card_text.split("## Usage", 1)[1]
    return re.search(r"```python\n(.*?)```", usage, flags=re.S).group(1)


def run_snippets(snippets: dict[str, str], cwd) -> dict[str, str]:
    """Run each snippet as a fresh ``__main__`` in one Python process (importing torch once); its output."""
    driver = (
        "import contextlib, io, json, sys\n"
        "outputs = {}\n"
        "for name, code in json.loads(sys.stdin.read()).items():\n"
        "    buffer = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buffer):\n"
        "        exec(compile(code, name, 'exec'), {'__name__': '__main__'})\n"
        "    outputs[name] = buffer.getvalue()\n"
        "print(json.dumps(outputs))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", driver], input=json.dumps(snippets), capture_output=True, text=True, cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_metadata_parses_back_to_what_was_passed(regression_folder):
    config = training_config(regression_folder)
    path = write_model_card(regression_folder, config, eval_results=RESULTS)
    data = ModelCard.load(path).data
    assert data.license == "apache-2.0"
    assert data.library_name == "hf_icl"
    assert data.tags == ["in-context-learning", "hf_icl", "gpt2_icl", "noisy_linear_regression"]
    assert data.datasets is None  # trained on fresh prompts, no built dataset
    assert data.model_name == "linreg-run"
    assert len(data.eval_results) == len(RESULTS)
    for result, passed in zip(data.eval_results, RESULTS, strict=True):
        assert result.task_type == "in-context-regression"
        assert result.dataset_type == "noisy_linear_regression"
        assert result.dataset_args == {"n_dims": N_DIMS, "noise_std": 0.1}
        assert result.metric_type == "squared_error/d"
        assert result.metric_value == passed["value"]
        assert result.metric_name == f"squared_error/d at {passed['n_examples']} example" + (
            "" if passed["n_examples"] == 1 else "s"
        )
    parsed = read_card_results(regression_folder)
    assert [{k: r[k] for k in passed} for r, passed in zip(parsed, RESULTS, strict=True)] == RESULTS
    assert {r["task"] for r in parsed} == {"noisy_linear_regression"}
    assert {r["task_type"] for r in parsed} == {"in-context-regression"}


def test_card_shows_the_parameter_count_training_command_and_limitations(regression_folder):
    config = training_config(regression_folder)
    text = write_model_card(regression_folder, config, eval_results=RESULTS).read_text()
    reloaded = AutoModel.from_pretrained(regression_folder)
    assert f"**{sum(p.numel() for p in reloaded.parameters()):,} parameters**" in text
    assert "GPT2ForInContextRegression" in text and "n_layer=3" in text
    assert "## Limitations" in text and "synthetic in-context-learning tasks only" in text
    assert "```bash\nhf-icl train" in text and "```yaml\ntask: noisy_linear_regression" in text
    # no results table was given: the eval results are tabulated, bands included
    assert "| 5 | squared_error/d | 0.03125 | [0.01562, 0.0625] |" in text
    assert "| 2 | squared_error/d | 0.25 |  |" in text


def test_usage_snippets_run_as_written_and_print_what_an_independent_loop_computes(tmp_path):
    """The snippet of a regression card and of a binary-classification card, each run from the folder's parent
    with the relative folder name as the model id; the printed scores match a loop over prompts."""
    regression = saved_model(tmp_path / "reg")
    binary = saved_model(tmp_path / "cls", target_kind="binary")
    write_model_card(tmp_path / "reg", training_config(tmp_path / "reg"), model_id="reg")
    write_model_card(
        tmp_path / "cls",
        training_config(tmp_path / "cls", task="linear_classification", task_params="{}"),
        model_id="cls",
    )
    snippets = {name: python_block((tmp_path / name / "README.md").read_text()) for name in ("reg", "cls")}
    assert "AutoModel.from_pretrained(model_id)" in snippets["reg"] and 'model_id = "reg"' in snippets["reg"]
    printed = run_snippets(snippets, cwd=tmp_path)

    number = r"(-?\d+\.\d{4})"
    reg = re.fullmatch(rf"squared_error/d with 5 examples: model {number}, least squares {number}\n", printed["reg"])
    cls = re.fullmatch(rf"accuracy with 5 examples: model {number}, least squares {number}\n", printed["cls"])
    assert reg and cls, printed

    # the independent reference: the same prompts, the last position scored one prompt at a time
    task = get_task("noisy_linear_regression", n_dims=N_DIMS, noise_std=0.1)
    xs, ys = task.sample(256, N_POINTS, seed=0)
    with torch.no_grad():
        preds = regression.eval()(xs, ys).predictions.double()
    model_error = sum((preds[b, -1] - ys[b, -1].double()).item() ** 2 for b in range(256)) / 256 / N_DIMS
    ls_error = 0.0
    for b in range(256):  # least squares on the 5 earlier pairs (5 > d = 3: a unique fit)
        weights = torch.linalg.lstsq(xs[b, :-1].double(), ys[b, :-1, None].double()).solution[:, 0]
        ls_error += (xs[b, -1].double() @ weights - ys[b, -1].double()).item() ** 2 / 256 / N_DIMS
    assert abs(float(reg.group(1)) - model_error) <= 6e-5
    assert abs(float(reg.group(2)) - ls_error) <= 6e-5

    task = get_task("linear_classification", n_dims=N_DIMS)
    xs, ys = task.sample(256, N_POINTS, seed=0)
    with torch.no_grad():
        logits = binary.eval()(xs, ys).predictions
    model_accuracy = sum(float(logits[b, -1] > 0) == float(ys[b, -1] > 0) for b in range(256)) / 256
    assert abs(float(cls.group(1)) - model_accuracy) <= 6e-5
    assert 0.0 <= float(cls.group(2)) <= 1.0


def test_categorical_snippet_compares_with_the_chance_rate():
    config = {"task": "categorical", "n_dims": 4, "task_params": '{"n_classes": 3}', "model_type": "gd_transformer"}
    code = usage_snippet("me/gd-categorical", config)
    assert "output.logits" in code and "chance" in code and "least_squares" not in code
    assert 'task_params = {"n_classes": 3}' in code.replace("'", '"')
    compile(code, "snippet", "exec")  # valid Python


def test_a_dataset_trained_run_lists_its_dataset(regression_folder, tmp_path):
    saved_on_disk = tmp_path / "linreg-pool"
    saved_on_disk.mkdir()
    config = {**training_config(regression_folder), "train_dataset": str(saved_on_disk)}
    write_model_card(regression_folder, config)
    assert ModelCard.load(regression_folder / "README.md").data.datasets == ["linreg-pool"]  # a local path: its name

    config = {**training_config(regression_folder), "train_dataset": "icl-lab/linreg-pool"}
    write_model_card(regression_folder, config, datasets=["icl-lab/linreg-eval"])
    assert ModelCard.load(regression_folder / "README.md").data.datasets == [
        "icl-lab/linreg-eval",
        "icl-lab/linreg-pool",
    ]


def test_the_trainers_old_call_still_writes_a_card(regression_folder):
    config = training_config(regression_folder)
    table = "## squared error / d by number of in-context examples\n\n| examples | gpt2_icl |\n|---|---|\n| 5 | 0.1 |"
    path = write_model_card(
        regression_folder, config, {"eval/loss": 0.25, "step": 10}, plot_file="context_scaling.png", results_table=table
    )
    text = path.read_text()
    assert "| eval/loss | 0.25 |" in text and table in text
    assert "![error vs number of in-context examples](context_scaling.png)" in text
    assert f'model_id = "{regression_folder}"' in text  # the folder as given
    data = ModelCard.load(path).data
    assert data.library_name == "hf_icl" and "model-index" not in data.to_dict()
    assert read_card_results(regression_folder) == []


def test_training_command_parses_back_to_the_training_arguments(tmp_path):
    arguments = {f.name for f in fields(ICLTrainingArguments)}
    overrides = dict(n_tasks=64, pool_seed=3, learning_rate=3e-4, seed=7, model_size="none", overwrite_output_dir=True)
    overrides["model_overrides"] = json.dumps({"n_embd": 32, "n_layer": 2, "n_head": 2})
    # a boolean flag switched on, whichever the arguments offer now (mixed precision aside: it needs a GPU)
    switchable = [
        f.name
        for f in fields(ICLTrainingArguments)
        if f.type in ("bool", bool) and f.default is False and f.name not in ("fp16", "bf16", "overwrite_output_dir")
    ]
    assert switchable
    overrides[switchable[0]] = True
    config = training_config(tmp_path / "run dir", **overrides)
    command = reconstruct_training_command(config)
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["hf-icl", "train"]
    assert f"--{switchable[0]}" in words
    assert "--overwrite_output_dir" not in words  # how to resume or overwrite a run says nothing about the model
    (parsed,) = HfArgumentParser(ICLTrainingArguments).parse_args_into_dataclasses(words[2:])
    expected = {**config, "overwrite_output_dir": False}
    assert {k: v for k, v in parsed.to_dict().items() if k in arguments} == expected
    # only what differs from the defaults is spelled out
    assert len([w for w in words if w.startswith("--")]) == sum(
        1
        for f in fields(ICLTrainingArguments)
        if f.name != "overwrite_output_dir" and config.get(f.name, f.default) != f.default
    )


def test_eval_results_from_a_context_scaling_evaluation_follow_its_curve():
    task = get_task("linear_regression", n_dims=N_DIMS)
    scaling = evaluate_context_scaling(
        {"least_squares": get_estimator("least_squares")}, task, n_prompts=64, n_points=9, seed=0
    )
    rows = eval_results_from_context_scaling(scaling, "least_squares")
    assert [r["n_examples"] for r in rows] == [1, 2, 4, 8]  # about 1, N/4, N/2 and the last
    for row in rows:
        i = row["n_examples"]
        assert row["metric"] == "squared_error/d"
        assert row["value"] == scaling.values["least_squares"][i].item()
        assert row["lower"] <= row["value"] <= row["upper"]
        # how the band was made travels with it: one draw of 64 prompts, bootstrapped
        assert row["n_prompts"] == 64 and row["seeds"] is None
        assert row["band"] == "5-95 % bootstrap band over the prompts of one draw"
    assert eval_results_from_context_scaling(scaling, "least_squares", positions=[3])[0]["n_examples"] == 3
    with pytest.raises(ValueError, match="predictor must be one of"):
        eval_results_from_context_scaling(scaling, "gpt2_icl")
    with pytest.raises(ValueError, match="positions"):
        eval_results_from_context_scaling(scaling, "least_squares", positions=[9])


def test_pointing_the_snippet_at_a_hub_repo(regression_folder, tmp_path):
    write_model_card(regression_folder, training_config(regression_folder))
    assert set_card_model_id(regression_folder, "icl-lab/linreg-run")
    code = python_block((regression_folder / "README.md").read_text())
    assert [line for line in code.splitlines() if line.startswith("model_id = ")] == [
        'model_id = "icl-lab/linreg-run"  # a folder written by save_pretrained, or a Hub repo id'
    ]
    assert code == usage_snippet("icl-lab/linreg-run", training_config(regression_folder))
    (tmp_path / "README.md").write_text("# a card without an hf_icl snippet\n")
    assert not set_card_model_id(tmp_path, "icl-lab/other")
    assert (tmp_path / "README.md").read_text() == "# a card without an hf_icl snippet\n"


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ([{"metric": "squared_error/d", "value": 0.1}], r"eval_results\[0\] lacks \['n_examples'\]"),
        ([{"metric": "squared_error/d", "value": math.nan, "n_examples": 3}], r"eval_results\[0\]\['value'\]"),
        ([{"metric": "", "value": 0.1, "n_examples": 3}], r"eval_results\[0\]\['metric'\]"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": -1}], r"eval_results\[0\]\['n_examples'\]"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": 2, "lower": 0.95, "upper": 0.8}], "lower <= upper"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": 2, "interval": 0.1}], r"unknown keys \['interval'\]"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": 2, "band": 0.1}], r"\['band'\] must be a non-empty"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": 2, "seeds": [1, 1]}], "must be distinct"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": 2, "seeds": 3}], r"\['seeds'\] must be a list"),
        ([{"metric": "accuracy", "value": 0.9, "n_examples": 2, "n_prompts": 0}], r"\['n_prompts'\]"),
        ({"metric": "accuracy"}, "eval_results must be a list"),
    ],
)
def test_bad_eval_results_are_refused(regression_folder, results, message):
    with pytest.raises(ValueError, match=message):
        write_model_card(regression_folder, training_config(regression_folder), eval_results=results)


def test_bad_card_inputs_are_refused(regression_folder, tmp_path):
    config = training_config(regression_folder)
    with pytest.raises(ValueError, match="has no config.json"):
        write_model_card(tmp_path, config)
    with pytest.raises(ValueError, match="plot_file must be a path relative"):
        write_model_card(regression_folder, config, plot_file=str(tmp_path / "plot.png"))
    with pytest.raises(ValueError, match=r"training_config lacks \['task'\]"):
        write_model_card(regression_folder, {"n_dims": N_DIMS})
    with pytest.raises(ValueError, match="datasets must be a list"):
        write_model_card(regression_folder, config, datasets="icl-lab/pool")
    with pytest.raises(ValueError, match="model_id must be a non-empty string"):
        usage_snippet("", config)
    with pytest.raises(ValueError, match="has no README.md"):
        read_card_results(tmp_path)


# -- bands over evaluation seeds -----------------------------------------------------------------------------------
def test_prediction_interval_is_the_textbook_formula():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    # t_{0.975, 4} = 2.7764 (a t table); s = sqrt(2.5); sqrt(1 + 1/5)
    half = 2.7764451051977987 * math.sqrt(2.5) * math.sqrt(1.2)
    assert prediction_interval(values) == pytest.approx((3.0, 3.0 - half, 3.0 + half), rel=1e-12)
    # t_{0.95, 9} = 1.8331 for a 90 % interval from ten values
    ten = [float(v) for v in range(10)]
    half = 1.8331129326536335 * torch.tensor(ten).std().item() * math.sqrt(1.1)
    assert prediction_interval(ten, level=0.9) == pytest.approx((4.5, 4.5 - half, 4.5 + half), rel=1e-6)
    assert prediction_interval(values, bounds=(0.0, 6.0)) == pytest.approx((3.0, 0.0, 6.0))
    assert prediction_interval([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)  # no spread, no band
    with pytest.raises(ValueError, match="at least 2 values"):
        prediction_interval([1.0])
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        prediction_interval(values, level=1.0)


def test_a_fresh_seed_lands_in_the_prediction_band_19_times_in_20():
    """The rule's promise, simulated: 10 seeds' values and one more, all normal, 20,000 times over. The prediction
    interval holds the fresh value 95 % of the time; the mean's confidence interval (what a band over one draw's
    prompts estimates) holds it about half the time."""
    generator = torch.Generator().manual_seed(0)
    draws = 100.0 + torch.randn(11, 20_000, generator=generator, dtype=torch.float64)
    seeds, fresh = draws[:10], draws[10]
    summary = seed_evaluation_from_curves(
        {"model": seeds, "trivial": seeds}, PositionMetric("regression", 1.0), list(range(10)), 4096
    ).result
    inside = ((summary.lower["model"] <= fresh) & (fresh <= summary.upper["model"])).double().mean().item()
    assert abs(inside - 0.95) < 0.006, inside  # binomial sd 0.0015
    half = 2.2621571627409915 * seeds.std(dim=0) / math.sqrt(10)  # the mean's 95 % confidence interval
    inside_ci = ((fresh - summary.values["model"]).abs() <= half).double().mean().item()
    assert 0.4 < inside_ci < 0.6, inside_ci


def test_evaluate_over_seeds_is_the_mean_and_spread_of_one_evaluation_per_seed(regression_folder, tmp_path):
    task = get_task("noisy_linear_regression", n_dims=N_DIMS, noise_std=0.1)
    predictors = {"averaging": get_estimator("averaging"), "least_squares": get_estimator("least_squares")}
    seeds = card_seeds(11, 3)
    assert seeds == [11, 12, 13]
    evaluation = evaluate_over_seeds(predictors, task, seeds, 48, n_points=N_POINTS)
    single = [evaluate_context_scaling(predictors, task, n_prompts=48, seed=s, n_points=N_POINTS) for s in seeds]
    result = evaluation.result
    assert result.n_prompts == evaluation.n_prompts == 48 and evaluation.seeds == seeds
    assert result.predictors == ["averaging", "least_squares", "trivial"]
    for name in result.predictors:
        for i in range(N_POINTS):
            per_seed = [one.values[name][i].item() for one in single]
            assert evaluation.per_seed[name][:, i].tolist() == per_seed
            mean, lower, upper = prediction_interval(per_seed, bounds=(0.0, math.inf))
            assert (result.values[name][i].item(), result.lower[name][i].item(), result.upper[name][i].item()) == (
                pytest.approx(mean, rel=1e-12),
                pytest.approx(lower, rel=1e-12, abs=1e-300),
                pytest.approx(upper, rel=1e-12),
            )
    assert result.lower["least_squares"].min().item() >= 0.0  # squared errors: clipped at 0

    # the card: value and band at each reported position, with the seeds, the prompts per seed and the rule
    rows = evaluation.eval_results("averaging")
    write_model_card(regression_folder, training_config(regression_folder), eval_results=rows)
    parsed = read_card_results(regression_folder)
    assert [r["n_examples"] for r in parsed] == [1, 2, 5]
    for row in parsed:
        i = row["n_examples"]
        assert row["value"] == pytest.approx(result.values["averaging"][i].item(), rel=1e-12)
        assert (row["lower"], row["upper"]) == pytest.approx(
            (result.lower["averaging"][i].item(), result.upper["averaging"][i].item()), rel=1e-12
        )
        assert row["seeds"] == seeds and row["n_prompts"] == 48
        assert row["band"].startswith("95 % prediction interval for one more evaluation seed of 48 prompts")
    assert "mean over 3 evaluation seeds** (seeds 11–13), each a fresh draw of 48 prompts" in evaluation.describe()
    assert "t = t(0.975, 2) = 4.303" in evaluation.describe()

    entry = evaluation.entry()  # metrics.json: the summary curves plus every seed's
    assert entry["seeds"] == seeds and entry["seed"] == 11 and entry["level"] == 0.95
    assert entry["confidence"] == pytest.approx([0.025, 0.975])
    assert entry["seed_curves"]["averaging"] == evaluation.per_seed["averaging"].tolist()
    assert entry["predictors"]["averaging"]["upper"] == result.upper["averaging"].tolist()
    assert evaluation.plot(tmp_path / "curves.png").stat().st_size > 10_000


def test_accuracy_bands_stay_in_the_unit_interval():
    per_seed = {"model": [[1.0], [1.0], [0.9]], "trivial": [[0.5], [0.5], [0.5]]}
    result = seed_evaluation_from_curves(per_seed, PositionMetric("binary"), [0, 1, 2], 100).result
    assert result.upper["model"].item() == 1.0 and 0.0 <= result.lower["model"].item() < 0.9
    assert result.lower["trivial"].item() == result.upper["trivial"].item() == 0.5


@pytest.mark.parametrize(
    ("seeds", "message"),
    [([4], "at least 2 evaluation seeds"), ([4, 4], "must be distinct"), ([4, -1], r"seeds\[1\]")],
)
def test_seed_evaluations_refuse_bad_seeds(seeds, message):
    curves = {"trivial": torch.ones(len(seeds), 3, dtype=torch.float64)}
    with pytest.raises(ValueError, match=message):
        seed_evaluation_from_curves(curves, PositionMetric("regression"), seeds, 10)
    with pytest.raises(ValueError, match=message):
        evaluate_over_seeds({}, get_task("linear_regression", n_dims=2), seeds, 10, n_points=3)


def test_seed_evaluations_refuse_curves_that_do_not_match_the_seeds():
    with pytest.raises(ValueError, match=r"must all be \(n_seeds=3, N\)"):
        seed_evaluation_from_curves({"trivial": torch.ones(2, 4)}, PositionMetric("regression"), [0, 1, 2], 10)
    with pytest.raises(ValueError, match="must hold the 'trivial' curve"):
        seed_evaluation_from_curves({"model": torch.ones(3, 4)}, PositionMetric("regression"), [0, 1, 2], 10)
    with pytest.raises(ValueError, match="n_seeds"):
        card_seeds(0, 1)
