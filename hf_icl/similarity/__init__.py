"""Similarity kernels: how alike two rows (or two features) are, as the scores an attention head or a kernel
smoother turns into weights. Plain PyTorch, no Triton (the GPU kernels of :mod:`hf_icl.kernels` are another thing);
this package sits at the bottom of the layers with :mod:`hf_icl.kernels` and imports nothing above it.

* :mod:`.row_kernels`: scores between query and key rows, ``(..., M, D) × (..., N, D) → (..., M, N)``: dot product,
  RBF and the kernel-regression document's angular kernels (cosine ``cos θ / T``, Cayley ``-θ² / (2T²)``,
  geometric-algebra ``(β₁ cos θ - β₂ sin θ) / T`` and its "well" form). A softmax over the last axis makes them
  attention weights, i.e. a Nadaraya–Watson smoother: :class:`hf_icl.estimators.NadarayaWatson` and the kernel-ICL
  model's row attention use them.
* :mod:`.column_attention`: the document's geometric-algebra column attention (features compared across samples).
* :mod:`.gram`: pairwise distances and Gram matrices within a prompt (ridge, kernel ridge, k-NN, kernel smoothers).

>>> import torch
>>> from hf_icl.similarity import cayley_scores
>>> q = torch.tensor([[1.0, 0.0]])
>>> k = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
>>> cayley_scores(q, k, temperature=1.0).softmax(-1).argmax(-1)
tensor([0])
"""

from . import column_attention, gram, row_kernels
from .column_attention import column_mixing_weights, mix_columns, prefix_column_mixing_weights
from .gram import GRAM_KERNELS, gram_matrix, pairwise_distances
from .row_kernels import (
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

__all__ = [*row_kernels.__all__, *column_attention.__all__, *gram.__all__]
