"""The README.md model card written next to a trained model's weights, in the Hugging Face Hub's format.

The card's YAML header carries the Hub metadata (license, library, tags, datasets and a ``model-index``
of evaluation results); its body holds a summary, a usage snippet that runs as written, the results,
the context-scaling plot, the training command and configuration, and the model's limitations.

A band in the card says where a user's own number should land. A bootstrap over the prompts of one draw does
not: it leaves out how far a fresh draw of tasks moves the mean (heavy-tailed squared errors make it worse), so a
user's fresh prompts can fall outside it far more often than its level says. :func:`evaluate_over_seeds` therefore
scores the model on several evaluation seeds (independent draws of tasks and inputs, the same number of prompts
each) and states, at every position, the mean over the seeds and the **prediction interval** for the value of one
more seed (:func:`prediction_interval`)::

    mean ± t_{(1 + level)/2, n - 1} · s · sqrt(1 + 1/n)      (n seeds, s the standard deviation of their values)

With ``level = 0.95`` a fresh seed's value (same number of prompts) falls inside it 19 times in 20 when the
per-seed means are normal (4096 prompts each make them close to it). The model-index of such a card records, for
every result, the band's rule (``band``), the seeds (``seeds``) and the prompts per seed (``n_prompts``);
:func:`read_card_results` returns them.

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
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import validate_repo_id

from ..validation import check_float, check_int

CARD_FILE = "README.md"
LICENSE = "apache-2.0"
LIBRARY_NAME = "hf_icl"
#: the model-index task type of each target kind
TASK_TYPES = {
    "regression": "in-context-regression",
    "binary": "in-context-classification",
    "categorical": "in-context-classification",
}
#: keys of one evaluation result (what ``eval_results`` takes and :func:`read_card_results` returns); the first
#: three are required. ``lower`` / ``upper``: the band; ``n_prompts``: the prompts behind one evaluation (one seed);
#: ``seeds``: the evaluation seeds the value and band come from; ``band``: the band's rule in words
RESULT_KEYS = ("metric", "value", "n_examples", "lower", "upper", "n_prompts", "seeds", "band")
#: the result keys written into a model-index entry's ``args`` (besides ``n_examples``)
BAND_KEYS = ("lower", "upper", "n_prompts", "seeds", "band")
#: the level of a card's prediction interval over evaluation seeds
SEED_BAND_LEVEL = 0.95
#: how many evaluation seeds a card's band is drawn from by default
DEFAULT_EVAL_SEEDS = 10
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


def eval_results_from_context_scaling(
    result,
    predictor: str,
    positions: Sequence[int] | None = None,
    *,
    seeds: Sequence[int] | None = None,
    band: str | None = None,
) -> list[dict[str, Any]]:
    """``eval_results`` for :func:`write_model_card` from a context-scaling evaluation: ``predictor``'s mean
    score and band at a few numbers of in-context examples (default: about 1, N/4, N/2 and the last).

    ``result`` is a :class:`~hf_icl.evaluation.ContextScalingResult`; each row also records its prompt count
    (``n_prompts``), the evaluation ``seeds`` when given, and ``band``, the band's rule (default: the result's
    bootstrap quantiles over the prompts of one draw, e.g. ``"5-95 % bootstrap band over the prompts of one
    draw"``). :meth:`SeedEvaluation.eval_results` passes its seeds and its prediction-interval rule.
    """
    if predictor not in result.values:
        raise ValueError(f"predictor must be one of the evaluated curves {list(result.values)}, got {predictor!r}")
    if band is None:
        low, high = (100 * q for q in result.confidence)
        band = f"{low:g}-{high:g} % bootstrap band over the prompts of one draw"
    last = result.n_points - 1
    if positions is None:  # position 0 has no examples: every predictor predicts the prior there
        positions = sorted({1, last // 4, last // 2, last} - {0}) if last else [0]
    rows = []
    for position in positions:
        check_int("positions", position, low=0, high=last)
        rows.append(
            {
                "metric": result.metric.name,
                "value": float(result.values[predictor][position]),
                "n_examples": position,
                "lower": float(result.lower[predictor][position]),
                "upper": float(result.upper[predictor][position]),
                "n_prompts": int(result.n_prompts),
                "seeds": None if seeds is None else [int(seed) for seed in seeds],
                "band": band,
            }
        )
    return check_eval_results(rows)


# -- bands over evaluation seeds ---------------------------------------------------------------------------------
def card_seeds(first_seed: int, n_seeds: int = DEFAULT_EVAL_SEEDS) -> list[int]:
    """The evaluation seeds of a card: ``first_seed, first_seed + 1, ..., first_seed + n_seeds - 1``.

    Each seed draws its own tasks and inputs (``TaskFamily.sample(..., seed=seed)``), so the draws are independent.

    >>> card_seeds(7919, 3)
    [7919, 7920, 7921]
    """
    check_int("first_seed", first_seed, low=0)
    check_int("n_seeds", n_seeds, low=2)
    return list(range(first_seed, first_seed + n_seeds))


def t_quantile(level: float, n_values: int) -> float:
    """``t_{(1 + level)/2, n_values - 1}``: the Student-t quantile of a two-sided ``level`` interval from
    ``n_values`` values (scipy's ``t.ppf``)."""
    from scipy.stats import t  # scipy comes with scikit-learn

    return float(t.ppf((1.0 + _check_level(level)) / 2.0, check_int("n_values", n_values, low=2) - 1))


def prediction_interval(
    values: Sequence[float], level: float = SEED_BAND_LEVEL, bounds: tuple[float, float] | None = None
) -> tuple[float, float, float]:
    """``(mean, lower, upper)`` of ``n >= 2`` independent values: their mean, and the interval that one more
    independent value of the same kind falls into with probability ``level``::

        mean ± t_{(1 + level)/2, n - 1} · s · sqrt(1 + 1/n)

    where ``s`` is the values' standard deviation (``n - 1`` in its denominator). This is the textbook prediction
    interval of a normal sample: exact when the values are independent and normal, whatever the unknown mean and
    variance. It is wider than the mean's confidence interval (``± t · s / sqrt(n)``) because a new value carries
    its own scatter as well as the mean's uncertainty. ``bounds`` clips the interval to a metric's range
    (``(0, inf)`` for squared errors, ``(0, 1)`` for accuracy).

    >>> mean, lower, upper = prediction_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> mean, round(lower, 3), round(upper, 3)
    (3.0, -1.809, 7.809)
    >>> prediction_interval([1.0, 2.0, 3.0, 4.0, 5.0], bounds=(0.0, 6.0))[1:]
    (0.0, 6.0)
    """
    import torch

    tensor = torch.as_tensor([float(check_float("values", v)) for v in values], dtype=torch.float64)
    mean, lower, upper = _prediction_band(tensor[:, None], level, bounds)
    return float(mean[0]), float(lower[0]), float(upper[0])


def metric_bounds(metric) -> tuple[float, float]:
    """The range a metric's value can take: ``(0, inf)`` for squared errors, ``(0, 1)`` for accuracy."""
    return (0.0, math.inf) if metric.target_kind == "regression" else (0.0, 1.0)


@dataclass
class SeedEvaluation:
    """A context-scaling evaluation repeated on several evaluation seeds, summarised for a model card.

    Attributes:
        result: a :class:`~hf_icl.evaluation.ContextScalingResult` whose ``values`` are the mean over the seeds
            (of each seed's mean over its prompts) and whose ``lower`` / ``upper`` are the prediction interval
            for one more seed's value (:func:`prediction_interval`, clipped to the metric's range), per predictor
            and position; ``confidence`` is ``((1 - level)/2, (1 + level)/2)`` and ``n_prompts`` the prompts of
            one seed.
        seeds: the evaluation seeds, one draw of ``n_prompts`` prompts (fresh tasks) each.
        per_seed: ``{predictor: (n_seeds, N) float64}``, each seed's mean score at every position.
        level: the prediction interval's level (0.95: a fresh seed lands inside 19 times in 20).
    """

    result: Any
    seeds: list[int]
    per_seed: dict[str, Any]
    level: float = SEED_BAND_LEVEL

    @property
    def n_prompts(self) -> int:
        """Prompts behind one seed's evaluation (the size a user's own evaluation must have for the band)."""
        return self.result.n_prompts

    @property
    def band(self) -> str:
        """The band's rule in one line (the model-index's ``band``)."""
        n = len(self.seeds)
        return (
            f"{100 * self.level:g} % prediction interval for one more evaluation seed of {self.n_prompts} prompts: "
            f"mean over {n} seeds ± t({(1 + self.level) / 2:g}, {n - 1}) · s · sqrt(1 + 1/{n}), s the standard "
            "deviation over the seeds"
        )

    def describe(self) -> str:
        """A markdown paragraph for the card: what the numbers and the band are, and which seeds were used."""
        n = len(self.seeds)
        t = t_quantile(self.level, n)
        return (
            f"Every number below is the **mean over {n} evaluation seeds** ({_seed_list(self.seeds)}), each a "
            f"fresh draw of {self.n_prompts} prompts with their own tasks; its band is the "
            f"**{100 * self.level:g} % prediction interval for one more seed**, mean ± t · s · √(1 + 1/{n}) with "
            f"t = t({(1 + self.level) / 2:g}, {n - 1}) = {t:.3f} and s the standard deviation of the "
            f"{n} per-seed values (clipped to the metric's range). Scoring the model on {self.n_prompts} fresh "
            f"prompts of your own (any other seed) should land inside the band {self._odds()}. A bootstrap over "
            "the prompts of one draw would be narrower and would understate this: it leaves out how far a fresh "
            "draw of tasks moves the mean."
        )

    def _odds(self) -> str:
        return "19 times in 20" if math.isclose(self.level, 0.95) else f"with probability {self.level:g}"

    def eval_results(self, predictor: str, positions: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """``eval_results`` for :func:`write_model_card`: ``predictor``'s mean over the seeds and its prediction
        interval at a few positions (those of :func:`eval_results_from_context_scaling`), each recording
        ``n_prompts``, ``seeds`` and the band's rule."""
        return eval_results_from_context_scaling(self.result, predictor, positions, seeds=self.seeds, band=self.band)

    def entry(self, **extra: Any) -> dict[str, Any]:
        """The ``metrics.json`` evaluation entry (:func:`~hf_icl.evaluation.runs.evaluation_entry`): the curves
        (mean over seeds, prediction band), ``seed`` (the first seed), ``seeds``, ``level``, ``band`` and
        ``seed_curves``, each seed's curve per predictor (enough to recompute the band by any other rule)."""
        from ..evaluation.runs import evaluation_entry

        curves = {name: values.tolist() for name, values in self.per_seed.items()}
        return evaluation_entry(
            self.result,
            seed=self.seeds[0],
            seeds=list(self.seeds),
            level=self.level,
            band=self.band,
            **extra,
            seed_curves=curves,
        )

    def plot(self, path: str | Path, *, title: str | None = None) -> Path:
        """The curves with their prediction bands shaded (the trivial predictor dashed), written to a PNG."""
        import torch

        from ..evaluation.plotting import BASELINE_STYLES, draw_band_curve, new_axes, save_figure

        result = self.result
        fig, ax = new_axes(title or f"{result.task_name} ({len(self.seeds)} seeds × {self.n_prompts} prompts)")
        x = torch.arange(result.n_points)
        for name in result.predictors:
            style = {"linestyle": BASELINE_STYLES[0], "color": "0.4"} if name == "trivial" else {"marker": "."}
            draw_band_curve(ax, x, result.values[name], result.lower[name], result.upper[name], label=name, **style)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("number of in-context examples")
        ax.set_ylabel(result.metric.axis_label)
        if result.metric.target_kind == "regression":
            ax.set_yscale("log")
        from matplotlib.patches import Patch

        handles, labels = ax.get_legend_handles_labels()
        handles.append(Patch(facecolor="0.5", alpha=0.2, linewidth=0))
        labels.append(f"{100 * self.level:g} % prediction band for one more seed")
        ax.legend(handles, labels)
        return save_figure(fig, path)


def seed_evaluation_from_curves(
    per_seed: dict[str, Any],
    metric,
    seeds: Sequence[int],
    n_prompts: int,
    *,
    task_name: str = "",
    level: float = SEED_BAND_LEVEL,
) -> SeedEvaluation:
    """A :class:`SeedEvaluation` from each seed's curves ``{predictor: (n_seeds, N)}`` (``"trivial"`` among
    them): mean over seeds and :func:`prediction_interval` at every position, clipped to ``metric``'s range."""
    import torch

    from ..evaluation import ContextScalingResult

    seeds = _check_seeds("seeds", seeds, 2)
    level = _check_level(level)
    check_int("n_prompts", n_prompts, low=1)
    if "trivial" not in per_seed:
        raise ValueError(f"per_seed must hold the 'trivial' curve besides the predictors, got {sorted(per_seed)}")
    curves = {name: torch.as_tensor(c, dtype=torch.float64) for name, c in per_seed.items()}
    shapes = {tuple(c.shape) for c in curves.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != len(seeds):
        raise ValueError(f"per_seed curves must all be (n_seeds={len(seeds)}, N), got shapes {sorted(shapes)}")
    bands = {name: _prediction_band(c, level, metric_bounds(metric)) for name, c in curves.items()}
    result = ContextScalingResult(
        metric=metric,
        values={name: band[0] for name, band in bands.items()},
        lower={name: band[1] for name, band in bands.items()},
        upper={name: band[2] for name, band in bands.items()},
        n_prompts=n_prompts,
        task_name=task_name,
        confidence=((1 - level) / 2, (1 + level) / 2),
    )
    return SeedEvaluation(result=result, seeds=seeds, per_seed=curves, level=level)


def evaluate_over_seeds(
    models_and_estimators: dict[str, Any],
    task,
    seeds: Sequence[int],
    n_prompts: int,
    *,
    n_points: int | None = None,
    batch_size: int | None = None,
    device=None,
    level: float = SEED_BAND_LEVEL,
) -> SeedEvaluation:
    """Score every predictor on ``n_prompts`` fresh prompts of ``task`` for each of ``seeds`` (at least two;
    one :func:`~hf_icl.evaluation.evaluate_context_scaling` per seed, the predictors sharing each seed's prompts)
    and summarise the seeds: mean over seeds and the ``level`` prediction interval for one more seed's value.

    Each seed is an independent draw of tasks and inputs of the same size, so the spread over seeds is the spread
    a user's own evaluation of ``n_prompts`` prompts will show, task draw included; see the module docstring for
    the rule. The per-seed bootstrap is skipped (its bands are not used).

    Example::

        >>> from hf_icl.data.tasks import get_task
        >>> from hf_icl.estimators import get_estimator
        >>> seeds = evaluate_over_seeds({"averaging": get_estimator("averaging")},
        ...                             get_task("linear_regression", n_dims=2), seeds=[0, 1, 2], n_prompts=32,
        ...                             n_points=4)
        >>> seeds.seeds, seeds.n_prompts, tuple(seeds.per_seed["averaging"].shape)
        ([0, 1, 2], 32, (3, 4))
    """
    import torch

    from ..evaluation import evaluate_context_scaling

    seeds = _check_seeds("seeds", seeds, 2)
    per_seed: dict[str, list] = {}
    for seed in seeds:
        result = evaluate_context_scaling(
            models_and_estimators,
            task,
            n_prompts=n_prompts,
            seed=seed,
            n_points=n_points,
            batch_size=batch_size,
            device=device,
            n_bootstrap=1,
        )
        for name, values in result.values.items():
            per_seed.setdefault(name, []).append(values)
    curves = {name: torch.stack(values) for name, values in per_seed.items()}
    return seed_evaluation_from_curves(curves, result.metric, seeds, n_prompts, task_name=result.task_name, level=level)


def check_eval_results(eval_results: Any) -> list[dict[str, Any]]:
    """Check ``eval_results`` (a list of dicts with :data:`RESULT_KEYS`) and return them with plain numbers."""
    if not isinstance(eval_results, (list, tuple)):
        raise ValueError(f"eval_results must be a list of dicts, got {type(eval_results).__name__}")
    checked = []
    for i, item in enumerate(eval_results):
        where = f"eval_results[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a dict with keys {list(RESULT_KEYS)}, got {item!r}")
        missing = [key for key in RESULT_KEYS[:3] if key not in item]
        unknown = sorted(set(item) - set(RESULT_KEYS))
        if missing or unknown:
            problem = f"lacks {missing}" if missing else f"has unknown keys {unknown}"
            raise ValueError(
                f"{where} {problem}; its keys must be {list(RESULT_KEYS)} (all but the first three optional)"
            )
        if not isinstance(item["metric"], str) or not item["metric"]:
            raise ValueError(
                f"{where}['metric'] must be a metric name such as 'squared_error/d', got {item['metric']!r}"
            )
        row = {
            "metric": item["metric"],
            "value": check_float(f"{where}['value']", item["value"]),
            "n_examples": check_int(f"{where}['n_examples']", item["n_examples"], low=0),
        }
        for key in ("lower", "upper"):
            value = item.get(key)
            row[key] = None if value is None else check_float(f"{where}[{key!r}]", value)
        if row["lower"] is not None and row["upper"] is not None and row["lower"] > row["upper"]:
            raise ValueError(
                f"{where} has lower {row['lower']} above upper {row['upper']}; a band needs lower <= upper"
            )
        n_prompts = item.get("n_prompts")
        row["n_prompts"] = None if n_prompts is None else check_int(f"{where}['n_prompts']", n_prompts, low=1)
        row["seeds"] = None if item.get("seeds") is None else _check_seeds(f"{where}['seeds']", item["seeds"], 1)
        band = item.get("band")
        if band is not None and not (isinstance(band, str) and band.strip()):
            raise ValueError(f"{where}['band'] must be a non-empty string saying how the band was made, got {band!r}")
        row["band"] = band
        checked.append(row)
    return checked


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


def _check_level(level: Any) -> float:
    level = check_float("level", level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level}")
    return level


def _check_seeds(name: str, seeds: Any, at_least: int) -> list[int]:
    """Distinct non-negative integer seeds, at least ``at_least`` of them, as a list."""
    if not isinstance(seeds, (list, tuple)) or len(seeds) < at_least:
        raise ValueError(f"{name} must be a list of at least {at_least} evaluation seeds, got {seeds!r}")
    checked = [check_int(f"{name}[{i}]", seed, low=0) for i, seed in enumerate(seeds)]
    if len(set(checked)) != len(checked):
        raise ValueError(f"{name} must be distinct (each seed one independent draw), got {checked}")
    return checked


def _prediction_band(values, level: float, bounds: tuple[float, float] | None = None):
    """Mean, lower and upper along dim 0 of ``values`` ``(n, ...)``: see :func:`prediction_interval`."""
    import torch

    n = values.shape[0]
    if n < 2:
        raise ValueError(f"a prediction interval needs at least 2 values (seeds), got {n}")
    mean = values.mean(dim=0)
    half = t_quantile(level, n) * values.std(dim=0, correction=1) * math.sqrt(1.0 + 1.0 / n)
    lower, upper = mean - half, mean + half
    if bounds is not None:
        lower, upper = lower.clamp(min=bounds[0], max=bounds[1]), upper.clamp(min=bounds[0], max=bounds[1])
    return mean, torch.minimum(lower, mean), torch.maximum(upper, mean)


def _seed_list(seeds: Sequence[int]) -> str:
    """``7919–7928`` for consecutive seeds, else the seeds joined by commas."""
    consecutive = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"seeds {seeds[0]}–{seeds[-1]}" if consecutive and len(seeds) > 2 else "seeds " + ", ".join(map(str, seeds))


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
