"""Retired: CAB's per-block selection policies (one selection per query block of ``(B, H, Mq, Mk)``).

CAB selects per query token (:mod:`hf_icl.kernels.token_selection`, through
:func:`hf_icl.attention.cab.select_cab_blocks`): causal by construction, so teacher-forced logits equal
step-by-step generation. The per-block policies, their budgets (``"row"``, ``"global"``) and scores were removed;
:func:`attention_preservation` moved to :mod:`hf_icl.attention.preservation` and stays importable from here, with a
``DeprecationWarning``, for one release.
"""

from __future__ import annotations

from ..deprecation import moved, retired

__all__: list[str] = []

#: removed names → what replaces them
RETIRED = {
    "BUDGETS": "hf_icl.attention.cab.BUDGETS (the per-token budgets 'row' and 'topk')",
    "SELECTION_POLICIES": "hf_icl.attention.cab.POLICIES with hf_icl.kernels.token_selection.select_token_blocks",
    "block_scores": "hf_icl.kernels.token_selection.token_block_scores (per query token)",
    "causal_block_mask": "the per-token rule, which is causal by construction (hf_icl.kernels.token_selection)",
    "forced_blocks": "the per-token rule's sink and local blocks (cab_sink_blocks, cab_local_blocks)",
    "frc_scores": "hf_icl.kernels.token_selection.token_frc_scores (per query token)",
    "select_blocks": "hf_icl.attention.cab.select_cab_blocks (per query token)",
    "true_block_mass": "hf_icl.kernels.token_selection.token_block_mass (the 'oracle' policy's per-token mass)",
    "reference_cab_v3_selection": "nothing: the document's non-causal selection scored future blocks",
    **{
        f"{policy}_policy": f"cab_policy={policy!r} of the per-token rule (hf_icl.attention.cab.POLICIES)"
        for policy in ("frc", "frc_low", "magnitude", "hybrid", "streaming", "dense", "oracle")
    },
}
#: why the names in :data:`RETIRED` went (the retired-name error says it)
REASON = "with CAB's per-block selection policies (CAB selects per query token)"
#: moved names → their new module
MOVED = {"attention_preservation": "hf_icl.attention.preservation"}

__getattr__ = moved(__name__, MOVED, fallback=retired(__name__, RETIRED, reason=REASON))
