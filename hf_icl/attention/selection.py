"""Block scoring and block selection policies of CAB (curvature-aware block-sparse attention).

Queries and keys are coarsened to one representative row per block of ``block_size`` tokens
(``q_c (B, H, Mq, D)``, ``k_c (B, H, Mk, D)``); :func:`block_scores` turns them into block logits
``(B, H, Mq, Mk)`` and a policy turns those into a boolean keep mask of the same shape, which the
executor (:mod:`.block_sparse`) then runs.

Causality. Keys start at absolute position 0; the queries start at ``q_offset``. Query block ``i``
is at absolute block index ``q_offset // block_size + i`` and sees key block ``j`` iff
``j <= q_offset // block_size + i`` (:func:`causal_block_mask`). The diagonal block is only partly
visible; token-level causality inside it is the executor's job. A policy never selects a block
outside the causal mask.

Forced blocks and budgets (the exact rule, shared by every budgeted policy):

* The *forced* set of a row is its diagonal block (the last causal column of the row, i.e. the
  block holding the query's own position) plus the first ``sink_blocks`` key blocks, restricted
  to the causal ones. Forced blocks are always kept, so no row is ever empty.
* Forced blocks count toward the budget: a row (``budget="row"``) or a ``(b, h)`` slice
  (``budget="global"``) with budget ``n`` keeps its forced blocks plus the ``max(0, n - n_forced)``
  best remaining causal blocks under the policy's ranking. Hence the number kept is exactly
  ``max(min(n, n_causal), n_forced)``: the budget is exceeded only when the forced blocks alone
  exceed it.
* :func:`select_blocks` budgets, with ``round`` meaning round-half-up (``floor(x + 0.5)``) and
  ``C`` the number of causal blocks of the ``(Mq, Mk)`` grid:
  ``budget="row"``: ``k = max(1, round((1 - sparsity) * C / Mq))`` per row, capped at the row's
  causal count; ``budget="global"``: ``K = max(1, round((1 - sparsity) * C))`` per ``(b, h)``,
  capped at ``C``. ``sparsity == 0`` returns exactly the causal mask for every policy (a row budget
  would otherwise cap late rows at the average row length).
* Ties in a policy's ranking are broken towards the lower (earlier) flat block index.
* Every budgeted policy also takes ``max_keep``: a host-side upper bound on the per-row budget (what
  :func:`select_blocks` passes), which lets the selection run one partial top-k instead of a full sort
  without reading the budget back from the device. It must not be below any row's budget; ``None`` is
  always safe.

The CAB "FRC" curvature proxy: ``A`` = block scores min-max normalised to ``[0, 1]`` over the
causal entries of each ``(b, h)``, future entries set to 0 (before normalisation and before the
two-hop term, so only causal paths contribute); ``FRC = A - lam * T / Mk`` where ``T`` is the
two-hop term ``A @ A``. With a KV cache (``Mq != Mk``) only the query blocks' own rows of the
square key-block matrix are known, so ``T[i, k] = sum_r A[i, pos_r] * A[r, k]`` over query-block
rows ``r`` at absolute block ``pos_r`` (unknown rows of cached blocks contribute 0); for a square
prefill grid this is exactly ``A @ A``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..kernels.token_selection.topk import top_among as _top_among

__all__ = [
    "BUDGETS",
    "SELECTION_POLICIES",
    "attention_preservation",
    "block_scores",
    "causal_block_mask",
    "dense_policy",
    "forced_blocks",
    "frc_low_policy",
    "frc_policy",
    "frc_scores",
    "hybrid_policy",
    "magnitude_policy",
    "oracle_policy",
    "reference_cab_v3_selection",
    "select_blocks",
    "streaming_policy",
    "true_block_mass",
]

BUDGETS = ("row", "global")


# --------------------------------------------------------------------------------------------------
# masks and scores
# --------------------------------------------------------------------------------------------------


def causal_block_mask(
    n_q_blocks: int, n_k_blocks: int, q_block_offset: int = 0, device: torch.device | str | None = None
) -> torch.Tensor:
    """``(Mq, Mk)`` bool: query block ``i`` (absolute block ``q_block_offset + i``) sees key block ``j``
    iff ``j <= q_block_offset + i``. For decode (one query at position ``p``) pass ``p // block_size``."""
    if n_q_blocks < 0 or n_k_blocks < 0 or q_block_offset < 0:
        raise ValueError(
            f"causal_block_mask: n_q_blocks={n_q_blocks}, n_k_blocks={n_k_blocks}, "
            f"q_block_offset={q_block_offset}; all must be >= 0"
        )
    rows = q_block_offset + torch.arange(n_q_blocks, device=device)
    cols = torch.arange(n_k_blocks, device=device)
    return cols[None, :] <= rows[:, None]


