"""Small tensor helpers shared by the estimators: precision, causal masks, prefix sums."""

from __future__ import annotations

import torch


def working_dtype(device: torch.device) -> torch.dtype:
    """The dtype for numerically delicate work: float64, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def to_working(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Cast tensors to :func:`working_dtype` of their (common) device."""
    dtype = working_dtype(tensors[0].device)
    return tuple(t.to(dtype) for t in tensors)


def earlier_mask(n_points: int, device: torch.device) -> torch.Tensor:
    """Boolean ``(N, N)`` mask, ``True`` at ``[i, j]`` iff ``j < i``: the examples position i may use."""
    return torch.ones(n_points, n_points, dtype=torch.bool, device=device).tril(-1)


def exclusive_cumsum(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum of the entries strictly before each index along ``dim`` (so index 0 gets 0)."""
    # Shifting before summing (rather than subtracting ``values`` afterwards) keeps it exact.
    leading_zero = torch.zeros_like(values.narrow(dim, 0, 1))
    earlier = values.narrow(dim, 0, values.shape[dim] - 1)
    return torch.cat([leading_zero, earlier.cumsum(dim)], dim)


def prefix_counts(n_points: int, like: torch.Tensor) -> torch.Tensor:
    """``[0, 1, ..., N-1]``: how many examples each position sees, in ``like``'s dtype and device."""
    return torch.arange(n_points, dtype=like.dtype, device=like.device)
