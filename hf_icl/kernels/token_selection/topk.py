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
    row length), so one partial ``topk`` of ``max_count + 1`` ranks serves every row. Ties go to the lower index,
    whatever order ``topk`` returns equal values in: a row whose ``count``-th and next-best candidates differ takes
    its ``count`` best as ``topk`` lists them; a row with a tie across that boundary (rare on real scores) is
    resolved by :func:`_threshold_top`. Non-candidates rank after every candidate, so a ``-inf``/NaN rank never
    displaces them.
    """
    n = rank.shape[-1]
    k = n if max_count is None else max(0, min(int(max_count), n))
    shape = torch.broadcast_shapes(rank.shape, candidate.shape)
    if k == 0:
        return torch.zeros(shape, dtype=torch.bool, device=rank.device)
    # candidates keep their (lifted, finite or +inf) ranks; every other entry is -inf, below all of them
    ranked = lifted(rank).expand(shape).masked_fill(~candidate, float("-inf"))
    listed = min(k + 1, n)  # one more than any row takes: the boundary shows whether a tie crosses it
    best, where = torch.topk(ranked, listed, dim=-1)  # descending
    count = count.expand(shape[:-1]).clamp(0, k).unsqueeze(-1)
    last = best.gather(-1, (count - 1).clamp_min(0))  # each row's count-th best
    after = best.gather(-1, count.clamp_max(listed - 1))  # and the one after it
    crossing = (count > 0) & (count < listed) & (last == after) & (last > float("-inf"))
    take = (torch.arange(listed, device=rank.device) < count) & (best > float("-inf"))  # candidates only
    chosen = torch.zeros(shape, dtype=torch.bool, device=rank.device).scatter_(-1, where, take)
    tied = crossing.squeeze(-1)
    if bool(tied.any()):
        chosen[tied] = _threshold_top(ranked[tied], count[tied].squeeze(-1), k)
    return chosen


def _threshold_top(ranked: torch.Tensor, count: torch.Tensor, k: int) -> torch.Tensor:
    """Rows ``(R, n)`` of ranks (non-candidates at -inf) → the ``count`` best of each, ties to the lower index: every
    candidate above the row's ``count``-th best, then the lowest-index ones equal to it."""
    best = torch.topk(ranked, k, dim=-1).values
    count = count.unsqueeze(-1)
    threshold = best.gather(-1, (count - 1).clamp_min(0))
    wants = count > 0
    above = ranked > torch.where(wants, threshold, float("inf"))  # nothing is above +inf: a row wanting none
    at = ranked == torch.where(wants & (threshold > float("-inf")), threshold, float("nan"))
    wanted = count - torch.count_nonzero(above, dim=-1).unsqueeze(-1)  # ties to take, lowest index first
    return above | (at & (at.cumsum(-1) <= wanted))
