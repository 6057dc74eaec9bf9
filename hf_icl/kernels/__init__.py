"""Triton kernels with their PyTorch references and dispatchers: CAB's block-sparse attention (and its per-token
executor), CAB's fused per-token block selection (its reference and dispatcher are
:mod:`hf_icl.kernels.token_selection`) and causal linear attention.

Importing this package never requires triton: kernels are only defined when it is importable.
"""

from .block_sparse_attention import (
    block_sparse_attention_forward,
    block_sparse_attention_reference,
    block_sparse_attention_triton,
)
from .block_sparse_backward import block_sparse_attention_backward_triton, block_sparse_flash_attention
from .block_sparse_decode import block_sparse_decode, block_sparse_decode_reference, block_sparse_decode_triton
from .coarsen import (
    coarsen_max_l2,
    coarsen_max_l2_reference,
    coarsen_max_l2_triton,
    triton_available,
)
from .linear_attention import (
    apply_feature_map,
    causal_linear_attention,
    feature_dim,
    linear_attention_state,
    linear_attention_step,
)
from .token_selection.fused import fused_selection_unsupported, select_token_blocks_triton, selection_width

__all__ = [
    "block_sparse_attention_backward_triton",
    "block_sparse_attention_forward",
    "block_sparse_attention_reference",
    "block_sparse_attention_triton",
    "block_sparse_decode",
    "block_sparse_decode_reference",
    "block_sparse_decode_triton",
    "block_sparse_flash_attention",
    "coarsen_max_l2",
    "coarsen_max_l2_reference",
    "coarsen_max_l2_triton",
    "triton_available",
    "fused_selection_unsupported",
    "selection_width",
    "select_token_blocks_triton",
    "apply_feature_map",
    "causal_linear_attention",
    "feature_dim",
    "linear_attention_state",
    "linear_attention_step",
]
