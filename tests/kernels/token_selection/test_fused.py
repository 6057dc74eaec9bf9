"""The fused Triton token selection against the PyTorch reference (``select_token_blocks(backend="torch")``).

Equality is exact (``torch.equal``) over policies × scores × budgets × sparsities × local / sink windows ×
``min_seq_len`` × GQA ratios × prefill / chunked prefill / decode × block sizes × ragged lengths × dtypes. The kernel
and the reference sum a block score's D products in different orders, so random inputs only compare exactly when no
two candidates' scores lie within float32 rounding of each other (true of these seeded inputs); the tie tests use
small-integer inputs, whose scores every summation order computes exactly, so ties (duplicate key blocks) are real
ties in both and the tie rule — lower block index first — decides them. FRC's two-hop sums are not exact in either
implementation, so FRC policies are compared on continuous inputs only (the kernel's contract, see its module).

Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors; shapes stay small (a few programs per call).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from kernel_helpers import DEVICE, needs_triton, record_keyword

from hf_icl.attention.cab import CABParams, cab_attention_forward, select_cab_blocks
from hf_icl.kernels.block_sparse_decode import block_sparse_decode_reference, block_sparse_decode_triton
from hf_icl.kernels.token_selection import fused as fused_module
from hf_icl.kernels.token_selection import rule as ts
from hf_icl.kernels.token_selection.fused import (
    FUSED_POLICIES,
    MAX_KEY_BLOCKS,
    select_token_blocks_triton,
    selection_width,
)
from hf_icl.kernels.token_selection.rule import (
    key_block_summaries,
    select_token_blocks,
    selection_backend,
    token_block_scores,
)

POLICIES = FUSED_POLICIES  # dense, streaming, magnitude, frc, frc_low, hybrid
SCORES = ("bound", "mean", "max_l2")


def _inputs(b, h, kv_heads, n_q, n_k, d, *, seed=0, dtype=torch.float32, integer=False):
    """``query (b, h, n_q, d)`` and ``key (b, kv_heads, n_k, d)``: normal draws, or small integers (exact sums)."""
    gen = torch.Generator().manual_seed(seed)
    if integer:
        q = torch.randint(-2, 3, (b, h, n_q, d), generator=gen).float()
        k = torch.randint(-2, 3, (b, kv_heads, n_k, d), generator=gen).float()
    else:
        q, k = torch.randn(b, h, n_q, d, generator=gen), torch.randn(b, kv_heads, n_k, d, generator=gen)
    return q.to(dtype).to(DEVICE), k.to(dtype).to(DEVICE)


def _compare(query, key, **rule):
    """Both backends on the same inputs; exact equality; returns the reference's selection."""
    rule = {"scaling": 0.25, "block_size": 16, **rule}
    expected = select_token_blocks(query, key, backend="torch", **rule)
    fused = select_token_blocks(query, key, backend="triton", **rule)
    assert fused.dtype == torch.bool and fused.shape == expected.shape
    mismatch = (fused != expected).nonzero()[:5].tolist()
    assert torch.equal(fused, expected), f"{rule}: first (b, h, t, block) mismatches {mismatch}"
    return expected


