"""Train the model zoo: one checkpoint per ICL architecture of hf_icl, each shipped as ``models/<name>``.

Each recipe is a dict of :class:`~hf_icl.training.ICLTrainingArguments` fields. The trainer writes into
``--work-dir/<name>`` (checkpoints included); only the files a user needs are copied into ``--output/<name>``:
the weights, the config, the model card (rewritten with this script's command, the hardware and the wall time),
the training arguments, ``metrics.json`` and the context-scaling curve and plot.

**The card's evaluation.** After training, the model and its task's default baselines are scored on
``--eval-seeds`` evaluation seeds (default 10: the training seed + 7919 + k, k = 0, 1, ...), ``--eval-prompts``
fresh prompts (fresh tasks) each, by :func:`hf_icl.training.model_card.evaluate_over_seeds`. The card, the
model-index, ``metrics.json``, the CSV, the plot and the zoo's table give the mean over the seeds and the 95 %
prediction interval for one more seed, mean ± t(0.975, n - 1) · s · sqrt(1 + 1/n) (s: the standard deviation over
the n seeds): a user's own evaluation on that many fresh prompts should land inside it 19 times in 20. (A bootstrap
over the prompts of one draw, what the trainer's own card states, is narrower: it leaves out how far a fresh draw
of tasks moves the mean.) ``--evaluate-only`` reruns this evaluation alone on the shipped folders, the weights
untouched, and rewrites their cards (keeping the hardware, wall time and date of training the old card states),
``metrics.json``, curves, plots and the table.

The recipes are CPU sizes (a few minutes each on a 2-core VM); ``--steps-scale`` multiplies every step count for
a longer run on a GPU.

Usage::

    python scripts/train_model_zoo.py                                  # all five into models/
    python scripts/train_model_zoo.py --only sgpt-linear-regression     # one of them
    python scripts/train_model_zoo.py --device cuda --steps-scale 10   # a GPU run, ten times the steps
    python scripts/train_model_zoo.py --evaluate-only                  # new cards for the shipped weights

Example (the recipes as training arguments)::

    >>> args = training_arguments("sgpt-linear-regression", "outputs/zoo-work", eval_prompts=256)
    >>> args.model_type, args.n_dims, args.n_points
    ('sgpt', 5, 21)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import sys
import time
from datetime import date
from pathlib import Path
from typing import NamedTuple

#: the linear-regression task of the three regression models: d = 5, 21 points (least squares is exact from 5 on)
LINEAR_REGRESSION = {"task": "linear_regression", "n_dims": 5, "n_points": 21}
#: GPT-2-style models read concatenated [x, y] rows (one token per example; a query row [x_i, 0] predicts y_i):
#: on a CPU budget this layout trains far better than Garg's interleaved tokens (docs/results/reliability.md);
#: gelu_pytorch_tanh is gelu_new's function in one kernel
CONCATENATED = {"prompt_format": "concatenated", "activation_function": "gelu_pytorch_tanh", "io_init": "gpt2"}
#: the optimisation shared by the recipes (the quickstart's, hf_icl/quickstart.py); each recipe may override it
SCHEDULE = {"lr_scheduler_type": "cosine", "warmup_steps": 200, "max_grad_norm": 1.0}

RECIPES: dict[str, dict] = {
    # Garg et al.'s GPT-2 baseline at the tiny preset (64 wide, 3 layers, 2 heads)
    "gpt2-icl-linear-regression": {
        **LINEAR_REGRESSION,
        "model_type": "gpt2_icl",
        "model_size": "tiny",
        "model_overrides": CONCATENATED,
        "max_steps": 3500,
        "per_device_train_batch_size": 128,
        "learning_rate": 3e-3,
    },
    # SGPT: identity Q/K/V, l1-normalised attention, a fixed random read-in (tiny: 64 wide, 3 layers)
    "sgpt-linear-regression": {
        **LINEAR_REGRESSION,
        "model_type": "sgpt",
        "model_size": "tiny",
        "max_steps": 15000,
        "per_device_train_batch_size": 128,
        "learning_rate": 3e-3,
    },
    # GPT-2 with causal linear attention (φ = ReLU², the parallel form: 21 tokens make it the cheapest mode)
    "linear-gpt-linear-regression": {
        **LINEAR_REGRESSION,
        "model_type": "linear_gpt",
        "model_size": "tiny",
        "model_overrides": {**CONCATENATED, "linear_attention_mode": "parallel"},
        "max_steps": 3000,
        "per_device_train_batch_size": 128,
        "learning_rate": 3e-3,
    },
    # the kernel-regression document's single learned head (softmax row kernel, d_model 64) on its sinusoids
    "kernel-icl-sinusoid": {
        "task": "sinusoid",
        "n_dims": 1,
        "n_points": 41,
        "model_type": "kernel_icl",
        "model_size": "standard",
        "max_steps": 6000,
        "per_device_train_batch_size": 64,
        "learning_rate": 1e-3,
    },
    # the functional-GD transformer trained from scratch on 5-class linear-softmax labels in 5 dimensions; trained
    # (before issue 29) with the causal variant, which predicts every prefix in one pass; the document's full-context
    # attention runs the all-prefix protocol once per prefix (41x the work), a retraining left for a bigger machine
    "gd-transformer-categorical": {
        "task": "categorical",
        "task_params": {"n_classes": 5, "function": "linear"},
        "n_dims": 5,
        "n_points": 41,
        "model_type": "gd_transformer",
        "model_size": "small",
        "model_overrides": {
            "n_blocks": 2,
            "kernel": "softmax",
            "normalize_by_count": True,
            "context_attention": "causal",
        },
        "max_steps": 15000,
        "per_device_train_batch_size": 64,
        "learning_rate": 1e-3,
    },
}
MANIFEST_FILE = "manifest.json"  # hf_icl.modeling.manifest.MANIFEST_FILE (kept here so --help needs no torch)
#: what a user of a zoo model needs; the trainer's checkpoints/ and tracker logs stay in the work dir
SHIPPED_FILES = (
    "config.json",
    "model.safetensors",
    "README.md",
    "training_args.json",
    "metrics.json",
    "context_scaling.png",
    "context_scaling.csv",
    MANIFEST_FILE,  # the sha256 of the model files, written for the shipped folder (every loader verifies it)
)
DEFAULT_OUTPUT = "models"
DEFAULT_WORK_DIR = "outputs/zoo-work"
DEFAULT_EVAL_PROMPTS = 4096
DEFAULT_EVAL_SEEDS = 10  # hf_icl.training.model_card.DEFAULT_EVAL_SEEDS (kept here so --help needs no torch)
DEVICES = ("auto", "cpu", "cuda")


def training_arguments(name: str, work_dir: str | Path, *, steps_scale: float = 1.0, eval_prompts: int = 4096):
    """The :class:`~hf_icl.training.ICLTrainingArguments` of recipe ``name``, training into ``work_dir/name``.

    ``steps_scale`` multiplies the training and warm-up steps (at least one step each)."""
    from hf_icl.training import ICLTrainingArguments

    if name not in RECIPES:
        raise ValueError(f"name must be one of the zoo's models {sorted(RECIPES)}, got {name!r}")
    if not (isinstance(steps_scale, (int, float)) and math.isfinite(steps_scale) and steps_scale > 0):
        raise ValueError(f"steps_scale must be a finite number > 0, got {steps_scale!r}")
    recipe = {**SCHEDULE, **RECIPES[name]}
    steps = max(1, round(recipe["max_steps"] * steps_scale))
    values = {
        **recipe,
        "task_params": json.dumps(recipe.get("task_params", {})),
        "model_overrides": json.dumps(recipe.get("model_overrides", {})),
        "max_steps": steps,
        "warmup_steps": min(max(1, round(recipe["warmup_steps"] * steps_scale)), steps // 10),
        "eval_steps": 0,  # evaluate once, at the end (on the card's prompts)
        "save_steps": 0,  # one checkpoint, at the end
        "logging_steps": max(1, steps // 25),
        "eval_prompts": eval_prompts,
        "seed": 0,
        "report_to": "none",
        "run_name": name,
        "output_dir": str(Path(work_dir) / name),
        "overwrite_output_dir": True,
    }
    return ICLTrainingArguments(**values)


def script_command(name: str, options: argparse.Namespace) -> str:
    """The command that retrains model ``name`` as ``options`` did (the work and output dirs aside)."""
    parts = ["python", "scripts/train_model_zoo.py", "--only", name]
    if options.device != "auto":
        parts += ["--device", options.device]
    if options.steps_scale != 1.0:
        parts += ["--steps-scale", f"{options.steps_scale:g}"]
    return shlex.join(parts + evaluation_flags(options))


def evaluation_command(name: str, options: argparse.Namespace) -> str:
    """The command that reruns the card's evaluation of model ``name`` alone, as ``options`` did."""
    parts = ["python", "scripts/train_model_zoo.py", "--evaluate-only", "--only", name]
    if options.device != "auto":
        parts += ["--device", options.device]
    return shlex.join(parts + evaluation_flags(options))


