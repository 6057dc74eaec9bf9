"""k-nearest-neighbour regression on every prefix."""

from __future__ import annotations

import torch

from ..similarity.gram import pairwise_distances
from ..validation import check_int
from ._prefix import earlier_mask, to_working
from .base import InContextEstimator


class KNN(InContextEstimator):
    """Mean of the ``y`` of the ``k`` earlier points nearest to ``x_i`` (Euclidean distance).

    With fewer than ``k`` earlier points, the mean of all of them; position 0 predicts 0. Ties
    in distance go to the earlier example. Vectorised through a ``(B, N, N)`` distance matrix
    with the pairs ``j >= i`` masked out.

    Args:
        k: number of neighbours, a positive integer.
    """

    def __init__(self, k: int = 3):
        self.k = check_int("k", k, low=1)
        self.name = f"knn(k={self.k})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        n_points = xs.shape[1]
        usable = earlier_mask(n_points, xs.device)
        distances = pairwise_distances(xs).masked_fill(~usable, float("inf"))
        k = min(self.k, n_points)
        # A stable sort keeps equal distances in index order; masked pairs (inf) sort last.
        nearest = distances.sort(dim=-1, stable=True).indices[..., :k]
        neighbour_ys = ys.unsqueeze(1).expand(-1, n_points, -1).gather(-1, nearest)
        # Position i has i usable examples, so its first min(k, i) neighbours are real.
        is_real = torch.arange(k, device=xs.device) < torch.arange(n_points, device=xs.device).unsqueeze(-1)
        n_real = is_real.sum(-1).clamp_min(1)
        return (neighbour_ys * is_real).sum(-1) / n_real