def _candidates(n_q, n_k, block_size, local_blocks, sink_blocks):
    """``(Nq, Mk)`` bool: the blocks each query ranks (visible, outside its local window and the sinks)."""
    own = ((n_k - n_q + torch.arange(n_q)) // block_size)[:, None]
    cols = torch.arange(-(-n_k // block_size))
    return (cols <= own - local_blocks) & (cols >= sink_blocks)


# ---------------------------------------------------------------------------------------------------------------
# exact equality with the reference
# ---------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("budget", ["row", "topk"])
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_score_and_budget(policy, score, budget):
    """GQA 2, 75 tokens in 16-token blocks (ragged), a second local block and two sinks."""
    q, k = _inputs(1, 2, 1, 75, 75, 16, seed=3)
    _compare(q, k, policy=policy, score=score, budget=budget, sparsity=0.6, topk=3, local_blocks=2, sink_blocks=2)


@needs_triton
@pytest.mark.parametrize("dot", [False, True], ids=["outer products", "tl.dot"])
@pytest.mark.parametrize("dim", [32, 24], ids=["D=32", "D=24 (a partial chunk of 16)"])
def test_both_ways_of_scoring_select_what_the_reference_does(monkeypatch, dot, dim):
    """Prefill tiles (>= 16 rows) score with a float32 tl.dot by default and decode's few rows with outer products;
    each way, forced on every tile it can take, selects what the reference does (bound / mean scores, row / topk
    budgets, GQA, FRC), and the launch really took it."""
    monkeypatch.setattr(fused_module, "_DOT_SCORES", dot)
    taken, decide = [], fused_module._scores_with_dot
    monkeypatch.setattr(fused_module, "_scores_with_dot", lambda rows: taken.append(decide(rows)) or taken[-1])
    q, k = _inputs(1, 4, 2, 70, 70, dim, seed=11)
    for score, budget in itertools.product(("bound", "mean"), ("row", "topk")):
        _compare(q, k, policy="magnitude", score=score, budget=budget, sparsity=0.6, topk=3)
    _compare(q, k, policy="hybrid", score="mean", sparsity=0.5)
    assert taken == [dot] * 5
    one, _ = _inputs(1, 4, 2, 1, 70, dim, seed=12)  # a decode step: 2 rows per program, outer products either way
    _compare(one, k, policy="magnitude", score="mean", sparsity=0.6)
    assert taken[-1] is False


@needs_triton
@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.75, 0.95])
def test_sparsities_windows_sinks_and_dense_prefixes(sparsity):
    """Every combination of local window, sinks and min_seq_len at each sparsity, row budget (and topk at one)."""
    q, k = _inputs(1, 1, 1, 120, 120, 8, seed=4)
    for policy, local, sink, min_seq_len in itertools.product(
        ("magnitude", "streaming", "frc"), (1, 3), (0, 2), (0, 40)
    ):
        rule = {"local_blocks": local, "sink_blocks": sink, "min_seq_len": min_seq_len, "policy": policy}
        _compare(q, k, score="mean", sparsity=sparsity, **rule)
        if sparsity == 0.75:
            _compare(q, k, score="bound", budget="topk", topk=4, **rule)


@needs_triton
@pytest.mark.parametrize(("heads", "kv_heads", "batch"), [(2, 2, 2), (4, 2, 1), (3, 1, 1), (4, 1, 2)])
@pytest.mark.parametrize("policy", ["magnitude", "hybrid"])
def test_grouped_query_attention(heads, kv_heads, batch, policy):
    """Query head h reads KV head h // (H / Hk): ratios 1, 2, 3 (a group that is no power of two) and 4."""
    q, k = _inputs(batch, heads, kv_heads, 70, 70, 16, seed=heads + kv_heads)
    _compare(q, k, policy=policy, score="bound", sparsity=0.5)


@needs_triton
@pytest.mark.parametrize(
    ("n_q", "n_k"),
    [(96, 96), (32, 96), (17, 83), (1, 1), (1, 16), (1, 17), (1, 250)],
    ids=["prefill", "chunk", "ragged-chunk", "decode-first", "decode-16", "decode-17", "decode-250"],
)
@pytest.mark.parametrize("policy", ["magnitude", "streaming", "frc_low"])
def test_prefill_chunked_prefill_and_decode(n_q, n_k, policy):
    """Queries are the last Nq of Nk positions: a whole prompt, a cached chunk (block-aligned or not), one token."""
    q, k = _inputs(1, 2, 1, n_q, n_k, 16, seed=n_q + n_k)
    _compare(q, k, policy=policy, score="max_l2", sparsity=0.7, sink_blocks=1)
    _compare(q, k, policy=policy, score="mean", budget="topk", topk=2, sink_blocks=0)


@needs_triton
@pytest.mark.parametrize(("block_size", "n"), [(16, 300), (32, 201), (64, 130), (24, 100)])
def test_block_sizes_and_long_rows(block_size, n):
    """Block sizes 16 to 64 (and 24: the rule takes any), Mk up to 19 (several two-hop chunks of 16 blocks)."""
    q, k = _inputs(1, 2, 2, n, n, 16, seed=block_size)
    for policy in ("magnitude", "frc", "hybrid"):
        _compare(q, k, policy=policy, score="bound", sparsity=0.8, block_size=block_size)


@needs_triton
@pytest.mark.parametrize("head_dim", [8, 80])
def test_head_dims_that_are_not_a_tile(head_dim):
    """Head dims that are no power of two or smaller than the usual 32: the scores loop over D, any D works."""
    q, k = _inputs(1, 2, 1, 50, 50, head_dim, seed=head_dim)
    for score in SCORES:
        _compare(q, k, policy="magnitude", score=score, sparsity=0.5, scaling=head_dim**-0.5)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["magnitude", "frc", "hybrid"])