def evaluation_flags(options: argparse.Namespace) -> list[str]:
    """The evaluation options that differ from their defaults."""
    flags = []
    if options.eval_prompts != DEFAULT_EVAL_PROMPTS:
        flags += ["--eval-prompts", str(options.eval_prompts)]
    if options.eval_seeds != DEFAULT_EVAL_SEEDS:
        flags += ["--eval-seeds", str(options.eval_seeds)]
    return flags


def hardware_description(device) -> str:
    """The processor (or GPU), the threads torch used, and the torch / transformers versions."""
    import torch
    import transformers

    if device.type == "cuda":
        where = f"GPU {torch.cuda.get_device_name(device)}"
    else:
        where = f"CPU {_cpu_model()} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads), no GPU"
    return f"{where}; torch {torch.__version__}, transformers {transformers.__version__}, {platform.system()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class TrainingFacts(NamedTuple):
    """What a card says about how its model was trained, kept when the evaluation is rerun alone (a NamedTuple, not
    a dataclass: the tests load this script as a module that is not in ``sys.modules``)."""

    on_gpu: bool
    hardware: str
    seconds: float
    date: str
    #: the options of the script's training run (device, steps scale): the card's retraining command keeps them
    options: argparse.Namespace


def facts_from_card(folder: Path) -> TrainingFacts:
    """The training facts in ``folder/README.md`` (its Notes, written by :func:`run_notes`, and its training
    command, written by :func:`script_command`)."""
    text = (folder / "README.md").read_text(encoding="utf-8")
    hardware = re.search(r"^- hardware(?: of training)?: (.+)$", text, flags=re.M)
    seconds = re.search(r"^- wall time of training: .*?\((\d+) s\)", text, flags=re.M)
    day = re.search(r"^- date(?: of training)?: (\S+)$", text, flags=re.M)
    command = re.search(r"^## Training\n\n```bash\npython scripts/train_model_zoo\.py (.+)\n```", text, flags=re.M)
    if not (hardware and seconds and day and command):
        raise ValueError(
            f"the card {folder / 'README.md'} does not state the hardware, wall time, date and command of training "
            "(lines '- hardware: ...', '- wall time of training: ... (N s)', '- date of training: ...' and a "
            "'python scripts/train_model_zoo.py ...' block under '## Training'); retrain the model with this script "
            "instead of rerunning its evaluation alone"
        )
    options = parse_options(shlex.split(command.group(1)))
    return TrainingFacts("**CPU size.**" not in text, hardware.group(1), float(seconds.group(1)), day.group(1), options)


