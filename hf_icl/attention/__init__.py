"""Attention implementations that plug into transformers models: CAB block-sparse attention.

Importing this package registers ``"cab"`` with ``transformers.AttentionInterface`` and
``AttentionMaskInterface``; :func:`enable_cab` switches a model to it.
"""

from ..kernels.block_sparse_reference import (
    block_sparse_attention,
    dense_masked_attention,
    selected_block_indices,
    token_keep_mask,
)
from ..kernels.token_selection.rule import SCORES, achieved_sparsity, select_token_blocks
from ..kernels.token_sparse import token_sparse_attention
from .cab import BUDGETS, POLICIES, CABParams, cab_attention_forward, enable_cab, register_cab, select_cab_blocks
from .cab_cache import (
    CABCache,
    CABCacheLayer,
    KeyBlockSummaries,
    block_summaries_of,
    cached_block_selection,
    select_blocks_from_summaries,
    use_cab_cache,
)
from .selection import (
    SELECTION_POLICIES,
    attention_preservation,
    block_scores,
    causal_block_mask,
    reference_cab_v3_selection,
    select_blocks,
    true_block_mass,
)

register_cab()