def test_low_precision_inputs_select_what_the_reference_selects_on_them(dtype, policy):
    """bf16 / fp16 queries and keys: both upcast exactly to float32 before scoring, so the same selection."""
    q, k = _inputs(1, 4, 2, 90, 90, 32, seed=5, dtype=dtype)
    for score in SCORES:
        _compare(q, k, policy=policy, score=score, sparsity=0.6, scaling=32**-0.5)


@needs_triton
def test_row_budget_rounds_in_float64_like_the_reference():
    """sparsity 0.9, own block 14: (1 - 0.9) * 15 = 1.4999999999999996 in float64 rounds to 1 block (float32: 2)."""
    assert math.floor((1 - 0.9) * 15 + 0.5) == 1 and math.floor(float(torch.tensor(0.1) * 15) + 0.5) == 2
    q, k = _inputs(1, 1, 1, 16, 240, 8, seed=12)  # the 16 queries all sit in block 14
    for policy in ("streaming", "magnitude"):
        keep = _compare(q, k, policy=policy, score="mean", sparsity=0.9, sink_blocks=0)
        assert keep.sum(-1).eq(1).all()  # the own block only


# ---------------------------------------------------------------------------------------------------------------
# ties
# ---------------------------------------------------------------------------------------------------------------


def _with_duplicate_blocks(k, block_size, pairs):
    """Copy block ``src``'s keys over block ``dst`` for each pair: two blocks with equal summaries (equal scores)."""
    k = k.clone()
    for src, dst in pairs:
        k[:, :, dst * block_size : (dst + 1) * block_size] = k[:, :, src * block_size : (src + 1) * block_size]
    return k


def _decided_ties(query, key, keep, score, block_size, local_blocks, sink_blocks):
    """How many (row, pair of candidates) have equal scores with exactly one of the two kept: ties the rule broke."""
    scores = token_block_scores(query, key_block_summaries(key, block_size, score), 0.25)
    cand = _candidates(query.shape[2], key.shape[2], block_size, local_blocks, sink_blocks).to(scores.device)
    s = scores.masked_fill(~cand, float("nan"))  # NaN never equals: pairs of candidates only
    equal = s[..., :, None] == s[..., None, :]
    one_kept = keep[..., :, None] != keep[..., None, :]
    return int((equal & one_kept).sum()) // 2


@needs_triton
@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize(("budget", "local", "sink"), [("row", 1, 1), ("topk", 2, 0), ("row", 1, 0)])
def test_ties_go_to_the_lower_block_exactly_as_in_the_reference(score, budget, local, sink):
    """Small-integer queries and keys (every score exact) and duplicated key blocks: many exact ties, decided."""
    q, k = _inputs(1, 2, 1, 140, 140, 8, seed=11, integer=True)
    k = _with_duplicate_blocks(k, 16, [(1, 3), (2, 5), (1, 6)])
    rule = {"budget": budget, "local_blocks": local, "sink_blocks": sink, "sparsity": 0.6, "topk": 3}
    keep = _compare(q, k, policy="magnitude", score=score, **rule)
    _compare(q, k, policy="streaming", score=score, **rule)
    assert _decided_ties(q, k, keep, score, 16, local, sink) > 0  # the tie rule was exercised, not avoided