def run_notes(
    name: str,
    args,
    facts: TrainingFacts,
    evaluation,
    *,
    evaluation_seconds: float,
    evaluation_hardware: str,
    rerun_command: str,
    references: str | None = None,
) -> str:
    """The card's "Notes" of model ``name``: size, hardware, wall time, the evaluation (its seeds, prompts, band
    rule, cost and the command that reruns it alone) and the equivalent ``hf-icl train`` command."""
    from hf_icl.training.model_card import reconstruct_training_command

    prompts = args.max_steps * args.per_device_train_batch_size
    if not facts.on_gpu:
        gpu_command = shlex.join(
            ["python", "scripts/train_model_zoo.py", "--only", name, "--device", "cuda", "--steps-scale", "10"]
        )
        size = (
            "**CPU size.** No GPU was available: this checkpoint was trained on a CPU at a size that takes minutes "
            f"({args.max_steps:,} steps × {args.per_device_train_batch_size} prompts = {prompts:,} fresh prompts), "
            f"far below the papers' budgets. Retrain longer on a GPU with `{gpu_command}`."
        )
    else:
        size = f"Trained on a GPU: {args.max_steps:,} steps × {args.per_device_train_batch_size} prompts."
    seeds = evaluation.seeds
    return (
        f"{size}\n\n{references + chr(10) * 2 if references else ''}"
        f"- hardware: {facts.hardware}\n"
        f"- wall time of training: {facts.seconds / 60:.1f} min ({facts.seconds:.0f} s), final evaluation included\n"
        f"- date of training: {facts.date}\n"
        f"- evaluation: {len(seeds)} seeds × {evaluation.n_prompts} fresh prompts (fresh tasks), seeds "
        f"{seeds[0]}–{seeds[-1]} (the training seed {args.seed} + 7919 + k, k = 0, …, {len(seeds) - 1}); "
        f"the mean over the seeds with the {100 * evaluation.level:g} % prediction interval for one more seed "
        f"(see Results); {evaluation_seconds:.0f} s on {evaluation_hardware}, {date.today().isoformat()}\n"
        f"- rerun the evaluation alone (the weights unchanged): `{rerun_command}`\n\n"
        f"The same run with the package's CLI:\n\n```bash\n{reconstruct_training_command(_cli_config(args))}\n```"
    )


