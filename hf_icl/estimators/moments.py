"""Estimators built on the prefix moment ``Σ_{j<i} y_j x_j``: averaging and one GD step."""

from __future__ import annotations

import torch

from ..validation import check_float
from ._prefix import exclusive_cumsum, prefix_counts, to_working
from .base import InContextEstimator


def _moment_predictions(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """``x_iᵀ Σ_{j<i} y_j x_j`` for every position (0 at position 0), in float64."""
    xs, ys = to_working(xs, ys)
    return (xs * exclusive_cumsum(ys.unsqueeze(-1) * xs, dim=1)).sum(-1)


class Averaging(InContextEstimator):
    """Garg et al.'s averaging estimator: ``ŵ_i = mean_{j<i} y_j x_j``, ``ŷ_i = x_iᵀ ŵ_i``.

    Position 0 (no examples) predicts 0.
    """

    name = "averaging"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        moment = _moment_predictions(xs, ys)
        return moment / prefix_counts(xs.shape[1], moment).clamp_min(1)


class OneStepGD(InContextEstimator):
    """One gradient-descent step from ``w = 0`` on ``½ Σ_{j<i} (y_j - wᵀx_j)²``:
    ``ŷ_i = lr · x_iᵀ Σ_{j<i} y_j x_j`` (the unnormalised sum; ψ_L of the SGPT paper).

    Position 0 (empty sum) predicts 0.

    Args:
        lr: the step size.
    """

    def __init__(self, lr: float = 1.0):
        self.lr = check_float("lr", lr, low=0.0, low_inclusive=False)
        self.name = f"one_step_gd(lr={self.lr:g})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return self.lr * _moment_predictions(xs, ys)
