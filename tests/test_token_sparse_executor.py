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