def categorical_references(args, seeds=None, n_prompts: int | None = None) -> str:
    """For a categorical task, two references at the last position on the card's own evaluation prompts: a
    scikit-learn logistic regression fitted on each prompt's context pairs alone, and the Bayes classifier that
    knows the task's true weights (the ceiling: labels are drawn from a softmax, so it errs too).

    ``seeds`` are the card's evaluation seeds (default: the trainer's one, ``args.seed + 7919``) and ``n_prompts``
    the prompts of each (default ``args.eval_prompts``); with two seeds or more each accuracy is the mean over the
    seeds with the card's prediction interval for one more seed."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from hf_icl.data.tasks import get_task
    from hf_icl.training.model_card import prediction_interval
    from hf_icl.training.trainer import EVAL_SEED_OFFSET

    task = get_task(args.task, n_dims=args.n_dims, **json.loads(args.task_params))
    seeds = [args.seed + EVAL_SEED_OFFSET] if seeds is None else list(seeds)
    n_prompts = args.eval_prompts if n_prompts is None else n_prompts
    logistic, bayes = [], []
    for seed in seeds:
        xs, ys, params = task.sample(n_prompts, args.n_points, seed=seed, return_params=True)
        bayes.append((params["signal"][:, -1].argmax(-1) == ys[:, -1]).double().mean().item())
        hits = []
        for x, y in zip(xs.double().numpy(), ys.numpy(), strict=True):
            if len(set(y[:-1])) < 2:  # one class seen: predict it
                hits.append(y[0] == y[-1])
                continue
            probe = LogisticRegression(max_iter=1000).fit(x[:-1], y[:-1])
            hits.append(probe.predict(x[-1:])[0] == y[-1])
        logistic.append(float(np.mean(hits)))

    def summary(values: list[float]) -> str:
        if len(values) < 2:
            return f"{values[0]:.3f}"
        mean, lower, upper = prediction_interval(values, bounds=(0.0, 1.0))
        return f"{mean:.3f} [{lower:.3f}, {upper:.3f}]"

    examples = args.n_points - 1
    where = (
        f"the same {n_prompts} evaluation prompts"
        if len(seeds) == 1
        else f"the card's evaluation prompts ({len(seeds)} seeds × {n_prompts}; mean [the card's band])"
    )
    return (
        f"References on {where}, accuracy with {examples} examples: "
        f"logistic regression fitted on each prompt's {examples} pairs (scikit-learn, L2, C = 1, with an intercept, "
        f"over the classes the prompt shows) {summary(logistic)}; "
        f"the Bayes classifier with the task's true weights (the ceiling) {summary(bayes)}; "
        f"chance {1 / task.n_classes:.3f}."
    )


def _cli_config(args) -> dict:
    """The training arguments without this script's bookkeeping (where the run was written)."""
    return {k: v for k, v in args.to_dict().items() if k not in ("output_dir", "run_name")}


