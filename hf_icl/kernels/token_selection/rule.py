"""CAB's causal block selection: every query token picks its own key blocks (MoBA-style gating).

Why per token. A selection shared by a query block must be computed from that block's queries, later tokens
included, so a token's attention would depend on its future; and teacher-forced logits would differ from
generation, where the later tokens do not exist yet. Here query token ``t`` (real index ``r``, own block
``c = r // block_size``) decides from ``q_t`` and the keys of the *complete* blocks ``j < c`` only, so its
selection is the same in prefill and in decode, whatever follows.

The rule, for each query token (blocks laid over the row's real tokens, padding squeezed out):

* *visible* blocks are ``j <= c``; *forced* blocks are its local window ``c - local_blocks < j <= c`` (its own
  block, partly visible: token-level causality inside it is the executor's job, and with ``local_blocks > 1`` the
  blocks just before it) and the sinks ``j < sink_blocks``; *candidates* are the visible, unforced blocks, all
  complete and wholly in the past.
* the budget counts visible blocks, forced ones included: ``budget="row"`` keeps ``max(1, round((1 - sparsity)
  * (c + 1)))`` (round half up), ``budget="topk"`` keeps ``topk``; forced blocks are kept even beyond it. A token
  whose real index is below ``min_seq_len`` keeps every visible block (short prefixes stay dense).
* candidates are ranked by the policy; ties go to the lower block index.

Block scores (``score``): ``"bound"`` is Quest's upper bound of ``q·k`` over a key block, from the block's
element-wise min and max keys, ``Σ_d max(q_d kmin_d, q_d kmax_d)``; ``"mean"`` is ``q · mean key``; ``"max_l2"``
is ``q ·`` the block's largest-norm key (CAB's coarsening). All are scaled like the logits.

FRC (``frc``, ``frc_low``, ``hybrid``): ``A`` = the token's candidate scores min–max normalised over its own
candidates (a running, causal normalisation); the two-hop term is ``Σ_r A[r] · B[r, k]`` where ``B`` scores block
``r``'s mean key against block ``k < r`` with the same score, each row normalised the same way (keys, because a
decode step has no past queries); ``FRC = A - lam * two_hop / n_candidates``.

Backends. This module's PyTorch code (``backend="torch"``) is the reference. ``backend="auto"`` runs the fused Triton
kernel (:mod:`hf_icl.kernels.token_selection.fused`: scores, forced blocks, budgets and top-k in one launch, no host
sync) on CUDA for unpadded inputs and every policy but ``oracle``, and the PyTorch code elsewhere; ``"triton"``
insists.
The kernel's selection logic is the reference's bit for bit; its float32 scores may differ from PyTorch's matmul by
rounding (summation order), which can only matter for candidates whose ranks lie within rounding of each other.
"""

from __future__ import annotations

import functools

import torch

from .._common import resolve_backend
from ..block_sparse_reference import real_positions
from ..coarsen import coarsen_one_max_l2
from .fused import fused_selection_unsupported, select_token_blocks_triton
from .policies import FRC_POLICIES as _FRC_POLICIES
from .policies import SCORES, TOKEN_POLICIES
from .topk import top_among as _top_among

__all__ = [
    "SCORES",
    "TOKEN_POLICIES",
    "achieved_sparsity",
    "key_block_summaries",
    "selection_backend",
    "select_token_blocks",
    "token_block_scores",
    "token_block_selector",
    "select_token_blocks_fused",
    "fused_block_selector",
    "frc_hop_matrix",
    "token_block_mass",
    "token_frc_scores",
]


# -- block summaries and scores --------------------------------------------------------------------


def _compact(x: torch.Tensor, key_index: torch.Tensor | None) -> torch.Tensor:
    """``(B, Hk, Nk, D)`` with each row's real tokens moved to the front (in order)."""
    if key_index is None:
        return x
    return x.gather(2, key_index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    pad = -x.shape[2] % block_size
    return torch.nn.functional.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, block_size))  # (B, Hk, Mk, bs, D)


def key_block_summaries(keys: torch.Tensor, block_size: int, score: str) -> tuple[torch.Tensor, ...]:
    """Per key block, what ``score`` needs, float32 ``(B, Hk, Mk, D)`` each: ``(kmin, kmax)`` for ``"bound"``,
    ``(kmean,)`` for ``"mean"``, ``(krep,)`` for ``"max_l2"``. ``keys`` are compacted (real tokens first); a
    partial last block is summarised over zeros too, which never matters: only complete blocks are candidates."""
    if score == "max_l2":
        return (coarsen_one_max_l2(keys, block_size).float(),)
    blocks = _blocks(keys.float(), block_size)
    if score == "mean":
        return (blocks.mean(3),)
    if score == "bound":
        return blocks.amin(3), blocks.amax(3)
    raise ValueError(f"score={score!r} is unknown; allowed: {list(SCORES)}")


