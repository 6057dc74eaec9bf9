"""Confidence intervals: Wilson's closed form written out again, its edge cases, its coverage; the t interval."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from scipy import stats

import hf_icl.evaluation.intervals as intervals
from hf_icl.evaluation.intervals import intervals_separated, t_interval, wilson_interval


def _wilson_by_hand(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson (1927) as Agresti & Coull (1998) write it: the roots in p of (p̂ - p)² = z² p (1 - p) / n."""
    p_hat = k / n
    # (1 + z²/n) p² - (2 p̂ + z²/n) p + p̂² = 0
    a, b, c = 1 + z**2 / n, -(2 * p_hat + z**2 / n), p_hat**2
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_wilson_matches_the_roots_of_its_defining_quadratic(confidence):
    z = stats.norm.ppf(0.5 + confidence / 2)
    for n in [1, 2, 5, 12, 40, 200]:
        for k in range(n + 1):
            low, high = wilson_interval(k, n, confidence)
            expected = _wilson_by_hand(k, n, z)
            assert (low, high) == pytest.approx(expected, abs=1e-12)
            assert 0.0 <= low <= k / n <= high <= 1.0


def test_wilson_edge_cases_and_known_values():
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    z = stats.norm.ppf(0.975)
    assert wilson_interval(0, 10)[1] == pytest.approx(z**2 / (10 + z**2), rel=1e-12)  # at 0/n: z² / (n + z²)
    assert wilson_interval(10, 10)[0] == pytest.approx(10 / (10 + z**2), rel=1e-12)  # at n/n: n / (n + z²)
    low, high = wilson_interval(81, 263)
    assert (low, high) == pytest.approx((0.2553, 0.3662), abs=1e-4)  # Newcombe (1998), table I, example (a)
    assert wilson_interval(np.int64(3), np.int64(7)) == wilson_interval(3, 7)
    wide, narrow = wilson_interval(5, 10, 0.99), wilson_interval(5, 10, 0.8)
    assert wide[0] < narrow[0] and narrow[1] < wide[1]  # more confidence, wider interval
    assert wilson_interval(5, 10) == pytest.approx((1 - wilson_interval(5, 10)[1], 1 - wilson_interval(5, 10)[0]))


def test_wilson_rejects_bad_arguments_naming_them():
    for args, match in [
        ((3, 0), r"n must be an integer in \[1, \+inf\)"),
        ((-1, 5), r"hits must be an integer in \[0, \+inf\)"),
        ((6, 5), "hits must be at most n, got hits=6, n=5"),
        ((2.0, 5), "hits must be an integer"),
        ((True, 5), "hits must be an integer"),
        ((2, 5, 1.0), r"confidence must be in \(0, 1\)"),
        ((2, 5, 0.0), r"confidence must be in \(0, 1\)"),
        ((2, 5, math.nan), "confidence must be a finite number"),
        ((2, 5, 95), r"confidence must be in \(0, 1\), got 95"),
    ]:
        with pytest.raises(ValueError, match=match):
            wilson_interval(*args)


def test_wilson_covers_close_to_its_level():
    rng = np.random.default_rng(0)
    draws = 4000
    for n, p in [(20, 0.5), (30, 0.8), (50, 0.3), (100, 0.9)]:
        hits = rng.binomial(n, p, size=draws)
        covered = sum(low <= p <= high for low, high in (wilson_interval(int(k), n) for k in hits))
        # Wilson's coverage oscillates around 0.95 with n and p; 4,000 draws add ±0.007 (2 sd) of noise
        assert 0.925 <= covered / draws <= 0.975, (n, p, covered / draws)


def test_t_interval_is_scipys():
    values = [2.31, 2.45, 2.28, 2.60, 2.52]
    low, high = t_interval(values)
    expected = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected, rel=1e-12)
    assert t_interval(np.array(values, dtype=np.float32), 0.9) == pytest.approx(
        stats.t.interval(0.9, 4, loc=np.mean(np.float32(values)), scale=stats.sem(np.float32(values))), rel=1e-6
    )
    assert t_interval([3.0]) is None and t_interval([]) is None
    assert t_interval([1.5, 1.5, 1.5]) == (1.5, 1.5)
    with pytest.raises(ValueError, match=r"values\[1\] must be a finite number"):
        t_interval([1.0, math.nan])


def test_intervals_separated():
    assert intervals_separated((0.1, 0.3), (0.35, 0.6)) and intervals_separated((0.35, 0.6), (0.1, 0.3))
    assert not intervals_separated((0.1, 0.4), (0.35, 0.6)) and not intervals_separated((0.1, 0.6), (0.2, 0.3))
    assert not intervals_separated((0.1, 0.3), (0.3, 0.6))  # touching is overlapping
    assert intervals_separated(wilson_interval(2, 40), wilson_interval(30, 40))
    assert not intervals_separated(wilson_interval(20, 40), wilson_interval(26, 40))
    for args, match in [
        (((0.5, 0.1), (0.0, 1.0)), "first must have low <= high"),
        (((0.1, 0.5), 0.3), r"second must be an interval \(low, high\)"),
        (((0.1, math.inf), (0.0, 1.0)), r"first\[1\] must be a finite number"),
    ]:
        with pytest.raises(ValueError, match=match):
            intervals_separated(*args)


def test_docstring_examples_run():
    assert doctest.testmod(intervals, raise_on_error=True).attempted > 0
