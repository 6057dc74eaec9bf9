"""CAB block scoring / selection: causality, budgets, each policy against plain loop references,
the document's (non-causal) CAB V3 selection, and argument validation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_icl.attention.selection import (
    SELECTION_POLICIES,
    attention_preservation,
    block_scores,
    causal_block_mask,
    forced_blocks,
    frc_scores,
    reference_cab_v3_selection,
    select_blocks,
    true_block_mass,
)

POLICIES = sorted(SELECTION_POLICIES)


# ------------------------------------------------------------------------------------------------
# plain references (loops on purpose)
# ------------------------------------------------------------------------------------------------


def loop_causal(n_q: int, n_k: int, off: int) -> torch.Tensor:
    out = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        for j in range(n_k):
            out[i, j] = j <= off + i
    return out


def half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def expected_row_budget(sparsity: float, causal: torch.Tensor) -> list[int]:
    n_q = causal.shape[0]
    total = int(causal.sum())
    k = max(1, half_up((1 - sparsity) * total / n_q))
    return [min(k, int(causal[i].sum())) for i in range(n_q)]


def forced_set(row: int, off: int, n_k: int, sink: int) -> set[int]:
    diag = min(off + row, n_k - 1)
    return {diag} | {j for j in range(min(sink, n_k)) if j <= diag}


def loop_frc(scores: torch.Tensor, off: int, lam: float) -> torch.Tensor:
    """Per (b, h): normalise causal entries to [0, 1], zero the future, two-hop over known rows, FRC."""
    b_, h_, n_q, n_k = scores.shape
    out = torch.zeros(b_, h_, n_q, n_k, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            vals = [float(scores[b, h, i, j]) for i in range(n_q) for j in range(n_k) if j <= off + i]
            lo, hi = min(vals), max(vals)
            a = [[0.0] * n_k for _ in range(n_q)]
            for i in range(n_q):
                for j in range(n_k):
                    if j <= off + i:
                        a[i][j] = (float(scores[b, h, i, j]) - lo) / (hi - lo) if hi > lo else 1.0
            for i in range(n_q):
                for kk in range(n_k):
                    if kk > off + i:
                        continue
                    # two-hop i -> pos_r -> kk through every query row r we know (r is at block off + r)
                    two = sum(a[i][off + r] * a[r][kk] for r in range(n_q) if off + r < n_k)
                    out[b, h, i, kk] = a[i][kk] - lam * two / n_k
    return out


def loop_row_select(rank: torch.Tensor, off: int, budgets: list[int], sink: int, descending: bool = True):
    """Forced blocks + best remaining by ``rank`` (argsort), per (b, h, row)."""
    b_, h_, n_q, n_k = rank.shape
    keep = torch.zeros(b_, h_, n_q, n_k, dtype=torch.bool)
    for b in range(b_):
        for h in range(h_):
            for i in range(n_q):
                forced = forced_set(i, off, n_k, sink)
                cands = [j for j in range(n_k) if j <= off + i and j not in forced]
                sign = -1.0 if descending else 1.0
                cands.sort(key=lambda j: (sign * float(rank[b, h, i, j]), j))
                free = max(0, budgets[i] - len(forced))
                for j in list(forced) + cands[:free]:
                    keep[b, h, i, j] = True
    return keep


def max_l2_coarsen(q: torch.Tensor, k: torch.Tensor, block_size: int):
    """Simple test coarsening: per block, the row with the largest L2 norm (N a multiple of block_size)."""

    def pick(x):
        b_, h_, n, d = x.shape
        blocks = x.reshape(b_, h_, n // block_size, block_size, d)
        idx = blocks.norm(dim=-1).argmax(-1)
        return blocks.gather(3, idx[..., None, None].expand(-1, -1, -1, 1, d)).squeeze(3)

    return pick(q), pick(k)


def random_scores(b, h, n_q, n_k, off, seed=0):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(b, h, n_q, n_k, generator=g)
    return raw.masked_fill(~causal_block_mask(n_q, n_k, off), float("-inf"))


# ------------------------------------------------------------------------------------------------
# causality and the invariants of every policy
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_q,n_k,off", [(1, 1, 0), (4, 4, 0), (3, 7, 4), (1, 9, 8), (5, 3, 0), (2, 6, 1)])
def test_causal_block_mask_matches_loop(n_q, n_k, off):
    assert torch.equal(causal_block_mask(n_q, n_k, off), loop_causal(n_q, n_k, off))


def test_block_scores_values_and_future_inf():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g)
    causal = causal_block_mask(4, 6, 2)
    s = block_scores(q, k, 0.25, causal)
    assert s.dtype == torch.float32 and s.shape == (2, 3, 4, 6)
    for i in range(4):
        for j in range(6):
            if j <= 2 + i:
                torch.testing.assert_close(s[:, :, i, j], 0.25 * (q[:, :, i] * k[:, :, j]).sum(-1))
            else:
                assert torch.isinf(s[:, :, i, j]).all() and (s[:, :, i, j] < 0).all()


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 2),
    n_q=st.integers(1, 7),
    off=st.integers(0, 6),
    sparsity=st.sampled_from([0.0, 0.3, 0.5, 0.75, 0.9, 0.99]),
    policy=st.sampled_from(POLICIES),
    budget=st.sampled_from(["row", "global"]),
    sink=st.integers(0, 3),
    seed=st.integers(0, 10_000),
)
def test_invariants_every_policy(b, h, n_q, off, sparsity, policy, budget, sink, seed):
    n_k = off + n_q
    causal = causal_block_mask(n_q, n_k, off)
    scores = random_scores(b, h, n_q, n_k, off, seed)
    keep = select_blocks(scores, causal, policy=policy, sparsity=sparsity, budget=budget, sink_blocks=sink)
    assert keep.shape == scores.shape and keep.dtype == torch.bool
    assert not (keep & ~causal).any(), "a future block was selected"
    assert keep.any(-1).all(), "an empty row"
    for i in range(n_q):
        for j in forced_set(i, off, n_k, sink):
            assert keep[:, :, i, j].all(), f"forced block ({i}, {j}) dropped"
    if sparsity == 0 or policy == "dense":
        assert torch.equal(keep, causal.expand_as(keep))
        return
    n_forced_rows = [len(forced_set(i, off, n_k, sink)) for i in range(n_q)]
    if budget == "row":
        want = [max(k, f) for k, f in zip(expected_row_budget(sparsity, causal), n_forced_rows, strict=True)]
        assert keep.sum(-1).tolist() == [[want] * h] * b
    else:
        total = int(causal.sum())
        k_total = min(max(1, half_up((1 - sparsity) * total)), total)
        assert (keep.sum((-2, -1)) == max(k_total, sum(n_forced_rows))).all()


def test_decode_single_query_row():
    # decode: one query at absolute position 37 with block 8 → block 4; keys cover 5 blocks
    causal = causal_block_mask(1, 5, 37 // 8)
    assert causal.all()
    scores = random_scores(1, 2, 1, 5, 4, seed=3)
    for policy in POLICIES:
        keep = select_blocks(scores, causal, policy=policy, sparsity=0.75, sink_blocks=1)
        assert keep[..., 0].all() and keep[..., 4].all()  # sink and diagonal
        assert (keep.sum(-1) == (2 if policy != "dense" else 5)).all()  # k = round(0.25 * 5) = 1 → forced 2


# ------------------------------------------------------------------------------------------------
# budgets
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", ["row", "global"])
def test_sparsity_zero_is_causal_mask(budget):
    causal = causal_block_mask(6, 9, 3)
    scores = random_scores(2, 2, 6, 9, 3)
    for policy in POLICIES:
        keep = select_blocks(scores, causal, policy=policy, sparsity=0.0, budget=budget, sink_blocks=2)
        assert torch.equal(keep, causal.expand(2, 2, 6, 9)), policy


def test_sparsity_09_on_20x20_grid():
    causal = causal_block_mask(20, 20, 0)
    assert int(causal.sum()) == 210
    scores = random_scores(1, 1, 20, 20, 0, seed=5)
    # global: K = round(0.1 * 210) = 21 = 10% of the causal blocks (20 diagonals + 1 free)
    keep = select_blocks(scores, causal, policy="frc", sparsity=0.9, budget="global")
    assert int(keep.sum()) == 21
    # row: k = max(1, round(0.1 * 210 / 20)) = round(1.05) = 1 per row → 20 blocks (9.5%)
    keep = select_blocks(scores, causal, policy="frc", sparsity=0.9, budget="row")
    assert keep.sum(-1).tolist() == [[[1] * 20]]
    assert torch.equal(keep[0, 0], torch.eye(20, dtype=torch.bool))
    # sparsity 0.5: k = round(0.5 * 210 / 20) = round(5.25) = 5, capped for the first rows
    keep = select_blocks(scores, causal, policy="magnitude", sparsity=0.5, budget="row")
    assert keep.sum(-1)[0, 0].tolist() == [min(5, i + 1) for i in range(20)]


def test_per_row_tensor_and_int_budget_direct_call():
    causal = causal_block_mask(4, 4, 0)
    scores = random_scores(1, 1, 4, 4, 0, seed=2)
    keep = SELECTION_POLICIES["magnitude"](scores, causal, torch.tensor([1, 1, 3, 2]))
    assert keep.sum(-1).tolist() == [[[1, 1, 3, 2]]]
    keep = SELECTION_POLICIES["magnitude"](scores, causal, 6)
    assert int(keep.sum()) == 6
    with pytest.raises(ValueError, match="n_keep"):
        SELECTION_POLICIES["frc"](scores, causal, torch.tensor([1, 2]))


# ------------------------------------------------------------------------------------------------
# each policy against a loop reference
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_q,off,lam", [(8, 0, 0.5), (5, 3, 0.5), (6, 0, 2.0), (1, 6, 0.5)])
def test_frc_scores_match_loop(n_q, off, lam):
    scores = random_scores(2, 2, n_q, n_q + off, off, seed=7)
    causal = causal_block_mask(n_q, n_q + off, off)
    torch.testing.assert_close(frc_scores(scores, causal, lam).double(), loop_frc(scores, off, lam))


def test_frc_square_prefill_is_normalised_a_minus_two_hop():
    # on a square prefill grid the two-hop term is literally A @ A (causal A, future zeroed)
    scores = random_scores(1, 1, 6, 6, 0, seed=11)
    causal = causal_block_mask(6, 6)
    s = scores[0, 0]
    lo, hi = s[causal].min(), s[causal].max()
    a = torch.where(causal, (s - lo) / (hi - lo), torch.zeros(()))
    expected = torch.where(causal, a - 0.5 * (a @ a) / 6, torch.zeros(()))
    torch.testing.assert_close(frc_scores(scores, causal, 0.5)[0, 0], expected)


@pytest.mark.parametrize("off,sink", [(0, 0), (0, 2), (4, 1)])
@pytest.mark.parametrize("sparsity", [0.5, 0.8])
def test_frc_frc_low_magnitude_vs_loop(off, sink, sparsity):
    n_q = 8
    n_k = n_q + off
    causal = causal_block_mask(n_q, n_k, off)
    scores = random_scores(2, 2, n_q, n_k, off, seed=13)
    budgets = expected_row_budget(sparsity, causal)
    frc = loop_frc(scores, off, 0.5)
    kw = dict(sparsity=sparsity, sink_blocks=sink)
    assert torch.equal(select_blocks(scores, causal, policy="frc", **kw), loop_row_select(frc, off, budgets, sink))
    assert torch.equal(
        select_blocks(scores, causal, policy="frc_low", **kw), loop_row_select(frc, off, budgets, sink, False)
    )
    assert torch.equal(
        select_blocks(scores, causal, policy="magnitude", **kw), loop_row_select(scores, off, budgets, sink)
    )


def test_frc_and_frc_low_are_complementary_orderings():
    # with the full free budget split, frc's free picks and frc_low's free picks are disjoint extremes
    causal = causal_block_mask(10, 10)
    scores = random_scores(1, 1, 10, 10, 0, seed=17)
    frc = frc_scores(scores, causal)
    # k = round(0.5 * 55 / 10) = 3 per row: diagonal + 2 free; rows with >= 4 off-diagonal candidates are disjoint
    high = select_blocks(scores, causal, policy="frc", sparsity=0.5)
    low = select_blocks(scores, causal, policy="frc_low", sparsity=0.5)
    free_high, free_low = high & ~torch.eye(10, dtype=torch.bool), low & ~torch.eye(10, dtype=torch.bool)
    assert (free_high.sum(-1)[0, 0, 2:] == 2).all() and not (free_high & free_low)[..., 4:, :].any()
    for i in range(4, 10):  # free picks are the extremes of the off-diagonal FRC of the row
        others = causal[i] & ~torch.eye(10, dtype=torch.bool)[i]
        row = frc[0, 0, i]
        assert row[free_high[0, 0, i]].min() >= row[others & ~free_high[0, 0, i]].max()
        assert row[free_low[0, 0, i]].max() <= row[others & ~free_low[0, 0, i]].min()


def test_global_budget_frc_vs_loop():
    causal = causal_block_mask(6, 6)
    scores = random_scores(2, 1, 6, 6, 0, seed=19)
    frc = loop_frc(scores, 0, 0.5)
    keep = select_blocks(scores, causal, policy="frc", sparsity=0.6, budget="global")
    k_total = half_up(0.4 * 21)  # 8: 6 diagonals + 2 free
    for b in range(2):
        cands = [(i, j) for i in range(6) for j in range(i)]
        cands.sort(key=lambda ij: (-float(frc[b, 0, ij[0], ij[1]]), ij[0] * 6 + ij[1]))
        want = torch.eye(6, dtype=torch.bool)
        for i, j in cands[: k_total - 6]:
            want[i, j] = True
        assert torch.equal(keep[b, 0], want)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0, 0.3])
def test_hybrid_splits_budget(fraction):
    n_q, sink = 12, 1
    causal = causal_block_mask(n_q, n_q)
    scores = random_scores(1, 2, n_q, n_q, 0, seed=23)
    frc = loop_frc(scores, 0, 0.5)
    keep = select_blocks(scores, causal, policy="hybrid", sparsity=0.6, sink_blocks=sink, magnitude_fraction=fraction)
    budgets = expected_row_budget(0.6, causal)
    for h in range(2):
        for i in range(n_q):
            forced = forced_set(i, 0, n_q, sink)
            free = max(0, budgets[i] - len(forced))
            n_mag = half_up(fraction * free)
            cands = [j for j in range(i + 1) if j not in forced]
            by_mag = sorted(cands, key=lambda j: (-float(scores[0, h, i, j]), j))[:n_mag]
            rest = sorted((j for j in cands if j not in by_mag), key=lambda j: (-float(frc[0, h, i, j]), j))
            want = forced | set(by_mag) | set(rest[: free - n_mag])
            assert set(torch.nonzero(keep[0, h, i]).flatten().tolist()) == want
    if fraction == 1.0:
        assert torch.equal(keep, select_blocks(scores, causal, policy="magnitude", sparsity=0.6, sink_blocks=sink))
    if fraction == 0.0:
        assert torch.equal(keep, select_blocks(scores, causal, policy="frc", sparsity=0.6, sink_blocks=sink))


@pytest.mark.parametrize("off,sink", [(0, 0), (0, 2), (5, 2)])
def test_streaming_is_sinks_plus_window(off, sink):
    n_q = 10
    n_k = n_q + off
    causal = causal_block_mask(n_q, n_k, off)
    scores = random_scores(1, 1, n_q, n_k, off, seed=29)
    keep = select_blocks(scores, causal, policy="streaming", sparsity=0.7, sink_blocks=sink)
    budgets = expected_row_budget(0.7, causal)
    for i in range(n_q):
        diag = off + i
        want = {j for j in range(sink) if j <= diag}
        j = diag
        while j >= 0 and len(want) < max(budgets[i], len(forced_set(i, off, n_k, sink))):
            want.add(j)  # the window grows backwards from the diagonal
            j -= 1
        assert set(torch.nonzero(keep[0, 0, i]).flatten().tolist()) == want, i


def test_true_block_mass_vs_loop_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(31)
    bs, off = 4, 8
    q, k = torch.randn(1, 2, 8, 5, generator=g), torch.randn(1, 2, 16, 5, generator=g)
    mass = true_block_mass(q, k, 0.4, bs, off)
    assert mass.shape == (1, 2, 2, 4)
    for h in range(2):
        ref = torch.zeros(2, 4)
        for s in range(8):
            logits = torch.tensor([0.4 * float(q[0, h, s] @ k[0, h, t]) for t in range(off + s + 1)])
            p = torch.softmax(logits, 0)
            for t in range(off + s + 1):
                ref[s // bs, t // bs] += p[t] / bs
        torch.testing.assert_close(mass[0, h], ref)
    torch.testing.assert_close(mass.sum(-1), torch.ones(1, 2, 2))
    assert (mass * ~causal_block_mask(2, 4, off // bs)).abs().max() < 1e-6


def test_oracle_finds_planted_heavy_block():
    g = torch.Generator().manual_seed(37)
    bs, n, d = 4, 32, 16
    q = torch.randn(1, 1, n, d, generator=g) * 0.1
    k = torch.randn(1, 1, n, d, generator=g) * 0.1
    direction = torch.zeros(d)
    direction[0] = 1.0
    q[..., :] += 3.0 * direction
    k[0, 0, 8:12] += 3.0 * direction  # key block 2 dominates everyone who can see it
    mass = true_block_mass(q, k, d**-0.5, bs)
    causal = causal_block_mask(n // bs, n // bs)
    keep = select_blocks(mass, causal, policy="oracle", sparsity=0.5)  # k = round(0.5 * 36 / 8) = 2 per row
    assert keep[0, 0, 3:, 2].all()  # every row past block 2 keeps the planted block
    # magnitude on the coarse scores of random rows need not; the oracle is exact by construction
    for i in range(3, n // bs):
        free = keep[0, 0, i] & ~torch.nn.functional.one_hot(torch.tensor(i), n // bs).bool()
        assert mass[0, 0, i][free].min() >= mass[0, 0, i][causal[i] & ~keep[0, 0, i]].max()


def test_attention_preservation():
    probs = torch.tensor([[[[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.2, 0.3, 0.5]]]])
    keep = torch.tensor([[True, False, False], [False, True, False], [True, False, True]])
    # chosen keys {0, 1}: mass on them 1 + 1 + 0.5 = 2.5; kept 1 + 0.75 + 0.2 = 1.95
    out = attention_preservation(probs, keep, torch.tensor([0, 1]))
    torch.testing.assert_close(out, torch.tensor([[1.95 / 2.5]]))
    out_bool = attention_preservation(probs, keep, torch.tensor([True, True, False]))
    torch.testing.assert_close(out_bool, out)
    # all keys: (1 + 0.75 + 0.7) / 3
    torch.testing.assert_close(attention_preservation(probs, keep), torch.tensor([[2.45 / 3]]))
    # chosen key without mass → 1.0, never NaN
    torch.testing.assert_close(attention_preservation(probs, keep, torch.tensor([2]))[0, 0], torch.tensor(0.5 / 0.5))
    zero = attention_preservation(torch.zeros(1, 1, 2, 2), torch.ones(2, 2, dtype=torch.bool))
    assert torch.equal(zero, torch.ones(1, 1))


# ------------------------------------------------------------------------------------------------
# the document's selection, literally
# ------------------------------------------------------------------------------------------------


def literal_document_selection(q, k, sparsity, block_size):
    b_, h_, _, d = q.shape
    q_c, k_c = max_l2_coarsen(q, k, block_size)
    m = q_c.shape[2]
    out = torch.zeros(b_, h_, m, m, dtype=torch.bool)
    for b in range(b_):
        for h in range(h_):
            scores = [[float(q_c[b, h, i] @ k_c[b, h, j]) / math.sqrt(d) for j in range(m)] for i in range(m)]
            direct = [[abs(x) for x in row] for row in scores]
            frc = [
                [direct[i][j] - 0.5 * sum(direct[i][t] * direct[t][j] for t in range(m)) for j in range(m)]
                for i in range(m)
            ]
            k_keep = max(1, int(m * m * (1 - sparsity)))
            threshold = sorted((x for row in frc for x in row), reverse=True)[k_keep - 1]
            for i in range(m):
                for j in range(m):
                    out[b, h, i, j] = frc[i][j] >= threshold - 1e-9 * max(1.0, abs(threshold))
    return out


@pytest.mark.parametrize("sparsity,seed", [(0.9, 0), (0.5, 1), (0.75, 2)])
def test_reference_cab_v3_matches_literal_transcription(sparsity, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 32, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 32, 8, generator=g, dtype=torch.float64)
    got = reference_cab_v3_selection(q, k, sparsity, 4, max_l2_coarsen)
    assert got.shape == (2, 2, 8, 8)
    assert torch.equal(got, literal_document_selection(q, k, sparsity, 4))
    assert (got.sum((-2, -1)) >= max(1, int(64 * (1 - sparsity)))).all()


def test_reference_cab_v3_selects_future_blocks_ours_do_not():
    g = torch.Generator().manual_seed(41)
    q, k = torch.randn(1, 2, 32, 8, generator=g), torch.randn(1, 2, 32, 8, generator=g)
    causal = causal_block_mask(8, 8)
    doc = reference_cab_v3_selection(q, k, 0.75, 4, max_l2_coarsen)
    assert (doc & ~causal).any(), "the document's selection is non-causal"
    q_c, k_c = max_l2_coarsen(q, k, 4)
    ours = select_blocks(block_scores(q_c, k_c, 8**-0.5, causal), causal, policy="frc", sparsity=0.75)
    assert not (ours & ~causal).any() and not torch.equal(ours, doc)


def test_reference_cab_v3_ties_keep_more():
    # identical blocks → every FRC ties → the threshold keeps all M*M blocks, as the document does
    q = torch.ones(1, 1, 16, 4)
    keep = reference_cab_v3_selection(q, q.clone(), 0.9, 4, max_l2_coarsen)
    assert keep.all()


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(policy="nope", sparsity=0.5), "policy='nope'.*allowed"),
        (dict(policy="frc", sparsity=1.0), "sparsity=1.0.*allowed"),
        (dict(policy="frc", sparsity=-0.1), "sparsity=-0.1.*allowed"),
        (dict(policy="frc", sparsity=0.5, budget="column"), "budget='column'.*allowed"),
        (dict(policy="frc", sparsity=0.5, sink_blocks=-1), "sink_blocks=-1.*allowed"),
        (dict(policy="frc", sparsity=0.5, lam=-0.5), "lam=-0.5.*allowed"),
        (dict(policy="hybrid", sparsity=0.5, magnitude_fraction=1.5), "magnitude_fraction=1.5.*allowed"),
        (dict(policy="hybrid", sparsity=0.5, magnitude_fraction=-0.1), "magnitude_fraction=-0.1.*allowed"),
    ],
)
def test_validation_errors(kwargs, match):
    causal = causal_block_mask(3, 3)
    with pytest.raises(ValueError, match=match):
        select_blocks(random_scores(1, 1, 3, 3, 0), causal, **kwargs)


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_level_validation(policy):
    causal = causal_block_mask(3, 3)
    with pytest.raises(ValueError, match="lam"):
        SELECTION_POLICIES[policy](random_scores(1, 1, 3, 3, 0), causal, 2, lam=-1.0)
    if policy != "dense":  # the dense policy has no budget to bound
        with pytest.raises(ValueError, match=r"max_keep=-1 is invalid"):
            SELECTION_POLICIES[policy](random_scores(1, 1, 3, 3, 0), causal, torch.tensor([1, 2, 2]), max_keep=-1)


def test_bad_causal_mask_and_offsets():
    with pytest.raises(ValueError, match="causal"):
        select_blocks(random_scores(1, 1, 3, 3, 0), torch.ones(3, 4, dtype=torch.bool), policy="frc", sparsity=0.5)
    with pytest.raises(ValueError, match="q_block_offset"):
        causal_block_mask(2, 2, -1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bounded", [False, True])
def test_top_among_matches_a_sorted_loop_with_ties_nan_inf_and_signed_zeros(seed, bounded):
    """The top-k pass (one topk of max_count + 1, the threshold fallback for ties across the boundary) selects what
    sorting (rank desc, index asc) per row selects; rows with and without boundary ties both occur here."""
    from hf_icl.kernels.token_selection.topk import top_among as _top_among

    g = torch.Generator().manual_seed(seed)
    rows, n = 7, 23
    # few distinct values → many ties; then NaN, ±inf and -0.0 sprinkled in
    rank = torch.randint(-3, 4, (rows, n), generator=g).float()
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0])
    where = torch.rand(rows, n, generator=g) < 0.25
    rank[where] = specials[torch.randint(0, 5, (int(where.sum()),), generator=g)]
    candidate = torch.rand(rows, n, generator=g) < 0.7
    count = torch.randint(0, n + 1, (rows,), generator=g)
    chosen = _top_among(rank, candidate, count, int(count.max()) if bounded else None)

    lowest = torch.finfo(torch.float32).min

    def order_key(r, j):  # NaN and -inf candidates are the lowest floats; -0.0 equals 0.0
        value = rank[r, j].item()
        value = lowest if math.isnan(value) or value == float("-inf") else value
        return (-value, j)

    for r in range(rows):
        best = sorted((j for j in range(n) if candidate[r, j]), key=lambda j, r=r: order_key(r, j))[: count[r]]
        assert chosen[r].nonzero().flatten().tolist() == sorted(best), (r, rank[r], candidate[r], count[r])


def test_row_budget_bound_never_truncates_a_row():
    """select_blocks' host bound on the row budget (used for top-k) covers every row's real budget."""
    g = torch.Generator().manual_seed(0)
    for n_q, n_k, off in [(9, 9, 0), (1, 40, 39), (5, 17, 12), (64, 64, 0)]:
        scores = torch.randn(2, 3, n_q, n_k, generator=g)
        causal = causal_block_mask(n_q, n_k, off)
        for sparsity in (0.1, 0.5, 0.77, 0.9, 0.95):
            keep = select_blocks(scores, causal, policy="magnitude", sparsity=sparsity, budget="row")
            total = int(causal.sum())
            k = max(1, math.floor((1 - sparsity) * total / n_q + 0.5))
            forced = forced_blocks(causal, n_q, n_k, 0).sum(-1)
            expected = torch.maximum(causal.sum(-1).clamp(max=k), forced)  # the module docstring's rule
            assert torch.equal(keep.sum(-1), expected.expand(2, 3, n_q))
