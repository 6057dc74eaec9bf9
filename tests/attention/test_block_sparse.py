"""Gathered block-sparse attention equals dense attention masked to the same blocks."""

import pytest
import torch
import torch.nn.functional as F

from hf_icl.kernels.block_sparse_reference import block_sparse_attention, dense_masked_attention, selected_block_indices


def random_keep(batch, heads, n_q_blocks, n_k_blocks, q_block_offset, generator, density=0.4):
    keep = torch.rand(batch, heads, n_q_blocks, n_k_blocks, generator=generator) < density
    rows = q_block_offset + torch.arange(n_q_blocks)
    keep[..., torch.arange(n_q_blocks), rows.clamp(max=n_k_blocks - 1)] = True  # the diagonal, as CAB always keeps
    return keep


def qkv(batch, heads, n_q, n_k, dim, generator, dtype=torch.float32):
    return [torch.randn(batch, heads, n, dim, generator=generator).to(dtype) for n in (n_q, n_k, n_k)]


def test_selected_block_indices_lists_kept_blocks_in_order():
    keep = torch.tensor([[[[True, False, True, False], [False, False, False, True]]]])
    indices, valid = selected_block_indices(keep)
    assert indices[0, 0, 0, :2].tolist() == [0, 2] and valid[0, 0, 0].tolist() == [True, True]
    assert indices[0, 0, 1, 0] == 3 and valid[0, 0, 1].tolist() == [True, False]


@pytest.mark.parametrize("n, block_size", [(64, 16), (70, 16), (33, 32), (5, 16)])
def test_prefill_matches_dense_masked_attention(n, block_size):
    g = torch.Generator().manual_seed(n)
    q, k, v = qkv(2, 3, n, n, 32, g)
    m = -(-n // block_size)
    keep = random_keep(2, 3, m, m, 0, g)
    kwargs = dict(block_size=block_size, scaling=32**-0.5)
    torch.testing.assert_close(
        block_sparse_attention(q, k, v, keep, **kwargs), dense_masked_attention(q, k, v, keep, **kwargs)
    )


def test_all_blocks_kept_equals_sdpa_causal():
    g = torch.Generator().manual_seed(1)
    q, k, v = qkv(1, 2, 50, 50, 32, g)
    keep = torch.ones(1, 2, 4, 4, dtype=torch.bool)
    out = block_sparse_attention(q, k, v, keep, block_size=16, scaling=32**-0.5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_q, q_offset", [(1, 47), (1, 64), (16, 32)])
def test_cached_queries_with_offset(n_q, q_offset):
    g = torch.Generator().manual_seed(q_offset)
    n_k = q_offset + n_q
    q, k, v = qkv(2, 2, n_q, n_k, 32, g)
    m_q, m_k = -(-n_q // 16), -(-n_k // 16)
    keep = random_keep(2, 2, m_q, m_k, q_offset // 16, g)
    kwargs = dict(block_size=16, scaling=0.2, q_offset=q_offset)
    torch.testing.assert_close(
        block_sparse_attention(q, k, v, keep, **kwargs), dense_masked_attention(q, k, v, keep, **kwargs)
    )


@pytest.mark.parametrize("q_offset", [0, 37, 48])
def test_decode_query_with_padding_mask_matches_dense(q_offset):
    """One query (decode; its block is not padded to block_size) under a left-padding mask."""
    g = torch.Generator().manual_seed(q_offset + 11)
    n_k = q_offset + 1
    q, k, v = qkv(2, 3, 1, n_k, 32, g)
    mask = torch.ones(2, 1, 1, n_k, dtype=torch.bool)
    mask[1, ..., : min(5, n_k - 1)] = False  # the second sequence is left-padded
    keep = random_keep(2, 3, 1, -(-n_k // 16), q_offset // 16, g)
    kwargs = dict(block_size=16, scaling=0.2, q_offset=q_offset, attention_mask=mask)
    out = block_sparse_attention(q, k, v, keep, **kwargs)
    torch.testing.assert_close(out, dense_masked_attention(q, k, v, keep, **kwargs))


def test_padding_mask_and_fully_masked_rows_give_no_nan():
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(2, 2, 40, 40, 32, g)
    mask = torch.ones(2, 1, 40, 40, dtype=torch.bool)
    mask[0, :, :, :7] = False  # left padding of 7 tokens in the first sequence
    mask[1, :, :, 35:] = False  # right padding
    keep = random_keep(2, 2, 3, 3, 0, g, density=0.7)
    kwargs = dict(block_size=16, scaling=0.2, attention_mask=mask)
    out = block_sparse_attention(q, k, v, keep, **kwargs)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_masked_attention(q, k, v, keep, **kwargs))


def test_bf16_and_gradients():
    g = torch.Generator().manual_seed(4)
    q, k, v = qkv(1, 2, 48, 48, 32, g)
    keep = random_keep(1, 2, 3, 3, 0, g)
    kwargs = dict(block_size=16, scaling=0.2)
    low = block_sparse_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), keep, **kwargs)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), dense_masked_attention(q, k, v, keep, **kwargs), atol=3e-2, rtol=3e-2)
    q.requires_grad_(True)
    block_sparse_attention(q, k, v, keep, **kwargs).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


def test_sdpa_returning_a_non_contiguous_layout_is_handled(monkeypatch):
    """CUDA's SDPA backends may return (batch·heads, blocks, bs, D) in another memory layout; a ``view`` then fails."""
    sdpa = F.scaled_dot_product_attention

    def strided_sdpa(*args, **kwargs):  # same values, the heads-major layout some CUDA kernels produce
        return sdpa(*args, **kwargs).transpose(1, 2).contiguous().transpose(1, 2)

    g = torch.Generator().manual_seed(5)
    q, k, v = qkv(2, 3, 48, 48, 32, g)
    keep = random_keep(2, 3, 3, 3, 0, g)
    kwargs = dict(block_size=16, scaling=32**-0.5)
    expected = dense_masked_attention(q, k, v, keep, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", strided_sdpa)
    torch.testing.assert_close(block_sparse_attention(q, k, v, keep, **kwargs), expected)
