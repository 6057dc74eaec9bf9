"""The README.md model card written next to a trained model's weights, in the Hugging Face Hub's format.

The card's YAML header carries the Hub metadata (license, library, tags, datasets and a ``model-index``
of evaluation results); its body holds a summary, a usage snippet that runs as written, the results,
the context-scaling plot, the training command and configuration, and the model's limitations.

The evaluation results and their bands over evaluation seeds are :mod:`hf_icl.training.card_evaluation`'s (every
name there is importable from here too).

Example::

    >>> import tempfile
    >>> from hf_icl.modeling import build_model
    >>> folder = tempfile.mkdtemp()
    >>> build_model("gpt2_icl", "tiny", n_dims=3, n_points=6, target_kind="regression").save_pretrained(folder)
    >>> config = {"task": "linear_regression", "n_dims": 3, "n_points": 6, "model_type": "gpt2_icl"}
    >>> results = [{"metric": "squared_error/d", "value": 0.12, "n_examples": 5, "lower": 0.1, "upper": 0.14}]
    >>> path = write_model_card(folder, config, eval_results=results)
    >>> read_card_results(folder)[0]["value"]
    0.12
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import validate_repo_id

from .card_evaluation import (  # noqa: F401  (re-exported: the card's evaluation names from before the split)
    BAND_KEYS,
    DEFAULT_EVAL_SEEDS,
    RESULT_KEYS,
    SEED_BAND_LEVEL,
    SeedEvaluation,
    card_seeds,
    check_eval_results,
    eval_results_from_context_scaling,
    evaluate_over_seeds,
    metric_bounds,
    prediction_interval,
    seed_evaluation_from_curves,
    t_quantile,
)

CARD_FILE = "README.md"
LICENSE = "apache-2.0"
LIBRARY_NAME = "hf_icl"
#: the model-index task type of each target kind
TASK_TYPES = {
    "regression": "in-context-regression",
    "binary": "in-context-classification",
    "categorical": "in-context-classification",
}
#: config fields that describe the model's shape, shown in the summary when the config has them
SHAPE_KEYS = (
    "n_layer",
    "n_head",
    "n_embd",
    "hidden_size",
    "n_hidden_layers",
    "embed_dim",
    "n_blocks",
    "prompt_format",
    "mlp_input",
    "feature_map",
    "normalization",
    "row_kernel",
    "kernel",
    "linear_attention_feature_map",
)
#: training arguments about resuming or clearing a run, not about the model: left out of the training command
NOT_IN_COMMAND = ("resume_from_checkpoint", "overwrite_output_dir")
#: training-config keys that name a dataset the model was trained on
DATASET_KEYS = ("train_dataset", "dataset_name")
#: the snippet's first line: :func:`set_card_model_id` finds it to point the card at a Hub repo
MODEL_ID_COMMENT = "# a folder written by save_pretrained, or a Hub repo id"
_MODEL_ID_LINE = re.compile(r"^model_id = .*  " + re.escape(MODEL_ID_COMMENT) + "$", flags=re.M)


def write_model_card(
    output_dir: str | Path,
    training_config: dict,
    metrics: dict[str, float] | None = None,
    plot_file: str | None = None,
    results_table: str | None = None,
    *,
    eval_results: list[dict] | None = None,
    datasets: list[str] | None = None,
    training_command: str | None = None,
    model_id: str | None = None,
    notes: str | None = None,
    metrics_title: str = "Final metrics",
) -> Path:
    """Write ``output_dir/README.md``, a Hub model card for the model saved in ``output_dir``.

    Args:
        output_dir: a folder written by ``save_pretrained`` (its ``config.json`` gives the architecture
            and the parameter count).
        training_config: the training arguments (``ICLTrainingArguments.to_dict()``); needs ``task`` and
            ``n_dims``, and ``task_params`` (a JSON object, or a dict) when the task has hyperparameters.
        metrics: final metrics, shown as a table.
        plot_file: the context-scaling plot, a path relative to ``output_dir`` (the card links it).
        results_table: a markdown section with the results (shown as given).
        eval_results: the model's scores for the ``model-index``, dicts with ``metric`` (e.g.
            ``"squared_error/d"``), ``value``, ``n_examples`` and optionally ``lower`` / ``upper`` (the band),
            ``n_prompts``, ``seeds`` and ``band`` (how the band was made, see :data:`RESULT_KEYS`); see
            :func:`eval_results_from_context_scaling` and :meth:`SeedEvaluation.eval_results`.
        datasets: datasets the model was trained on (added to the ``train_dataset`` / ``dataset_name`` of
            ``training_config``).
        training_command: the command that trained the model (default: rebuilt from ``training_config``).
        model_id: what the usage snippet loads (default: ``output_dir`` as given).
        notes: markdown shown as a "Notes" section after the training command (e.g. the hardware, the wall
            time, why the run is small).
        metrics_title: the heading of the ``metrics`` table (say where the numbers come from when the card's
            results come from another evaluation).

    Returns:
        The path of the card.
    """
    output_dir = Path(output_dir)
    if not (output_dir / "config.json").is_file():
        raise ValueError(
            f"output_dir {str(output_dir)!r} has no config.json: write the model there with save_pretrained "
            "before its model card"
        )
    if plot_file is not None and Path(plot_file).is_absolute():
        raise ValueError(f"plot_file must be a path relative to output_dir, got the absolute path {plot_file!r}")
    if notes is not None and not (isinstance(notes, str) and notes.strip()):
        raise ValueError(f"notes must be a non-empty markdown string or None, got {notes!r}")
    if not (isinstance(metrics_title, str) and metrics_title.strip() and "\n" not in metrics_title):
        raise ValueError(f"metrics_title must be a one-line non-empty string, got {metrics_title!r}")
    task = _task_family(training_config)
    results = [] if eval_results is None else check_eval_results(eval_results)
    model_id = str(output_dir) if model_id is None else model_id
    model_name = str(training_config.get("run_name") or output_dir.resolve().name)
    data = ModelCardData(
        license=LICENSE,
        library_name=LIBRARY_NAME,
        tags=_unique(["in-context-learning", LIBRARY_NAME, _model_type(output_dir, training_config), task.name]),
        datasets=_card_datasets(training_config, datasets) or None,
        model_name=model_name,
        eval_results=[_eval_result(item, task, training_config) for item in results] or None,
    )
    sections = [
        f"# {_model_type(output_dir, training_config)} trained in context on `{task.name}`",
        _summary(output_dir, training_config, task),
        "## Usage\n\n"
        "Draw fresh prompts from the task family, predict every position in one forward pass, and compare the "
        f"last position with {_baseline_label(task)}:\n\n```python\n{usage_snippet(model_id, training_config)}```",
        _results_section(metrics, results_table, results, plot_file, metrics_title.strip()),
        "## Training\n\n"
        f"```bash\n{training_command or reconstruct_training_command(training_config)}\n```\n\n"
        f"### Training configuration\n\n```yaml\n{_yaml(training_config)}```",
        f"## Notes\n\n{notes.strip()}" if notes else "",
        "## Limitations\n\n"
        f"Trained and evaluated on synthetic in-context-learning tasks only (`{task.name}` prompts with "
        f"{training_config['n_dims']}-dimensional inputs): it is a research model of in-context learning, "
        "not a model of real-world data, and its predictions outside that prompt distribution are untested.",
    ]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(s for s in sections if s) + "\n")
    path = output_dir / CARD_FILE
    card.save(path)
    return path


def usage_snippet(model_id: str, training_config: dict) -> str:
    """Python code that loads the model, draws prompts of its task, and prints the error (or accuracy)
    at the last position next to a classical baseline (least squares; chance for categorical labels).

    >>> code = usage_snippet("runs/linreg", {"task": "linear_regression", "n_dims": 5})
    >>> 'AutoModel.from_pretrained(model_id)' in code and 'get_task("linear_regression"' in code
    True
    """
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"model_id must be a non-empty string (a folder or a Hub repo id), got {model_id!r}")
    task = _task_family(training_config)
    params = _task_params(training_config)
    categorical = task.target_kind == "categorical"
    output = "output.logits" if categorical else "output.predictions"
    if categorical:
        baseline = "baseline_score = metric.trivial_per_prompt(ys)[:, -1].mean().item()  # chance: 1 / n_classes\n"
        label = "chance"
    else:
        baseline = (
            'baseline = hf_icl.get_estimator("least_squares")(xs, ys)  # refitted on every prefix\n'
            "baseline_score = metric.per_prompt(baseline, ys)[:, -1].mean().item()\n"
        )
        label = "least squares"
    fresh = "  # fresh tasks from the prior" if training_config.get("n_tasks") is not None else ""
    return (
        "import torch\n"
        "from transformers import AutoModel\n\n"
        "import hf_icl  # registers hf_icl's architectures with the Auto classes\n"
        "from hf_icl.evaluation import metric_for_task\n\n"
        f"model_id = {json.dumps(model_id)}  {MODEL_ID_COMMENT}\n"
        "model = AutoModel.from_pretrained(model_id).eval()\n"
        "config = model.config\n"
        f"task_params = {params!r}\n"
        f'task = hf_icl.get_task("{task.name}", n_dims=config.n_dims, **task_params){fresh}\n'
        "xs, ys = task.sample(256, config.n_points, seed=0)  # 256 prompts: xs (256, N, d), ys (256, N)\n\n"
        "with torch.no_grad():\n"
        "    output = model(xs, ys)  # every position i at once, each predicted from the pairs j < i and x_i\n"
        f"metric = metric_for_task(task)  # how hf_icl scores {task.name}: {metric_name(task)}\n"
        f"model_score = metric.per_prompt({output}, ys)[:, -1].mean().item()\n"
        f"{baseline}"
        f'print(f"{{metric.name}} with {{config.n_points - 1}} examples: model {{model_score:.4f}}, '
        f'{label} {{baseline_score:.4f}}")\n'
    )


def read_card_results(folder: str | Path) -> list[dict[str, Any]]:
    """The evaluation results in the ``model-index`` of ``folder/README.md`` (empty if it has none).

    Each is a dict with :data:`RESULT_KEYS` (``lower`` / ``upper`` None when the card gives no band, and
    ``n_prompts`` / ``seeds`` / ``band`` None when the card does not say), plus ``task`` (the task family) and
    ``task_type``. A card written from :func:`evaluate_over_seeds` gives, for every result, the mean over
    ``seeds`` as ``value`` and the prediction interval for one more seed of ``n_prompts`` prompts as the band.
    """
    path = Path(folder) / CARD_FILE
    if not path.is_file():
        raise ValueError(f"folder {str(folder)!r} has no {CARD_FILE} model card")
    card = ModelCard.load(path)
    found = []
    for result in card.data.eval_results or []:
        args = result.metric_args or {}
        found.append(
            {
                "metric": result.metric_type,
                "value": result.metric_value,
                "n_examples": args.get("n_examples"),
                **{key: args.get(key) for key in BAND_KEYS},
                "task": result.dataset_type,
                "task_type": result.task_type,
            }
        )
    return found


def reconstruct_training_command(training_config: dict) -> str:
    """The ``hf-icl train`` command that trains with ``training_config``: a flag for every training argument
    that differs from its default (resuming and overwriting aside).

    >>> reconstruct_training_command({"task": "linear_regression", "n_dims": 5, "seed": 0})
    'hf-icl train --n_dims 5'
    """
    from . import arguments

    legacy = getattr(arguments, "LEGACY_NAMES", {})  # names of earlier versions (old training_args.json files)
    defaults = {f.name: _field_default(f) for f in fields(arguments.ICLTrainingArguments)}
    flags = []
    for key, value in training_config.items():
        name = legacy.get(key, key)
        if name in NOT_IN_COMMAND or name not in defaults or value == defaults[name]:
            continue  # an unknown key has no flag to set
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--{name} False")
        elif value is None:
            flags.append(f"--{name} none")
        else:
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            flags.append(f"--{name} {shlex.quote(text)}")
    return " \\\n  ".join(["hf-icl train", *flags]) if len(flags) > 3 else " ".join(["hf-icl train", *flags])


def set_card_model_id(folder: str | Path, model_id: str) -> bool:
    """Point the usage snippet of ``folder/README.md`` at ``model_id`` (e.g. the Hub repo it is pushed to).

    Returns False (and leaves the card alone) when the card has no hf_icl usage snippet."""
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"model_id must be a non-empty string, got {model_id!r}")
    path = Path(folder) / CARD_FILE
    text = path.read_text(encoding="utf-8")
    line = f"model_id = {json.dumps(model_id)}  {MODEL_ID_COMMENT}"
    updated, count = _MODEL_ID_LINE.subn(lambda _: line, text)
    if count:
        path.write_text(updated, encoding="utf-8")
    return bool(count)


def metric_name(task) -> str:
    """The name of ``task``'s metric (``squared_error/d``, ``accuracy``, ...)."""
    from ..evaluation.metrics import metric_for_task

    return metric_for_task(task).name


