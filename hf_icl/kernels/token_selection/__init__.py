"""CAB's per-token block selection, laid out as one op: the rule beside its fused kernel.

* :mod:`.policies` — the scores, policies and budgets, defined once;
* :mod:`.topk` — the budgeted top-k every rule shares (ties to the lower block);
* :mod:`.rule` — the rule in PyTorch (the reference, and the CPU path), query range by query range
  (:func:`token_block_selector`), the dispatcher :func:`select_token_blocks`, and the fused kernel's entry points
  returning block lists (:func:`select_token_blocks_fused`, :func:`fused_block_selector`);
* :mod:`.fused` — the Triton kernel: scores, forced blocks, budgets and top-k in one launch, no host sync.
"""

from __future__ import annotations

from .fused import MAX_KEY_BLOCKS, fused_selection_unsupported, select_token_blocks_triton, selection_width
from .policies import BUDGETS, FUSED_BUDGETS, FUSED_POLICIES, SCORES, TOKEN_POLICIES
from .rule import (
    achieved_sparsity,
    apply_selection_rule,
    fused_block_selector,
    key_block_summaries,
    select_token_blocks,
    select_token_blocks_fused,
    selection_backend,
    token_block_mass,
    token_block_scores,
    token_block_selector,
    token_frc_scores,
)
from .topk import top_among

__all__ = [
    "BUDGETS",
    "FUSED_BUDGETS",
    "FUSED_POLICIES",
    "MAX_KEY_BLOCKS",
    "SCORES",
    "TOKEN_POLICIES",
    "achieved_sparsity",
    "apply_selection_rule",
    "fused_block_selector",
    "fused_selection_unsupported",
    "key_block_summaries",
    "select_token_blocks",
    "select_token_blocks_fused",
    "select_token_blocks_triton",
    "selection_backend",
    "selection_width",
    "token_block_mass",
    "token_block_scores",
    "token_block_selector",
    "token_frc_scores",
    "top_among",
]
