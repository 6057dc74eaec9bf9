"""Lasso on every prefix, by coordinate descent batched over prompts and prefixes."""

from __future__ import annotations

import warnings

import torch
from torch.nn.functional import softshrink

from ..validation import check_float, check_int
from ._prefix import exclusive_cumsum, prefix_counts, to_working
from .base import InContextEstimator


class Lasso(InContextEstimator):
    """Lasso refitted on each prefix, no intercept, as ``sklearn.linear_model.Lasso``.

    ``w_i = argmin_w (1 / (2n)) |y_<i - X_<i w|² + alpha |w|_1`` with ``n = i`` examples, and
    ``ŷ_i = x_iᵀ w_i``. All ``B × N`` problems are solved together by scikit-learn's algorithm,
    cyclic coordinate descent from ``w = 0`` with its stopping rule (a duality gap below
    ``tol · mean(y_<i²)``, checked once a sweep moves no coefficient by more than
    ``tol · max |w|``), run on the prefix moments ``X_<iᵀX_<i / n``, ``X_<iᵀy_<i / n`` in
    float64. Each problem stops on its own, so a prediction does not depend on the rest of the
    batch. Position 0 (``n = 0``) predicts 0.

    Args:
        alpha: the L1 penalty > 0.
        max_iter: maximum number of sweeps over the coordinates. The default, 100 000, is Garg et
            al.'s (sklearn's own 1000 leaves badly conditioned prefixes, with fewer examples than
            dimensions, unconverged: prediction gaps of several units on sparse tasks). A fit that
            still has not converged is reported with a ``LassoConvergenceWarning``.
        tol: sklearn's tolerance (default 1e-4).
    """

    def __init__(self, alpha: float = 0.1, max_iter: int = 100_000, tol: float = 1e-4):
        self.alpha = check_float("alpha", alpha, low=0.0, low_inclusive=False)
        self.max_iter = check_int("max_iter", max_iter, low=1)
        self.tol = check_float("tol", tol, low=0.0, low_inclusive=False)
        self.name = f"lasso(α={self.alpha:g})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        batch, n_points, n_dims = xs.shape
        n_examples = prefix_counts(n_points, xs).clamp_min(1).unsqueeze(-1)
        second_moment = exclusive_cumsum(xs.unsqueeze(-1) * xs.unsqueeze(-2), 1) / n_examples.unsqueeze(-1)
        cross_moment = exclusive_cumsum(xs * ys.unsqueeze(-1), 1) / n_examples
        mean_square = exclusive_cumsum(ys.square(), 1) / n_examples.squeeze(-1)
        weights = _coordinate_descent(
            second_moment.reshape(-1, n_dims, n_dims),
            cross_moment.reshape(-1, n_dims),
            mean_square.reshape(-1),
            self.alpha,
            self.max_iter,
            self.tol,
        )
        weights = weights.view(batch, n_points, n_dims)
        return (weights * xs).sum(-1)


class LassoConvergenceWarning(RuntimeWarning):
    """Some lasso fits reached ``max_iter`` sweeps without meeting the stopping rule."""


