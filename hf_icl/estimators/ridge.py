"""Ridge regression on every prefix, in its dual (kernel) form or its primal (weight) form."""

from __future__ import annotations

import torch

from ..similarity.gram import gram_matrix
from ..validation import check_choice, check_float
from ._cholesky_prefix import prefix_posterior
from ._prefix import exclusive_cumsum, to_working
from .base import InContextEstimator

RIDGE_FORMS = ("dual", "primal")


class Ridge(InContextEstimator):
    """Ridge regression refitted on each prefix, no intercept.

    ``w_i = argmin_w |y_<i - X_<i w|² + lam |w|²`` and ``ŷ_i = x_iᵀ w_i``, in float64, in one of two forms
    with the same predictions (the Woodbury identity):

    * ``form="dual"`` (default): ``ŷ_i = k_iᵀ (K_<i + lam I)⁻¹ y_<i`` with ``K = X Xᵀ``, for all prefixes
      from one ``N × N`` Cholesky (:mod:`._cholesky_prefix`); the inputs appear only through dot products.
    * ``form="primal"``: ``w_i = (X_<iᵀ X_<i + lam I_d)⁻¹ X_<iᵀ y_<i``, the ``d × d`` systems of all prefixes
      built from cumulative sums of the outer products ``x_j x_jᵀ`` and solved in one batched call (cheaper
      than the dual when ``d`` is small and ``N`` large).

    Position 0 predicts 0.

    Args:
        lam: the ridge penalty λ > 0 (use :class:`LeastSquares` for λ = 0).
        form: ``"dual"`` or ``"primal"``.

    >>> import torch
    >>> from hf_icl.estimators import Ridge
    >>> xs = torch.randn(2, 9, 3, dtype=torch.float64)
    >>> ys = xs @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    >>> torch.allclose(Ridge(0.3, form="primal")(xs, ys), Ridge(0.3)(xs, ys))
    True
    """

    def __init__(self, lam: float = 0.1, form: str = "dual"):
        self.lam = check_float("lam", lam, low=0.0, low_inclusive=False)
        self.form = check_choice("form", form, RIDGE_FORMS)
        self.name = f"ridge(λ={self.lam:g})" if form == "dual" else f"ridge(λ={self.lam:g}, primal)"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        if self.form == "dual":
            return prefix_posterior(gram_matrix(xs, "linear"), ys, self.lam).mean
        # Σ_{j<i} x_j x_jᵀ and Σ_{j<i} x_j y_j for every i: (B, N, d, d) and (B, N, d).
        scatter = exclusive_cumsum(xs.unsqueeze(-1) * xs.unsqueeze(-2), dim=1)
        moments = exclusive_cumsum(xs * ys.unsqueeze(-1), dim=1)
        weights = regularised_solve(scatter, moments.unsqueeze(-1), self.lam).squeeze(-1)
        return (xs * weights).sum(-1)

    def _predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        context_xs, context_ys, query_xs = to_working(context_xs, context_ys, query_xs)
        if self.form == "dual":
            gram = context_xs @ context_xs.transpose(-1, -2)
            alpha = regularised_solve(gram, context_ys.unsqueeze(-1), self.lam)
            return ((query_xs @ context_xs.transpose(-1, -2)) @ alpha).squeeze(-1)
        scatter = context_xs.transpose(-1, -2) @ context_xs
        weights = regularised_solve(scatter, context_xs.transpose(-1, -2) @ context_ys.unsqueeze(-1), self.lam)
        return (query_xs @ weights).squeeze(-1)


def regularised_solve(matrix: torch.Tensor, rhs: torch.Tensor, lam: float) -> torch.Tensor:
    """``(matrix + lam I)⁻¹ rhs`` for a batch of symmetric positive semi-definite ``matrix (..., m, m)`` and
    ``rhs (..., m, k)``, by Cholesky.

    Raises:
        ValueError: if ``matrix + lam I`` is not numerically positive definite.
    """
    identity = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    chol, info = torch.linalg.cholesky_ex(matrix + lam * identity)
    if bool((info != 0).any()):
        raise ValueError(f"matrix + lam * I is not positive definite in floating point (lam={lam:g}); use a larger lam")
    return torch.cholesky_solve(rhs, chol)