# -- the parts of the card ------------------------------------------------------------------------------------
def _summary(output_dir: Path, training_config: dict, task) -> str:
    config = json.loads((output_dir / "config.json").read_text())
    architecture = (config.get("architectures") or [config.get("model_type", "model")])[0]
    shape = ", ".join(f"{key}={config[key]}" for key in SHAPE_KEYS if config.get(key) is not None)
    pool = training_config.get("n_tasks")
    source = f"a fixed pool of {pool} tasks" if pool is not None else "a fresh task for every prompt"
    return (
        f"A `{architecture}` (model_type `{config.get('model_type')}`{', ' + shape if shape else ''}) with "
        f"**{parameter_count(output_dir):,} parameters**, trained with "
        f"hf_icl to learn `{task.name}` functions in context ({task.target_kind} targets): "
        f"a prompt holds up to {config.get('n_points')} pairs (x, y) with x in {config.get('n_dims')} dimensions, "
        "and the model predicts y at every position from the pairs before it. Training drew "
        f"{source}; it is scored by {metric_name(task)} against classical estimators fitted to the same prompts."
    )


def _results_section(metrics, results_table, results, plot_file, metrics_title="Final metrics") -> str:
    parts = ["## Results"]
    if metrics:
        rows = "\n".join(
            f"| {k} | {v if isinstance(v, int) else format(v, '.4g')} |"
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        )
        parts.append(f"### {metrics_title}\n\n| metric | value |\n|---|---:|\n{rows}")
    if results_table:
        parts.append(results_table)
    elif results:
        rows = "\n".join(
            f"| {r['n_examples']} | {r['metric']} | {r['value']:.4g} | "
            + ("" if r["lower"] is None else f"[{r['lower']:.4g}, {r['upper']:.4g}]")
            + " |"
            for r in results
        )
        header = "### By number of in-context examples\n\n| examples | metric | value | band |\n|---:|---|---:|---|"
        parts.append(f"{header}\n{rows}")
    if plot_file:
        parts.append(f"### Context scaling\n\n![error vs number of in-context examples]({plot_file})")
    return "\n\n".join(parts) if len(parts) > 1 else ""


