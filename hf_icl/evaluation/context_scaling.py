"""Context scaling: how the error (or accuracy) of each predictor changes with the number of
in-context examples, with bootstrap bands and the trivial predictor for reference.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> def least_squares(xs, ys):  # min-norm least squares on each prefix, a small reference
    ...     preds = torch.zeros_like(ys)
    ...     for i in range(1, ys.shape[1]):
    ...         w = torch.linalg.pinv(xs[:, :i]) @ ys[:, :i, None]
    ...         preds[:, i] = (xs[:, i, None, :] @ w)[:, 0, 0]
    ...     return preds
    >>> result = evaluate_context_scaling(
    ...     {"least_squares": least_squares}, get_task("linear_regression", n_dims=3), n_prompts=200, n_points=6
    ... )
    >>> float(result.curves["least_squares"][5]) < 1e-6 < float(result.trivial[5])
    True
    >>> result.rows[0]["predictor"], result.rows[0]["n_examples"], result.rows[0]["metric"]
    ('least_squares', 0, 'squared_error/d')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..data.tasks import TaskFamily, make_task
from ..validation import check_device, check_int
from .bootstrap import band_from_indices, bootstrap_indices, check_confidence
from .metrics import PositionMetric, metric_for_task
from .plotting import BASELINE_STYLES, draw_band_curve, finish_axes, new_axes, save_figure
from .predictors import (
    Predictor,
    check_predictors,
    check_target_kinds,
    resolve_n_points,
    score_predictors,
)
from .tables import format_band, markdown_grid, rows_to_dataframe

#: Name of the trivial predictor's curve: zeros for regression, chance for classification.
TRIVIAL = "trivial"


@dataclass
class ContextScalingResult:
    """Per-position mean scores with bootstrap bands, one curve per predictor plus ``"trivial"``.

    Attributes:
        metric: how positions were scored (name, normaliser, target kind).
        values / lower / upper: ``{name: (N,) float64}``, the mean over prompts and its band.
        n_prompts: prompts behind every curve (shared by all predictors).
        task_name: the task family's registered name.
        confidence: the bootstrap quantiles behind ``lower`` and ``upper``.
    """

    metric: PositionMetric
    values: dict[str, torch.Tensor]
    lower: dict[str, torch.Tensor]
    upper: dict[str, torch.Tensor]
    n_prompts: int
    task_name: str = ""
    confidence: tuple[float, float] = (0.05, 0.95)

    @property
    def curves(self) -> dict[str, torch.Tensor]:
        """``{name: (N,)}`` mean score at each number of in-context examples (``"trivial"`` included)."""
        return dict(self.values)

    @property
    def trivial(self) -> torch.Tensor:
        """The trivial predictor's curve, ``(N,)``."""
        return self.values[TRIVIAL]

    @property
    def predictors(self) -> list[str]:
        """Curve names in evaluation order, ``"trivial"`` last."""
        return list(self.values)

    @property
    def n_points(self) -> int:
        return len(self.trivial)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows ``{"predictor", "n_examples", "metric", "value", "lower", "upper"}``; ``n_examples``
        is the position i, i.e. the number of examples before the query."""
        return [
            {
                "predictor": name,
                "n_examples": i,
                "metric": self.metric.name,
                "value": float(self.values[name][i]),
                "lower": float(self.lower[name][i]),
                "upper": float(self.upper[name][i]),
            }
            for name in self.values
            for i in range(self.n_points)
        ]

    def cell(self, name: str, position: int) -> str:
        """``value [lower, upper]`` of one predictor at one position."""
        return format_band(*(float(d[name][position]) for d in (self.values, self.lower, self.upper)))

    def to_pandas(self):
        """:attr:`rows` as a ``pandas.DataFrame``."""
        return rows_to_dataframe(self.rows)

    def to_markdown(self, positions: Sequence[int] | None = None) -> str:
        """Rows: number of in-context examples (all positions by default); columns: predictors. The corner names
        the metric with its normaliser (``examples \\ squared_error/d``), as every report does."""
        positions = range(self.n_points) if positions is None else positions
        corner = f"examples \\ {self.metric.name}"
        return markdown_grid(corner, self.predictors, positions, lambda i, name: self.cell(name, i))

    def plot(self, path: str | Path, *, log_y: bool | None = None, title: str | None = None) -> Path:
        """Write the curves to a PNG: bands shaded, the trivial predictor dashed; returns ``path``.

        ``log_y`` defaults to a log axis for errors and a linear one for accuracy; a ``title`` too wide for the axes
        is wrapped to fit (:func:`~hf_icl.evaluation.plotting.fit_titles`)."""
        fig, ax = new_axes(title or f"{self.task_name} ({self.n_prompts} prompts)")
        x = torch.arange(self.n_points)
        for name in self.predictors:
            style = {"linestyle": BASELINE_STYLES[0], "color": "0.4"} if name == TRIVIAL else {"marker": "."}
            draw_band_curve(ax, x, self.values[name], self.lower[name], self.upper[name], label=name, **style)
        ax.xaxis.get_major_locator().set_params(integer=True)  # example counts are whole numbers
        ax.set_xlabel("number of in-context examples")
        finish_axes(ax, self.metric, log_y=log_y, confidence=self.confidence)
        return save_figure(fig, path)


def evaluate_context_scaling(
    models_and_estimators: Mapping[str, Predictor],
    task: TaskFamily | str | dict[str, Any],
    n_prompts: int = 1280,
    seed: int = 0,
    *,
    n_points: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    n_bootstrap: int = 1000,
    confidence: tuple[float, float] = (0.05, 0.95),
    plot_path: str | Path | None = None,
    title: str | None = None,
    normalizer: float | None = None,
) -> ContextScalingResult:
    """Score every predictor at every position on the same ``n_prompts`` prompts of ``task``.

    Args:
        models_and_estimators: ``{name: predictor}``; models run one forward pass per batch (see
            :mod:`hf_icl.evaluation.predictors`), estimators are called as ``f(xs, ys)``.
        task: a task family, its registered name, or its ``to_dict()``.
        n_prompts: prompts drawn once, on the CPU, from ``seed`` and shared by every predictor,
            so differences between curves are paired.
        n_points: prompt length; defaults to the (shortest) ``config.n_points`` of the models.
        batch_size: prompts per call (all at once by default); does not change the prompts.
        device: where estimators run; models run on their own device.
        n_bootstrap, confidence: replicates and quantiles of the bootstrap band (seeded with ``seed``).
        plot_path, title: if given, the curves are also written to this PNG.
        normalizer: overrides the squared-error normaliser (d, or s for sparse tasks; regression only).

    Regression is scored by squared error / normaliser, classification by accuracy; see
    :mod:`hf_icl.evaluation.metrics` for the normalisers and the decision rule of each target kind.

    Returns:
        A :class:`ContextScalingResult` with one curve per predictor and ``"trivial"``.

    Raises:
        ValueError: among others, when a predictor (model or estimator) returns a NaN or infinite prediction; the
            message names the predictor, the prompt and the position (checked once per batch,
            :func:`~hf_icl.evaluation.predictors.check_finite_predictions`), instead of drawing a NaN curve.
    """
    predictors, family, metric, n_points, device, confidence = checked_evaluation(
        models_and_estimators, task, n_prompts, n_points, device, confidence, normalizer
    )
    xs, ys = family.sample(n_prompts, n_points, seed=seed)
    scores = score_predictors(predictors, xs, ys, metric, batch_size=batch_size, device=device)
    trivial = metric.trivial_per_prompt(ys)
    result = result_from_scores(
        scores, trivial, metric, task_name=family.name, seed=seed, n_bootstrap=n_bootstrap, confidence=confidence
    )
    if plot_path is not None:
        result.plot(plot_path, title=title)
    return result


class CheckedEvaluation(NamedTuple):
    """An evaluation's arguments after :func:`checked_evaluation`."""

    predictors: dict[str, Predictor]
    family: TaskFamily
    metric: PositionMetric
    n_points: int
    device: torch.device | None
    confidence: tuple[float, float]


