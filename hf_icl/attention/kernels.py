"""Row kernels as attention scores: dot product, RBF and the kernel-regression document's angular kernels
(cosine ``cos θ / T``, Cayley ``-θ² / (2T²)``, geometric-algebra ``(β₁ cos θ - β₂ sin θ) / T`` and its "well"
form).

This is the public home of the functions in :mod:`hf_icl.kernels.row_kernels` (which holds their code, beside
the other kernels). Each maps query rows ``(..., M, D)`` and key rows ``(..., N, D)`` to scores
``(..., M, N)``; a softmax over the last axis makes them attention weights, i.e. a Nadaraya–Watson smoother.
They are used by :class:`hf_icl.estimators.NadarayaWatson` (``kernel="cosine"``, ``"cayley"``, ``"ga"``, on
raw inputs or, via :class:`hf_icl.estimators.OnFeatures`, on random Fourier features) and by the kernel-ICL
model's row attention.

>>> import torch
>>> from hf_icl.attention.kernels import cayley_scores
>>> q = torch.tensor([[1.0, 0.0]])
>>> k = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
>>> cayley_scores(q, k, temperature=1.0).softmax(-1).argmax(-1)
tensor([0])
"""

from ..kernels.row_kernels import (
    EPS,
    ROW_KERNELS,
    WEDGE_MODES,
    cayley_scores,
    clamped_cosine,
    cosine_scores,
    dot_product_scores,
    ga_scores,
    rbf_scores,
    row_kernel_scores,
    sine_of,
    unit_rows,
)

__all__ = [
    "EPS",
    "ROW_KERNELS",
    "WEDGE_MODES",
    "cayley_scores",
    "clamped_cosine",
    "cosine_scores",
    "dot_product_scores",
    "ga_scores",
    "rbf_scores",
    "row_kernel_scores",
    "sine_of",
    "unit_rows",
]