def block_scores(
    q_coarse: torch.Tensor, k_coarse: torch.Tensor, scaling: float, causal: torch.Tensor | None
) -> torch.Tensor:
    """Block logits ``scaling * q_c @ k_c^T`` as float32 ``(B, H, Mq, Mk)``, future blocks ``-inf``.

    ``causal`` is the ``(Mq, Mk)`` bool mask of :func:`causal_block_mask` (``None``: every block visible).
    """
    scores = torch.matmul(q_coarse.float(), k_coarse.float().transpose(-1, -2)) * scaling
    if causal is not None:
        _check_causal(causal, scores)
        scores = scores.masked_fill(~causal, float("-inf"))
    return scores


def _check_causal(causal: torch.Tensor, scores: torch.Tensor) -> None:
    if causal.dtype != torch.bool or causal.shape != scores.shape[-2:]:
        raise ValueError(
            f"causal must be a bool tensor of shape (Mq, Mk)={tuple(scores.shape[-2:])}; "
            f"got dtype={causal.dtype}, shape={tuple(causal.shape)}"
        )


def _causal_or_all(scores: torch.Tensor, causal: torch.Tensor | None) -> torch.Tensor:
    """The ``(Mq, Mk)`` visibility mask (all True when ``causal`` is None)."""
    if causal is None:
        return torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device)
    _check_causal(causal, scores)
    return causal


