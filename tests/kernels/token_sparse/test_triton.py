"""Per-token block-sparse attention in Triton (key-block-major, LSE merge) against a float64 dense reference.

CPU tensors under ``TRITON_INTERPRET=1`` (the Makefile sets it), CUDA tensors when a GPU is visible. The reference is
a dense float64 softmax under the per-token mask that (indices, counts, lengths, q_offset, causality) define.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import DEVICE, needs_triton

from hf_icl.kernels.token_sparse.triton_backward import token_sparse_attention_triton
from hf_icl.kernels.token_sparse.triton_forward import token_sparse_forward_triton
from hf_icl.kernels.token_sparse.triton_pairs import build_pair_list, cut_work_items, item_bound

# the kernels run on CUDA, or on CPU tensors under TRITON_INTERPRET=1 (how CI runs them)
pytestmark = needs_triton

# ----------------------------------------------------------------------------------------------------------------
# Helpers: random selections and the float64 reference
# ----------------------------------------------------------------------------------------------------------------


def random_selection(batch, heads, n_q, n_k, block_size, q_offset, *, keep=0.5, zero_counts=0, seed=0):
    """For each (b, h, t) a random subset of the blocks up to its own (always its own), in (indices, counts) form:
    ascending ids, padding slots repeat the last valid one (0 when the count is 0). ``zero_counts`` random queries
    get count 0."""
    gen = torch.Generator().manual_seed(seed)
    mk = math.ceil(n_k / block_size)
    own = (q_offset + torch.arange(n_q)) // block_size  # (Nq,)
    blocks = torch.arange(mk)
    chosen = (torch.rand(batch, heads, n_q, mk, generator=gen) < keep) & (blocks <= own[:, None])
    chosen |= blocks == own[:, None]
    counts = chosen.sum(-1)
    if zero_counts:
        flat = torch.randperm(batch * heads * n_q, generator=gen)[:zero_counts]
        chosen.view(-1, mk)[flat] = False
        counts.view(-1)[flat] = 0
    width = int(counts.max())
    # ascending ids of the chosen blocks first: sort by (not chosen, id)
    order = torch.sort(torch.where(chosen, blocks, mk + blocks), dim=-1).values[..., :width]
    slot = torch.arange(width)
    last = order.gather(-1, (counts - 1).clamp(min=0)[..., None])
    indices = torch.where(slot < counts[..., None], order, last)
    indices = torch.where(counts[..., None] > 0, indices, 0)
    return indices.to(torch.int32).to(DEVICE), counts.to(torch.int32).to(DEVICE)


def token_mask(indices, counts, n_k, block_size, q_offset, lengths=None):
    """Bool ``(B, H, Nq, Nk)``: key ``s`` is visible to query ``t``."""
    batch, heads, n_q, width = indices.shape
    mk = math.ceil(n_k / block_size)
    valid = torch.arange(width, device=indices.device) < counts[..., None]
    slots = torch.where(valid, indices.long(), mk)
    selected = torch.zeros(batch, heads, n_q, mk + 1, dtype=torch.bool, device=indices.device)
    selected = selected.scatter(-1, slots, True)[..., :mk]
    k_pos = torch.arange(n_k, device=indices.device)
    q_pos = q_offset + torch.arange(n_q, device=indices.device)
    mask = selected[..., k_pos // block_size] & (k_pos <= q_pos[:, None])
    if lengths is not None:
        row = lengths.view(batch, 1, 1, 1).to(indices.device)
        mask = mask & (k_pos < row) & (q_pos[:, None] < row)
    return mask


def reference(q, k, v, mask, scaling):
    """Dense softmax attention in float64 under ``mask``; rows with no key give zeros and lse = -inf."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~mask, float("-inf"))
    seen = mask.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~seen, 0.0), -1) * seen
    return probs @ v, torch.logsumexp(scores, -1)


def make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype=torch.float32, seed=0, strided=False):
    gen = torch.Generator().manual_seed(seed + 1)
    if strided:  # (B, N, H, D) storage viewed as (B, H, N, D), as a projection's reshape gives
        q = torch.randn(batch, n_q, heads, head_dim, generator=gen).transpose(1, 2)
        k = torch.randn(batch, n_k, kv_heads, head_dim, generator=gen).transpose(1, 2)
        v = torch.randn(batch, n_k, kv_heads, head_dim, generator=gen).transpose(1, 2)
    else:
        q = torch.randn(batch, heads, n_q, head_dim, generator=gen)
        k = torch.randn(batch, kv_heads, n_k, head_dim, generator=gen)
        v = torch.randn(batch, kv_heads, n_k, head_dim, generator=gen)
    return tuple(x.to(device=DEVICE, dtype=dtype) for x in (q, k, v))


