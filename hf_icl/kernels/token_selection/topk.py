"""The budgeted top-k every selection rule shares: mark each row's ``count`` best candidates, ties to the lower
index (the PyTorch rule, the block-level policies and the fused kernel's reference all use it)."""

from __future__ import annotations

import torch

__all__ = ["lifted", "top_among"]


def lifted(rank: torch.Tensor) -> torch.Tensor:
    """``rank`` as float32 with NaN and -inf lifted to the lowest float (a candidate's NaN still ranks above every
    non-candidate). One pass to check, a second only if needed."""
    value = rank.float()
    low, high = torch.aminmax(value) if value.numel() else (value.new_zeros(()), value.new_zeros(()))
    if not (torch.isfinite(low) and torch.isfinite(high)):  # NaN propagates into both
        lowest = torch.finfo(torch.float32).min
        value = torch.nan_to_num(value, nan=lowest, posinf=float("inf"), neginf=lowest)
    return value


def top_among(
    rank: torch.Tensor, candidate: torch.Tensor, count: torch.Tensor, max_count: int | None = None
) -> torch.Tensor:
    """Along the last dim, mark the ``count`` highest-``rank`` entries among ``candidate`` ones.

    ``count`` broadcasts against ``rank.shape[:-1]``; ``max_count`` is a host-side upper bound on it (None: the
    row length), so one partial ``topk`` of the ranks finds each row's threshold (its ``count``-th best candidate).
    Every candidate above the threshold is kept, and of those equal to it the lowest indices fill the rest: ties go to
    the lower index, whatever order ``topk`` returns equal values in. Non-candidates rank after every candidate, so
    a ``-inf``/NaN rank never displaces them.
    """
    n = rank.shape[-1]
    k = n if max_count is None else max(0, min(int(max_count), n))
    shape = torch.broadcast_shapes(rank.shape, candidate.shape)
    if k == 0:
        return torch.zeros(shape, dtype=torch.bool, device=rank.device)
    # candidates keep their (lifted, finite or +inf) ranks; every other entry is -inf, below all of them
    ranked = lifted(rank).expand(shape).masked_fill(~candidate, float("-inf"))
    best = torch.topk(ranked, k, dim=-1).values  # descending
    count = count.expand(shape[:-1]).clamp(0, k)
    threshold = best.gather(-1, (count - 1).clamp_min(0).unsqueeze(-1))
    wants = (count > 0).unsqueeze(-1)
    # strictly above the threshold: kept (nothing is above +inf, so a row wanting none keeps none)
    above = ranked > torch.where(wants, threshold, float("inf"))
    # at the threshold: the ties (NaN compares unequal: rows wanting none, or fewer candidates than wanted)
    at = ranked == torch.where(wants & (threshold > float("-inf")), threshold, float("nan"))
    # how many ties to take, lowest index first (count_nonzero: no int64 copy of the bool masks)
    wanted = count.unsqueeze(-1) - torch.count_nonzero(above, dim=-1).unsqueeze(-1)
    if bool((torch.count_nonzero(at, dim=-1).unsqueeze(-1) > wanted).any()):  # more ties than room (rare)
        at = at & (at.cumsum(-1) <= wanted)
    return above | at
