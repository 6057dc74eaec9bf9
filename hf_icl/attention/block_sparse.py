"""The block-sparse PyTorch reference, re-exported where earlier releases had it.

It lives beside its Triton kernels in :mod:`hf_icl.kernels.block_sparse_reference` (kernels import
nothing from ``attention``)."""

from ..kernels.block_sparse_reference import (  # noqa: F401
    block_sparse_attention,
    dense_masked_attention,
    selected_block_indices,
    token_mask,
)