# (B, H, Hk, Nq, Nk, D, block, q_offset, lengths, zero_counts)
CASES = {
    "ragged_prefill_gqa": (2, 4, 2, 150, 150, 32, 32, 0, None, 0),
    "chunked_prefill_mqa": (1, 4, 1, 40, 150, 16, 16, 110, None, 3),
    "decode_mqa": (2, 4, 1, 1, 137, 64, 32, 136, None, 0),
    "lengths_zero_counts": (2, 2, 2, 100, 100, 32, 16, 0, [100, 61], 5),
    "block64_d64": (1, 2, 1, 200, 200, 64, 64, 0, None, 0),
    "block128_chunk": (1, 2, 2, 70, 200, 16, 128, 130, [190], 0),
    "decode_lengths": (2, 4, 2, 1, 90, 32, 16, 89, [90, 40], 0),
    "d128_chunk": (1, 2, 1, 20, 100, 128, 32, 80, None, 0),
}


def run_case(name, dtype=torch.float32, *, strided=False, seed=0):
    batch, heads, kv_heads, n_q, n_k, head_dim, block, offset, lengths, zeros = CASES[name]
    q, k, v = make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, seed=seed, strided=strided)
    indices, counts = random_selection(batch, heads, n_q, n_k, block, offset, zero_counts=zeros, seed=seed)
    lengths = None if lengths is None else torch.tensor(lengths, device=DEVICE)
    mask = token_mask(indices, counts, n_k, block, offset, lengths)
    kwargs = dict(block_size=block, scaling=head_dim**-0.5, q_offset=offset, lengths=lengths)
    return q, k, v, indices, counts, mask, kwargs


# ----------------------------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_float64_reference(name):
    q, k, v, indices, counts, mask, kwargs = run_case(name, strided=name == "ragged_prefill_gqa")
    out, lse = token_sparse_attention_triton(q, k, v, indices, counts, return_lse=True, **kwargs)
    ref, ref_lse = reference(q, k, v, mask, kwargs["scaling"])
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=2e-6)  # -inf where nothing is seen
    empty = ~mask.any(-1)
    assert torch.all(out[empty] == 0) and torch.all(lse[empty] == float("-inf"))
    assert not torch.isnan(out).any()
    # the forward alone gives the same
    out2, lse2 = token_sparse_forward_triton(q, k, v, indices, counts, **kwargs)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_padded_queries_and_zero_counts_give_zeros():
    q, k, v, indices, counts, mask, kwargs = run_case("lengths_zero_counts")
    out, lse = token_sparse_attention_triton(q, k, v, indices, counts, return_lse=True, **kwargs)
    assert torch.all(out[1, :, 61:] == 0) and torch.all(lse[1, :, 61:] == float("-inf"))
    zero = counts == 0
    assert zero.sum() == 5 and torch.all(out[zero] == 0) and torch.all(lse[zero] == float("-inf"))


def test_expanded_selection_and_dense_list():
    """An expanded (stride-0) selection shared by every head, listing every block up to the last query's, including
    blocks wholly after some queries (masked by causality, never NaN)."""
    batch, heads, kv_heads, n_q, n_k, head_dim, block = 2, 4, 2, 50, 150, 32, 32
    q, k, v = make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim)
    mk = math.ceil(n_k / block)
    indices = torch.arange(mk, dtype=torch.int32, device=DEVICE).view(1, 1, 1, mk).expand(batch, heads, n_q, mk)
    counts = torch.full((1, 1, 1), mk, dtype=torch.int32, device=DEVICE).expand(batch, heads, n_q)
    out = token_sparse_attention_triton(q, k, v, indices, counts, block_size=block, scaling=0.2, q_offset=100)
    ref, _ = reference(q, k, v, token_mask(indices, counts, n_k, block, 100), 0.2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-6)
    dense = F.scaled_dot_product_attention(
        q.double(),
        k.double().repeat_interleave(2, 1),
        v.double().repeat_interleave(2, 1),
        attn_mask=torch.ones(n_q, n_k, dtype=torch.bool, device=DEVICE).tril(100),
        scale=0.2,
    )
    torch.testing.assert_close(out.double(), dense, rtol=1e-5, atol=2e-6)


