"""Task scaling: the error of models pretrained on pools of T tasks, against T, on fresh tasks.

Raventós et al. train one model per task-pool size T (a family with ``n_tasks=T``) and ask
when it stops behaving like a lookup of the T pretraining tasks and starts solving new ones.
Every model is therefore scored on tasks drawn fresh from the prior (``n_tasks=None``), all on
the same prompts, at a few context lengths; baselines (e.g. the Bayes-optimal ridge) are flat
lines because they do not depend on T.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> def shrunk_copy(quality):  # fake "models": predictions that shrink the truth by T's quality
    ...     return lambda xs, ys: quality * ys
    >>> result = evaluate_task_scaling(
    ...     {1: shrunk_copy(0.0), 16: shrunk_copy(0.5), 256: shrunk_copy(1.0)},
    ...     get_task("linear_regression", n_dims=4, n_tasks=1),
    ...     n_prompts=100,
    ...     n_points=8,
    ... )
    >>> [round(row["value"], 3) for row in result.rows if row["predictor"] == "model"][-1]
    0.0
    >>> result.positions
    [7]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.tasks import TaskFamily, make_task
from ..validation import check_int
from .context_scaling import TRIVIAL, ContextScalingResult, evaluate_context_scaling
from .plotting import BASELINE_STYLES, draw_band_curve, finish_axes, new_axes, save_figure
from .predictors import Predictor, resolve_n_points
from .tables import markdown_grid, rows_to_dataframe

#: ``predictor`` value of the rows that belong to the pretrained models.
MODEL = "model"


def baseline_style(index: int, name: str):
    """Dashed for the trivial predictor, then dotted, dash-dotted, … for the others."""
    others = BASELINE_STYLES[1:]
    return BASELINE_STYLES[0] if name == TRIVIAL else others[index % len(others)]


def model_key(n_tasks: int) -> str:
    """Curve name of the model pretrained on ``n_tasks`` tasks."""
    return f"T={n_tasks}"


@dataclass
class TaskScalingResult:
    """Scores against the pool size T at chosen positions, built on a :class:`ContextScalingResult`.

    Attributes:
        pool_sizes: the T's, ascending.
        positions: the positions (numbers of in-context examples) reported.
        baselines: baseline names, ``"trivial"`` last.
        context_scaling: the full per-position curves of every model (named ``"T=<T>"``) and baseline.
    """

    pool_sizes: list[int]
    positions: list[int]
    baselines: list[str]
    context_scaling: ContextScalingResult

    def curve_name(self, row_label: int | str) -> str:
        """The context-scaling curve behind a table row: ``"T=<T>"`` for a pool size, else the baseline."""
        return model_key(row_label) if isinstance(row_label, int) else row_label

    def by_pool_size(self, position: int, curves: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The models' mean scores at ``position``, one per pool size: ``(len(pool_sizes),)``.
        ``curves`` picks another statistic, e.g. ``result.context_scaling.lower``."""
        curves = self.context_scaling.values if curves is None else curves
        return torch.stack([curves[model_key(t)][position] for t in self.pool_sizes])

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Tidy rows ``{"n_tasks", "n_examples", "predictor", "value", "lower", "upper"}``: first the
        models (``predictor="model"``) by T and position, then the baselines (``n_tasks=None``)."""
        cs = self.context_scaling
        labelled = [(t, MODEL, model_key(t)) for t in self.pool_sizes] + [(None, b, b) for b in self.baselines]
        return [
            {
                "n_tasks": n_tasks,
                "n_examples": i,
                "predictor": predictor,
                "value": float(cs.values[curve][i]),
                "lower": float(cs.lower[curve][i]),
                "upper": float(cs.upper[curve][i]),
            }
            for n_tasks, predictor, curve in labelled
            for i in self.positions
        ]

    def to_pandas(self):
        """:attr:`rows` as a ``pandas.DataFrame``."""
        return rows_to_dataframe(self.rows)

    def to_markdown(self) -> str:
        """Rows: pool sizes T, then the baselines; columns: ``<i> examples`` for each position."""
        columns = {f"{i} examples": i for i in self.positions}
        return markdown_grid(
            "n_tasks",
            list(columns),
            [*self.pool_sizes, *self.baselines],
            lambda label, column: self.context_scaling.cell(self.curve_name(label), columns[column]),
        )

    def plot(self, path: str | Path, *, log_y: bool | None = None, title: str | None = None) -> Path:
        """Write score against T (log x axis) to a PNG: one line with band per position, each
        baseline as a horizontal line in that position's colour; returns ``path``. ``log_y``
        defaults to a log axis for errors and a linear one for accuracy."""
        cs = self.context_scaling
        fig, ax = new_axes(title or f"{cs.task_name}: fresh tasks ({cs.n_prompts} prompts)")
        x = torch.tensor(self.pool_sizes, dtype=torch.float64)
        for i in self.positions:
            value, lower, upper = (self.by_pool_size(i, curves) for curves in (cs.values, cs.lower, cs.upper))
            line = draw_band_curve(ax, x, value, lower, upper, marker="o", label=f"model, {i} examples")
            for k, name in enumerate(self.baselines):
                ax.axhline(
                    float(cs.values[name][i]),
                    color=line.get_color(),
                    linestyle=baseline_style(k, name),
                    linewidth=1.2,
                    label=f"{name}, {i} examples",
                )
        ax.set_xscale("log")
        ax.set_xlabel("number of pretraining tasks T")
        finish_axes(ax, cs.metric, log_y=log_y, confidence=cs.confidence, fontsize="small")
        return save_figure(fig, path)


def check_pool_sizes(models_by_pool_size: Mapping[int, Predictor]) -> list[int]:
    """The pool sizes, ascending, or a ``ValueError`` for an empty mapping or a non-positive-int key."""
    if not isinstance(models_by_pool_size, Mapping) or not models_by_pool_size:
        raise ValueError(f"expected a non-empty mapping {{pool size T: model}}, got {models_by_pool_size!r}")
    return sorted(check_int("pool size T", t, low=1) for t in models_by_pool_size)


def check_positions(positions: Sequence[int] | None, n_points: int) -> list[int]:
    """The positions to report (default: the last), each in ``[0, n_points)``."""
    last = n_points - 1
    if positions is None:
        return [last]
    positions = [check_int("position", i, low=0, high=last) for i in positions]
    if not positions:
        raise ValueError("positions must name at least one position (default: the last)")
    return positions


def evaluate_task_scaling(
    models_by_pool_size: Mapping[int, Predictor],
    task: TaskFamily | str | dict[str, Any],
    positions: Sequence[int] | None = None,
    n_prompts: int = 1280,
    seed: int = 0,
    plot_path: str | Path | None = None,
    baselines: Mapping[str, Predictor] | None = None,
    *,
    n_points: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    n_bootstrap: int = 1000,
    confidence: tuple[float, float] = (0.05, 0.95),
    title: str | None = None,
) -> TaskScalingResult:
    """Score each model (pretrained on T tasks) on fresh tasks at ``positions`` (default: the last).

    Args:
        models_by_pool_size: ``{T: model}``; any predictor accepted by
            :func:`~hf_icl.evaluation.evaluate_context_scaling` works.
        task: the pretraining family (its ``n_tasks`` is ignored: evaluation tasks are fresh).
        positions: numbers of in-context examples to report, each in ``[0, n_points)``.
        baselines: ``{name: predictor}`` drawn as horizontal lines; ``"trivial"`` is always added.
        n_prompts, seed, n_points, batch_size, device, n_bootstrap, confidence: as in
            :func:`~hf_icl.evaluation.evaluate_context_scaling`, on the same shared prompts.
        plot_path, title: if given, the plot is written there.
    """
    pool_sizes = check_pool_sizes(models_by_pool_size)
    baselines = dict(baselines or {})
    clashes = sorted(set(baselines) & {model_key(t) for t in pool_sizes})
    if clashes:
        raise ValueError(f"baseline names {clashes} clash with the models' curve names; rename them")
    fresh = dataclasses.replace(make_task(task), n_tasks=None)
    predictors = {model_key(t): models_by_pool_size[t] for t in pool_sizes} | baselines
    n_points = resolve_n_points(predictors, n_points)
    positions = check_positions(positions, n_points)
    curves = evaluate_context_scaling(
        predictors,
        fresh,
        n_prompts,
        seed,
        n_points=n_points,
        batch_size=batch_size,
        device=device,
        n_bootstrap=n_bootstrap,
        confidence=confidence,
    )
    result = TaskScalingResult(pool_sizes, positions, [*baselines, TRIVIAL], curves)
    if plot_path is not None:
        result.plot(plot_path, title=title)
    return result
