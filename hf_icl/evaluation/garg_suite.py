"""Garg et al.'s full evaluation suite (their ``build_evals``) on one model in one call, cached in ``metrics.json``.

For a model trained on ``linear_regression`` the suite (:data:`GARG_EVALUATIONS`, in Garg et al.'s order) is:

* ``standard``: ordinary prompts of the training family;
* ``random_quadrants``, ``orthogonal_train_test``, ``overlapping_train_test``: queries placed against their
  context (:mod:`hf_icl.evaluation.prompt_strategies`, scored position by position);
* ``half_subspace``: inputs in a random d/2-dimensional subspace, rescaled to E‖x‖² = d (Garg normalises);
* ``skewed``: x ~ N(0, Σ) with eigenvalues ∝ 1/i², trace d;
* ``scale-x=k`` / ``scale-y=k`` for k in 0.333, 0.5, 2, 3: inputs, or the task's outputs, multiplied by k;
* ``noisyLR``: linear regression with N(0, 1) label noise. Garg et al. rescale the labels of each batch by
  √d / std(y) (``renormalize_ys="batch"`` here), a factor that depends on which prompts share the batch.
  The suite uses ``renormalize_ys="fixed"``: the constant √(d / (d + 1)) that the batch factor estimates
  (std(y)² → d + 1 for w, x ~ N(0, I) and σ = 1), so each prompt's labels depend on that prompt only and
  the numbers do not change with the batch size.

Other families get ``standard`` only, and ``relu_2nn_regression`` also ``linear_regression`` (the model run on
plain linear regression with its input distribution), as in ``build_evals``.

Every evaluation compares the model with estimators on the same prompts: by default the
:func:`~hf_icl.evaluation.baselines.default_baselines` of the family being evaluated (so ``noisyLR`` adds the
Bayes-optimal ridge). Results go to ``output_dir/metrics.json`` (:mod:`hf_icl.evaluation.runs`' schema),
rewritten atomically after each evaluation; a rerun computes only the (evaluation, predictor) pairs that are
missing or were computed with another ``n_prompts``, ``seed`` or prompt length. Each evaluation also gets a
figure ``garg_<name>.png``, and ``garg_suite.md`` tabulates every predictor's error at the last position.
The cache knows predictors by name, not by weights: give each checkpoint its own ``output_dir``.

Example::

    >>> import tempfile
    >>> from hf_icl.data.tasks import get_task
    >>> from hf_icl.modeling import GPT2ForInContextRegression, GPT2ICLConfig
    >>> model = GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=2, n_points=4))
    >>> metrics = run_garg_suite(model, get_task("linear_regression", n_dims=2), tempfile.mkdtemp(),
    ...                          n_prompts=8, estimators=["least_squares"], progress=False)
    >>> list(metrics["evaluations"]) == list(GARG_EVALUATIONS)
    True
    >>> sorted(metrics["evaluations"]["noisyLR"]["predictors"])
    ['gpt2_icl', 'least_squares', 'trivial']
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.tasks import TASK_REGISTRY, TaskFamily, make_task
from ..validation import check_device, check_int
from .baselines import default_baselines, estimator_for_task
from .context_scaling import TRIVIAL, ContextScalingResult, evaluate_context_scaling
from .ood import ood_task
from .predictors import Predictor, check_predictors, resolve_n_points
from .prompt_strategies import PROMPT_STRATEGIES, evaluate_prompt_strategy, scored_positions
from .runs import METRICS_FILE, evaluation_entry, read_metrics, result_from_entry, write_metrics
from .tables import format_band, markdown_grid

#: The scale factors of ``scale-x=k`` and ``scale-y=k`` (written as in the evaluation names).
SCALES = (0.333, 0.5, 2, 3)
#: The markdown summary written beside ``metrics.json``.
SUMMARY_FILE = "garg_suite.md"
#: The summary's column with the position each row reports.
LAST_POSITION = "last position"


@dataclass(frozen=True)
class GargEvaluation:
    """One evaluation of the suite: the family it runs on (derived from the trained one) and its prompts.

    Args:
        name: the evaluation's name (Garg et al.'s).
        strategy: ``"standard"`` or one of :data:`~hf_icl.evaluation.prompt_strategies.PROMPT_STRATEGIES`.
        ood_kind, ood_kwargs: an :func:`~hf_icl.evaluation.ood_task` shift applied to the family.
        base_task: evaluate on this registered family instead (same d and inputs), e.g. ``"linear_regression"``.

    >>> from hf_icl.data.tasks import get_task
    >>> GARG_EVALUATIONS["scale-y=2"].task(get_task("linear_regression", n_dims=3)).scale
    2.0
    """

    name: str
    strategy: str = "standard"
    ood_kind: str | None = None
    ood_kwargs: tuple[tuple[str, Any], ...] = ()
    base_task: str | None = None

    def task(self, family: TaskFamily) -> TaskFamily:
        """The family this evaluation draws its prompts from, given the model's training ``family``."""
        if self.base_task is not None:
            family = TASK_REGISTRY[self.base_task](n_dims=family.n_dims, inputs=family.inputs)
        if self.ood_kind is not None:
            family = ood_task(family, self.ood_kind, **dict(self.ood_kwargs))
        return family

    def evaluate(self, predictors: Mapping[str, Predictor], family: TaskFamily, **kwargs: Any) -> ContextScalingResult:
        """Run ``predictors`` on this evaluation's prompts (``kwargs`` as for ``evaluate_context_scaling``)."""
        task = self.task(family)
        if self.strategy == "standard":
            return evaluate_context_scaling(predictors, task, **kwargs)
        return evaluate_prompt_strategy(predictors, task, self.strategy, **kwargs)

    def n_positions(self, n_points: int, n_dims: int) -> int:
        """Length of this evaluation's curves for prompts of ``n_points`` examples in ``n_dims`` dimensions."""
        return n_points if self.strategy == "standard" else scored_positions(self.strategy, n_points, n_dims)


