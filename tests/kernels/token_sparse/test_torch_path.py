"""CAB's PyTorch path (:mod:`hf_icl.kernels.token_sparse.torch_path`) against dense softmax under the per-token mask,
in float64.

The path lists (token, block) pairs key block by key block, cuts them into bucketed work items, masks causality on
own-block items only and merges each token's partial results; the reference below knows none of that.
"""

from __future__ import annotations

import math

import pytest
import torch

import hf_icl.kernels.token_sparse.torch_path as executor
from hf_icl.kernels.token_sparse import token_sparse_attention


def dense_reference(q, k, v, token_keep, block_size, scaling, key_valid=None):
    """Softmax over the keys each query may see, written out: a key is seen iff its block (counted over the row's
    real tokens) is kept for that query and its real index is at most the query's; no seen key → zeros."""
    batch, heads, n_q, _ = q.shape
    n_k, group = k.shape[2], heads // k.shape[1]
    out = torch.zeros(batch, heads, n_q, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        valid = torch.ones(n_k, dtype=torch.bool) if key_valid is None else key_valid[b]
        real = valid.long().cumsum(0) - 1  # each key's index among the real tokens
        for h in range(heads):
            kh, vh = k[b, h // group].double(), v[b, h // group].double()
            for i in range(n_q):
                position = n_k - n_q + i
                if not valid[position]:
                    continue
                seen = valid & (real <= real[position])
                seen &= token_keep[b, h, i][(real // block_size).clamp(min=0)]
                if not seen.any():
                    continue
                scores = (kh[seen] @ q[b, h, i].double()) * scaling
                out[b, h, i] = torch.softmax(scores, 0) @ vh[seen]
    return out


def _inputs(seed, batch, heads, kv_heads, n_q, n_k, dim=8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_q, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, kv_heads, n_k, dim, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, g


CASES = {
    "prefill": dict(batch=2, heads=2, kv_heads=2, n_q=45, n_k=45),
    "grouped-query": dict(batch=1, heads=4, kv_heads=2, n_q=40, n_k=40),
    "chunked prefill": dict(batch=2, heads=2, kv_heads=1, n_q=13, n_k=37),
    "decode": dict(batch=2, heads=3, kv_heads=1, n_q=1, n_k=29),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "left and right padding"])
@pytest.mark.parametrize("max_elements", [None, 64], ids=["one piece", "many pieces and ranges"])
def test_executor_equals_dense_softmax_under_the_token_mask(case, padded, max_elements, monkeypatch):
    shape = CASES[case]
    q, k, v, g = _inputs(7, **shape)
    block_size = 8
    n_k = shape["n_k"]
    # random picks, future blocks and empty rows included: the executor must mask them, not trust them
    keep = torch.rand(shape["batch"], shape["heads"], shape["n_q"], math.ceil(n_k / block_size), generator=g) < 0.4
    key_valid = None
    if padded:
        key_valid = torch.ones(shape["batch"], n_k, dtype=torch.bool)
        key_valid[0, :5] = False  # left padding
        key_valid[-1, -3:] = False  # right padding (the decode case's query itself is padded there)
    if max_elements is not None:  # tiny pieces, ranges and items: a token's blocks split over many work items
        monkeypatch.setattr(executor, "_MAX_SCORE_ELEMENTS", max_elements)
        monkeypatch.setattr(executor, "_MAX_SELECTION_ELEMENTS", max_elements)
        monkeypatch.setattr(executor, "_MAX_ITEM", 8)
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    out = token_sparse_attention(q, k, v, keep, block_size=block_size, scaling=0.4, key_valid=key_valid)
    expected = dense_reference(q, k, v, keep, block_size, 0.4, key_valid)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)

    # gradients: the executor's against autograd through the written-out reference
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    want = torch.autograd.grad((dense_reference(q, k, v, keep, block_size, 0.4, key_valid) * weights).sum(), (q, k, v))
    for name, a, b in zip("qkv", got, want, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_is_no_worse_than_sdpa(dtype):
    """Scores, softmax and sums run in float32 whatever the input dtype: against float64, CAB's PyTorch path in
    bf16 / fp16 errs no more than SDPA does on the same rounded inputs under the same mask."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=g) for _ in range(3))
    keep = torch.rand(1, 4, 256, 8, generator=g) < 0.5
    q16, k16, v16 = (x.to(dtype) for x in (q, k, v))
    exact = dense_reference(q16, k16, v16, keep, 32, 0.125)  # float64 on the rounded inputs
    ours = token_sparse_attention(q16, k16, v16, keep, block_size=32, scaling=0.125)
    mask = executor_mask(keep, 32, 256)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q16, k16, v16, attn_mask=mask, scale=0.125)
    seen = mask.any(-1, keepdim=True)  # SDPA gives NaN where a row sees nothing; ours gives zeros there
    ours_error = ((ours.double() - exact) * seen).pow(2).mean().sqrt()
    sdpa_error = ((sdpa.double().nan_to_num(0.0) - exact) * seen).pow(2).mean().sqrt()
    assert ours.dtype == dtype
    assert ours_error <= 1.05 * sdpa_error + 1e-6, (float(ours_error), float(sdpa_error))


def executor_mask(keep, block_size, n):
    """The (B, H, N, N) bool mask of a per-token selection (no padding), written out."""
    blocks = torch.arange(n) // block_size
    causal = torch.arange(n)[:, None] >= torch.arange(n)
    return keep[..., blocks] & causal


def test_the_selection_is_asked_for_one_bounded_range_at_a_time(monkeypatch):
    """No (heads × tokens × blocks) tensor for the whole sequence: the executor asks the selection for ranges whose
    selection holds at most _MAX_SELECTION_ELEMENTS entries, covering every query once, in order."""
    monkeypatch.setattr(executor, "_MAX_SELECTION_ELEMENTS", 4 * 13 * 8 + 5)  # 8 tokens × 4 heads × 13 blocks
    q, k, v, g = _inputs(5, batch=1, heads=4, kv_heads=2, n_q=100, n_k=100)
    keep = torch.rand(1, 4, 100, 13, generator=g) < 0.5
    asked = []

    def select(start, stop):
        asked.append((start, stop))
        return keep[:, :, start:stop]

    out = executor.attend_selected(q, k, v, select, block_size=8, scaling=0.3)
    assert asked == [(s, min(100, s + 8)) for s in range(0, 100, 8)]  # 4·13 entries per token: one block of 8
    assert all((stop - start) * 4 * 13 <= executor._MAX_SELECTION_ELEMENTS for start, stop in asked)
    torch.testing.assert_close(out, dense_reference(q, k, v, keep, 8, 0.3), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "left and right padding"])
def test_the_ops_naive_reference_equals_the_loop(case, padded):
    """token_sparse/naive.py (the op's dense float64 reference) equals the per-query loop written out above."""
    from hf_icl.kernels.token_sparse import token_sparse_attention_naive

    shape = CASES[case]
    q, k, v, g = _inputs(3, **shape)
    keep = torch.rand(shape["batch"], shape["heads"], shape["n_q"], math.ceil(shape["n_k"] / 8), generator=g) < 0.4
    key_valid = None
    if padded:
        key_valid = torch.ones(shape["batch"], shape["n_k"], dtype=torch.bool)
        key_valid[0, :5] = False
        key_valid[-1, -3:] = False
    naive = token_sparse_attention_naive(q, k, v, keep, block_size=8, scaling=0.4, key_valid=key_valid)
    torch.testing.assert_close(naive, dense_reference(q, k, v, keep, 8, 0.4, key_valid), atol=1e-12, rtol=1e-12)
