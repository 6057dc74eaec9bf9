"""Confidence intervals for evaluation results: Wilson score intervals for hit rates, Student-t intervals for means.

* :func:`wilson_interval`: the Wilson score interval of a binomial proportion (``hits`` of ``n``), e.g. exact-match
  accuracy over ``n`` passkey prompts. Unlike the normal ("Wald") interval ``p ± z·sqrt(p(1 - p)/n)``, it stays
  inside ``[0, 1]``, is not empty at ``0/n`` or ``n/n``, and covers close to its nominal level at small ``n``.
  With ``p = hits / n`` and ``z`` the standard normal's ``(1 + confidence) / 2`` quantile::

      centre    = (p + z² / (2n)) / (1 + z² / n)
      half      = z / (1 + z² / n) · sqrt(p (1 - p) / n + z² / (4 n²))
      interval  = [centre - half, centre + half]

* :func:`t_interval`: the Student-t interval of a mean over a few independent values (e.g. the mean negative
  log-likelihood over text windows): ``mean ± t_{(1 + confidence) / 2, m - 1} · sd / sqrt(m)``.
* :func:`intervals_separated`: whether two intervals do not overlap (one lies wholly above the other).

Example::

    >>> low, high = wilson_interval(8, 10)
    >>> round(low, 3), round(high, 3)
    (0.49, 0.943)
    >>> intervals_separated((0.1, 0.3), (0.35, 0.6)), intervals_separated((0.1, 0.4), (0.35, 0.6))
    (True, False)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from statistics import NormalDist

from ..validation import check_float, check_int

__all__ = ["intervals_separated", "t_interval", "wilson_interval"]


def check_confidence(confidence: float) -> float:
    confidence = check_float("confidence", _real(confidence))
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return confidence


def wilson_interval(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of the proportion ``hits / n`` at level ``confidence``.

    ``hits`` and ``n`` are integers (numpy's too) with ``0 <= hits <= n`` and ``n >= 1``;
    ``confidence`` is in ``(0, 1)``. ``low`` is exactly 0 when ``hits == 0`` and ``high`` exactly 1 when
    ``hits == n``.
    """
    hits = check_int("hits", int(hits) if _integral(hits) else hits, low=0)
    n = check_int("n", int(n) if _integral(n) else n, low=1)
    if hits > n:
        raise ValueError(f"hits must be at most n, got hits={hits}, n={n}")
    z = NormalDist().inv_cdf(0.5 + check_confidence(confidence) / 2)
    p = hits / n
    scale = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n))
    low = 0.0 if hits == 0 else max(0.0, centre - half)
    high = 1.0 if hits == n else min(1.0, centre + half)
    return low, high


def _integral(value) -> bool:
    """An integer of another library (numpy, torch) is taken as an int; bools and floats are left to fail."""
    return not isinstance(value, (bool, float)) and hasattr(value, "__index__")


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The Student-t interval ``(low, high)`` of the mean of ``values``; None for fewer than two values.

    ``mean ± t · sd / sqrt(m)`` with ``sd`` the sample standard deviation (``m - 1`` in the denominator) and ``t``
    the ``(1 + confidence) / 2`` quantile of Student's t with ``m - 1`` degrees of freedom.
    """
    from scipy.stats import t  # scipy comes with scikit-learn

    values = [check_float(f"values[{i}]", _real(v)) for i, v in enumerate(values)]
    confidence = check_confidence(confidence)
    m = len(values)
    if m < 2:
        return None
    mean = math.fsum(values) / m
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (m - 1))
    half = float(t.ppf(0.5 + confidence / 2, m - 1)) * sd / math.sqrt(m)
    return mean - half, mean + half


def _real(value):
    """A real of another library (numpy float32, a 0-d tensor's item) as a float; anything else is left to fail."""
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else value


def intervals_separated(first: Sequence[float], second: Sequence[float]) -> bool:
    """True when the intervals ``(low, high)`` do not overlap: one lies wholly above the other (touching overlaps)."""
    (low_a, high_a), (low_b, high_b) = _check_interval("first", first), _check_interval("second", second)
    return high_a < low_b or high_b < low_a


def _check_interval(name: str, interval) -> tuple[float, float]:
    try:
        low, high = interval
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an interval (low, high), got {interval!r}") from None
    low, high = check_float(f"{name}[0]", _real(low)), check_float(f"{name}[1]", _real(high))
    if not low <= high:
        raise ValueError(f"{name} must have low <= high, got {interval!r}")
    return low, high
