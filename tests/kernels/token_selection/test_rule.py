"""CAB's per-token block selection against the rule written out token by token, in plain Python loops."""

from __future__ import annotations

import math

import pytest
import torch

from hf_icl.kernels.token_selection.rule import achieved_sparsity, select_token_blocks, token_block_selector
from hf_icl.kernels.token_selection.topk import top_among

BS = 16


def _loop_score(q, block, score):
    """One query vector against one key block ``(bs, D)``, the formula written out per dimension."""
    if score == "mean":
        return sum(float(q[d]) * float(block[:, d].mean()) for d in range(q.shape[0]))
    if score == "bound":
        return sum(max(float(q[d] * block[:, d].min()), float(q[d] * block[:, d].max())) for d in range(q.shape[0]))
    norms = block.double().norm(dim=-1)
    return float(q.double() @ block[int(norms.argmax())].double())


def _loop_selection(q, k, *, policy, score, sparsity=None, topk=None, sink=1, local=1, min_seq_len=0, valid=None):
    """Per query token: own block (and the ``local - 1`` before it) + sinks, then the best past complete blocks up
    to the budget."""
    n_k = k.shape[0]
    real = list(range(n_k)) if valid is None else [p for p in range(n_k) if valid[p]]
    keys = k[real]
    n_blocks = math.ceil(n_k / BS)
    rows = []
    for t in range(q.shape[0]):
        abs_pos = n_k - q.shape[0] + t
        keep = [False] * n_blocks
        if valid is not None and not valid[abs_pos]:
            rows.append(keep)
            continue
        r = real.index(abs_pos)
        own = r // BS
        if r < min_seq_len:
            rows.append([j <= own for j in range(n_blocks)])
            continue
        budget = topk if topk is not None else max(1, math.floor((1 - sparsity) * (own + 1) + 0.5))
        forced = {j for j in range(max(0, own - local + 1), own + 1)} | {j for j in range(min(sink, own + 1))}
        for j in forced:
            keep[j] = True
        candidates = [j for j in range(own) if j not in forced]
        if policy == "streaming":
            rank = {j: j for j in candidates}
        else:
            rank = {j: _loop_score(q[t], keys[j * BS : (j + 1) * BS], score) for j in candidates}
        ordered = sorted(candidates, key=lambda j: (-rank[j], j))
        for j in ordered[: max(0, budget - len(forced))]:
            keep[j] = True
        rows.append(keep)
    return torch.tensor(rows)


def _qk(n_q, n_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_q, 8, generator=g, dtype=torch.float64), torch.randn(n_k, 8, generator=g, dtype=torch.float64)


def _select(q, k, valid=None, **rule):
    """``select_token_blocks`` on one (batch, head) at scale 1, 16-token blocks, one sink unless given."""
    rule = {"sink_blocks": 1, **rule}
    mask = None if valid is None else valid[None]
    return select_token_blocks(q[None, None], k[None, None], scaling=1.0, block_size=BS, key_valid=mask, **rule)[0, 0]


@pytest.mark.parametrize("score", ["bound", "mean", "max_l2"])
@pytest.mark.parametrize("policy", ["magnitude", "streaming"])
@pytest.mark.parametrize("budget", [{"sparsity": 0.6}, {"topk": 3}])
@pytest.mark.parametrize("local", [1, 2])
def test_selection_equals_the_rule_written_out_per_token(score, policy, budget, local):
    q, k = _qk(100, 100)
    kind = "row" if "sparsity" in budget else "topk"
    token_keep = _select(q, k, policy=policy, score=score, budget=kind, local_blocks=local, **budget)
    expected = _loop_selection(q, k, policy=policy, score=score, local=local, **budget)
    assert torch.equal(token_keep, expected)


