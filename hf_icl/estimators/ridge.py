"""Ridge regression on every prefix, in its dual (kernel) form."""

from __future__ import annotations

import torch

from ..validation import check_float
from ._cholesky_prefix import prefix_posterior
from ._kernels import gram_matrix
from ._prefix import to_working
from .base import InContextEstimator


class Ridge(InContextEstimator):
    """Ridge regression refitted on each prefix, no intercept.

    ``w_i = argmin_w |y_<i - X_<i w|² + lam |w|²`` and ``ŷ_i = x_iᵀ w_i``. Computed in the dual,
    ``ŷ_i = k_iᵀ (K_<i + lam I)⁻¹ y_<i`` with ``K = X Xᵀ``, for all prefixes from one Cholesky
    (:mod:`._cholesky_prefix`), in float64. Position 0 predicts 0.

    Args:
        lam: the ridge penalty λ > 0 (use :class:`LeastSquares` for λ = 0).
    """

    def __init__(self, lam: float = 0.1):
        self.lam = check_float("lam", lam, low=0.0, low_inclusive=False)
        self.name = f"ridge(λ={self.lam:g})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        return prefix_posterior(gram_matrix(xs, "linear"), ys, self.lam).mean
