"""Kernel ridge regression on every prefix."""

from __future__ import annotations

import torch

from ..validation import check_choice, check_float
from ._cholesky_prefix import prefix_posterior
from ._kernels import KERNELS, check_bandwidth, gram_matrix
from ._prefix import to_working
from .base import InContextEstimator


class KernelRidge(InContextEstimator):
    """Kernel ridge regression refitted on each prefix (as ``sklearn.kernel_ridge.KernelRidge``).

    ``ŷ_i = k(x_i, X_<i) (K_<i + lam I)⁻¹ y_<i``, for all prefixes from one Cholesky
    (:mod:`._cholesky_prefix`), in float64. Position 0 predicts 0.

    Args:
        lam: the ridge penalty λ > 0 (sklearn's ``alpha``).
        kernel: ``"rbf"``: ``exp(-|x - x'|² / (2 bandwidth²))`` (sklearn's ``gamma =
            1 / (2 bandwidth²)``), or ``"linear"``: ``x · x'`` (then this is :class:`Ridge`).
        bandwidth: the RBF length scale h > 0 (default 1); the linear kernel has none, so passing
            one with it is an error rather than silently ignored.
    """

    def __init__(self, lam: float = 0.1, kernel: str = "rbf", bandwidth: float | None = None):
        self.lam = check_float("lam", lam, low=0.0, low_inclusive=False)
        self.kernel = check_choice("kernel", kernel, KERNELS)
        self.bandwidth = check_bandwidth(bandwidth, kernel, uses_bandwidth=kernel == "rbf")
        scale = f", h={self.bandwidth:g}" if kernel == "rbf" else ""
        self.name = f"kernel_ridge({kernel}, λ={self.lam:g}{scale})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        return prefix_posterior(gram_matrix(xs, self.kernel, self.bandwidth), ys, self.lam).mean
