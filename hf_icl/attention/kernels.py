"""Deprecated: the row kernels (dot product, RBF, cosine, Cayley, geometric-algebra) this module re-exported live in
:mod:`hf_icl.similarity`. The old names still work, with a ``DeprecationWarning``, for one release."""

from ..deprecation import moved
from ..similarity import row_kernels

__all__: list[str] = []

__getattr__ = moved(__name__, dict.fromkeys(row_kernels.__all__, "hf_icl.similarity"))