@needs_triton
def test_all_equal_scores_keep_the_earliest_candidates():
    """Zero queries score every block 0: each token keeps its sink, its own block and the earliest candidates."""
    q = torch.zeros(1, 1, 64, 16, device=DEVICE)
    k = _inputs(1, 1, 1, 64, 64, 16, seed=2)[1]
    keep = _compare(q, k, policy="magnitude", score="mean", budget="topk", topk=3, sink_blocks=0)
    assert keep[0, 0, -1].tolist() == [True, True, False, True]  # own block 3, then blocks 0 and 1 (not 2)


@needs_triton
@pytest.mark.parametrize("inputs", ["untied", "integer ties", "all equal"])
def test_the_early_exit_bisection_selects_what_the_reference_does(monkeypatch, inputs):
    """The bisection that stops a tile once each row's bound is found (``_EARLY_EXIT``, off by default until timed
    on a GPU) keeps what the reference keeps: untied scores under every ranking policy, many exact ties (integer
    inputs with duplicated blocks, where rows need all 32 passes), every score equal."""
    monkeypatch.setattr(fused_module, "_EARLY_EXIT", True)
    rule = {"sparsity": 0.6, "topk": 3}
    if inputs == "untied":
        q, k = _inputs(1, 4, 2, 90, 90, 16, seed=21)
        for policy, budget in itertools.product(("magnitude", "frc", "frc_low", "hybrid"), ("row", "topk")):
            _compare(q, k, policy=policy, score="mean", budget=budget, **rule)
        return
    if inputs == "integer ties":
        q, k = _inputs(1, 2, 1, 140, 140, 8, seed=11, integer=True)
        k = _with_duplicate_blocks(k, 16, [(1, 3), (2, 5), (1, 6)])
    else:
        q, k = torch.zeros(1, 1, 140, 8, device=DEVICE), _inputs(1, 1, 1, 140, 140, 8, seed=2)[1]
    for score, budget in itertools.product(SCORES, ("row", "topk")):
        _compare(q, k, policy="magnitude", score=score, budget=budget, **rule)


# ---------------------------------------------------------------------------------------------------------------
# indices and counts
# ---------------------------------------------------------------------------------------------------------------


def _fused(query, key, *, return_indices=True, **rule):
    rule = {"scaling": 0.25, "block_size": 16, "policy": "magnitude", "sparsity": 0.7, **rule}
    summaries = key_block_summaries(key, rule["block_size"], rule.pop("score", "bound"))
    return select_token_blocks_triton(query, summaries, n_keys=key.shape[2], return_indices=return_indices, **rule)


@needs_triton
@pytest.mark.parametrize(
    "rule",
    [{}, {"min_seq_len": 50}, {"policy": "streaming", "budget": "topk", "topk": 2}, {"policy": "dense"}],
    ids=["magnitude", "dense-prefix", "streaming-topk", "dense"],
)
def test_indices_list_the_kept_blocks_ascending_with_counts(rule):
    """Per token: its kept block ids in ascending order, then its last one repeated up to the host-side width;
    counts = blocks kept."""
    q, k = _inputs(1, 2, 1, 100, 100, 16, seed=6)
    keep, indices, counts = _fused(q, k, **rule)
    width = selection_width(7, n_keys=100, block_size=16, **{"policy": "magnitude", "sparsity": 0.7, **rule})
    assert indices.shape == (1, 2, 100, width) and indices.dtype == counts.dtype == torch.int32
    assert torch.equal(counts, keep.sum(-1).int())
    for b, h, t in itertools.product(range(1), range(2), range(100)):
        kept = keep[b, h, t].nonzero().flatten().tolist()
        assert indices[b, h, t].tolist() == kept + kept[-1:] * (width - len(kept))


