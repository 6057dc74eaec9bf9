"""Plain per-position squared errors without bands (the CLI's quickstart table).

These predate :func:`~hf_icl.evaluation.evaluate_context_scaling` and are thin uses of its
parts: always squared error (normalised by d unless told otherwise), the zero predictor named
``"zero"``, and a fixed four-decimal table.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> errors = compare_on_task({"copy": lambda xs, ys: ys}, get_task("linear_regression", n_dims=2),
    ...                          n_prompts=10, n_points=3)
    >>> list(errors), float(errors["copy"].sum())
    (['copy', 'zero'], 0.0)
    >>> print(markdown_table({"a": torch.tensor([0.5, 0.25])}))
    | examples | a |
    |---:|---:|
    | 0 | 0.5000 |
    | 1 | 0.2500 |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..data.tasks import TaskFamily
from .metrics import PositionMetric, squared_error
from .predictors import Predictor, check_predictors, score_predictors
from .tables import markdown_grid


def error_by_position(preds: torch.Tensor, ys: torch.Tensor, normalizer: float = 1.0) -> torch.Tensor:
    """Mean over prompts of (pred − y)² / ``normalizer`` at each position: ``(N,)``.

    Garg et al. normalise by the input dimension d, so the zero predictor scores about 1 on
    isotropic linear regression.
    """
    return squared_error(preds, ys, normalizer).mean(dim=0)


def compare_on_task(
    predictors: Mapping[str, Predictor],
    family: TaskFamily,
    *,
    n_prompts: int,
    n_points: int,
    seed: int = 0,
    normalizer: float | None = None,
) -> dict[str, torch.Tensor]:
    """Draw ``n_prompts`` prompts once and score every predictor on them, one call each.

    Returns ``{name: (N,) error}`` plus ``"zero"``, the trivial predictor that always says 0.
    """
    predictors = check_predictors(predictors, reserved=("zero",))
    xs, ys = family.sample(n_prompts, n_points, seed=seed)
    metric = PositionMetric("regression", normalizer=float(family.n_dims) if normalizer is None else normalizer)
    scores = score_predictors(predictors, xs, ys, metric)
    scores["zero"] = metric.trivial_per_prompt(ys)
    return {name: s.mean(dim=0) for name, s in scores.items()}


def markdown_table(errors: Mapping[str, torch.Tensor], positions: Sequence[int] | None = None) -> str:
    """Rows: number of in-context examples; columns: predictors."""
    n_points = len(next(iter(errors.values())))
    positions = range(n_points) if positions is None else positions
    return markdown_grid("examples", list(errors), positions, lambda i, name: f"{float(errors[name][i]):.4f}")