def checked_evaluation(
    models_and_estimators: Mapping[str, Predictor],
    task: TaskFamily | str | dict[str, Any],
    n_prompts: int,
    n_points: int | None,
    device: str | torch.device | None,
    confidence: tuple[float, float],
    normalizer: float | None,
) -> CheckedEvaluation:
    """The checks every position-by-position evaluation makes before it draws a prompt (predictor names, task, counts,
    device, band, the models' prompt length and target kind), and what they resolve to: the predictors, the task
    family, its metric, the prompt length, the device and the band's quantiles."""
    predictors = check_predictors(models_and_estimators, reserved=(TRIVIAL,))
    family = make_task(task)
    check_int("n_prompts", n_prompts, low=1)
    device = check_device("device", device)
    confidence = check_confidence(confidence)
    n_points = resolve_n_points(predictors, n_points)
    check_target_kinds(predictors, family.target_kind)
    return CheckedEvaluation(predictors, family, metric_for_task(family, normalizer), n_points, device, confidence)


def result_from_scores(
    scores: Mapping[str, torch.Tensor],
    trivial_scores: torch.Tensor,
    metric: PositionMetric,
    *,
    task_name: str,
    seed: int,
    n_bootstrap: int = 1000,
    confidence: tuple[float, float] = (0.05, 0.95),
) -> ContextScalingResult:
    """Curves and bootstrap bands from per-prompt scores ``{name: (P, N)}`` plus the trivial
    predictor's ``(P, N)``: every evaluation that scores prompts position by position ends here.

    One bootstrap resampling (seeded with ``seed``) serves every curve, so bands are paired like the curves.

    >>> import torch
    >>> from hf_icl.evaluation.metrics import PositionMetric
    >>> scores = {"half": torch.full((4, 2), 0.5, dtype=torch.float64)}
    >>> result = result_from_scores(scores, torch.ones(4, 2, dtype=torch.float64), PositionMetric("regression"),
    ...                             task_name="demo", seed=0)
    >>> result.predictors, float(result.curves["half"][1]), float(result.upper["half"][1])
    (['half', 'trivial'], 0.5, 0.5)
    """
    scores = {**scores, TRIVIAL: trivial_scores}
    n_prompts = trivial_scores.shape[0]
    indices = bootstrap_indices(n_bootstrap, n_prompts, seed)  # one resampling shared by all curves
    bands = {name: band_from_indices(s, indices, confidence) for name, s in scores.items()}
    return ContextScalingResult(
        metric=metric,
        values={name: s.mean(dim=0) for name, s in scores.items()},
        lower={name: band[0] for name, band in bands.items()},
        upper={name: band[1] for name, band in bands.items()},
        n_prompts=n_prompts,
        task_name=task_name,
        confidence=check_confidence(confidence),
    )
