"""Argument checks whose errors name the argument, the value received and what is allowed."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` if it is an int in ``[low, high]``; raise ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer in {_interval(low, high)}, got {value}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
) -> float:
    """Return ``float(value)`` if it is a finite real in the interval; raise ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    too_low = low is not None and (value < low or (not low_inclusive and value == low))
    if too_low or (high is not None and value > high):
        raise ValueError(f"{name} must be a number in {_interval(low, high, low_inclusive)}, got {value}")
    return float(value)


def check_scaling(scaling: Any, name: str = "scaling") -> float:
    """Return ``float(scaling)`` if it is a finite positive real (an attention softmax scale); raise otherwise."""
    if isinstance(scaling, bool) or not isinstance(scaling, numbers.Real) or not math.isfinite(scaling) or scaling <= 0:
        raise ValueError(
            f"{name} must be a finite positive number (the softmax scale, usually head_dim ** -0.5), got {scaling!r}"
        )
    return float(scaling)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``; raise ``ValueError`` listing them otherwise."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_range(name: str, value: Any, *, low: float | None = None) -> tuple[float, float]:
    """Return ``(lo, hi)`` for a pair of finite numbers with ``lo < hi`` (and ``lo >= low``)."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high) of numbers, got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi) or (low is not None and lo < low):
        floor = "" if low is None else f" and low >= {low}"
        raise ValueError(f"{name} must satisfy low < high{floor} with finite values, got {value!r}")
    return lo, hi


def check_device(name: str, value: Any):
    """``value`` as a ``torch.device`` that exists on this machine (None stays None): a CUDA device
    needs CUDA (and that index), MPS needs MPS; raise ``ValueError`` otherwise."""
    if value is None:
        return None
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name} must be a torch device such as cpu, cuda or cuda:1, got {value!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only torch build" if torch.version.cuda is None else "no GPU is visible"
            raise ValueError(f"{name} {value}: CUDA is not available on this machine ({build}); use cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {value}: there are only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{name} {value}: MPS is not available on this machine; use cpu")
    elif device.type != "cpu":
        raise ValueError(f"{name} must be cpu, cuda, cuda:N or mps, got {value!r}")
    return device


def _interval(low, high, low_inclusive: bool = True) -> str:
    left = "(-inf" if low is None else ("[" if low_inclusive else "(") + str(low)
    right = "+inf)" if high is None else f"{high}]"
    return f"{left}, {right}"
