"""The ``bandwidth`` argument of the kernel estimators (their kernels are in :mod:`hf_icl.similarity`)."""

from __future__ import annotations

from ..validation import check_float


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
