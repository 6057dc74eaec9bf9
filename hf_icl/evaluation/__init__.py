"""Evaluation of in-context learners: context scaling, task scaling, out-of-distribution prompts.

* :func:`evaluate_context_scaling`: per-position error (or accuracy) of models and estimators on
  shared prompts, with bootstrap bands and the trivial predictor; tables, tidy rows, PNG plots.
* :func:`evaluate_task_scaling`: error against the number of pretraining tasks T, on fresh tasks.
* :func:`ood_task` / :data:`OOD_KINDS`: Garg et al.'s distribution-shifted prompts.
* :func:`evaluate_prompt_strategy` (:func:`random_quadrants_prompts`, :func:`orthogonal_prompts`,
  :func:`overlapping_prompts`): queries placed against their context, scored position by position.
* :func:`run_garg_suite` / :func:`garg_evaluations` / :data:`GARG_EVALUATIONS`: Garg et al.'s whole evaluation
  suite on one model, cached in ``metrics.json`` with a figure per evaluation and a summary table.
* :func:`write_metrics`, :func:`read_metrics`, :func:`evaluation_entry`, :func:`write_curve_csv`,
  :func:`read_runs`: the ``metrics.json`` format every run writes, and a directory of runs as one DataFrame.
* :func:`load_metric`, :class:`ICLSquaredError`, :class:`ICLAccuracy`: the same metrics as
  ``evaluate.Metric`` classes; loaded on first use, so importing this package needs neither
  ``evaluate`` nor ``datasets``.
* :func:`run_niah`, :func:`niah_methods`, :func:`summarize_niah`, :func:`write_niah_report`: needle-in-a-haystack
  passkey retrieval under dense and CAB attention (exact match, answer log-prob, attention preservation),
  resumable, with heatmaps (``hf-icl niah``).
* :func:`wilson_interval`, :func:`t_interval`, :func:`intervals_separated`: 95% intervals of hit rates and of means
  over a few values, and whether two intervals are apart.
* :func:`judge_stories`, :func:`judge_prompt`, :func:`parse_scores`, :func:`aggregate_scores`,
  :func:`local_model_judge`: grading generated stories (grammar, consistency, plot, creativity, 1–10) with a judge
  model, the GD document's GPT-4o evaluation with the grader left open.

Example::

    >>> from hf_icl.data.tasks import get_task
    >>> from hf_icl.estimators import get_estimator
    >>> result = evaluate_context_scaling(
    ...     {"least_squares": get_estimator("least_squares")},
    ...     ood_task(get_task("linear_regression", n_dims=3), "scaled_x", k=2),
    ...     n_prompts=256,
    ...     n_points=6,
    ... )
    >>> print(result.to_markdown(positions=[0, 5]).splitlines()[0])
    | examples | least_squares | trivial |
"""

from typing import Any

from .bootstrap import bootstrap_band, bootstrap_indices
from .context_scaling import TRIVIAL, ContextScalingResult, evaluate_context_scaling, result_from_scores
from .garg_suite import GARG_EVALUATIONS, GargEvaluation, garg_evaluations, run_garg_suite
from .intervals import intervals_separated, t_interval, wilson_interval
from .metrics import PositionMetric, metric_for_task, normalizer_for, predicted_labels
from .niah import NIAHMethod, greedy_answer, load_niah_results, niah_methods, run_niah
from .niah_report import summarize_niah, write_niah_report
from .ood import OOD_KINDS, ood_task
from .prompt_strategies import (
    PROMPT_STRATEGIES,
    evaluate_prompt_strategy,
    orthogonal_prompts,
    overlapping_prompts,
    random_quadrants_prompts,
)
from .runs import evaluation_entry, read_metrics, read_runs, result_from_entry, write_curve_csv, write_metrics
from .story_judge import aggregate_scores, judge_prompt, judge_stories, local_model_judge, parse_scores
from .task_scaling import TaskScalingResult, evaluate_task_scaling

#: Names served by :mod:`.hf_metrics`, imported on first access (it needs evaluate + datasets).
_LAZY_HF_METRICS = ("ICLAccuracy", "ICLSquaredError", "load_metric")


def __getattr__(name: str) -> Any:
    if name in _LAZY_HF_METRICS:
        from . import hf_metrics

        return getattr(hf_metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GARG_EVALUATIONS",
    "OOD_KINDS",
    "PROMPT_STRATEGIES",
    "TRIVIAL",
    "ContextScalingResult",
    "GargEvaluation",
    "ICLAccuracy",
    "ICLSquaredError",
    "NIAHMethod",
    "PositionMetric",
    "TaskScalingResult",
    "aggregate_scores",
    "bootstrap_band",
    "bootstrap_indices",
    "evaluate_context_scaling",
    "evaluate_prompt_strategy",
    "evaluate_task_scaling",
    "evaluation_entry",
    "garg_evaluations",
    "greedy_answer",
    "intervals_separated",
    "judge_prompt",
    "judge_stories",
    "load_metric",
    "load_niah_results",
    "local_model_judge",
    "metric_for_task",
    "niah_methods",
    "normalizer_for",
    "ood_task",
    "orthogonal_prompts",
    "overlapping_prompts",
    "parse_scores",
    "predicted_labels",
    "random_quadrants_prompts",
    "read_metrics",
    "read_runs",
    "result_from_entry",
    "result_from_scores",
    "run_garg_suite",
    "run_niah",
    "summarize_niah",
    "t_interval",
    "wilson_interval",
    "write_curve_csv",
    "write_metrics",
    "write_niah_report",
]
