"""Bootstrap bands for per-position means over prompts.

Prompts are resampled with replacement. All replicates come from ONE index tensor
``(n_bootstrap, n_prompts)`` drawn from a generator seeded with ``seed``, and the same indices
serve every predictor, so bands of different predictors are paired like their curves.

A replicate's mean is ``counts @ scores / n_prompts``, where ``counts[b, p]`` is how often prompt
``p`` was drawn in replicate ``b``: one matrix product for all replicates instead of gathering an
``(n_bootstrap, n_prompts, N)`` tensor. Replicates are processed in chunks that keep the count
matrix under :data:`MAX_COUNT_ENTRIES` entries.

Example::

    >>> import torch
    >>> scores = torch.rand(200, 3, dtype=torch.float64)
    >>> lower, upper = bootstrap_band(scores, n_bootstrap=500, confidence=(0.05, 0.95), seed=0)
    >>> bool((lower <= scores.mean(0)).all() and (scores.mean(0) <= upper).all())
    True
"""

from __future__ import annotations

import torch

from ..validation import check_float, check_int

#: Upper bound on the entries of one chunk's ``(replicates, n_prompts)`` count matrix.
MAX_COUNT_ENTRIES = 2**24


def check_confidence(confidence: tuple[float, float]) -> tuple[float, float]:
    """``(lower_quantile, upper_quantile)`` with ``0 <= lower < upper <= 1``."""
    try:
        lower, upper = confidence
    except (TypeError, ValueError):
        raise ValueError(f"confidence must be a pair of quantiles (lower, upper), got {confidence!r}") from None
    lower = check_float("confidence[0]", lower, low=0, high=1)
    upper = check_float("confidence[1]", upper, low=0, high=1)
    if not lower < upper:
        raise ValueError(f"confidence must have lower < upper quantile, got {confidence!r}")
    return lower, upper


def bootstrap_indices(n_bootstrap: int, n_prompts: int, seed: int) -> torch.Tensor:
    """Row ``b`` holds the prompts drawn (with replacement) for replicate ``b``: ``(n_bootstrap, n_prompts)``."""
    check_int("n_bootstrap", n_bootstrap, low=1)
    check_int("n_prompts", n_prompts, low=1)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(n_prompts, (n_bootstrap, n_prompts), generator=generator)


def bootstrap_means(scores: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Per-position means of every replicate, ``(n_bootstrap, N)``, for ``scores (n_prompts, N)``."""
    n_prompts = scores.shape[0]
    rows_per_chunk = max(1, MAX_COUNT_ENTRIES // n_prompts)
    means = []
    for chunk in indices.split(rows_per_chunk):
        counts = torch.zeros(chunk.shape[0], n_prompts, dtype=scores.dtype)
        counts.scatter_add_(1, chunk, torch.ones_like(chunk, dtype=scores.dtype))
        means.append(counts @ scores / n_prompts)
    return torch.cat(means)


def band_from_indices(
    scores: torch.Tensor, indices: torch.Tensor, confidence: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``confidence`` quantiles over replicates of the per-position means: ``(lower, upper)``, each ``(N,)``."""
    quantiles = torch.tensor(check_confidence(confidence), dtype=scores.dtype)
    lower, upper = torch.quantile(bootstrap_means(scores, indices), quantiles, dim=0)
    return lower, upper


def bootstrap_band(
    scores: torch.Tensor, *, n_bootstrap: int, confidence: tuple[float, float], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bootstrap band of ``scores.mean(0)`` for ``scores (n_prompts, N)`` (float64 on the CPU)."""
    return band_from_indices(scores, bootstrap_indices(n_bootstrap, scores.shape[0], seed), confidence)
