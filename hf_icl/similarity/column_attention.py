"""Geometric-algebra column attention (the kernel-regression document, seed 000, ``LearnableColumnAttention``).

Row attention compares samples; column attention compares *features*. Each feature ``d`` of a sample set
``xs (..., N, D)`` is the N-vector of its values over the samples (a column). With unit columns ``u_d`` the score of
the pair ``(d, e)`` is

    score[d, e] = β₁ cos θ_de − β₂ (sin θ_de − μ)² + diag_bias · [d = e],     cos θ_de = u_d · u_e,

(inner part: alignment; wedge part ``sin θ = √(1 − cos²θ)``: a well at ``sin θ = μ``), and the mixing weights are
its softmax over ``e``. Every sample is then mixed through a residual gate,
``x̃ = (1 − σ(g)) x + σ(g) α x``, so correlated features (a group sharing a latent) are averaged and denoised.

:func:`column_mixing_weights` computes the weights of one sample set; :func:`prefix_column_mixing_weights` the
weights of every prefix ``xs[:, :i]`` at once (the causal protocol, position ``i`` may use the samples ``j < i``
only) from a cumulative Gram matrix; :func:`mix_columns` applies them.

Numerics (as in :mod:`~hf_icl.similarity.row_kernels`): column norms are clamped at ``eps`` (a zero column, e.g. a
feature switched off by the dimension curriculum or an empty prefix, has cosine 0 with everything), and the cosine
is clamped to ``[-1 + eps, 1 - eps]`` so that ``sin θ`` stays differentiable for parallel columns. The parameters
may be floats or (learnable) tensors.
"""

from __future__ import annotations

import torch

from ..validation import check_float
from .row_kernels import EPS, clamped_cosine, sine_of

__all__ = ["column_mixing_weights", "mix_columns", "prefix_column_mixing_weights"]


def _check_samples(xs, name: str = "xs") -> None:
    if not isinstance(xs, torch.Tensor) or not xs.is_floating_point() or xs.ndim < 2:
        shape = tuple(xs.shape) if isinstance(xs, torch.Tensor) else type(xs).__name__
        raise ValueError(f"{name} must be a floating-point tensor of shape (..., n_samples, n_features), got {shape}")


def _check_eps(eps) -> None:
    check_float("eps", eps, low=0.0, low_inclusive=False, high=0.5)


def _scores_from_cosine(cosine: torch.Tensor, beta1, beta2, diag_bias, wedge_mu) -> torch.Tensor:
    """``β₁ cos − β₂ (sin − μ)² + diag_bias · I`` for a ``(..., D, D)`` matrix of clamped cosines."""
    identity = torch.eye(cosine.shape[-1], dtype=cosine.dtype, device=cosine.device)
    return beta1 * cosine - beta2 * (sine_of(cosine) - wedge_mu).square() + diag_bias * identity


def column_mixing_weights(
    xs: torch.Tensor, beta1=4.0, beta2=1.0, diag_bias=2.0, wedge_mu=0.5, eps: float = EPS
) -> torch.Tensor:
    """The column-attention weights ``α (..., D, D)`` of the sample set ``xs (..., N, D)`` (rows sum to 1).

    Defaults are the document's initial values. ``N = 0`` (no samples) is allowed: every column is zero, so every
    cosine is 0 and the weights are the softmax of ``-β₂ (1 - μ)² + diag_bias · I``.

    Example::

        >>> import torch
        >>> xs = torch.randn(2, 50, 4)
        >>> alpha = column_mixing_weights(xs)
        >>> alpha.shape, bool(torch.allclose(alpha.sum(-1), torch.ones(2, 4)))
        (torch.Size([2, 4, 4]), True)
    """
    _check_samples(xs)
    _check_eps(eps)
    columns = xs.transpose(-1, -2)  # (..., D, N): a feature is the vector of its values over the samples
    cosine = clamped_cosine(columns, columns, eps)
    return torch.softmax(_scores_from_cosine(cosine, beta1, beta2, diag_bias, wedge_mu), dim=-1)


def prefix_column_mixing_weights(
    xs: torch.Tensor, beta1=4.0, beta2=1.0, diag_bias=2.0, wedge_mu=0.5, eps: float = EPS
) -> torch.Tensor:
    """The weights of every prefix: ``(B, N, D, D)`` whose entry ``i`` is :func:`column_mixing_weights` of the
    samples ``xs[:, :i]`` (``j < i``), for ``xs (B, N, D)`` (any leading batch shape).

    One pass: the Gram matrix of the columns over the samples before ``i``, ``G_i = Σ_{j<i} x_j x_jᵀ``, is an
    exclusive cumulative sum of outer products, and ``cos θ_de = G_de / (max(|x_d|, eps) · max(|x_e|, eps))`` with
    the column norms ``|x_d| = √(G_i)_dd``. Position 0 has no samples: all cosines are 0 (finite weights).

    Example::

        >>> import torch
        >>> xs = torch.randn(2, 8, 3)
        >>> every = prefix_column_mixing_weights(xs)
        >>> bool(torch.allclose(every[:, 5], column_mixing_weights(xs[:, :5]), atol=1e-6))
        True
    """
    _check_samples(xs)
    _check_eps(eps)
    outer = xs.unsqueeze(-1) * xs.unsqueeze(-2)  # (..., N, D, D): sample j's contribution to the Gram matrix
    if xs.shape[-2] == 0:
        return outer  # no positions, no weights
    # Shift, then sum (rather than subtracting each sample's own term afterwards): entry i holds samples j < i only.
    gram = torch.cat([torch.zeros_like(outer.narrow(-3, 0, 1)), outer.narrow(-3, 0, xs.shape[-2] - 1)], dim=-3)
    gram = gram.cumsum(-3)
    # max(|x_d|, eps) as √max(|x_d|², eps²): the same value, with a finite gradient at a zero column
    norms = gram.diagonal(dim1=-2, dim2=-1).clamp_min(eps * eps).sqrt()
    cosine = (gram / (norms.unsqueeze(-1) * norms.unsqueeze(-2))).clamp(-1 + eps, 1 - eps)
    return torch.softmax(_scores_from_cosine(cosine, beta1, beta2, diag_bias, wedge_mu), dim=-1)


def mix_columns(xs: torch.Tensor, weights: torch.Tensor, gate=0.0) -> torch.Tensor:
    """``(1 − σ(gate)) x + σ(gate) α x`` for every sample ``x`` (a row of ``xs (..., N, D)``).

    ``weights`` is ``α (..., D, D)``, one matrix per sample set: its leading dimensions broadcast against those of
    ``xs`` without the sample axis (``xs (B, 1, N, D)`` with ``weights (B, P, D, D)`` mixes the same samples with P
    different matrices, giving ``(B, P, N, D)``).

    Example::

        >>> import torch
        >>> xs = torch.randn(2, 10, 3)
        >>> mixed = mix_columns(xs, column_mixing_weights(xs), gate=0.0)  # σ(0) = 1/2: half x, half αx
        >>> mixed.shape
        torch.Size([2, 10, 3])
    """
    _check_samples(xs)
    if not isinstance(weights, torch.Tensor) or weights.ndim < 2 or weights.shape[-2:] != (xs.shape[-1],) * 2:
        shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise ValueError(
            f"weights must be a tensor of shape (..., {xs.shape[-1]}, {xs.shape[-1]}) for xs with "
            f"{xs.shape[-1]} features, got {shape}"
        )
    openness = torch.sigmoid(torch.as_tensor(gate, dtype=xs.dtype, device=xs.device))
    return (1 - openness) * xs + openness * (xs @ weights.transpose(-1, -2))
