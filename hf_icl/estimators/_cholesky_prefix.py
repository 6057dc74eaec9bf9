"""Gaussian-process regression on every prefix of a prompt from ONE Cholesky factorisation.

Model: latent values ``f ~ N(0, cov)`` observed as ``y = f + eps`` with independent
``eps_i ~ N(0, noise_var_i)``. For every position ``i`` we want ``E[f_i | y_<i]`` and
``log p(y_<i)``. Ridge (``cov = X Xᵀ``, noise ``λ``), kernel ridge (``cov`` a kernel matrix) and
the Bayes-optimal ridge (``cov = τ² X Xᵀ``, noise ``σ²``) are all this computation.

Why one factorisation gives all prefixes: let ``L = cholesky(cov + diag(noise_var))``. Its
leading block ``L[:i, :i]`` is the Cholesky factor of the prefix system ``C_<i``, and its row
``L[i, :i] = L[:i, :i]⁻¹ cov[:i, i]``. With ``z = L⁻¹ y`` (forward substitution, so ``z[:i]``
depends on ``y[:i]`` only)::

    E[f_i | y_<i] = cov[i, :i] C_<i⁻¹ y_<i = L[i, :i] · z[:i],   i.e.  mean = tril(L, -1) @ z.

Reading ``y = L e`` with ``e ~ N(0, I)`` sequentially also gives the predictive decomposition
``y_i | y_<i ~ N(mean_i, L_ii²)``, hence ``log p(y_<i) = Σ_{j<i} [log N(z_j; 0, 1) - log L_jj]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ._prefix import exclusive_cumsum


class PrefixPosterior(NamedTuple):
    """Per-position results of :func:`prefix_posterior`, each of shape ``(..., N)``."""

    mean: torch.Tensor
    """``E[f_i | y_<i]``: the posterior-mean prediction at position i (0 at position 0)."""
    log_evidence: torch.Tensor
    """``log p(y_<i)``: log marginal likelihood of the examples before position i (0 at i = 0)."""


def prefix_posterior(cov: torch.Tensor, targets: torch.Tensor, noise_var: float | torch.Tensor) -> PrefixPosterior:
    """Posterior mean and evidence of every prefix of a Gaussian-process regression.

    Args:
        cov: ``(..., N, N)`` prior covariance of the latent values, positive semi-definite.
        targets: ``(..., N)`` observations ``y``.
        noise_var: observation-noise variance, a positive scalar or a tensor broadcastable to
            ``(..., N)`` (one variance per observation).

    Raises:
        ValueError: if ``cov + diag(noise_var)`` is not numerically positive definite.
    """
    noise = torch.as_tensor(noise_var, dtype=cov.dtype, device=cov.device)
    chol, info = torch.linalg.cholesky_ex(cov + torch.diag_embed(noise.expand(cov.shape[:-1])))
    if bool((info != 0).any()):
        raise ValueError(
            "cov + noise_var * I is not positive definite in floating point; use a larger "
            "regulariser (λ or noise variance)"
        )
    return posterior_from_factor(chol, targets)


def posterior_from_factor(chol: torch.Tensor, targets: torch.Tensor) -> PrefixPosterior:
    """:func:`prefix_posterior` given ``chol``, a lower-triangular factor ``L`` of
    ``cov + diag(noise_var)`` with positive diagonal."""
    whitened = torch.linalg.solve_triangular(chol, targets.unsqueeze(-1), upper=False).squeeze(-1)
    # y = L z row by row: y_i = mean_i + L_ii z_i, which avoids forming tril(L, -1) @ z.
    pivots = chol.diagonal(dim1=-2, dim2=-1)
    mean = targets - pivots * whitened
    mean[..., 0] = 0.0  # exactly: position 0 has no examples (the line above leaves rounding there)
    step_log_likelihood = -0.5 * whitened.square() - pivots.log() - 0.5 * math.log(2 * math.pi)
    return PrefixPosterior(mean=mean, log_evidence=exclusive_cumsum(step_log_likelihood, -1))