def evaluation_task(args):
    """The task the card evaluates on: the training family with fresh tasks from the prior (as the trainer's)."""
    from hf_icl.data.tasks import make_task

    return make_task({**args.task_family().to_dict(), "n_tasks": None})


def evaluate_folder(
    folder: Path, args, options: argparse.Namespace, facts: TrainingFacts, *, model=None, model_id: str
) -> dict:
    """The card's evaluation of the model saved in ``folder`` (``model`` if given, else loaded from there), and
    everything written from it: ``metrics.json`` (the trainer's scalars kept), the CSV, the plot and the card.

    The model and the task's default baselines are scored on ``options.eval_seeds`` seeds of
    ``options.eval_prompts`` fresh prompts each (:func:`~hf_icl.training.model_card.evaluate_over_seeds`).
    Returns a summary line's numbers (the last position's mean and band per curve)."""
    from transformers import AutoModel

    from hf_icl.evaluation.baselines import default_baselines
    from hf_icl.evaluation.runs import METRICS_FILE, read_metrics, write_curve_csv, write_metrics
    from hf_icl.training.model_card import card_seeds, evaluate_over_seeds
    from hf_icl.training.trainer import CURVE_FILE, EVAL_SEED_OFFSET, PLOT_FILE

    if model is None:
        model = AutoModel.from_pretrained(folder).eval().to(evaluation_device(options))
    device = next(model.parameters()).device
    task = evaluation_task(args)
    seeds = card_seeds(args.seed + EVAL_SEED_OFFSET, options.eval_seeds)
    start = time.perf_counter()
    evaluation = evaluate_over_seeds(
        {args.model_type: model, **default_baselines(task)},
        task,
        seeds,
        options.eval_prompts,
        n_points=args.n_points,
    )
    references = None
    if args.task == "categorical":
        references = categorical_references(args, seeds, options.eval_prompts)
    seconds = time.perf_counter() - start

    previous = read_metrics(folder / METRICS_FILE)  # the trainer's: its scalars (steps, final loss) stay
    write_metrics(
        folder / METRICS_FILE,
        {"standard": evaluation.entry()},
        model=args.model_type,
        task=task.name,
        scalars=previous["scalars"],
        run_name=previous.get("run_name") or folder.name,
    )
    write_curve_csv(folder / CURVE_FILE, evaluation.result)
    evaluation.plot(folder / PLOT_FILE)
    notes = run_notes(
        folder.name,
        args,
        facts,
        evaluation,
        evaluation_seconds=seconds,
        evaluation_hardware=hardware_description(device),
        rerun_command=evaluation_command(folder.name, options),
        references=references,
    )
    rewrite_card(
        folder,
        args,
        evaluation,
        scalars=previous["scalars"],
        command=script_command(folder.name, training_options(facts.options, options)),
        notes=notes,
        model_id=model_id,
    )
    last = evaluation.result.n_points - 1
    curves = evaluation.result
    return {
        "metric": curves.metric.name,
        "seeds": evaluation.seeds,
        "n_prompts": evaluation.n_prompts,
        "last": {name: float(curves.values[name][last]) for name in curves.predictors},
        "band": {
            name: [float(curves.lower[name][last]), float(curves.upper[name][last])] for name in curves.predictors
        },
        "evaluation_seconds": round(seconds, 1),
        "device": str(device),
    }


def rewrite_card(folder: Path, args, evaluation, *, scalars: dict, command: str, notes: str, model_id: str) -> None:
    """The card from the seed evaluation: its results table and model-index, this script's command, the run's
    notes, the shipped folder as model id; the trainer's own final metrics shown as such."""
    from hf_icl.training.model_card import write_model_card
    from hf_icl.training.trainer import EVAL_SEED_OFFSET, PLOT_FILE

    result = evaluation.result
    table = (
        f"## {result.metric.axis_label} by number of in-context examples\n\n"
        f"{evaluation.describe()}\n\n{result.to_markdown()}"
    )
    write_model_card(
        folder,
        args.to_dict(),
        scalars,
        plot_file=PLOT_FILE,
        results_table=table,
        eval_results=evaluation.eval_results(args.model_type),
        training_command=command,
        model_id=model_id,
        notes=notes,
        metrics_title=(
            f"Final metrics of training (the trainer's own evaluation: {args.eval_prompts} prompts of one seed, "
            f"{args.seed + EVAL_SEED_OFFSET})"
        ),
    )


