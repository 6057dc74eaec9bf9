"""Rank-revealing Gram–Schmidt of a prompt's points, in order, vectorised over prompts.

Point ``x_j`` is *independent* if it is not (numerically) in the span of ``x_0 .. x_{j-1}``;
each independent point opens one new orthonormal direction, dependent points open none. This
handles collinear inputs of any pattern (repeated points, points inside an earlier span
followed by new directions) exactly, at the price of a loop over the N positions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class SequentialBasis(NamedTuple):
    """Result of :func:`sequential_basis` for prompts ``xs (B, N, d)``."""

    coords: torch.Tensor
    """``(B, N, N)``: row j holds the coordinates of ``x_j`` on the directions opened by the
    independent points ``<= j`` (column c is the direction opened by point c, so the matrix is
    lower triangular and the columns of dependent points are zero). A dependent point's row
    holds the coordinates of its projection onto the span of the earlier points."""
    independent: torch.Tensor
    """``(B, N)`` bool: whether ``x_j`` opened a new direction."""


def sequential_basis(xs: torch.Tensor, rtol: float) -> SequentialBasis:
    """Orthogonalise the points of each prompt ``xs (B, N, d)`` in order.

    A point whose distance to the span of the earlier points is at most ``rtol * |x_j|`` counts
    as dependent. Distances are computed on the points themselves (not from their Gram matrix),
    so they are accurate to rounding.
    """
    batch, n_points, _ = xs.shape
    directions = torch.zeros_like(xs)
    coords = xs.new_zeros(batch, n_points, n_points)
    independent = torch.zeros(batch, n_points, dtype=torch.bool, device=xs.device)
    # The loop is over positions, each step batched over prompts.
    for j in range(n_points):
        point = xs[:, j]
        along, residual = _split_on_span(point, directions[:, :j])
        # Re-orthogonalising once ("twice is enough") makes the residual accurate to rounding.
        correction, residual = _split_on_span(residual, directions[:, :j])
        distance = residual.norm(dim=-1)
        is_new = distance > rtol * point.norm(dim=-1)
        coords[:, j, :j] = along + correction
        coords[:, j, j] = torch.where(is_new, distance, 0.0)
        unit = residual / torch.where(is_new, distance, 1.0).unsqueeze(-1)
        directions[:, j] = torch.where(is_new.unsqueeze(-1), unit, 0.0)
        independent[:, j] = is_new
    return SequentialBasis(coords=coords, independent=independent)


def _split_on_span(vectors: torch.Tensor, orthonormal_rows: torch.Tensor):
    """Coordinates ``(B, k)`` of ``vectors (B, d)`` on the rows of ``orthonormal_rows (B, k, d)``
    and the remainder ``(B, d)`` orthogonal to them."""
    along = (orthonormal_rows @ vectors.unsqueeze(-1)).squeeze(-1)
    return along, vectors - (along.unsqueeze(-2) @ orthonormal_rows).squeeze(-2)


def earlier_independent_weights(basis: SequentialBasis) -> torch.Tensor:
    """``(B, N, N)`` matrix ``H``: row i expresses the projection of ``x_i`` onto the span of the
    points before it as a combination of the earlier *independent* points,
    ``proj(x_i) = Σ_b H[i, b] x_b`` (``H[i, b] = 0`` unless ``b < i`` and ``b`` is independent).

    Solves ``H M = tril(coords, -1)`` where ``M`` is ``coords`` with each dependent point's row
    replaced by a unit row, which makes ``M`` invertible without changing the other rows.
    """
    independent = basis.independent.to(basis.coords.dtype)
    opened = basis.coords * independent.unsqueeze(-1) + torch.diag_embed(1.0 - independent)
    # H M = C  <=>  Mᵀ Hᵀ = Cᵀ: a left solve, much faster than torch's right-sided one on CPU.
    transposed = torch.linalg.solve_triangular(
        opened.transpose(-1, -2), basis.coords.tril(-1).transpose(-1, -2), upper=True
    )
    return transposed.transpose(-1, -2)
