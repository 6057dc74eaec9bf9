"""Nadaraya–Watson kernel smoothing over the earlier examples of every position."""

from __future__ import annotations

import torch

from ..validation import check_choice
from ._kernels import check_bandwidth, pairwise_distances
from ._prefix import earlier_mask, to_working
from .base import InContextEstimator

NW_KERNELS = ("exp", "softmax", "rbf", "hilbert")


class NadarayaWatson(InContextEstimator):
    """Kernel-weighted average ``ŷ_i = Σ_{j<i} w_ij y_j / Σ_{j<i} w_ij``.

    Kernels (``d`` is the input dimension, ``xs.shape[-1]``):

    * ``"exp"`` / ``"softmax"`` (synonyms): ``w_ij = exp(x_iᵀx_j / bandwidth)``, a softmax
      attention over the examples with temperature ``bandwidth``;
    * ``"rbf"``: ``w_ij = exp(-|x_i - x_j|² / (2 bandwidth²))``;
    * ``"hilbert"``: ``w_ij = |x_i - x_j|^-d``, the Hilbert kernel estimate (no bandwidth; a
      consistent smoother). If ``x_i`` exactly equals earlier points, its weight concentrates on
      them (the limit of the kernel): the prediction is the mean of their ``y``.

    Weights are normalised in log space with a masked log-sum-exp, so large logits are stable.
    Position 0 (no examples) predicts 0.

    Args:
        kernel: one of ``"exp"``, ``"softmax"``, ``"rbf"``, ``"hilbert"``.
        bandwidth: temperature (exp/softmax) or length scale (rbf), > 0 (default 1); the Hilbert
            kernel has none, so passing one with it is an error rather than silently ignored.
    """

    def __init__(self, kernel: str = "rbf", bandwidth: float | None = None):
        self.kernel = check_choice("kernel", kernel, NW_KERNELS)
        self.bandwidth = check_bandwidth(bandwidth, kernel, uses_bandwidth=kernel != "hilbert")
        scale = "" if kernel == "hilbert" else f", {'τ' if kernel in ('exp', 'softmax') else 'h'}={self.bandwidth:g}"
        self.name = f"nadaraya_watson({kernel}{scale})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        usable = earlier_mask(xs.shape[1], xs.device)
        log_weights = self._log_weights(xs, usable).masked_fill(~usable, float("-inf"))
        normaliser = torch.logsumexp(log_weights, dim=-1, keepdim=True)
        # Position 0 has no usable pair: its normaliser is -inf and all its weights are zeroed.
        weights = torch.where(usable, torch.exp(log_weights - normaliser), 0.0)
        return (weights * ys.unsqueeze(1)).sum(-1)

    def _log_weights(self, xs: torch.Tensor, usable: torch.Tensor) -> torch.Tensor:
        """Unnormalised log-weights ``(B, N, N)``; only the entries ``j < i`` matter."""
        if self.kernel in ("exp", "softmax"):
            return xs @ xs.transpose(-1, -2) / self.bandwidth
        distances = pairwise_distances(xs)
        if self.kernel == "rbf":
            return -distances.square() / (2 * self.bandwidth**2)
        duplicates = (distances == 0) & usable
        has_duplicate = duplicates.any(-1, keepdim=True)
        log_hilbert = -xs.shape[-1] * torch.where(duplicates, 1.0, distances).log()
        # An exact duplicate has infinite weight: keep only the duplicates, with equal weights.
        on_duplicates = torch.where(duplicates, 0.0, float("-inf"))
        return torch.where(has_duplicate, on_duplicates, log_hilbert)