def _eval_result(item: dict, task, training_config: dict) -> EvalResult:
    args = {key: item[key] for key in ("n_examples", *BAND_KEYS) if item[key] is not None}
    dataset_args = {"n_dims": training_config["n_dims"], **_task_params(training_config)}
    return EvalResult(
        task_type=TASK_TYPES[task.target_kind],
        task_name=f"in-context {task.target_kind}",
        dataset_type=task.name,
        dataset_name=f"{task.name} prompts (fresh tasks, d={training_config['n_dims']})",
        dataset_args=dataset_args,
        metric_type=item["metric"],
        metric_name=f"{item['metric']} at {item['n_examples']} example{'' if item['n_examples'] == 1 else 's'}",
        metric_value=item["value"],
        metric_args=args,
    )


# -- helpers -----------------------------------------------------------------------------------------------------
def _task_family(training_config: dict):
    from ..data.tasks import get_task

    if not isinstance(training_config, dict):
        raise ValueError(f"training_config must be a dict of training arguments, got {type(training_config).__name__}")
    missing = [key for key in ("task", "n_dims") if key not in training_config]
    if missing:
        raise ValueError(f"training_config lacks {missing}: the card needs the task family and its input dimension")
    return get_task(training_config["task"], n_dims=training_config["n_dims"], **_task_params(training_config))