# ----------------------------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["ragged_prefill_gqa", "chunked_prefill_mqa", "decode_mqa", "lengths_zero_counts", "block128_chunk"]
)
def test_gradients_match_float64_reference(name):
    q, k, v, indices, counts, mask, kwargs = run_case(name, seed=1)
    gen = torch.Generator().manual_seed(7)
    dout = torch.randn(q.shape, generator=gen).to(DEVICE)
    dlse = torch.randn(q.shape[:3], generator=gen).to(DEVICE)
    use_lse = name in ("chunked_prefill_mqa", "lengths_zero_counts")  # the lse's gradient folds into delta

    ours = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = token_sparse_attention_triton(*ours, indices, counts, return_lse=True, **kwargs)
    loss = (out * dout).sum()
    if use_lse:
        loss = loss + (lse.masked_fill(lse.isinf(), 0.0) * dlse).sum()
    loss.backward()

    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref, ref_lse = reference(*refs, mask, kwargs["scaling"])
    ref_loss = (ref * dout.double()).sum()
    if use_lse:
        ref_loss = ref_loss + (ref_lse.masked_fill(ref_lse.isinf(), 0.0) * dlse.double()).sum()
    ref_loss.backward()
    for label, mine, theirs in zip("qkv", ours, refs, strict=True):
        assert mine.grad.dtype == mine.dtype, label
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-5, atol=1e-5, msg=f"d{label}")
    empty = ~mask.any(-1)
    assert torch.all(ours[0].grad[empty] == 0)


# ----------------------------------------------------------------------------------------------------------------
# Half precision: no worse than SDPA in the same dtype
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["ragged_prefill_gqa", "block64_d64"])
def test_half_precision_error_no_worse_than_sdpa(name, dtype):
    q, k, v, indices, counts, mask, kwargs = run_case(name, dtype, seed=2)
    scaling = kwargs["scaling"]
    ours = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = token_sparse_attention_triton(*ours, indices, counts, **kwargs)
    group = q.shape[1] // k.shape[1]
    theirs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    sdpa = F.scaled_dot_product_attention(
        theirs[0],
        theirs[1].repeat_interleave(group, 1),
        theirs[2].repeat_interleave(group, 1),
        attn_mask=mask,
        scale=scaling,
    )
    refs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref, _ = reference(*refs, mask, scaling)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    (out.float() * dout).sum().backward()
    (sdpa.float() * dout).sum().backward()
    (ref * dout.double()).sum().backward()
    slack = 1e-3 if dtype == torch.bfloat16 else 1e-4
    seen = mask.any(-1)  # every query sees a key here (no padding, no empty selections)
    assert seen.all()
    for label, mine, base, exact in (
        ("out", out, sdpa, ref),
        *((f"d{x}", a.grad, b.grad, c.grad) for x, a, b, c in zip("qkv", ours, theirs, refs, strict=True)),
    ):
        assert mine.dtype == dtype
        err = (mine.double() - exact).abs().max().item()
        base_err = (base.double() - exact).abs().max().item()
        assert err <= 1.5 * base_err + slack, f"{label}: {err} vs SDPA {base_err}"


# ----------------------------------------------------------------------------------------------------------------
# Work list
# ----------------------------------------------------------------------------------------------------------------


def test_work_list_covers_live_pairs_once():
    batch, heads, kv_heads, n_q, n_k, block = 2, 4, 2, 60, 150, 16
    indices, counts = random_selection(batch, heads, n_q, n_k, block, n_k - n_q, zero_counts=4, seed=5)
    lengths = torch.tensor([150, 101], device=DEVICE)
    pairs = build_pair_list(
        indices, counts, kv_heads=kv_heads, n_keys=n_k, block_size=block, q_offset=n_k - n_q, lengths=lengths
    )
    items = cut_work_items(pairs, 16)
    n_pairs = indices.numel()
    assert items.n_items == item_bound(n_pairs, pairs.n_blocks, 16)
    lens = (items.end - items.start).cpu()
    assert torch.all(lens >= 0) and torch.all(lens <= 16)
    real = lens > 0
    assert int(lens.sum()) == int(pairs.bounds[-1])  # every live pair in exactly one item
    covered = torch.zeros(n_pairs, dtype=torch.int64)
    for s, e in zip(items.start.cpu()[real].tolist(), items.end.cpu()[real].tolist(), strict=True):
        covered[s:e] += 1
    assert torch.all(covered[: int(pairs.bounds[-1])] == 1) and torch.all(covered[int(pairs.bounds[-1]) :] == 0)
    # every pair of an item belongs to the item's KV block, and the live pairs are exactly the mask's blocks
    mask = token_mask(indices, counts, n_k, block, n_k - n_q, lengths)
    width = indices.shape[3]
    pid = pairs.order.cpu()
    b, h, t, s = pid // (width * n_q * heads), pid // (width * n_q) % heads, pid // width % n_q, pid % width
    blk = indices.cpu().long()[b, h, t, s]
    key = (b * kv_heads + h // (heads // kv_heads)) * math.ceil(n_k / block) + blk
    for i in torch.nonzero(real).flatten().tolist():
        assert torch.all(key[items.start[i] : items.end[i]] == items.kvb[i].cpu())
    live = pid[: int(pairs.bounds[-1])]
    assert mask.view(-1, n_k).any(-1).sum() == torch.unique(live // width).numel()


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def _good():
    q, k, v = make_inputs(1, 2, 1, 20, 40, 16)
    indices, counts = random_selection(1, 2, 20, 40, 16, 20)
    return dict(q=q, k=k, v=v, indices=indices, counts=counts, block_size=16, scaling=0.25, q_offset=20)


def _call(**kw):
    return token_sparse_attention_triton(
        kw.pop("q"), kw.pop("k"), kw.pop("v"), kw.pop("indices"), kw.pop("counts"), **kw
    )


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda a: a.update(q=a["q"][..., :8]), "q"),
        (lambda a: a.update(k=a["k"].half()), "k.dtype"),
        (lambda a: a.update(v=a["v"][:, :, :30]), "v"),
        (lambda a: a.update(block_size=24), "block_size"),
        (lambda a: a.update(scaling=-1.0), "scaling"),
        (lambda a: a.update(q_offset=25), "q_offset"),
        (lambda a: a.update(indices=a["indices"].float()), "indices.dtype"),
        (lambda a: a.update(indices=a["indices"][:, :1]), "indices"),
        (lambda a: a.update(counts=a["counts"][..., :5]), "counts"),
        (lambda a: a.update(counts=a["counts"] + 100), "counts"),
        (lambda a: a.update(indices=a["indices"] + 7), "indices"),
        (lambda a: a.update(indices=a["indices"].flip(-1)), "ascending"),
        (lambda a: a.update(lengths=torch.tensor([10, 20], device=DEVICE)), "lengths"),
        (lambda a: a.update(lengths=torch.tensor([41], device=DEVICE)), "lengths"),
    ],
)
def test_validation_names_the_argument(change, needle):
    args = _good()
    change(args)
    with pytest.raises(ValueError, match=needle):
        _call(**args)


