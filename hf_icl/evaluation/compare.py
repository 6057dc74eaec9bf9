"""Error at every context length for several in-context predictors on one set of prompts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from ..data.tasks import TaskFamily

Predictor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def error_by_position(preds: torch.Tensor, ys: torch.Tensor, normalizer: float = 1.0) -> torch.Tensor:
    """Mean over prompts of (pred − y)² / ``normalizer`` at each position: ``(N,)``.

    Garg et al. normalise by the input dimension d, so the zero predictor scores about 1 on
    isotropic linear regression.
    """
    if preds.shape != ys.shape:
        raise ValueError(f"preds has shape {tuple(preds.shape)} but ys has shape {tuple(ys.shape)}")
    return (preds.double() - ys.double()).square().mean(dim=0) / normalizer


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
    xs, ys = family.sample(n_prompts, n_points, seed=seed)
    normalizer = float(family.n_dims) if normalizer is None else normalizer
    errors = {name: error_by_position(predict(xs, ys), ys, normalizer) for name, predict in predictors.items()}
    errors["zero"] = error_by_position(torch.zeros_like(ys), ys, normalizer)
    return errors


def markdown_table(errors: Mapping[str, torch.Tensor], positions: Sequence[int] | None = None) -> str:
    """Rows: number of in-context examples; columns: predictors."""
    names = list(errors)
    n_points = len(next(iter(errors.values())))
    positions = range(n_points) if positions is None else positions
    lines = ["| examples | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for i in positions:
        lines.append(f"| {i} | " + " | ".join(f"{float(errors[n][i]):.4f}" for n in names) + " |")
    return "\n".join(lines)