def train_one(name: str, options: argparse.Namespace) -> dict:
    """Train recipe ``name``, evaluate it for its card, ship it into ``options.output/name``; returns a summary
    line's numbers."""
    from hf_icl.modeling.model_folder import write_model_manifest
    from hf_icl.training import train

    args = training_arguments(
        name, options.work_dir, steps_scale=options.steps_scale, eval_prompts=options.eval_prompts
    )
    print(f"== {name}: {args.model_type} on {args.task}, {args.max_steps} steps", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = train(args)
    seconds = time.perf_counter() - start
    device = next(result.model.parameters()).device
    facts = TrainingFacts(
        device.type == "cuda", hardware_description(device), seconds, date.today().isoformat(), options
    )
    work, shipped = Path(args.output_dir), Path(options.output) / name
    evaluated = evaluate_folder(work, args, options, facts, model=result.model, model_id=str(shipped))
    if shipped.exists():
        shutil.rmtree(shipped)
    shipped.mkdir(parents=True)
    for file in SHIPPED_FILES:
        if file != MANIFEST_FILE:
            shutil.copy2(work / file, shipped / file)
    write_model_manifest(shipped)  # after the last model file is in place
    summary = {
        "name": name,
        "seconds": round(seconds, 1),
        **evaluated,
        "megabytes": sum(f.stat().st_size for f in shipped.iterdir()) / 2**20,
    }
    print(json.dumps(summary), flush=True)
    return summary


def evaluate_one(name: str, options: argparse.Namespace) -> dict:
    """Rerun the card's evaluation of the shipped folder ``options.output/name`` alone: the weights, config and
    training arguments stay as they are; the card (its training facts kept), ``metrics.json``, the CSV and the
    plot are rewritten. Returns a summary line's numbers."""
    from hf_icl.training import ICLTrainingArguments
    from hf_icl.training.arguments import upgrade_names

    folder = Path(options.output) / name
    if not (folder / "training_args.json").is_file():
        raise ValueError(f"{folder} holds no shipped zoo model (no training_args.json): train it first")
    values = upgrade_names(json.loads((folder / "training_args.json").read_text()), str(folder))
    args = ICLTrainingArguments(**values)
    facts = facts_from_card(folder)
    print(f"== {name}: evaluating {args.model_type} on {options.eval_seeds} seeds", file=sys.stderr, flush=True)
    evaluated = evaluate_folder(folder, args, options, facts, model_id=str(folder))
    summary = {"name": name, **evaluated}
    print(json.dumps(summary), flush=True)
    return summary


def training_options(trained: argparse.Namespace, evaluated: argparse.Namespace) -> argparse.Namespace:
    """The options of a run that trains as ``trained`` did and evaluates as ``evaluated`` does: what the card's
    training command must say after ``--evaluate-only`` (whose own options know nothing of the training)."""
    return argparse.Namespace(
        **{**vars(trained), "eval_prompts": evaluated.eval_prompts, "eval_seeds": evaluated.eval_seeds}
    )


def evaluation_device(options: argparse.Namespace) -> str:
    """Where ``--evaluate-only`` runs the model: the GPU for ``--device cuda`` (or ``auto`` with one), else the CPU."""
    import torch

    return "cuda" if options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available()) else "cpu"


