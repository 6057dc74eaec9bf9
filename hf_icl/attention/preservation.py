"""How much of the dense attention a sparse selection keeps: :func:`attention_preservation`.

Used by the NIAH preservation score (:mod:`hf_icl.evaluation.cab_methods`) and the CAB figures
(:mod:`.visualize`), on token-level masks such as
:func:`~hf_icl.kernels.block_sparse_reference.token_keep_mask` of a per-token selection.
"""

from __future__ import annotations

import torch

__all__ = ["attention_preservation"]


def attention_preservation(
    attn_probs: torch.Tensor, keep_token_mask: torch.Tensor, key_positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Fraction of the dense attention mass on the chosen keys that the sparse mask keeps.

    ``attn_probs`` ``(B, H, Nq, Nk)``: dense (causal) attention probabilities. ``keep_token_mask``: bool,
    broadcastable to it, True where the selection lets a query attend a key. ``key_positions``:
    the chosen keys (e.g. label tokens of the demonstrations), a bool mask over the last dim
    broadcastable to ``(B, H, Nq, Nk)`` or a 1-D long tensor of key indices; ``None`` = every key.

    Returns ``(B, H)`` float32: ``sum(p * keep * chosen) / sum(p * chosen)`` over all queries and keys
    of each ``(b, h)``; 1.0 where the chosen keys carry no mass at all (nothing to lose, never NaN).

    >>> probs = torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]])
    >>> attention_preservation(probs, torch.tensor([[True, False], [True, False]]))
    tensor([[0.6250]])
    """
    probs = attn_probs.float()
    n_k = probs.shape[-1]
    if key_positions is None:
        chosen = torch.ones(n_k, dtype=torch.bool, device=probs.device)
    elif key_positions.dtype == torch.bool:
        chosen = key_positions.to(probs.device)
    else:
        chosen = torch.zeros(n_k, dtype=torch.bool, device=probs.device)
        chosen[key_positions.to(probs.device).long()] = True
    on_chosen = probs * chosen
    total = on_chosen.sum(dim=(-2, -1))
    kept = (on_chosen * keep_token_mask.to(probs.device)).sum(dim=(-2, -1))
    return torch.where(total > 0, kept / total.clamp_min(torch.finfo(torch.float32).tiny), torch.ones_like(total))