def _suite() -> dict[str, GargEvaluation]:
    evaluations = [GargEvaluation("standard")]
    evaluations += [GargEvaluation(strategy, strategy=strategy) for strategy in PROMPT_STRATEGIES]
    evaluations += [
        GargEvaluation("half_subspace", ood_kind="half_subspace", ood_kwargs=(("match_norm", True),)),
        GargEvaluation("skewed", ood_kind="skewed_covariance"),
    ]
    for axis in ("x", "y"):
        evaluations += [
            GargEvaluation(f"scale-{axis}={k}", ood_kind=f"scaled_{axis}", ood_kwargs=(("k", k),)) for k in SCALES
        ]
    evaluations.append(
        GargEvaluation("noisyLR", ood_kind="noisy_labels", ood_kwargs=(("noise_std", 1.0), ("renormalize_ys", "fixed")))
    )
    return {evaluation.name: evaluation for evaluation in evaluations}


#: The suite of a model trained on ``linear_regression``: name → :class:`GargEvaluation`, in Garg et al.'s order.
GARG_EVALUATIONS: dict[str, GargEvaluation] = _suite()
#: The extra evaluation of ``relu_2nn_regression`` models: the model on plain linear regression.
LINEAR_REGRESSION_EVALUATION = GargEvaluation("linear_regression", base_task="linear_regression")


def garg_evaluations(family: TaskFamily | str | dict[str, Any]) -> dict[str, GargEvaluation]:
    """The evaluations Garg et al.'s ``build_evals`` runs for a model trained on ``family`` (a family, its
    name or its ``to_dict()``): all of :data:`GARG_EVALUATIONS` for ``linear_regression``, ``standard`` and
    ``linear_regression`` for ``relu_2nn_regression``, ``standard`` for everything else.

    >>> list(garg_evaluations("relu_2nn_regression"))
    ['standard', 'linear_regression']
    >>> len(garg_evaluations("linear_regression"))
    15
    """
    if isinstance(family, str):
        if family not in TASK_REGISTRY:
            raise ValueError(f"unknown task family {family!r}; known task families: {sorted(TASK_REGISTRY)}")
        name = family
    else:
        name = make_task(family).name
    if name == "linear_regression":
        return dict(GARG_EVALUATIONS)
    standard = {"standard": GARG_EVALUATIONS["standard"]}
    if name == "relu_2nn_regression":
        return {**standard, "linear_regression": LINEAR_REGRESSION_EVALUATION}
    return standard