def _task_params(training_config: dict) -> dict[str, Any]:
    params = training_config.get("task_params") or {}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except json.JSONDecodeError as err:
            raise ValueError(f"training_config['task_params'] must be a JSON object, got {params!r} ({err})") from None
    if not isinstance(params, dict):
        raise ValueError(f"training_config['task_params'] must be a JSON object, got {params!r}")
    return params


def _model_type(output_dir: Path, training_config: dict) -> str:
    return json.loads((output_dir / "config.json").read_text()).get("model_type") or training_config.get(
        "model_type", "icl_model"
    )


def parameter_count(output_dir: Path) -> int:
    """Parameters of the saved architecture, counted on the meta device (no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from .. import modeling  # noqa: F401  (registers the architectures with the Auto classes)

    config = AutoConfig.from_pretrained(output_dir)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _card_datasets(training_config: dict, datasets: list[str] | None) -> list[str]:
    if datasets is not None and (
        not isinstance(datasets, (list, tuple)) or not all(isinstance(d, str) and d for d in datasets)
    ):
        raise ValueError(f"datasets must be a list of dataset names, got {datasets!r}")
    from_config = [_dataset_label(training_config[key]) for key in DATASET_KEYS if training_config.get(key)]
    return _unique([*(datasets or []), *from_config])


def _dataset_label(value: Any) -> str:
    """A Hub dataset id as given; a dataset saved to disk by its folder's name (its path means nothing on the Hub)."""
    value = str(value)
    try:
        validate_repo_id(value)
    except ValueError:
        return Path(value).name
    return Path(value).name if Path(value).exists() else value


def _baseline_label(task) -> str:
    return "the chance rate" if task.target_kind == "categorical" else "least squares"


def _field_default(field) -> Any:
    if field.default is not MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not MISSING else MISSING


def _unique(items: list) -> list:
    return list(dict.fromkeys(item for item in items if item))


def _yaml(values: dict) -> str:
    import yaml

    return yaml.safe_dump(values, sort_keys=False)