def _row_positions(causal: torch.Tensor | None, n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """Absolute key-block index of every query block row, ``(Mq,)`` long (-1 for a row seeing nothing).

    Under a causal mask it is the row's last visible column (its diagonal block); without one the
    grid is taken as a square prefill, row ``i`` at block ``i`` (clamped to the key range).
    """
    if causal is None:
        return torch.arange(n_q, device=device).clamp(max=n_k - 1)
    cols = torch.arange(n_k, device=device)
    return torch.where(causal, cols, -1).amax(-1) if n_k > 0 else torch.full((n_q,), -1, device=device)


def forced_blocks(causal: torch.Tensor | None, n_q: int, n_k: int, sink_blocks: int, device=None) -> torch.Tensor:
    """``(Mq, Mk)`` bool: each row's diagonal block plus the first ``sink_blocks`` blocks, causal ones only."""
    cols = torch.arange(n_k, device=device)
    diag = _row_positions(causal, n_q, n_k, cols.device)
    forced = (cols[None, :] == diag[:, None]) | (cols[None, :] < sink_blocks)
    return forced if causal is None else forced & causal


def frc_scores(scores: torch.Tensor, causal: torch.Tensor | None, lam: float = 0.5) -> torch.Tensor:
    """Causal FRC ``A - lam * T / Mk`` (see the module docstring), float32 ``(B, H, Mq, Mk)``.

    Future entries of the result are 0 (they are never selected anyway). A ``(b, h)`` whose causal
    scores are all equal gets ``A = 1`` on its causal entries (no contrast to normalise).
    """
    visible = _causal_or_all(scores, causal)
    s = scores.float()
    lo = s.masked_fill(~visible, float("inf")).amin(dim=(-2, -1), keepdim=True)
    hi = s.masked_fill(~visible, float("-inf")).amax(dim=(-2, -1), keepdim=True)
    span = hi - lo
    # masked_fill before dividing: future -inf entries must not leak NaN/inf into the normalisation
    centred = s.masked_fill(~visible, 0.0) - lo.masked_fill(~torch.isfinite(lo), 0.0)
    a = torch.where(span > 0, centred / span.clamp_min(torch.finfo(torch.float32).tiny), torch.ones_like(s))
    a = a.masked_fill(~visible, 0.0)
    n_q, n_k = s.shape[-2:]
    pos = _row_positions(causal, n_q, n_k, s.device)
    # A[i, pos_r] for every row r (a gather, not a one-hot matmul), then @ A sums the hop r → k;
    # a row seeing nothing (pos -1) has an all-zero A row, so its hop weight is 0 whatever it picks
    hop = a.index_select(-1, pos.clamp_min(0)).masked_fill((pos < 0)[None, :], 0.0)  # (B, H, Mq, Mq)
    two_hop = torch.matmul(hop, a)
    frc = a - lam * two_hop / max(n_k, 1)
    return frc.masked_fill(~visible, 0.0)


# --------------------------------------------------------------------------------------------------
# generic budgeted top selection
# --------------------------------------------------------------------------------------------------


def _budgeted_keep(
    rank: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    sink_blocks: int,
    *,
    max_keep: int | None = None,
    extra: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool, int | None], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Forced blocks plus the best ``n_keep - n_forced`` remaining causal blocks by ``rank``.

    ``n_keep``: ``(Mq,)`` long → per-row budget (``max_keep``, if given, bounds it on the host); int (or
    0-dim tensor) → budget per ``(b, h)`` over the flattened grid. ``extra(candidate, remaining, rank, flat,
    max_count)``, if given, replaces the plain top selection of the free slots (the hybrid policy splits them).
    """
    if max_keep is not None and (not isinstance(max_keep, int) or isinstance(max_keep, bool) or max_keep < 0):
        raise ValueError(f"max_keep={max_keep!r} is invalid; allowed: None or an integer >= 0")
    n_q, n_k = rank.shape[-2:]
    visible = _causal_or_all(rank, causal)
    forced = forced_blocks(causal, n_q, n_k, sink_blocks, device=rank.device)
    forced_full = forced.expand(rank.shape)
    candidate = (visible & ~forced).expand(rank.shape)
    per_row = torch.is_tensor(n_keep) and n_keep.dim() == 1
    if per_row:
        if n_keep.shape[0] != n_q:
            raise ValueError(f"n_keep of shape {tuple(n_keep.shape)}: a per-row budget must have shape (Mq,)=({n_q},)")
        remaining = (n_keep.to(rank.device).long() - forced.sum(-1)).clamp_min(0)  # (Mq,)
        flat, max_count = False, max_keep
        cand, rk = candidate, rank
    else:
        free = max(0, int(n_keep) - int(forced.sum()))
        remaining, max_count = torch.tensor(free, device=rank.device), free
        flat = True
        cand, rk = candidate.flatten(-2), rank.flatten(-2)
    if extra is not None:
        chosen = extra(cand, remaining, rk, flat, max_count)
    else:
        chosen = _top_among(rk, cand, remaining, max_count)
    if flat:
        chosen = chosen.unflatten(-1, (n_q, n_k))
    return forced_full | chosen


def _validate_policy_args(lam: float, sink_blocks: int, magnitude_fraction: float) -> None:
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam={lam!r} is invalid; allowed: a finite number >= 0")
    if not isinstance(sink_blocks, int) or isinstance(sink_blocks, bool) or sink_blocks < 0:
        raise ValueError(f"sink_blocks={sink_blocks!r} is invalid; allowed: an integer >= 0")
    if not (isinstance(magnitude_fraction, (int, float)) and 0.0 <= magnitude_fraction <= 1.0):
        raise ValueError(f"magnitude_fraction={magnitude_fraction!r} is invalid; allowed: a number in [0, 1]")


# --------------------------------------------------------------------------------------------------
# policies: policy(scores, causal, n_keep, *, lam, sink_blocks, magnitude_fraction) -> keep
# --------------------------------------------------------------------------------------------------


def frc_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """CAB: keep the highest-FRC causal blocks (the document's "CAB V3" choice)."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    return _budgeted_keep(frc_scores(scores, causal, lam), causal, n_keep, sink_blocks, max_keep=max_keep)


def frc_low_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """Bridge-preserving variant: keep the LOWEST-FRC causal blocks."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    return _budgeted_keep(-frc_scores(scores, causal, lam), causal, n_keep, sink_blocks, max_keep=max_keep)


def magnitude_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """H2O-style: keep the causal blocks with the highest block scores."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    return _budgeted_keep(scores.float(), causal, n_keep, sink_blocks, max_keep=max_keep)


def hybrid_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """Split the free budget (after forced blocks): ``round(magnitude_fraction * free)`` slots go to the
    highest scores, the rest to the highest FRC among the blocks not yet chosen."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    frc = frc_scores(scores, causal, lam)

    def split(candidate, remaining: torch.Tensor, magnitude, flat: bool, max_count: int | None) -> torch.Tensor:
        n_mag = torch.floor(remaining.float() * magnitude_fraction + 0.5).long()
        by_mag = _top_among(magnitude, candidate, n_mag, max_count)
        # the FRC part ranks only what magnitude left; its share is the rest of the free slots
        rest = remaining - n_mag
        return by_mag | _top_among(frc.flatten(-2) if flat else frc, candidate & ~by_mag, rest, max_count)

    return _budgeted_keep(scores.float(), causal, n_keep, sink_blocks, max_keep=max_keep, extra=split)


def streaming_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """StreamingLLM-style: the ``sink_blocks`` leading blocks plus the most recent causal blocks
    (a local window ending at the diagonal) up to the budget; scores are ignored."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    n_k = scores.shape[-1]
    recency = torch.arange(n_k, device=scores.device, dtype=torch.float32).expand(scores.shape)
    return _budgeted_keep(recency, causal, n_keep, sink_blocks, max_keep=max_keep)


def dense_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """Every causal block, whatever the budget."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    return _causal_or_all(scores, causal).expand(scores.shape).clone()


def oracle_policy(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    n_keep: int | torch.Tensor,
    *,
    lam: float = 0.5,
    sink_blocks: int = 0,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """Evaluation only: ``scores`` is the TRUE block attention mass (:func:`true_block_mass`); keep the
    blocks carrying the most of it."""
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    return _budgeted_keep(scores.float(), causal, n_keep, sink_blocks, max_keep=max_keep)


SELECTION_POLICIES: dict[str, Callable[..., torch.Tensor]] = {
    "frc": frc_policy,
    "frc_low": frc_low_policy,
    "magnitude": magnitude_policy,
    "hybrid": hybrid_policy,
    "streaming": streaming_policy,
    "dense": dense_policy,
    "oracle": oracle_policy,
}


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def select_blocks(
    scores: torch.Tensor,
    causal: torch.Tensor | None,
    *,
    policy: str,
    sparsity: float,
    budget: str = "row",
    sink_blocks: int = 0,
    lam: float = 0.5,
    magnitude_fraction: float = 0.5,
    max_keep: int | None = None,
) -> torch.Tensor:
    """Budgeted block selection ``(B, H, Mq, Mk)`` bool; see the module docstring for the exact rule.

    Args:
        scores: block scores from :func:`block_scores` (for ``policy="oracle"``: :func:`true_block_mass`).
        causal: ``(Mq, Mk)`` bool from :func:`causal_block_mask` (``None``: every block visible).
        policy: a key of :data:`SELECTION_POLICIES`.
        sparsity: fraction of CAUSAL blocks to drop, in ``[0, 1)``; 0 returns the causal mask.
        budget: ``"row"`` (same count per query-block row) or ``"global"`` (per ``(b, h)``).
    """
    if policy not in SELECTION_POLICIES:
        raise ValueError(f"policy={policy!r} is unknown; allowed: {sorted(SELECTION_POLICIES)}")
    if not (isinstance(sparsity, (int, float)) and 0.0 <= sparsity < 1.0):
        raise ValueError(f"sparsity={sparsity!r} is invalid; allowed: a number in [0, 1)")
    if budget not in BUDGETS:
        raise ValueError(f"budget={budget!r} is unknown; allowed: {list(BUDGETS)}")
    _validate_policy_args(lam, sink_blocks, magnitude_fraction)
    visible = _causal_or_all(scores, causal)
    if sparsity == 0:
        return visible.expand(scores.shape).clone()
    n_q = scores.shape[-2]
    n_k = scores.shape[-1]
    max_keep = None
    if budget == "row":
        # on the device, in float64 like the host's round-half-up: no GPU sync on the prefill/decode path
        per_row = (1.0 - sparsity) * visible.sum().double() / max(n_q, 1)
        k = torch.floor(per_row + 0.5).clamp_min(1).long()
        n_keep: int | torch.Tensor = visible.sum(-1).clamp(max=k)
        # a host bound on k (at most Mk causal blocks per row; +1 covers the division's rounding) for top-k
        max_keep = min(n_k, _round_half_up((1.0 - sparsity) * n_k) + 1)
    else:
        total = int(visible.sum())
        n_keep = min(max(1, _round_half_up((1.0 - sparsity) * total)), total)
    return SELECTION_POLICIES[policy](
        scores,
        causal,
        n_keep,
        lam=lam,
        sink_blocks=sink_blocks,
        magnitude_fraction=magnitude_fraction,
        max_keep=max_keep,
    )


# --------------------------------------------------------------------------------------------------
# evaluation helpers
# --------------------------------------------------------------------------------------------------


def true_block_mass(
    q: torch.Tensor, k: torch.Tensor, scaling: float, block_size: int, q_offset: int = 0
) -> torch.Tensor:
    """Causal softmax attention mass per block, float32 ``(B, H, Mq, Mk)`` (full N×N; small N only).

    ``mass[i, j]`` = mean over the queries of query block ``i`` (queries grouped as the executor
    does: ``i*block_size … (i+1)*block_size - 1`` counted from the first query) of the attention
    probability they put on the keys of block ``j``; every row with queries sums to 1.
    """
    n_q, n_k = q.shape[2], k.shape[2]
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling
    q_pos = q_offset + torch.arange(n_q, device=q.device)
    allowed = torch.arange(n_k, device=q.device)[None, :] <= q_pos[:, None]
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    n_q_blocks, n_k_blocks = -(-n_q // block_size), -(-n_k // block_size)
    q_group = (torch.arange(n_q, device=q.device) // block_size)[None, :] == torch.arange(n_q_blocks, device=q.device)[
        :, None
    ]
    q_avg = q_group.float() / q_group.sum(-1, keepdim=True).clamp_min(1)  # (Mq, Nq) averaging
    k_group = (torch.arange(n_k, device=q.device) // block_size)[:, None] == torch.arange(n_k_blocks, device=q.device)
    return torch.matmul(torch.matmul(q_avg, probs), k_group.float())


def attention_preservation(
    attn_probs: torch.Tensor, keep_token_mask: torch.Tensor, key_positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Fraction of the dense attention mass on the chosen keys that the sparse mask keeps.

    ``attn_probs`` ``(B, H, Nq, Nk)``: dense (causal) attention probabilities. ``keep_token_mask``: bool,
    broadcastable to it, True where the block selection lets a query attend a key. ``key_positions``:
    the chosen keys (e.g. label tokens of the demonstrations), a bool mask over the last dim
    broadcastable to ``(B, H, Nq, Nk)`` or a 1-D long tensor of key indices; ``None`` = every key.

    Returns ``(B, H)`` float32: ``sum(p * keep * chosen) / sum(p * chosen)`` over all queries and keys
    of each ``(b, h)``; 1.0 where the chosen keys carry no mass at all (nothing to lose, never NaN).
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


def reference_cab_v3_selection(
    q: torch.Tensor,
    k: torch.Tensor,
    sparsity: float,
    block_size: int,
    coarsen: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """The document's ``run_cab_v3_pipeline`` block selection, reproduced exactly (NON-causal).

    Scores ``q_c k_c^T / sqrt(D)``, ``direct = |scores|``, ``frc = direct - 0.5 * direct @ direct``
    (unnormalised, future blocks included), then per ``(b, h)`` keep ``frc >= v`` where ``v`` is the
    ``k_keep``-th largest FRC and ``k_keep = max(1, int(M * M * (1 - sparsity)))`` (ties can keep more).
    Returns ``(B, H, M, M)`` bool. It may select future blocks; the causal policies above never do.
    """
    batch, heads, _, dim = q.shape
    q_coarse, k_coarse = coarsen(q, k, block_size)
    scores_coarse = torch.matmul(q_coarse, k_coarse.transpose(-2, -1)) / (dim**0.5)
    m = q_coarse.shape[2]
    direct = scores_coarse.abs()
    frc = direct - 0.5 * torch.matmul(direct, direct)
    k_keep = max(1, int(m * m * (1 - sparsity)))
    threshold = torch.topk(frc.reshape(batch, heads, -1), k_keep, dim=-1, largest=True).values[:, :, -1:]
    return frc >= threshold.view(batch, heads, 1, 1)
