"""The model zoo (models/*, written by scripts/train_model_zoo.py): every shipped checkpoint is small, has a complete
Hub card, loads with ``AutoModel`` and, on the prompts of a seed its card did not use, scores inside the band its card
states at the last position (the card's band is a prediction interval for one more evaluation seed of the same size,
so this is the check a user's own evaluation makes)."""

import hashlib
import importlib.util
import json
import re
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import ModelCard
from repo_paths import REPO
from safetensors.torch import load_file
from transformers import AutoModel

import hf_icl  # noqa: F401  (registers hf_icl's architectures with the Auto classes)
from hf_icl.data.tasks import get_task
from hf_icl.evaluation import evaluate_context_scaling
from hf_icl.modeling.model_folder import verify_model_folder
from hf_icl.training.model_card import card_seeds, prediction_interval, read_card_results, write_model_card
from hf_icl.training.trainer import EVAL_SEED_OFFSET

MODELS = REPO / "models"
SCRIPTS = MODELS.parent / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zoo_script = load_script("train_model_zoo")
#: the zoo: one checkpoint per architecture (the NIAH retriever is a language model with its own test)
ZOO = {name: recipe["model_type"] for name, recipe in zoo_script.RECIPES.items()}
NOT_IN_ZOO = {"niah-retriever"}
SHIPPED_FILES = set(zoo_script.SHIPPED_FILES)
MAX_BYTES = 20 * 2**20
#: the seed of the fresh prompts: none of the cards' evaluation seeds (training seed + EVAL_SEED_OFFSET + k, checked)
FRESH_SEED = 424_242
#: a card's band must come from at least this many evaluation seeds
MIN_CARD_SEEDS = 5


def zoo_folders() -> list[Path]:
    return sorted(p for p in MODELS.iterdir() if p.is_dir() and p.name not in NOT_IN_ZOO)


@cache
def load(name: str):
    return AutoModel.from_pretrained(MODELS / name).eval()


@cache
def training_args(name: str) -> dict:
    return json.loads((MODELS / name / "training_args.json").read_text())


def fresh_task(name: str):
    """The task family the model was trained on, with fresh tasks from the prior (no finite pool)."""
    args = training_args(name)
    return get_task(args["task"], n_dims=args["n_dims"], n_tasks=None, **json.loads(args["task_params"]))


def last_position_claim(name: str) -> dict:
    """The card's result with the most in-context examples: the mean over its evaluation seeds, the prediction
    interval for one more seed (lower, upper), its seeds and the prompts per seed (model-index data)."""
    return max(read_card_results(MODELS / name), key=lambda r: r["n_examples"])


def test_the_zoo_holds_one_model_per_architecture():
    # the five architectures of the research documents (mlp_icl and the one-layer feature maps are the SGPT
    # study's baselines and probes, not architectures of their own)
    assert sorted(ZOO.values()) == sorted(["gpt2_icl", "sgpt", "linear_gpt", "kernel_icl", "gd_transformer"])
    assert [p.name for p in zoo_folders()] == sorted(ZOO)
    for name, model_type in ZOO.items():
        assert json.loads((MODELS / name / "config.json").read_text())["model_type"] == model_type


@pytest.mark.parametrize("name", sorted(ZOO))
def test_folder_is_small_and_holds_only_the_shipped_files(name):
    folder = MODELS / name
    assert {p.name for p in folder.iterdir()} == SHIPPED_FILES  # no checkpoints/, optimizer state or logs
    assert sum(p.stat().st_size for p in folder.iterdir()) <= MAX_BYTES