@needs_triton
def test_decode_kernel_consumes_the_fused_indices_without_a_host_sync():
    """Decode (Nq = 1) indices / counts are the split-K decode kernel's (B, H, 1, K) / (B, H, 1) operands."""
    q, k = _inputs(1, 4, 2, 1, 150, 32, seed=7)
    v = _inputs(1, 2, 2, 1, 150, 32, seed=8)[1]
    keep, indices, counts = _fused(q, k, scaling=32**-0.5)
    args = {"block_size": 16, "scaling": 32**-0.5, "q_offset": 149}
    out = block_sparse_decode_triton(q, k, v, indices, counts, **args)
    torch.testing.assert_close(out, block_sparse_decode_reference(q, k, v, keep, **args), atol=1e-5, rtol=1e-5)


def test_selection_width_bounds_every_row():
    """The bound the indices are laid out with: budget, forced blocks and dense prefixes, capped at Mk."""
    assert selection_width(100, n_keys=6400, block_size=64, policy="magnitude", sparsity=0.9) == 11
    assert selection_width(100, n_keys=6400, block_size=64, policy="frc", budget="topk", topk=4) == 4
    assert selection_width(100, n_keys=6400, block_size=64, policy="frc", budget="topk", topk=1, local_blocks=3) == 4
    assert selection_width(100, n_keys=6400, block_size=64, policy="streaming", min_seq_len=1024) == 16
    assert selection_width(100, n_keys=6400, block_size=64, policy="dense") == 100
    assert selection_width(5, n_keys=300, block_size=64, policy="magnitude", budget="topk", topk=50) == 5


# ---------------------------------------------------------------------------------------------------------------
# dispatch, wiring and errors
# ---------------------------------------------------------------------------------------------------------------


def _spy(monkeypatch, module=ts):
    return record_keyword(monkeypatch, module, "select_token_blocks_triton", "policy")


def test_auto_keeps_the_reference_on_cpu_tensors(monkeypatch):
    q, k = torch.randn(1, 2, 40, 8), torch.randn(1, 1, 40, 8)
    calls = _spy(monkeypatch)
    select_token_blocks(q, k, scaling=0.3, block_size=16, policy="magnitude")  # backend="auto"
    assert calls == [] and selection_backend("auto", q, 40, 16, "magnitude") == "torch"


@needs_triton
def test_auto_takes_the_kernel_where_cuda_would_and_the_reference_for_what_it_lacks(monkeypatch):
    """With resolve_backend answering as on a GPU: supported calls take the kernel, padded / oracle ones do not."""
    monkeypatch.setattr(ts, "resolve_backend", lambda backend, q: "torch" if backend == "torch" else "triton")
    calls = _spy(monkeypatch)
    q, k = _inputs(1, 2, 1, 40, 40, 8)
    rule = {"scaling": 0.3, "block_size": 16, "sparsity": 0.5}
    assert torch.equal(
        select_token_blocks(q, k, policy="frc", **rule),
        select_token_blocks(q, k, policy="frc", backend="torch", **rule),
    )
    assert calls == ["frc"]
    valid = torch.ones(1, 40, dtype=torch.bool, device=DEVICE)
    valid[:, :3] = False
    select_token_blocks(q, k, policy="magnitude", key_valid=valid, **rule)
    select_token_blocks(q, k, policy="oracle", **rule)
    assert calls == ["frc"]  # both on the PyTorch path, no error