def _estimators(estimators: Mapping[str, Predictor] | Sequence[str] | None, task: TaskFamily) -> dict[str, Predictor]:
    """The estimators of one evaluation: the defaults of its family, a fixed mapping, or named ones built
    for its family (a named estimator that does not apply to it, e.g. the Bayes ridge of noisy tasks on a
    noiseless one, is left out of that evaluation)."""
    if estimators is None:
        return default_baselines(task)
    if isinstance(estimators, Mapping):
        return dict(estimators)
    built = {}
    for name in estimators:
        try:
            built[name] = estimator_for_task(name, task)
        except ValueError:
            if name != "optimal_ridge":  # the one estimator that applies to some families only
                raise
    return built


def _check_estimators(estimators: Any, model_name: str) -> None:
    if estimators is None:
        return
    if isinstance(estimators, Mapping):
        names = list(check_predictors(estimators, reserved=(TRIVIAL,)))
    elif isinstance(estimators, str) or not isinstance(estimators, Sequence):
        raise ValueError(
            "estimators must be None, a mapping of names to estimators or a list of estimator names, "
            f"got {estimators!r}"
        )
    else:
        from ..estimators import available_estimators

        names = list(estimators)
        unknown = [name for name in names if name not in available_estimators()]
        if unknown:
            raise ValueError(f"estimators has unknown names {unknown}; known estimators: {available_estimators()}")
        if len(set(names)) != len(names):
            raise ValueError(f"estimators must not repeat a name, got {names}")
    if model_name in names:
        raise ValueError(
            f"model_name {model_name!r} is also an estimator's name in estimators; pass another model_name"
        )


def _model_name(model: Predictor) -> str:
    return getattr(getattr(model, "config", None), "model_type", None) or "model"


def _reusable(entry: Mapping[str, Any] | None, *, n_prompts: int, seed: int, n_positions: int) -> dict[str, Any]:
    """The stored curves of an evaluation that still answer this run's question (else an empty dict)."""
    if entry is None or entry.get("n_prompts") != n_prompts or entry.get("seed") != seed:
        return {}
    return {name: curve for name, curve in entry["predictors"].items() if len(curve["mean"]) == n_positions}