def test_validation_off_runs_and_matches():
    args = _good()
    a = _call(**args)
    b = _call(**args, validate=False)
    assert torch.equal(a, b)


@pytest.mark.skipif(DEVICE != "cuda", reason="device synchronisation is only observable on CUDA")
def test_no_device_sync_without_validation():  # pragma: no cover - GPU only
    q, k, v, indices, counts, mask, kwargs = run_case("lengths_zero_counts", torch.bfloat16)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    token_sparse_attention_triton(q, k, v, indices, counts, validate=False, **kwargs).sum().backward()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = token_sparse_attention_triton(q, k, v, indices, counts, validate=False, **kwargs)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ----------------------------------------------------------------------------------------------------------------
# The decode entry: per-row key starts of a left-padded batch
# ----------------------------------------------------------------------------------------------------------------


def test_decode_with_row_starts_equals_each_row_alone():
    """``token_sparse_decode`` with ``row_starts`` gives each left-padded row what that row gives alone on its real
    keys (blocks numbered from its first real key), grouped-query heads, whatever the padding holds."""
    from hf_icl.kernels.token_sparse import token_sparse_decode

    n_k, bs, starts = 80, 16, [0, 21, 64]
    g = torch.Generator().manual_seed(11)
    q = torch.randn(3, 4, 1, 32, generator=g).to(DEVICE)
    k, v = (torch.randn(3, 2, n_k, 32, generator=g).to(DEVICE) for _ in range(2))
    for b, start in enumerate(starts):
        k[b, :, :start], v[b, :, :start] = float("nan"), float("nan")
    indices = torch.zeros(3, 4, 1, 5, dtype=torch.int32)
    counts = torch.zeros(3, 4, 1, dtype=torch.int32)
    for b, start in enumerate(starts):
        own = (n_k - 1 - start) // bs  # the query's own real block, plus a random subset of those before it
        chosen = [j for j in range(own) if torch.rand(1, generator=g).item() < 0.5] + [own]
        indices[b, :, 0, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
        indices[b, :, 0, len(chosen) :] = own
        counts[b] = len(chosen)
    indices, counts = indices.to(DEVICE), counts.to(DEVICE)
    kwargs = dict(block_size=bs, scaling=32**-0.5)
    out = token_sparse_decode(
        q, k, v, indices, counts, q_offset=n_k - 1, row_starts=torch.tensor(starts, device=DEVICE), **kwargs
    )
    assert not out.isnan().any()
    for b, start in enumerate(starts):
        alone = token_sparse_decode(
            q[b : b + 1], k[b : b + 1, :, start:], v[b : b + 1, :, start:], indices[b : b + 1], counts[b : b + 1],
            q_offset=n_k - 1 - start, **kwargs,
        )  # fmt: skip
        torch.testing.assert_close(out[b : b + 1], alone, atol=1e-6, rtol=1e-6)