def _coordinate_descent(
    second_moment: torch.Tensor,
    cross_moment: torch.Tensor,
    mean_square: torch.Tensor,
    alpha: float,
    max_iter: int,
    tol: float,
) -> torch.Tensor:
    """Solve the problems ``min_w ½ wᵀAw - bᵀw + ½ m2 + alpha |w|_1`` (the Lasso objective written
    with the moments ``A = XᵀX/n``, ``b = Xᵀy/n``, ``m2 = yᵀy/n``) for a batch ``A (P, d, d)``,
    ``b (P, d)``, ``m2 (P,)``; each problem's weights are taken at the sweep where it converges.
    Problems still unconverged after ``max_iter`` sweeps keep their last iterate, with a warning."""
    solution = torch.zeros_like(cross_moment)
    rows = _Rows(second_moment, cross_moment, mean_square)
    for sweep in range(max_iter):
        largest_step = rows.sweep(alpha)
        largest_weight = rows.weights.abs().amax(-1)
        small_steps = (largest_weight == 0) | (largest_step < tol * largest_weight)
        gap = _duality_gap(rows.cross, rows.mean_square, rows.weights, rows.fitted, alpha)
        converged = small_steps & (gap <= tol * rows.mean_square)
        if sweep == max_iter - 1:
            _warn_unconverged(int((~rows.done & ~converged).sum()), len(cross_moment), max_iter)
        newly_done = ~rows.done & (converged if sweep < max_iter - 1 else True)
        solution[rows.problem[newly_done]] = rows.weights[newly_done]
        rows.done |= newly_done
        if bool(rows.done.all()):
            break
        # Finished problems keep being swept (harmlessly) until dropping them pays for the copy.
        if rows.done.sum() * 4 >= len(rows.done):
            rows = rows.select(~rows.done)
    return solution


def _warn_unconverged(count: int, total: int, max_iter: int) -> None:
    if count:
        warnings.warn(
            f"lasso: {count} of {total} prefix fits did not converge within max_iter={max_iter} sweeps; "
            "their predictions are the last iterate (raise max_iter)",
            LassoConvergenceWarning,
            stacklevel=4,
        )


class _Rows:
    """The problems still being iterated, with their iterates ``w`` and ``A w``."""

    def __init__(self, second: torch.Tensor, cross: torch.Tensor, mean_square: torch.Tensor):
        self.second, self.cross, self.mean_square = second, cross, mean_square
        self.problem = torch.arange(len(cross), device=cross.device)  # index in the full batch
        self.weights, self.fitted = torch.zeros_like(cross), torch.zeros_like(cross)
        self.done = torch.zeros(len(cross), dtype=torch.bool, device=cross.device)
        self.curvature = second.diagonal(dim1=-2, dim2=-1)
        # A coordinate whose column of X is zero stays 0 (its objective is just alpha |w_k|).
        self.inverse_curvature = torch.where(self.curvature > 0, 1.0 / self.curvature.clamp_min(1e-300), 0.0)

    def select(self, keep: torch.Tensor) -> _Rows:
        """The subset ``keep`` of the rows, iterates included."""
        subset = _Rows.__new__(_Rows)
        for field, value in vars(self).items():
            setattr(subset, field, value[keep])
        return subset

    def sweep(self, alpha: float) -> torch.Tensor:
        """One cyclic pass of exact coordinate minimisation, in place; returns each row's
        largest coefficient change."""
        weights, fitted = self.weights, self.fitted
        largest_step = torch.zeros_like(self.mean_square)
        for k in range(weights.shape[-1]):
            old = weights[:, k].clone()
            partial = self.cross[:, k] - fitted[:, k] + self.curvature[:, k] * old
            weights[:, k] = softshrink(partial, alpha) * self.inverse_curvature[:, k]
            step = weights[:, k] - old
            # A is symmetric, so its (contiguous) row k is the column k that A w changes by.
            fitted.add_(self.second[:, k, :] * step.unsqueeze(-1))
            largest_step = torch.maximum(largest_step, step.abs())
        return largest_step


def _duality_gap(
    cross: torch.Tensor, mean_square: torch.Tensor, weights: torch.Tensor, fitted: torch.Tensor, alpha: float
):
    """scikit-learn's duality gap of the Lasso, divided by n and written with the moments."""
    gradient = cross - fitted  # Xᵀr / n for the residual r = y - Xw
    dual_norm = gradient.abs().amax(-1)
    scale = torch.where(dual_norm > alpha, alpha / dual_norm.clamp_min(1e-300), 1.0)
    explained = (cross * weights).sum(-1)
    residual_sq = mean_square - 2 * explained + (weights * fitted).sum(-1)  # |r|² / n
    return 0.5 * residual_sq * (1 + scale.square()) + alpha * weights.abs().sum(-1) - scale * (mean_square - explained)