# -- models/README.md: the zoo's table, rebuilt from the shipped folders -----------------------------------------------
ZOO_README = """# The hf_icl model zoo

One trained checkpoint per ICL architecture of `hf_icl`, each a `save_pretrained` folder with a Hub model card
(task, size, training command, measured metrics with bands over evaluation seeds), its training arguments,
`metrics.json`, the context-scaling curve and plot, and a `manifest.json` (the sha256 of the model files: loading a
folder verifies it first, with its config against its weights). Load any of them with transformers' Auto classes:

```python
import torch
from transformers import AutoModel

import hf_icl  # registers hf_icl's architectures with the Auto classes

model = AutoModel.from_pretrained("models/gpt2-icl-linear-regression").eval()
xs, ys = hf_icl.get_task("linear_regression", n_dims=model.config.n_dims).sample(8, model.config.n_points, seed=0)
with torch.no_grad():
    predictions = model(xs, ys).predictions  # (8, N): position i predicted from the pairs j < i and x_i
```

**CPU sizes.** {size_note}

Every score in the table is a mean over the cards' {seeds} evaluation seeds, each a fresh draw of {prompts} prompts
(fresh tasks). The last column is the model's score at the last position (the most in-context examples) with the
95 % prediction interval for one more seed: mean ± t(0.975, n - 1) · s · √(1 + 1/n), s the standard deviation of
the n per-seed scores. Scoring a model on {prompts} fresh prompts of your own should land inside it 19 times in 20;
a bootstrap over the prompts of one draw is narrower and misses how far a fresh draw of tasks moves the mean. Each
card names its seeds and gives the band at every position. Regression is scored by squared error / d (/ 1 for the
unit-scale sinusoids), classification by top-1 accuracy. "Zero / chance" is the trivial predictor (predict 0, or
the chance rate 1/C). Least squares is exact on noiseless linear regression once the prompt holds d examples.

`tests/test_model_zoo.py` loads every folder with `AutoModel.from_pretrained`, scores it on {prompts} fresh prompts of
a seed none of the cards' evaluations used and checks that the last-position score falls inside the card's band,
that it beats the trivial predictor by a wide margin, and that `save_pretrained` -> `from_pretrained` is bit-exact.

{header}
{rows}

Rebuild every folder and this table with `python scripts/train_model_zoo.py` (one model: `--only NAME`; a longer
run on a GPU: `--device cuda --steps-scale 10`); rerun only the cards' evaluation, the weights untouched, with
`python scripts/train_model_zoo.py --evaluate-only`. `niah-retriever/` is the passkey-retrieval language model of
`docs/results/niah.md`, with its own card and test.
"""

TABLE_COLUMNS = (
    "model",
    "architecture",
    "task",
    "parameters",
    "size",
    "training",
    "wall time",
    "zero / chance",
    "least squares",
    "3-NN",
    "last position [95 % band for one more seed]",
)
NUMERIC_COLUMNS = ("parameters", "size", "wall time", "zero / chance", "least squares", "3-NN")


def zoo_row(folder: Path) -> tuple[str, str]:
    """One table row of a shipped folder (and how its card says it was trained: "CPU" or "GPU")."""
    from hf_icl.evaluation.runs import read_metrics
    from hf_icl.training.model_card import parameter_count

    config = json.loads((folder / "config.json").read_text())
    args = json.loads((folder / "training_args.json").read_text())
    entry = read_metrics(folder / "metrics.json")["evaluations"]["standard"]
    card = (folder / "README.md").read_text(encoding="utf-8")

    def last(predictor: str, band: bool = False) -> str:
        curves = entry["predictors"].get(predictor)
        if curves is None:
            return "—"
        text = f"{curves['mean'][-1]:.3g}"
        return f"**{text}** [{curves['lower'][-1]:.3g}, {curves['upper'][-1]:.3g}]" if band else text

    wall = re.search(r"wall time of training: .*?\((\d+) s\)", card)
    hardware = "CPU" if "**CPU size.**" in card else "GPU"
    task = args["task"] + ("" if args["task_params"] == "{}" else f" `{args['task_params']}`")
    row = [
        f"[`{folder.name}`]({folder.name}/)",
        f"`{config['architectures'][0]}`",
        f"{task}, d = {args['n_dims']}, {args['n_points']} points",
        f"{parameter_count(folder):,}",
        f"{sum(f.stat().st_size for f in folder.iterdir()) / 2**20:.2f} MB",
        f"{args['max_steps']:,} steps × {args['per_device_train_batch_size']}, AdamW {args['learning_rate']:g}",
        f"{int(wall.group(1)) / 60:.1f} min ({hardware})" if wall else "—",
        last("trivial"),
        last("least_squares"),
        last("knn"),
        f"{entry['metric']}: " + last(args["model_type"], band=True),
    ]
    return "| " + " | ".join(row) + " |", hardware


