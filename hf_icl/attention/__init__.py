"""Attention implementations that plug into transformers models: CAB block-sparse attention.

Importing this package registers ``"cab"`` with ``transformers.AttentionInterface`` and
``AttentionMaskInterface``; :func:`enable_cab` switches a model to it. :func:`observe_cab_selection` lets an
evaluation see the selection every CAB call computed.

CAB's per-block selection policies (``select_blocks``, ``SELECTION_POLICIES``, ``block_scores``,
``causal_block_mask``, ``true_block_mass``, ``reference_cab_v3_selection``) were retired: CAB selects per query
token (:mod:`hf_icl.kernels.token_selection`); asking for one of those names says what replaces it.
"""

from ..deprecation import retired as _retired
from ..kernels.block_sparse_reference import (
    block_sparse_attention,
    dense_masked_attention,
    selected_block_indices,
    token_keep_mask,
)
from ..kernels.token_selection.rule import SCORES, achieved_sparsity, select_token_blocks
from ..kernels.token_sparse import token_sparse_attention
from . import selection as _selection
from .cab import (
    BUDGETS,
    POLICIES,
    CABParams,
    CABSelection,
    cab_attention_forward,
    enable_cab,
    observe_cab_selection,
    register_cab,
    select_cab_blocks,
)
from .cab_cache import (
    CABCache,
    CABCacheLayer,
    KeyBlockSummaries,
    block_summaries_of,
    cached_block_selection,
    select_blocks_from_summaries,
    use_cab_cache,
)
from .preservation import attention_preservation

register_cab()


__getattr__ = _retired(__name__, _selection.RETIRED, reason=_selection.REASON)