@pytest.mark.parametrize("name", [*sorted(ZOO), *sorted(NOT_IN_ZOO)])
def test_folder_has_a_manifest_of_its_model_files_and_verifies(name):
    """Every shipped folder lists the sha256 and size of its model files (checked here with hashlib, not hf_icl's
    code) and passes the check every loader runs: manifest, safetensors header, config against weights, finite."""
    folder = MODELS / name
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == "hf_icl-model" and manifest["format_version"] == 1
    model_files = {"config.json", "model.safetensors", "training_args.json", "generation_config.json"}
    listed = {p.name for p in folder.iterdir() if p.name in model_files}
    assert set(manifest["files"]) == listed and {"config.json", "model.safetensors"} <= listed
    for file, entry in manifest["files"].items():
        data = (folder / file).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}, file
    verify_model_folder(folder)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_card_metadata_and_sections(name):
    card = ModelCard.load(MODELS / name / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0" and data["library_name"] == "hf_icl"
    assert "in-context-learning" in data["tags"] and ZOO[name] in data["tags"]
    assert data["model-index"][0]["results"], "the model-index lists no results"
    args = training_args(name)
    claim = last_position_claim(name)
    assert claim["n_examples"] == args["n_points"] - 1 and claim["task"] == args["task"]
    assert claim["lower"] <= claim["value"] <= claim["upper"]
    text = card.content
    # the script's command, the CPU-size statement, where the snippet loads from
    assert f"python scripts/train_model_zoo.py --only {name}" in text
    assert "## Notes" in text and "**CPU size.**" in text and "wall time of training" in text
    assert f'model_id = "models/{name}"' in text
    if args["task"] == "categorical":  # the references on the same prompts: the model sits between chance and Bayes
        bayes = float(re.search(r"the ceiling\) ([0-9.]+)", text).group(1))
        assert 1 / json.loads(args["task_params"])["n_classes"] < claim["value"] <= claim["upper"] <= bayes
    # the band: a prediction interval over several evaluation seeds, named in the model-index and in the text
    seeds = claim["seeds"]
    assert len(seeds) >= MIN_CARD_SEEDS and seeds == card_seeds(args["seed"] + EVAL_SEED_OFFSET, len(seeds))
    assert claim["n_prompts"] >= 1000 and "prediction interval" in claim["band"]
    assert f"mean over {len(seeds)} evaluation seeds** (seeds {seeds[0]}–{seeds[-1]})" in text
    assert f"each a fresh draw of {claim['n_prompts']} prompts" in text
    # metrics.json holds every seed's curve: the card's value and band are their mean and prediction interval
    standard = json.loads((MODELS / name / "metrics.json").read_text())["evaluations"]["standard"]
    assert standard["seeds"] == seeds and standard["n_prompts"] == claim["n_prompts"]
    per_seed = [curve[-1] for curve in standard["seed_curves"][ZOO[name]]]
    bounds = (0.0, 1.0) if claim["metric"] == "accuracy" else (0.0, float("inf"))
    mean, lower, upper = prediction_interval(per_seed, level=standard["level"], bounds=bounds)
    assert (claim["value"], claim["lower"], claim["upper"]) == pytest.approx((mean, lower, upper), rel=1e-12)


def direct_last_position_score(
    model, task, n_prompts: int, n_points: int, normalizer: float | None, seed: int = FRESH_SEED
) -> float:
    """The last position's mean score on the fresh prompts, written out without hf_icl's evaluation code:
    squared error / normalizer, or top-1 accuracy of the logits."""
    xs, ys = task.sample(n_prompts, n_points, seed=seed)
    with torch.no_grad():
        out = model(xs, ys)
    if normalizer is None:
        return (out.logits[:, -1].argmax(-1) == ys[:, -1]).double().mean().item()
    return ((out.predictions[:, -1].double() - ys[:, -1].double()) ** 2 / normalizer).mean().item()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_fresh_seed_lands_inside_the_cards_band(name):
    """What a user does: score the model on as many fresh prompts as one of the card's seeds, drawn with a seed the
    card did not use. The card's band is the 95 % prediction interval for exactly that number, so it must hold it."""
    model, args, task = load(name), training_args(name), fresh_task(name)
    claim = last_position_claim(name)
    assert FRESH_SEED not in claim["seeds"]  # prompts (and tasks) the card's evaluation did not see
    n_prompts, n_points = claim["n_prompts"], args["n_points"]  # the evaluation size the band is for
    fresh = evaluate_context_scaling(
        {"model": model}, task, n_prompts=n_prompts, seed=FRESH_SEED, n_points=n_points, n_bootstrap=1
    )
    mean = float(fresh.values["model"][-1])

    normalizer = {"squared_error/d": args["n_dims"], "squared_error/1": 1.0, "accuracy": None}[claim["metric"]]
    assert mean == pytest.approx(direct_last_position_score(model, task, n_prompts, n_points, normalizer), rel=1e-9)
    assert claim["lower"] <= mean <= claim["upper"], (mean, claim)

    trivial = float(fresh.trivial[-1])
    if normalizer is None:  # accuracy: at least twice the chance rate
        assert mean >= 2 * trivial, (mean, trivial)
    else:  # squared error: at most a fifth of predicting 0 (the sinusoids' label noise alone costs 0.04 of ~0.9)
        assert mean <= 0.2 * trivial, (mean, trivial)


@pytest.mark.parametrize("name", [n for n in sorted(ZOO) if n.endswith("linear-regression")])
def test_linear_regression_models_beat_averaging_and_approach_least_squares(name):
    """With 20 examples in 5 dimensions least squares is exact (0); the averaging estimator (w ≈ mean of y_i x_i)
    is not: a model that learned in-context regression is far below it."""
    model, args = load(name), training_args(name)
    xs, ys = fresh_task(name).sample(2048, args["n_points"], seed=FRESH_SEED + 1)
    with torch.no_grad():
        model_error = ((model(xs, ys).predictions[:, -1] - ys[:, -1]) ** 2).mean().item() / args["n_dims"]
    w_avg = (xs[:, :-1] * ys[:, :-1, None]).mean(dim=1)  # averaging, written out
    averaging_error = (((xs[:, -1] * w_avg).sum(-1) - ys[:, -1]) ** 2).mean().item() / args["n_dims"]
    assert averaging_error > 0.25
    assert model_error < 0.25 * averaging_error, (model_error, averaging_error)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_shipped_weights_round_trip_bit_exactly(name, tmp_path):
    model = load(name)
    shipped = load_file(MODELS / name / "model.safetensors")
    state = model.state_dict()
    assert set(shipped) <= set(state)
    for key, tensor in shipped.items():
        assert torch.equal(state[key], tensor), key
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    for key, tensor in state.items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    args = training_args(name)
    xs, ys = fresh_task(name).sample(64, args["n_points"], seed=FRESH_SEED + 2)
    with torch.no_grad():
        assert torch.equal(model(xs, ys).loss, reloaded(xs, ys).loss)


def test_zoo_readme_lists_every_model_with_its_cards_band():
    table = (MODELS / "README.md").read_text()
    assert "95 % prediction interval for one more seed" in table
    for name in ZOO:
        (row,) = [line for line in table.splitlines() if line.startswith(f"| [`{name}`]({name}/)")]
        claim = last_position_claim(name)
        assert row.endswith(f"**{claim['value']:.3g}** [{claim['lower']:.3g}, {claim['upper']:.3g}] |"), row
    seeds = {len(last_position_claim(name)["seeds"]) for name in ZOO}
    prompts = {last_position_claim(name)["n_prompts"] for name in ZOO}
    assert len(seeds) == len(prompts) == 1
    assert f"mean over the cards' {seeds.pop()} evaluation seeds, each a fresh draw of {prompts.pop()} prompts" in table


def test_write_model_card_refuses_empty_notes(tmp_path):
    folder = MODELS / "sgpt-linear-regression"
    for file in ("config.json", "model.safetensors"):
        (tmp_path / file).write_bytes((folder / file).read_bytes())
    with pytest.raises(ValueError, match="notes must be a non-empty markdown string"):
        write_model_card(tmp_path, training_args("sgpt-linear-regression"), notes="  ")


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def run_snippet(code: str, workdir: Path) -> dict:
    """Run a documentation snippet as written, from ``workdir``, with ``models/`` pointing at the shipped zoo."""
    code = code.replace('"models/', f'"{MODELS.as_posix()}/')
    namespace: dict = {"__name__": "__snippet__"}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        exec(compile(code, "<snippet>", "exec"), namespace)
    return namespace


def test_readme_first_screen_loads_a_zoo_model_and_plots_it_against_least_squares(tmp_path, capsys):
    readme = (MODELS.parent / "README.md").read_text(encoding="utf-8")
    first_section = readme.split("\n## ")[1]
    assert first_section.startswith("A trained model against least squares")
    (code,) = python_blocks(first_section)
    namespace = run_snippet(code, tmp_path)
    assert (tmp_path / "outputs" / "gpt2_vs_least_squares.png").stat().st_size > 10_000
    result = namespace["result"]
    assert set(result.values) >= {"gpt2_icl", "least_squares"}
    # least squares is exact once the prompt holds d examples; the model is scored on the same prompts
    assert float(result.values["least_squares"][-1]) < 1e-6
    model, n_dims = namespace["model"], namespace["model"].config.n_dims
    direct = direct_last_position_score(model, namespace["task"], 1000, model.config.n_points, n_dims, seed=0)
    assert float(result.values["gpt2_icl"][-1]) == pytest.approx(direct, rel=1e-6)
    printed = capsys.readouterr().out
    assert "gpt2_icl" in printed and "least_squares" in printed


def test_zoo_readme_snippet_runs(tmp_path):
    (code,) = python_blocks((MODELS / "README.md").read_text(encoding="utf-8"))
    namespace = run_snippet(code, tmp_path)
    xs, ys, predictions = namespace["xs"], namespace["ys"], namespace["predictions"]
    assert predictions.shape == ys.shape == (8, 21)
    # the snippet's predictions are the model's on a per-prefix loop (position i sees pairs j < i only)
    model = namespace["model"]
    with torch.no_grad():
        for i in (0, 5, 20):
            alone = model(xs[:, : i + 1], ys[:, : i + 1]).predictions[:, i]
            torch.testing.assert_close(predictions[:, i], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_card_usage_snippet_runs_as_written(name, tmp_path, capsys):
    card = (MODELS / name / "README.md").read_text(encoding="utf-8")
    usage = card.split("## Usage", 1)[1]
    code = python_blocks(usage)[0]
    namespace = run_snippet(code, tmp_path)
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    model_score = namespace["model_score"]
    assert f"model {model_score:.4f}" in printed
    # the snippet's number, written out without hf_icl's metric code
    args = training_args(name)
    xs, ys = namespace["xs"], namespace["ys"]
    with torch.no_grad():
        out = namespace["model"](xs, ys)
    if args["task"] == "categorical":
        expected = (out.logits[:, -1].argmax(-1) == ys[:, -1]).double().mean().item()
    else:
        normalizer = 1.0 if args["task"] == "sinusoid" else args["n_dims"]
        expected = ((out.predictions[:, -1].double() - ys[:, -1].double()) ** 2).mean().item() / normalizer
    assert model_score == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_the_script_trains_ships_and_indexes_a_model(tmp_path, capsys, monkeypatch):
    """A few steps of one recipe through the script: the shipped folder holds only the shipped files, its card
    names the script's command, the CPU size and its evaluation seeds, and the index lists it; --index-only
    rebuilds the index alone; --evaluate-only reruns the card's evaluation without touching the weights."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")  # what --device cpu sets; undone after the test
    output, work = tmp_path / "zoo", tmp_path / "work"
    argv = ["--only", "kernel-icl-sinusoid", "--steps-scale", "0.002", "--eval-prompts", "64", "--device", "cpu"]
    argv += ["--eval-seeds", "2"]
    zoo_script.main([*argv, "--output", str(output), "--work-dir", str(work)])
    folder = output / "kernel-icl-sinusoid"
    assert {p.name for p in folder.iterdir()} == SHIPPED_FILES
    verify_model_folder(folder)  # its manifest lists the shipped model files
    assert (work / "kernel-icl-sinusoid" / "checkpoints").is_dir()  # checkpoints stay in the work dir
    args = json.loads((folder / "training_args.json").read_text())
    assert args["max_steps"] == 12 and args["eval_prompts"] == 64  # 6000 × 0.002
    card = (folder / "README.md").read_text()
    command = "python scripts/train_model_zoo.py --only kernel-icl-sinusoid --device cpu --steps-scale 0.002"
    assert command + " --eval-prompts 64" in card and "**CPU size.**" in card
    assert f'model_id = "{folder}"' in card
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    claim = max(read_card_results(folder), key=lambda r: r["n_examples"])
    assert summary["last"]["kernel_icl"] == pytest.approx(claim["value"])
    assert claim["seeds"] == summary["seeds"] == [EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 1] and claim["n_prompts"] == 64
    assert "mean over 2 evaluation seeds** (seeds 7919, 7920)" in card
    index = (output / "README.md").read_text()
    assert "[`kernel-icl-sinusoid`](kernel-icl-sinusoid/)" in index and "12 steps × 64" in index
    (output / "README.md").unlink()
    zoo_script.main(["--index-only", "--output", str(output)])
    assert (output / "README.md").read_text() == index

    # the evaluation alone, on other seeds and prompts: the weights and training arguments stay byte for byte
    kept = {file: (folder / file).read_bytes() for file in ("model.safetensors", "config.json", "training_args.json")}
    wall_time = re.search(r"^- wall time of training: .*$", card, flags=re.M).group(0)
    zoo_script.main(["--evaluate-only", "--only", "kernel-icl-sinusoid", "--eval-prompts", "32", "--eval-seeds", "3",
                     "--device", "cpu", "--output", str(output)])  # fmt: skip
    assert {file: (folder / file).read_bytes() for file in kept} == kept
    assert {p.name for p in folder.iterdir()} == SHIPPED_FILES
    verify_model_folder(folder)  # the card, metrics and plot were rewritten; the model files, and so the manifest, not
    claim = max(read_card_results(folder), key=lambda r: r["n_examples"])
    assert claim["seeds"] == card_seeds(EVAL_SEED_OFFSET, 3) and claim["n_prompts"] == 32
    card = (folder / "README.md").read_text()
    assert wall_time in card and "**CPU size.**" in card  # the training facts of the old card, kept
    assert "--evaluate-only --only kernel-icl-sinusoid --device cpu --eval-prompts 32 --eval-seeds 3" in card
    assert command + " --eval-prompts 32 --eval-seeds 3" in card  # retraining also reproduces this evaluation
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["scalars"]["steps"] == 12 and metrics["evaluations"]["standard"]["seeds"] == claim["seeds"]
    assert "3 evaluation seeds, each a fresh draw of 32 prompts" in (output / "README.md").read_text()


def test_evaluate_only_needs_the_training_facts_of_the_old_card(tmp_path):
    (tmp_path / "README.md").write_text("---\nlibrary_name: hf_icl\n---\n\n# a card without notes\n")
    with pytest.raises(ValueError, match="does not state the hardware, wall time, date and command of training"):
        zoo_script.facts_from_card(tmp_path)
    facts = zoo_script.facts_from_card(MODELS / "sgpt-linear-regression")
    assert not facts.on_gpu and facts.seconds > 0 and "CPU" in facts.hardware
    assert facts.options.only == ["sgpt-linear-regression"] and facts.options.device == "cpu"
    assert facts.options.steps_scale == 1.0


def test_the_script_refuses_bad_recipes_and_scales(tmp_path):
    with pytest.raises(ValueError, match="name must be one of the zoo's models"):
        zoo_script.training_arguments("gpt3", tmp_path)
    with pytest.raises(ValueError, match=r"steps_scale must be a finite number > 0, got 0"):
        zoo_script.training_arguments("sgpt-linear-regression", tmp_path, steps_scale=0)
    with pytest.raises(ValueError, match="holds none of the zoo's models"):
        zoo_script.write_zoo_readme(tmp_path)


def reference_accuracies(logit_scale: float, n_points: int = 61) -> tuple[float, float]:
    args = SimpleNamespace(
        task="categorical",
        task_params=json.dumps({"n_classes": 3, "function": "linear", "logit_scale": logit_scale}),
        n_dims=2,
        n_points=n_points,
        eval_prompts=300,
        seed=0,
    )
    text = zoo_script.categorical_references(args)
    logistic = float(re.search(r"over the classes the prompt shows\) ([0-9.]+)", text).group(1))
    bayes = float(re.search(r"the ceiling\) ([0-9.]+)", text).group(1))
    assert f"chance {1 / 3:.3f}" in text and f"accuracy with {n_points - 1} examples" in text
    return logistic, bayes


def test_categorical_references_follow_the_label_noise():
    # labels drawn from softmax(0): coin flips; neither reference can beat chance by much (300 prompts: sd 0.027)
    logistic, bayes = reference_accuracies(0.0)
    assert abs(bayes - 1 / 3) < 0.1 and abs(logistic - 1 / 3) < 0.1
    # a huge logit scale makes labels the argmax of the true logits: the Bayes classifier is always right, and a
    # logistic regression on 60 separable examples in 2 dimensions nearly always
    logistic, bayes = reference_accuracies(1e4)
    assert bayes == 1.0 and logistic > 0.9


def test_garg_suite_on_the_zoo_tabulates_every_run(tmp_path, capsys):
    script = load_script("garg_suite_zoo")
    table = script.main(["--models-dir", str(MODELS), "--output-dir", str(tmp_path), "--n-prompts", "16"])
    assert capsys.readouterr().out.strip() == table  # stdout: the combined table only
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    documents = {name: json.loads((tmp_path / name / "metrics.json").read_text()) for name in script.MODELS}
    assert list(rows) == list(documents["sgpt-linear-regression"]["evaluations"])  # all 15, in the suite's order
    for evaluation, line in rows.items():
        cells = [c.strip() for c in line.strip("| ").split(" | ")]
        for column, (name, model_type) in enumerate(script.MODELS.items(), start=2):
            curve = documents[name]["evaluations"][evaluation]["predictors"][model_type]
            assert cells[column].startswith(f"{curve['mean'][-1]:.3g} ["), (evaluation, name)
        assert int(cells[1]) == len(curve["mean"]) - 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps-scale", "0"], "--steps-scale must be a finite number > 0, got 0.0"),
        (["--steps-scale", "nan"], "--steps-scale must be a finite number > 0, got nan"),
        (["--eval-prompts", "0"], "--eval-prompts must be at least 1, got 0"),
        (["--eval-seeds", "1"], "--eval-seeds must be at least 2 (a spread over seeds needs two), got 1"),
        (["--evaluate-only", "--index-only"], "argument --index-only: not allowed with argument --evaluate-only"),
        (["--only", "gpt3"], "argument --only: invalid choice: 'gpt3'"),
    ],
)
def test_the_script_names_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        zoo_script.parse_options(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_garg_suite_zoo_names_bad_options(tmp_path, capsys):
    script = load_script("garg_suite_zoo")
    with pytest.raises(SystemExit):
        script.main(["--n-prompts", "0", "--output-dir", str(tmp_path)])
    assert "--n-prompts must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="the garg suite failed on gpt2-icl-linear-regression"):
        script.main(["--models-dir", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path), "--n-prompts", "4"])