def write_zoo_readme(output: str | Path) -> Path:
    """Write ``output/README.md``: the table of every zoo folder in ``output`` (those with training_args.json)."""
    from hf_icl.evaluation.runs import read_metrics

    output = Path(output)
    folders = [f for f in sorted(output.iterdir()) if f.name in RECIPES and (f / "training_args.json").is_file()]
    if not folders:
        raise ValueError(f"output {str(output)!r} holds none of the zoo's models {sorted(RECIPES)}")
    rows, kinds = zip(*(zoo_row(folder) for folder in folders), strict=True)
    entries = [read_metrics(f / "metrics.json")["evaluations"]["standard"] for f in folders]
    prompts = {entry["n_prompts"] for entry in entries}
    seeds = {len(entry.get("seeds", [entry["seed"]])) for entry in entries}
    if set(kinds) == {"CPU"}:
        size_note = (
            "No GPU was available when these were trained: every model is a CPU size (minutes on a 2-core VM), "
            "far below the papers' budgets; each card says so and gives its hardware and wall time."
        )
    else:
        size_note = "Each card states whether it was trained on a CPU or a GPU, with the hardware and wall time."
    header = " | ".join(TABLE_COLUMNS)
    align = "|".join("---:" if c in NUMERIC_COLUMNS else "---" for c in TABLE_COLUMNS)
    text = ZOO_README.format(
        size_note=size_note,
        prompts=" / ".join(map(str, sorted(prompts))),
        seeds=" / ".join(map(str, sorted(seeds))),
        header=f"| {header} |\n|{align}|",
        rows="\n".join(rows),
    )
    path = output / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def select_device(device: str) -> None:
    """Make the trainer (Accelerate) use ``device``: ``cpu`` forces the CPU, ``cuda`` requires a GPU."""
    import torch

    if device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    elif device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no GPU here; pass --device cpu or auto")


def parse_options(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(RECIPES), action="append", help="train only this model (repeatable)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="where the shipped folders go (default: models)")
    parser.add_argument("--work-dir", default=DEFAULT_WORK_DIR, help="where the trainer writes (checkpoints, logs)")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="auto: a GPU if there is one")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply every recipe's steps (GPU runs)")
    parser.add_argument(
        "--eval-prompts", type=int, default=DEFAULT_EVAL_PROMPTS, help="fresh prompts per seed of the card's evaluation"
    )
    parser.add_argument(
        "--eval-seeds",
        type=int,
        default=DEFAULT_EVAL_SEEDS,
        help="evaluation seeds of the card (at least 2): the card gives their mean and a prediction interval",
    )
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--evaluate-only",
        action="store_true",
        help="train nothing; rerun the card's evaluation of the shipped folders in OUTPUT (weights untouched) and "
        "rewrite their cards, metrics, curves and OUTPUT/README.md",
    )
    modes.add_argument(
        "--index-only", action="store_true", help="train nothing; rewrite OUTPUT/README.md from the shipped folders"
    )
    options = parser.parse_args(argv)
    if not (math.isfinite(options.steps_scale) and options.steps_scale > 0):
        parser.error(f"--steps-scale must be a finite number > 0, got {options.steps_scale}")
    if options.eval_prompts < 1:
        parser.error(f"--eval-prompts must be at least 1, got {options.eval_prompts}")
    if options.eval_seeds < 2:
        parser.error(f"--eval-seeds must be at least 2 (a spread over seeds needs two), got {options.eval_seeds}")
    return options


def main(argv=None) -> None:
    options = parse_options(argv)
    select_device(options.device)
    if options.evaluate_only:
        for name in options.only or RECIPES:
            evaluate_one(name, options)
    elif not options.index_only:
        for name in options.only or RECIPES:
            train_one(name, options)
    print(f"wrote {write_zoo_readme(options.output)}", file=sys.stderr)


if __name__ == "__main__":
    main()
