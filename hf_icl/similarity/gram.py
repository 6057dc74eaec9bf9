"""Pairwise distances and Gram matrices between the inputs of a prompt (the kernels of ridge, kernel ridge, k-NN
and the SGPT document's kernel smoothers)."""

from __future__ import annotations

import torch

__all__ = ["GRAM_KERNELS", "gram_matrix", "pairwise_distances"]

#: the kernels :func:`gram_matrix` computes
GRAM_KERNELS = ("rbf", "linear")


def pairwise_distances(xs: torch.Tensor) -> torch.Tensor:
    """Euclidean distances ``(B, N, N)`` between the points of each prompt ``xs (B, N, d)``.

    Computed from coordinate differences, not via ``|a|² + |b|² - 2a·b``, so that duplicate points
    are at distance exactly 0 (k-NN ties and the Hilbert kernel's singularity depend on it).
    """
    return torch.cdist(xs, xs, compute_mode="donot_use_mm_for_euclid_dist")


def gram_matrix(xs: torch.Tensor, kernel: str, bandwidth: float = 1.0) -> torch.Tensor:
    """Kernel matrix ``(B, N, N)`` of each prompt.

    ``"linear"``: ``x_i · x_j``; ``"rbf"``: ``exp(-|x_i - x_j|² / (2 bandwidth²))``.
    """
    if kernel == "linear":
        return xs @ xs.transpose(-1, -2)
    if kernel == "rbf":
        return torch.exp(-pairwise_distances(xs).square() / (2 * bandwidth**2))
    raise ValueError(f"kernel must be one of {list(GRAM_KERNELS)}, got {kernel!r}")