@needs_triton
def test_forcing_triton_names_what_is_unsupported():
    q, k = _inputs(1, 2, 1, 40, 40, 8)
    rule = {"scaling": 0.3, "block_size": 16}
    valid = torch.ones(1, 40, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="backend='triton' cannot run this selection: padded batches"):
        select_token_blocks(q, k, policy="magnitude", key_valid=valid, backend="triton", **rule)
    with pytest.raises(ValueError, match="policy='oracle' is not fused"):
        select_token_blocks(q, k, policy="oracle", backend="triton", **rule)
    with pytest.raises(ValueError, match=r"backend must be one of \['auto', 'triton', 'torch'\], got 'cuda'"):
        select_token_blocks(q, k, policy="magnitude", backend="cuda", **rule)


@needs_triton
def test_too_many_key_blocks_is_refused_before_launch():
    q = torch.zeros(1, 1, 1, 8, device=DEVICE)
    n_keys = 16 * MAX_KEY_BLOCKS + 1
    with pytest.raises(ValueError, match=f"exceed the kernel's {MAX_KEY_BLOCKS}"):
        selection_backend("triton", q, n_keys, 16, "streaming")
    with pytest.raises(ValueError, match=f"at most {MAX_KEY_BLOCKS}"):
        select_token_blocks_triton(q, None, n_keys=n_keys, scaling=1.0, block_size=16, policy="streaming")


@needs_triton
def test_kernel_entry_point_validates_its_arguments():
    q, k = _inputs(1, 2, 1, 40, 40, 8)
    summaries = key_block_summaries(k, 16, "mean")
    base = {"n_keys": 40, "scaling": 0.3, "block_size": 16}
    cases = [
        ({"policy": "oracle"}, summaries, r"policy must be one of .*got 'oracle'"),
        ({"policy": "magnitude", "budget": "global"}, summaries, r"budget must be one of \['row', 'topk'\]"),
        ({"policy": "magnitude", "sparsity": 1.0}, summaries, r"sparsity must be a number in \[0, 1\), got 1.0"),
        ({"policy": "magnitude", "n_keys": 39}, summaries, r"n_keys must be an integer in \[40, "),
        ({"policy": "magnitude", "local_blocks": 0}, summaries, "local_blocks must be an integer in"),
        ({"policy": "magnitude"}, None, "summaries must be a tuple of 1 tensor"),
        ({"policy": "magnitude"}, (summaries[0].double(),), r"summaries\[0\] must be a float32"),
        ({"policy": "magnitude"}, (summaries[0][:, :, :1],), "summaries must cover between 2"),
        ({"policy": "frc"}, summaries, r"hop must be a float32 tensor of shape \(B, Hk, Mk, Mk\)"),
        ({"policy": "magnitude", "scaling": -1.0}, summaries, "scaling must be a finite positive number"),
    ]
    for overrides, given, message in cases:
        with pytest.raises(ValueError, match=message):
            select_token_blocks_triton(q, given, **{**base, **overrides})


@needs_triton
def test_cab_selection_and_attention_use_the_fused_kernel_when_triton_is_forced(monkeypatch):
    """select_cab_blocks passes cab_backend on; a padded call stays on PyTorch and the attention route says why."""
    calls = _spy(monkeypatch)
    params = CABParams(sparsity=0.5, block_size=16, min_seq_len=0, policy="magnitude", score="bound", backend="triton")
    q, k = _inputs(1, 4, 2, 70, 70, 32, seed=9)
    keep = select_cab_blocks(q, k, params, 0.2)
    assert calls == ["magnitude"]
    assert torch.equal(keep, select_cab_blocks(q, k, CABParams(**{**params.__dict__, "backend": "torch"}), 0.2))
    valid = torch.ones(1, 70, dtype=torch.bool, device=DEVICE)
    valid[:, :4] = False
    select_cab_blocks(q, k, params, 0.2, key_valid=valid)  # padded: the PyTorch selection, no error
    assert calls == ["magnitude"]
    module = type("M", (), {"config": type("C", (), params.to_config_fields())(), "training": False})()
    out, _ = cab_attention_forward(module, q[:, :, -1:], k, k, None)  # a decode step on the split-K kernel
    assert calls == ["magnitude", "magnitude"] and out.shape == (1, 1, 4, 32)
