"""Minimum-norm least squares on every prefix, vectorised over prompts and prefixes."""

from __future__ import annotations

import torch

from ..validation import check_float
from ._cholesky_prefix import posterior_from_factor, prefix_posterior
from ._prefix import to_working
from ._sequential_basis import earlier_independent_weights, sequential_basis
from .base import InContextEstimator


class LeastSquares(InContextEstimator):
    """Ordinary least squares refitted on each prefix: ``ŷ_i = x_iᵀ pinv(X_<i) y_<i``.

    Below full rank (fewer examples than dimensions, or collinear inputs) this is the
    minimum-norm solution, so position 0 predicts 0 and a point outside the span of the
    examples is predicted through its projection onto that span.

    How all prefixes are solved at once (float64). Call a point *independent* if it is not in
    the span of the points before it. Parametrise a fit by its fitted values ``θ_b`` at the
    independent points ``b``; any other point's fitted value is ``h_jᵀ θ``, with ``h_j`` the
    weights expressing (the projection of) ``x_j`` through the earlier independent points. The
    least-squares objective becomes ``Σ_b (θ_b - y_b)² + Σ_dependent j (h_jᵀθ - y_j)²``: the
    posterior mean for a prior ``θ ~ N(y_indep, I)`` observed through the dependent points with
    unit noise. So the prediction is a Gaussian-process prefix posterior with prior mean ``H y``
    and covariance ``H Hᵀ``, where independent points carry no information and dependent points
    have unit noise: one Cholesky for all prefixes (:mod:`._cholesky_prefix`).

    Fast path: inputs in general position (and curricula with zeroed trailing coordinates) have
    their independent points first, so the prior covariance only involves the later block. Any
    other pattern (e.g. a repeated point) uses :mod:`._sequential_basis`, a loop over positions.

    Args:
        rtol: a point whose distance to the span of the earlier points is at most
            ``rtol * |x_j|`` is treated as lying in that span (the numerical rank decision).
    """

    def __init__(self, rtol: float = 1e-6):
        self.rtol = check_float("rtol", rtol, low=1e-12, high=1.0)
        self.name = "least_squares"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        preds = _predict_independent_first(xs, ys, self.rtol)
        return preds if preds is not None else _predict_any_order(xs, ys, self.rtol)


def _predict_independent_first(xs: torch.Tensor, ys: torch.Tensor, rtol: float) -> torch.Tensor | None:
    """Predictions if, in every prompt, the first ``r`` points are independent and span all the
    later ones (the same ``r`` for the whole batch); ``None`` otherwise."""
    n_points, n_dims = xs.shape[-2:]
    size = min(n_points, n_dims)
    gram = xs[:, :size] @ xs[:, :size].transpose(-1, -2)
    chol, info = torch.linalg.cholesky_ex(gram)
    # Distance of each leading point to the span of the ones before it, from the points themselves:
    # x_j - proj(x_j) = L_jj (L⁻¹ X)_j. Gram pivots alone are too imprecise for the rank decision.
    # Rows after a failed (info) or spurious pivot are garbage, but forward substitution keeps them
    # from affecting earlier rows, and the leading run below stops before them.
    whitened = torch.linalg.solve_triangular(chol, xs[:, :size], upper=False)
    distance_sq = chol.diagonal(dim1=-2, dim2=-1).square() * whitened.square().sum(-1)
    computed = torch.arange(size, device=xs.device) < torch.where(info > 0, info - 1, size).unsqueeze(-1)
    is_new = computed & (distance_sq > rtol**2 * gram.diagonal(dim1=-2, dim2=-1))
    leading_run = is_new.int().cumprod(-1).sum(-1)
    rank = int(leading_run[0])
    if rank == 0 or not bool((leading_run == rank).all()):
        return None
    factor = chol[:, :rank, :rank]
    first = posterior_from_factor(factor, ys[:, :rank]).mean
    if rank == n_points:
        return first
    # Rows of K⁻¹ X for the first rank points (K their Gram): x ↦ its weights on those points.
    dual_basis = torch.linalg.solve_triangular(factor.transpose(-1, -2), whitened[:, :rank], upper=True)
    later_points = xs[:, rank:]
    weights = later_points @ dual_basis.transpose(-1, -2)  # (B, N - rank, rank)
    if rank < n_dims:  # (rank == d independent points span all of R^d)
        outside_sq = (later_points - weights @ xs[:, :rank]).square().sum(-1)
        if bool((outside_sq > rtol**2 * later_points.square().sum(-1)).any()):
            return None
    prior_mean = (weights @ ys[:, :rank].unsqueeze(-1)).squeeze(-1)
    later = prefix_posterior(weights @ weights.transpose(-1, -2), ys[:, rank:] - prior_mean, 1.0)
    return torch.cat([first, prior_mean + later.mean], dim=-1)


def _predict_any_order(xs: torch.Tensor, ys: torch.Tensor, rtol: float) -> torch.Tensor:
    """General path: independent and dependent points in any order (e.g. repeated points)."""
    basis = sequential_basis(xs, rtol)
    weights = earlier_independent_weights(basis)
    prior_mean = (weights @ ys.unsqueeze(-1)).squeeze(-1)
    # Finite stand-in for infinite noise: its effect, ~1/noise, is far below float64 resolution.
    no_information = torch.finfo(ys.dtype).max ** 0.5
    noise_var = torch.where(basis.independent, ys.new_tensor(no_information), ys.new_tensor(1.0))
    posterior = prefix_posterior(weights @ weights.transpose(-1, -2), ys - prior_mean, noise_var)
    return prior_mean + posterior.mean
