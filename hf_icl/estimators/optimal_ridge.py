"""The Bayes-optimal predictor for linear regression with Gaussian weights and Gaussian noise."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..similarity.gram import gram_matrix
from ..validation import check_float
from ._cholesky_prefix import prefix_posterior
from ._prefix import to_working
from .base import InContextEstimator


class OptimalRidge(InContextEstimator):
    """Posterior-mean prediction for ``y = xᵀw + σ ε`` with ``w ~ N(0, τ² I)``, ``ε ~ N(0, 1)``.

    With one noise level this is ridge with ``λ = σ² / τ²``. With a mixture of noise levels
    ``σ_m`` (prior probabilities ``p_m``), the posterior mean is the mixture of the per-level
    ridge predictions weighted by ``p(σ_m | y_<i) ∝ p_m N(y_<i; 0, τ² X_<i X_<iᵀ + σ_m² I)``;
    predictions and prefix evidences all come from one Cholesky per level
    (:mod:`._cholesky_prefix`), in float64. Position 0 predicts 0 (weights are the prior there).

    Args:
        noise_std: σ > 0, or a sequence of noise levels for a mixture.
        weight_var: τ², a positive number, or ``"1/d"`` for ``w ~ N(0, I / d)`` with d the input
            dimension of the prompts.
        noise_probs: prior probabilities of the noise levels (default: uniform).
    """

    def __init__(
        self,
        noise_std: float | Sequence[float],
        weight_var: float | str = 1.0,
        noise_probs: Sequence[float] | None = None,
    ):
        if isinstance(noise_std, (str, bytes)) or not isinstance(noise_std, (int, float, Sequence)):
            raise ValueError(f"noise_std must be a positive number or a non-empty sequence of them, got {noise_std!r}")
        levels = [noise_std] if isinstance(noise_std, (int, float)) else list(noise_std)
        if not levels:
            raise ValueError("noise_std must be a positive number or a non-empty sequence, got []")
        self.noise_std = [check_float(f"noise_std[{m}]", s, low=0.0, low_inclusive=False) for m, s in enumerate(levels)]
        self.noise_probs = _check_probabilities(noise_probs, len(self.noise_std))
        if weight_var != "1/d":
            weight_var = check_float("weight_var", weight_var, low=0.0, low_inclusive=False)
        self.weight_var = weight_var
        sigma = ",".join(f"{s:g}" for s in self.noise_std)
        tau = weight_var if isinstance(weight_var, str) else f"{weight_var:g}"
        self.name = f"optimal_ridge(τ²={tau}, σ={sigma})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        tau_sq = 1.0 / xs.shape[-1] if self.weight_var == "1/d" else self.weight_var
        noise_var = torch.tensor(self.noise_std, dtype=xs.dtype, device=xs.device).square()
        # Levels along a leading axis: (M, B, N, N) covariances, one Cholesky each.
        cov = (tau_sq * gram_matrix(xs, "linear")).expand(len(self.noise_std), *xs.shape[:2], xs.shape[1])
        posterior = prefix_posterior(cov, ys, noise_var[:, None, None])
        log_prior = torch.tensor(self.noise_probs, dtype=xs.dtype, device=xs.device).log()
        level_weights = torch.softmax(log_prior[:, None, None] + posterior.log_evidence, dim=0)
        return (level_weights * posterior.mean).sum(0)


def _check_probabilities(probs: Sequence[float] | None, n_levels: int) -> list[float]:
    """Uniform if ``probs`` is None, else ``probs`` checked to be ``n_levels`` non-negative
    numbers summing to 1."""
    if probs is None:
        return [1.0 / n_levels] * n_levels
    probs = [check_float(f"noise_probs[{m}]", p, low=0.0) for m, p in enumerate(probs)]
    if len(probs) != n_levels or not math.isclose(sum(probs), 1.0, rel_tol=1e-6):
        raise ValueError(
            f"noise_probs must be {n_levels} non-negative numbers (one per noise level) summing to 1, got {probs}"
        )
    return probs