def run_garg_suite(
    model: Predictor,
    family: TaskFamily | str | dict[str, Any],
    output_dir: str | Path,
    *,
    n_prompts: int = 1280,
    seed: int = 0,
    device: str | torch.device | None = None,
    estimators: Mapping[str, Predictor] | Sequence[str] | None = None,
    progress: bool = True,
    n_points: int | None = None,
    batch_size: int | None = None,
    model_name: str | None = None,
) -> dict[str, Any]:
    """Run every evaluation of :func:`garg_evaluations` for ``model`` (trained on ``family``) and the estimators.

    Args:
        model: the ICL model (it runs on its own device, in eval mode, without gradients).
        family: the family the model was trained on (an instance, its name or its ``to_dict()``).
        output_dir: receives ``metrics.json``, ``garg_<name>.png`` per evaluation and ``garg_suite.md``.
        n_prompts, seed: prompts per evaluation and the seed of prompts and bootstrap bands.
        device: where estimators run.
        estimators: ``None`` for the default baselines of each evaluated family, a list of estimator names
            (built for each evaluated family), or a mapping of names to predictors used everywhere.
        progress: print one line per evaluation on stderr.
        n_points: prompt length; the model's ``config.n_points`` by default (Garg et al.: the curriculum's end).
        batch_size: prompts per forward pass (all at once by default).
        model_name: the model's name in the results; its ``config.model_type`` by default.

    Returns:
        The ``metrics.json`` document (:mod:`hf_icl.evaluation.runs`), with every evaluation of the suite.
    """
    family = make_task(family)
    check_int("n_prompts", n_prompts, low=1)
    check_int("seed", seed, low=0)
    device = check_device("device", device)
    model_name = model_name or _model_name(model)
    _check_estimators(estimators, model_name)
    n_points = resolve_n_points({model_name: model}, n_points)
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"output_dir {str(output_dir)!r} exists and is not a directory")
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / METRICS_FILE
    document = read_metrics(path) if path.exists() else {"model": model_name, "task": family.name, "scalars": {}}
    stored = document.setdefault("evaluations", {})
    suite = garg_evaluations(family)

    for number, (name, evaluation) in enumerate(suite.items(), start=1):
        started = time.perf_counter()
        task = evaluation.task(family)
        predictors = {model_name: model, **_estimators(estimators, task)}
        n_positions = evaluation.n_positions(n_points, family.n_dims)
        kept = _reusable(stored.get(name), n_prompts=n_prompts, seed=seed, n_positions=n_positions)
        missing = [p for p in predictors if p not in kept]
        if missing:
            result = evaluation.evaluate(
                {p: predictors[p] for p in missing},
                family,
                n_prompts=n_prompts,
                seed=seed,
                n_points=n_points,
                batch_size=batch_size,
                device=device,
            )
            entry = evaluation_entry(result, seed=seed, evaluated_task=task.name)
            entry["predictors"] = {**kept, **entry["predictors"]}  # same prompts and bootstrap: the curves pair
            stored[name] = entry
            _save(path, document)
        figure = output_dir / f"garg_{name}.png"
        if missing or not figure.exists():
            title = f"{name}: {model_name} on {task.name}, d={task.n_dims} ({n_prompts} prompts)"
            result_from_entry(stored[name], task.name).plot(figure, title=title)  # save_figure wraps it to fit
        if progress:
            done = f"computed {', '.join(missing)}" if missing else "cached"
            seconds = time.perf_counter() - started
            print(f"garg suite [{number}/{len(suite)}] {name}: {done} ({seconds:.1f} s)", file=sys.stderr, flush=True)

    _save(path, document)
    (output_dir / SUMMARY_FILE).write_text(summary_markdown(document, list(suite)) + "\n")
    return read_metrics(path)


def _save(path: Path, document: dict[str, Any]) -> None:
    fields = {k: v for k, v in document.items() if k not in ("format", "evaluations")}
    write_metrics(path, document["evaluations"], **fields)


def summary_markdown(document: Mapping[str, Any], names: Sequence[str] | None = None) -> str:
    """A markdown table: one row per evaluation, each predictor's error (or accuracy) at the last scored
    position with its bootstrap band; predictors in order of first appearance, the trivial one last."""
    evaluations = document["evaluations"]
    names = list(evaluations) if names is None else [n for n in names if n in evaluations]
    predictors: list[str] = []
    for name in names:
        predictors += [p for p in evaluations[name]["predictors"] if p not in predictors and p != TRIVIAL]
    predictors.append(TRIVIAL)

    def cell(name: str, column: str) -> str:
        curves = evaluations[name]["predictors"]
        if column == LAST_POSITION:
            return str(len(next(iter(curves.values()))["mean"]) - 1)
        curve = curves.get(column)
        return "—" if curve is None else format_band(curve["mean"][-1], curve["lower"][-1], curve["upper"][-1])

    metrics = " / ".join(sorted({evaluations[name]["metric"] for name in names}))
    header = (
        f"Garg et al.'s evaluation suite: {document.get('model')} trained on {document.get('task')}. Each cell: "
        f"{metrics} at the last scored position (mean [5–95% bootstrap band]); orthogonal_train_test scores "
        f"positions 0 … d−1 only."
    )
    return header + "\n\n" + markdown_grid("evaluation", [LAST_POSITION, *predictors], names, cell)
