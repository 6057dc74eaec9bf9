"""Kernel ridge regression on every prefix (or on a context)."""

from __future__ import annotations

import torch

from ..similarity.gram import GRAM_KERNELS, gram_matrix
from ..similarity.row_kernels import row_kernel_scores
from ..validation import check_choice, check_float
from ._bandwidth import check_bandwidth
from ._cholesky_prefix import prefix_posterior
from ._prefix import to_working
from .base import InContextEstimator
from .ridge import regularised_solve


class KernelRidge(InContextEstimator):
    """Kernel ridge regression refitted on each prefix (as ``sklearn.kernel_ridge.KernelRidge``).

    ``ŷ_i = k(x_i, X_<i) (K_<i + lam I)⁻¹ y_<i``, for all prefixes from one Cholesky
    (:mod:`._cholesky_prefix`), in float64. Position 0 predicts 0. :meth:`predict_queries` solves
    ``(K + lam I) α = y`` once on the context Gram matrix and predicts ``k(x_q, X) α``.

    Args:
        lam: the ridge penalty λ > 0 (sklearn's ``alpha``).
        kernel: ``"rbf"``: ``exp(-|x - x'|² / (2 bandwidth²))`` (sklearn's ``gamma =
            1 / (2 bandwidth²)``), or ``"linear"``: ``x · x'`` (then this is :class:`Ridge`).
        bandwidth: the RBF length scale h > 0 (default 1); the linear kernel has none, so passing
            one with it is an error rather than silently ignored.

    >>> import torch
    >>> from hf_icl.estimators import KernelRidge
    >>> context_xs = torch.linspace(-3, 3, 50, dtype=torch.float64).reshape(1, 50, 1)
    >>> krr = KernelRidge(lam=1e-3, bandwidth=0.5)
    >>> query = torch.tensor([[[1.0]]], dtype=torch.float64)
    >>> round(krr.predict_queries(context_xs, torch.sin(context_xs[..., 0]), query).item(), 3)
    0.841
    """

    def __init__(self, lam: float = 0.1, kernel: str = "rbf", bandwidth: float | None = None):
        self.lam = check_float("lam", lam, low=0.0, low_inclusive=False)
        self.kernel = check_choice("kernel", kernel, GRAM_KERNELS)
        self.bandwidth = check_bandwidth(bandwidth, kernel, uses_bandwidth=kernel == "rbf")
        scale = f", h={self.bandwidth:g}" if kernel == "rbf" else ""
        self.name = f"kernel_ridge({kernel}, λ={self.lam:g}{scale})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        return prefix_posterior(gram_matrix(xs, self.kernel, self.bandwidth), ys, self.lam).mean

    def _predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        context_xs, context_ys, query_xs = to_working(context_xs, context_ys, query_xs)
        alpha = regularised_solve(
            gram_matrix(context_xs, self.kernel, self.bandwidth), context_ys.unsqueeze(-1), self.lam
        )
        return (self._cross_kernel(query_xs, context_xs) @ alpha).squeeze(-1)

    def _cross_kernel(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``k(x_q, x_j)`` ``(B, Q, n)``: the same kernel as :func:`gram_matrix`, between two sets of rows."""
        if self.kernel == "linear":
            return row_kernel_scores(queries, keys, "softmax")  # the plain dot product (scale 1)
        return row_kernel_scores(queries, keys, "rbf", bandwidth=self.bandwidth).exp()
