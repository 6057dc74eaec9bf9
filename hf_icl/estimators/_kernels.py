"""Pairwise distances and Gram matrices between the inputs of a prompt."""

from __future__ import annotations

import torch

from ..validation import check_float

KERNELS = ("rbf", "linear")


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
    raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")


def check_bandwidth(bandwidth, kernel: str, *, uses_bandwidth: bool) -> float:
    """The bandwidth of ``kernel`` (1 when not given), or a ``ValueError`` for a bad one, or for one
    given to a kernel that has none (it would be silently ignored)."""
    if not uses_bandwidth:
        if bandwidth is not None:
            raise ValueError(
                f"bandwidth does not apply to kernel={kernel!r} (it has none), got bandwidth={bandwidth!r}"
            )
        return 1.0
    return check_float("bandwidth", 1.0 if bandwidth is None else bandwidth, low=0.0, low_inclusive=False)