def _per_kv_head(query: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``(B, H, N, D)`` → ``(B, Hk, g·N, D)``: each KV head's query heads stacked (no copy of the keys)."""
    batch, heads, n, dim = query.shape
    return query.reshape(batch, kv_heads, (heads // kv_heads) * n, dim)


def _score(probe: torch.Tensor, summaries: tuple[torch.Tensor, ...], scaling: float) -> torch.Tensor:
    """``probe (B, Hk, R, D) · summaries`` → ``(B, Hk, R, Mk)`` float32."""
    probe = probe.float()
    if len(summaries) == 2:  # bound: positive q components meet kmax, negative ones kmin
        kmin, kmax = summaries
        raw = probe.clamp_min(0) @ kmax.transpose(-1, -2) + probe.clamp_max(0) @ kmin.transpose(-1, -2)
    else:
        raw = probe @ summaries[0].transpose(-1, -2)
    return raw * scaling


def token_block_scores(query: torch.Tensor, summaries: tuple[torch.Tensor, ...], scaling: float) -> torch.Tensor:
    """Every query token against every key block: float32 ``(B, H, Nq, Mk)``."""
    batch, heads, n_q, _ = query.shape
    kv_heads = summaries[0].shape[1]
    scores = _score(_per_kv_head(query, kv_heads), summaries, scaling)
    return scores.view(batch, heads, n_q, -1)


def _minmax(scores: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Min–max normalise each row over its candidates to [0, 1]; 1 where a row's candidates are all equal;
    0 off the candidates."""
    lo = scores.masked_fill(~candidate, float("inf")).amin(-1, keepdim=True)
    hi = scores.masked_fill(~candidate, float("-inf")).amax(-1, keepdim=True)
    span = hi - lo
    safe_lo = lo.masked_fill(~torch.isfinite(lo), 0.0)
    a = torch.where(span > 0, (scores - safe_lo) / span.clamp_min(torch.finfo(torch.float32).tiny), 1.0)
    return a.masked_fill(~candidate, 0.0)


def _hop_per_kv_head(summaries: tuple[torch.Tensor, ...], means: torch.Tensor, scaling: float) -> torch.Tensor:
    """``B (B, Hk, Mk, Mk)``: block ``r``'s mean key scored against block ``k < r``, rows min–max normalised."""
    n_blocks = means.shape[2]
    raw = _score(means, summaries, scaling)  # (B, Hk, Mk, Mk)
    lower = torch.ones(n_blocks, n_blocks, dtype=torch.bool, device=means.device).tril(-1)
    return _minmax(raw, lower)


def frc_hop_matrix(
    summaries: tuple[torch.Tensor, ...], means: torch.Tensor, scaling: float, heads: int
) -> torch.Tensor:
    """:func:`_hop_per_kv_head` repeated for every query head: ``(B, H, Mk, Mk)``."""
    hop = _hop_per_kv_head(summaries, means, scaling)
    return hop.repeat_interleave(heads // hop.shape[1], dim=1)


def token_frc_scores(scores: torch.Tensor, candidate: torch.Tensor, hop: torch.Tensor, lam: float) -> torch.Tensor:
    """Causal FRC per token (see the module docstring): ``A - lam * (A @ B) / n_candidates`` on the candidates."""
    a = _minmax(scores, candidate)
    two_hop = a @ hop
    n_candidates = candidate.sum(-1, keepdim=True).clamp_min(1)
    return (a - lam * two_hop / n_candidates).masked_fill(~candidate, 0.0)


def token_block_mass(
    query: torch.Tensor, keys: torch.Tensor, scaling: float, block_size: int, q_pos: torch.Tensor, n_real: torch.Tensor
) -> torch.Tensor:
    """The oracle's ranks: the true causal softmax mass each query token puts on each key block, float32
    ``(B, H, Nq, Mk)`` (dense O(Nq·Nk): an evaluation upper bound, not a speed-up). ``keys`` are compacted."""
    batch, heads, n_q, _ = query.shape
    kv_heads, n_k = keys.shape[1], keys.shape[2]
    logits = (_per_kv_head(query, kv_heads).float() @ keys.float().transpose(-1, -2)).view(batch, heads, n_q, n_k)
    k_pos = torch.arange(n_k, device=query.device)
    allowed = (k_pos <= q_pos[:, :, None]) & (k_pos < n_real.view(-1, 1, 1))
    probs = torch.softmax((logits * scaling).masked_fill(~allowed[:, None], float("-inf")), -1).nan_to_num(0.0)
    pad = -n_k % block_size
    return torch.nn.functional.pad(probs, (0, pad)).unflatten(-1, (-1, block_size)).sum(-1)


# -- selection ---------------------------------------------------------------------------------------


def select_token_blocks(
    query: torch.Tensor, key: torch.Tensor,
    *, scaling: float, block_size: int, policy: str, score: str = "bound",
    budget: str = "row", sparsity: float = 0.9, topk: int = 8, sink_blocks: int = 1, local_blocks: int = 1,
    min_seq_len: int = 0, lam: float = 0.5, magnitude_fraction: float = 0.5,
    key_valid: torch.Tensor | None = None, backend: str = "auto",
) -> torch.Tensor:  # fmt: skip
    """The per-token selection ``(B, H, Nq, Mk)`` bool under the rule of the module docstring.

    ``query (B, H, Nq, D)`` are the last ``Nq`` of the ``Nk`` positions of ``key (B, Hk, Nk, D)``; ``key_valid``
    ``(B, Nk)`` marks real tokens (None: no padding). Arguments are trusted (CABParams validated them).
    ``backend``: ``"auto"`` (the fused kernel on CUDA where it applies), ``"triton"`` or ``"torch"``; see
    :func:`selection_backend`.

        >>> q, k = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
        >>> token_keep = select_token_blocks(q, k, scaling=8**-0.5, block_size=16, policy="magnitude", sparsity=0.5)
        >>> token_keep.shape, token_keep[0, 0, -1].tolist()  # the last token: own block, sink, one of 3 by budget
        (torch.Size([1, 2, 40, 3]), [True, False, True])
    """
    rule = {
        "block_size": block_size,
        "policy": policy,
        "budget": budget,
        "sparsity": sparsity,
        "topk": topk,
        "sink_blocks": sink_blocks,
        "local_blocks": local_blocks,
        "min_seq_len": min_seq_len,
        "lam": lam,
        "magnitude_fraction": magnitude_fraction,
    }
    if selection_backend(backend, query, key.shape[2], block_size, policy, budget, key_valid) == "triton":
        return _select_fused(query, key, scaling=scaling, score=score, **rule)
    return token_block_selector(query, key, scaling=scaling, score=score, key_valid=key_valid, **rule)(
        0, query.shape[2]
    )


def token_block_selector(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    scaling: float,
    score: str,
    key_valid: torch.Tensor | None = None,
    **rule,
):
    """The PyTorch selection one query range at a time: returns ``select(start, stop)``, the ``(B, H, stop - start,
    Mk)`` bool selection of queries ``start ≤ t < stop`` under the rule of the module docstring (``rule``: the
    keywords of :func:`apply_selection_rule`). Key-block summaries (and FRC's hop matrix) are computed once, on first
    use; a range's block scores only for that range, so the whole sequence's (heads × tokens × blocks) scores never
    exist at once.

        >>> q, k = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
        >>> select = token_block_selector(q, k, scaling=8**-0.5, score="mean", block_size=16, policy="magnitude",
        ...     budget="row", sparsity=0.5, topk=8, sink_blocks=1, local_blocks=1, min_seq_len=0, lam=0.5,
        ...     magnitude_fraction=0.5)
        >>> select(32, 40).shape
        torch.Size([1, 2, 8, 3])
    """
    batch, heads, n_q, _ = query.shape
    n_k = key.shape[2]
    block_size = rule["block_size"]
    q_pos, key_index, n_real = real_positions(key_valid, n_q, n_k, query.device)
    keys = _compact(key, key_index)
    n_blocks = -(-n_k // block_size)

    @functools.cache
    def summaries():
        return key_block_summaries(keys, block_size, score)

    @functools.cache
    def hop():  # the hop probes blocks with their mean keys; the "mean" score already computed them
        means = summaries()[0] if score == "mean" else key_block_summaries(keys, block_size, "mean")[0]
        return frc_hop_matrix(summaries(), means, scaling, heads)

    def select(start: int, stop: int) -> torch.Tensor:
        q_range, pos = query[:, :, start:stop], q_pos[:, start:stop]

        def mass():
            n = stop - start
            return token_block_mass(q_range, keys, scaling, block_size, pos.expand(batch, n), n_real.expand(batch))

        return apply_selection_rule(
            (batch, heads, stop - start, n_blocks),
            pos,
            scores=lambda: token_block_scores(q_range, summaries(), scaling),
            hop=hop,
            mass=mass,
            visible_blocks=(n_k - n_q + stop - 1) // block_size + 1,  # the range's last query sees no block after
            **rule,
        )

    return select


def apply_selection_rule(
    shape: tuple[int, int, int, int],
    q_pos: torch.Tensor,
    *,
    scores,
    hop,
    mass=None,
    block_size: int,
    policy: str,
    budget: str,
    sparsity: float,
    topk: int,
    sink_blocks: int,
    local_blocks: int,
    min_seq_len: int,
    lam: float,
    magnitude_fraction: float,
    visible_blocks: int | None = None,
) -> torch.Tensor:
    """The rule of the module docstring given the block scores: the selection ``(B, H, Nq, Mk)`` bool of
    ``shape``, for query tokens at real positions ``q_pos (B|1, Nq)`` (−1: padding).

    ``scores``, ``hop`` and ``mass`` are called only when the policy needs them: the ``(B, H, Nq, Mk)`` block
    scores, the FRC hop matrix and the oracle's block mass. :func:`select_token_blocks` computes them from the keys;
    the decode cache (:mod:`.cab_cache`) from the block summaries it keeps, so both apply this one rule.
    ``visible_blocks``: a host-side bound on ``own block + 1`` over the rows (None: ``Mk``); the ranking then runs
    over those first blocks only (the rest are invisible to every row), with the same result.
    """
    batch, heads, n_q, n_blocks = shape
    own = (q_pos // block_size)[:, None, :, None]  # (B|1, 1, Nq, 1); -1 // bs = -1 for padded queries
    dense = policy == "dense" or (budget == "row" and sparsity == 0)
    # FRC's two-hop matmul would sum over fewer blocks (other rounding): its policies rank every block
    ranks_all = visible_blocks is None or dense or policy in _FRC_POLICIES
    seen = n_blocks if ranks_all else max(1, min(n_blocks, visible_blocks))
    cols = torch.arange(seen, device=q_pos.device)
    visible = (cols <= own) & (own >= 0)
    if dense:
        return visible.expand(batch, heads, n_q, n_blocks).clone()
    forced = visible & ((cols > own - local_blocks) | (cols < sink_blocks))
    candidate = visible & ~forced
    if budget == "row":
        n_keep = torch.floor((1.0 - sparsity) * (own + 1).double() + 0.5).clamp_min(1).long()
        max_count = min(seen, int((1.0 - sparsity) * seen + 0.5) + 1)  # own + 1 <= seen bounds every row's n_keep
    else:
        n_keep = torch.full_like(own, topk)
        max_count = min(seen, topk)
    remaining = (n_keep - forced.sum(-1, keepdim=True)).clamp_min(0).squeeze(-1)  # (B|1, 1, Nq)
    if policy == "streaming":
        chosen = _top_among(cols.float().expand(candidate.shape), candidate, remaining, max_count)
    elif policy == "oracle":
        chosen = _top_among(mass()[..., :seen], candidate, remaining, max_count)
    else:
        ranks = scores()[..., :seen]  # sliced after scoring: the same float32 values as over every block
        chosen = _rank_and_pick(ranks, candidate, remaining, max_count, policy, hop, lam, magnitude_fraction)
    token_keep = forced | chosen
    if min_seq_len > 0:  # early tokens attend densely
        token_keep = token_keep | (visible & (q_pos < min_seq_len)[:, None, :, None])
    token_keep = token_keep.expand(batch, heads, n_q, seen)
    return token_keep if seen == n_blocks else torch.nn.functional.pad(token_keep, (0, n_blocks - seen))


def _rank_and_pick(scores, candidate, remaining, max_count, policy, hop, lam, fraction):
    """The score-based policies: magnitude, frc, frc_low and hybrid (magnitude's share first, FRC the rest)."""
    if policy == "magnitude":
        return _top_among(scores, candidate, remaining, max_count)
    frc = token_frc_scores(scores, candidate, hop(), lam)
    if policy == "frc":
        return _top_among(frc, candidate, remaining, max_count)
    if policy == "frc_low":
        return _top_among(-frc, candidate, remaining, max_count)
    n_magnitude = torch.floor(remaining.float() * fraction + 0.5).long()
    by_magnitude = _top_among(scores, candidate, n_magnitude, max_count)
    return by_magnitude | _top_among(frc, candidate & ~by_magnitude, remaining - n_magnitude, max_count)


def selection_backend(
    backend: str,
    query: torch.Tensor,
    n_keys: int,
    block_size: int,
    policy: str,
    budget: str = "row",
    key_valid: torch.Tensor | None = None,
) -> str:
    """Which implementation runs a selection: ``"triton"`` (the fused kernel) or ``"torch"`` (PyTorch).

    ``"auto"`` takes the kernel for CUDA queries when it supports the call (unpadded, any policy but ``oracle``, at
    most :data:`~hf_icl.kernels.token_selection.fused.MAX_KEY_BLOCKS` key blocks) and PyTorch otherwise;
    ``"triton"`` insists and raises a ``ValueError`` naming what is unsupported.

        >>> selection_backend("auto", torch.zeros(1, 1, 4, 8), 64, 16, "magnitude")  # a CPU tensor
        'torch'
    """
    if resolve_backend(backend, query) == "torch":
        return "torch"
    reason = fused_selection_unsupported(query, -(-n_keys // block_size), policy, budget, key_valid)
    if reason is None:
        return "triton"
    if backend == "triton":
        raise ValueError(f"backend='triton' cannot run this selection: {reason}")
    return "torch"


def select_token_blocks_fused(query, key, *, scaling, score, **rule) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel's selection as block lists ``(indices, counts)`` (see
    :func:`~hf_icl.kernels.token_selection.fused.select_token_blocks_triton`), no host sync."""
    return fused_block_selector(key, scaling=scaling, score=score, **rule)(query, key.shape[2])


def fused_block_selector(key, *, scaling, score, **rule):
    """The fused kernel one query range at a time: returns ``select(query_range, n_keys)`` → ``(indices, counts)``
    for queries that are the last of the first ``n_keys`` positions. The key-block summaries (and FRC's hop matrix)
    are computed once for all of ``key`` and sliced per range: a block's summary and a hop row depend on that
    block's keys and earlier blocks only."""
    summaries, hop = _fused_inputs(key, scaling, score, rule)
    block_size = rule["block_size"]

    def select(query, n_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        n_blocks = -(-n_keys // block_size)
        _, indices, counts = select_token_blocks_triton(
            query,
            None if summaries is None else tuple(x[:, :, :n_blocks] for x in summaries),
            n_keys=n_keys,
            scaling=scaling,
            hop=None if hop is None else hop[:, :, :n_blocks, :n_blocks],
            return_indices=True,
            **rule,
        )
        return indices, counts

    return select


def _select_fused(query, key, *, scaling, score, **rule):
    """The fused kernel's bool selection on the summaries (and, for FRC, the per-KV-head hop matrix) the reference
    would use."""
    summaries, hop = _fused_inputs(key, scaling, score, rule)
    return select_token_blocks_triton(query, summaries, n_keys=key.shape[2], scaling=scaling, hop=hop, **rule)


def _fused_inputs(key, scaling, score, rule) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor | None]:
    """What the fused kernel reads: the score's key-block summaries and, for FRC, the per-KV-head hop matrix (None
    for the policies that read no keys)."""
    scored = rule["policy"] not in ("dense", "streaming") and not (rule["budget"] == "row" and rule["sparsity"] == 0)
    if not scored:
        return None, None
    summaries = key_block_summaries(key, rule["block_size"], score)
    hop = None
    if rule["policy"] in _FRC_POLICIES:
        means = summaries[0] if score == "mean" else key_block_summaries(key, rule["block_size"], "mean")[0]
        hop = _hop_per_kv_head(summaries, means, scaling)
    return summaries, hop


def achieved_sparsity(
    token_keep: torch.Tensor, block_size: int, n_k: int, key_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """The fraction of visible (query token, key block) pairs the selection skipped: a float32 scalar tensor (no
    sync). Visible means the key block is at most the token's own; padded queries do not count."""
    batch, heads, n_q, _ = token_keep.shape
    q_pos, _, _ = real_positions(key_valid, n_q, n_k, token_keep.device)
    visible = (q_pos // block_size + 1).clamp_min(0).expand(batch, -1).sum() * heads
    return 1.0 - token_keep.sum().float() / visible.clamp_min(1).float()