def test_decode_queries_padding_and_dense_prefix_follow_the_same_rule():
    q, k = _qk(1, 90, seed=1)  # one decode query at position 89
    token_keep = _select(q, k, policy="magnitude", score="bound", sparsity=0.5)
    assert torch.equal(token_keep, _loop_selection(q, k, policy="magnitude", score="bound", sparsity=0.5))
    valid = torch.ones(90, dtype=torch.bool)
    valid[:11] = False  # left padding: blocks start at the first real token
    q, k = _qk(90, 90, seed=2)
    token_keep = _select(q, k, valid, policy="magnitude", score="mean", sparsity=0.5, min_seq_len=40)
    expected = _loop_selection(q, k, policy="magnitude", score="mean", sparsity=0.5, min_seq_len=40, valid=valid)
    assert torch.equal(token_keep, expected)


@pytest.mark.parametrize("policy", ["magnitude", "streaming", "oracle"])
@pytest.mark.parametrize("budget", [{"sparsity": 0.6}, {"topk": 3}])
@pytest.mark.parametrize("padded", [False, True])
def test_query_ranges_rank_only_the_blocks_they_see_and_select_as_the_loop(policy, budget, padded):
    """The selector ranks a range's rows over the blocks up to its last query's own block only; every range, early
    ones included, still selects what the rule written out per token selects (the oracle against the whole-sequence
    selection, which the loop does not write out)."""
    q, k = _qk(100, 100, seed=3)
    valid = torch.ones(100, dtype=torch.bool)
    if padded:
        valid[:13] = False
    kind = "row" if "sparsity" in budget else "topk"
    rule = {
        "block_size": BS,
        "policy": policy,
        "budget": kind,
        "sparsity": 0.9,
        "topk": 8,
        "sink_blocks": 1,
        "local_blocks": 1,
        "min_seq_len": 0,
        "lam": 0.5,
        "magnitude_fraction": 0.5,
        **budget,
    }
    select = token_block_selector(
        q[None, None], k[None, None], scaling=1.0, score="mean", key_valid=valid[None] if padded else None, **rule
    )
    ranged = torch.cat([select(a, b) for a, b in ((0, 17), (17, 40), (40, 41), (41, 100))], dim=2)[0, 0]
    if policy == "oracle":
        expected = select(0, 100)[0, 0]
    else:
        loop_rule = {"sparsity": 0.9, **budget}
        expected = _loop_selection(q, k, policy=policy, score="mean", valid=valid if padded else None, **loop_rule)
    assert torch.equal(ranged, expected)


def test_achieved_sparsity_counts_visible_blocks_of_real_queries():
    q, k = _qk(64, 64)
    token_keep = _select(q, k, policy="streaming", score="mean", budget="topk", topk=1, sink_blocks=0)[None, None]
    # each token keeps only its own block; token t sees t // 16 + 1 blocks
    visible = sum(t // BS + 1 for t in range(64))
    assert float(achieved_sparsity(token_keep, BS, 64)) == pytest.approx(1 - 64 / visible)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bounded", [False, True])
def test_top_among_matches_a_sorted_loop_with_ties_nan_inf_and_signed_zeros(seed, bounded):
    """The top-k pass (one topk of max_count + 1, the threshold fallback for ties across the boundary) selects what
    sorting (rank desc, index asc) per row selects; rows with and without boundary ties both occur here."""
    g = torch.Generator().manual_seed(seed)
    rows, n = 7, 23
    # few distinct values → many ties; then NaN, ±inf and -0.0 sprinkled in
    rank = torch.randint(-3, 4, (rows, n), generator=g).float()
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0])
    where = torch.rand(rows, n, generator=g) < 0.25
    rank[where] = specials[torch.randint(0, 5, (int(where.sum()),), generator=g)]
    candidate = torch.rand(rows, n, generator=g) < 0.7
    count = torch.randint(0, n + 1, (rows,), generator=g)
    chosen = top_among(rank, candidate, count, int(count.max()) if bounded else None)

    lowest = torch.finfo(torch.float32).min

    def order_key(r, j):  # NaN and -inf candidates are the lowest floats; -0.0 equals 0.0
        value = rank[r, j].item()
        value = lowest if math.isnan(value) or value == float("-inf") else value
        return (-value, j)

    for r in range(rows):
        best = sorted((j for j in range(n) if candidate[r, j]), key=lambda j, r=r: order_key(r, j))[: count[r]]
        assert chosen[r].nonzero().flatten().tolist() == sorted(best), (r, rank[r], candidate[r], count[r])
