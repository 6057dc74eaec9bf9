"""Argument checks whose errors name the argument, the value received and what is allowed."""

from __future__ import annotations

import difflib
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


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is ``True`` or ``False``; raise ``ValueError`` otherwise (``"yes"``, 1, None)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_writable_dir(name: str, path: Any):
    """``path`` as a ``Path`` if it is a directory that exists or can be created: what exists of it must be a
    directory, and its deepest existing ancestor a writable directory; raise ``ValueError`` otherwise. Creates
    nothing (call it before any work)."""
    import os
    from pathlib import Path

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"{name} must be a directory path, got {path!r}")
    target = Path(path).expanduser()
    if target.exists():
        if not target.is_dir():
            raise ValueError(f"{name} must be a directory (created if missing), got an existing file: {path}")
        if not os.access(target, os.W_OK | os.X_OK):
            raise ValueError(f"{name} {path}: the directory is not writable (permission denied)")
        return target
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise ValueError(f"{name} {path}: {ancestor} is a file, so nothing can be created below it")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise ValueError(f"{name} {path}: {ancestor} is not writable (permission denied)")
            break
    return target


def _interval(low, high, low_inclusive: bool = True) -> str:
    left = "(-inf" if low is None else ("[" if low_inclusive else "(") + str(low)
    right = "+inf)" if high is None else f"{high}]"
    return f"{left}, {right}"


def format_bytes(nbytes: float) -> str:
    """``1.5 GB``-style size (decimal units) for error messages."""
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if abs(nbytes) < 1000 or unit == "PB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def memory_capacity(device=None) -> int | None:
    """Bytes of memory on ``device`` (None or cpu: this machine's RAM; cuda: that GPU's); None if unknown."""
    import os

    import torch

    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    return None


def check_memory(name: str, nbytes: float, device=None, *, what: str = "its tensors") -> None:
    """Raise ``ValueError`` naming ``name`` (the sizes that set it, e.g. ``"--batch-size 1000000000000"``) when
    ``nbytes`` (an up-front lower bound of what a call allocates) exceeds the memory of ``device``; a cheap check
    made before any work, so an absurd size is one clear error rather than torch's allocation failure."""
    capacity = memory_capacity(device)
    if capacity is not None and nbytes > capacity:
        where = "this machine's RAM" if device is None or str(device) == "cpu" else f"the memory of {device}"
        raise ValueError(
            f"{name} needs at least {format_bytes(nbytes)} for {what}, more than {where} ({format_bytes(capacity)}); "
            "use smaller sizes"
        )


def allocation_failure(error: BaseException) -> str | None:
    """A one-line description of ``error`` if it is a failed memory allocation (``MemoryError``,
    ``torch.OutOfMemoryError``, the CPU allocator's ``RuntimeError``), else None."""
    import re

    text = str(error)
    if isinstance(error, MemoryError):
        return "out of memory (MemoryError)"
    if not isinstance(error, RuntimeError):
        return None
    found = re.search(r"(?:tried to allocate|allocate) (\d+(?:\.\d+)?) ?(bytes|[KMGT]i?B)", text)
    cuda = "CUDA out of memory" in text or type(error).__name__ == "OutOfMemoryError"
    if not (cuda or "can't allocate memory" in text or "not enough memory" in text):
        return None
    size = ""
    if found:
        number, unit = found.groups()
        size = f" {format_bytes(float(number))}" if unit == "bytes" else f" {number} {unit}"
    return f"out of memory: {'the GPU' if cuda else 'the CPU allocator'} could not allocate{size}"


def did_you_mean(value: Any, candidates: Iterable[str], n: int = 2) -> str:
    """``"did you mean 'a' or 'b'?"`` for the candidates closest to ``value`` (a typo), or ``""`` if none is close;
    every "unknown name" message of the package words its hint with this.

    >>> did_you_mean("linear_regresion", ["linear_regression", "sinusoid"])
    "did you mean 'linear_regression'?"
    >>> did_you_mean("xyz", ["linear_regression"])
    ''
    """
    close = difflib.get_close_matches(str(value), list(candidates), n=n, cutoff=0.6)
    return f"did you mean {' or '.join(map(repr, close))}?" if close else ""


def one_line(err: BaseException) -> str:
    """An error's message on one line (a command prints exactly one line per error); its class name if it has none."""
    return " ".join(str(err).split()) or type(err).__name__
