"""Triton kernels (with PyTorch references) for CAB block-sparse attention.

Importing this package never requires triton: kernels are only defined when it is importable.
"""

from .coarsen import (
    coarsen_max_l2,
    coarsen_max_l2_reference,
    coarsen_max_l2_triton,
    triton_available,
)

__all__ = ["coarsen_max_l2", "coarsen_max_l2_reference", "coarsen_max_l2_triton", "triton_available"]
