"""Deprecated: the row kernels moved to :mod:`hf_icl.similarity.row_kernels` (this package holds the Triton kernels;
similarity kernels are not GPU kernels). The old names still work, with a ``DeprecationWarning``, for one release."""

from ..deprecation import moved
from ..similarity import row_kernels as new_home

__all__: list[str] = []

__getattr__ = moved(__name__, dict.fromkeys(new_home.__all__, new_home.__name__))
