"""Split-K block-sparse decode kernel vs. the PyTorch reference, the partial merge, split planning, validation.

One query token per head against a KV cache, at absolute position ``q_offset``. Ground truth is the reference on
fp32 CPU copies; under ``TRITON_INTERPRET=1`` the shapes stay tiny (B * H <= 4, Nk <= 300).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from kernel_helpers import DEVICE, LOOSE, left_padding_mask, needs_triton, qkv, random_keep

from hf_icl.kernels.block_sparse_decode import (
    _merge_splits,
    block_sparse_decode,
    block_sparse_decode_reference,
    block_sparse_decode_triton,
    plan_splits,
)
from hf_icl.kernels.block_sparse_reference import selected_block_indices

# the package re-exports the function ``block_sparse_decode``, which shadows the submodule's attribute name
decode_module = importlib.import_module("hf_icl.kernels.block_sparse_decode")


def _inputs(
    n_k: int,
    block_size: int,
    q_offset: int,
    *,
    b: int = 1,
    h: int = 2,
    d: int = 32,
    dtype: torch.dtype = torch.float32,
    kv_heads: int | None = None,
    p: float = 0.5,
    seed: int = 0,
):
    """q (b, h, 1, d), k / v (b, kv_heads, n_k, d) and a random (b, h, 1, Mk) selection keeping the query's block."""
    q, k, v = qkv(b, h, 1, n_k, d, dtype, seed=seed, kv_heads=kv_heads)
    keep = random_keep(b, h, 1, n_k, block_size, q_offset=q_offset, p=p, seed=seed)
    return q, k, v, keep


def _kernel(q, k, v, keep, *, block_size: int, q_offset: int, key_padding_mask=None, blocks_per_split=None):
    """The split-K kernel called directly on ``keep``'s selection; returns ``(out, lse)``."""
    indices, valid = selected_block_indices(keep)
    return block_sparse_decode_triton(
        q,
        k,
        v,
        indices,
        valid.sum(-1),
        block_size=block_size,
        scaling=q.shape[3] ** -0.5,
        q_offset=q_offset,
        key_padding_mask=key_padding_mask,
        blocks_per_split=blocks_per_split,
        return_lse=True,
    )


def _expected(q, k, v, keep, *, block_size: int, q_offset: int, key_padding_mask=None):
    """``(out, lse)`` of the reference on fp32 CPU copies, moved back to the test device."""
    out, lse = block_sparse_decode_reference(
        *(x.float().cpu() for x in (q, k, v)),
        keep.cpu(),
        block_size=block_size,
        scaling=q.shape[3] ** -0.5,
        q_offset=q_offset,
        key_padding_mask=None if key_padding_mask is None else key_padding_mask.cpu(),
        return_lse=True,
    )
    return out.to(q.device), lse.to(q.device)


def _check(q, k, v, keep, *, block_size: int, q_offset: int, key_padding_mask=None, blocks_per_split=None):
    """Kernel vs. reference (out in q's dtype within ``LOOSE``, fp32 lse within 1e-4); returns the kernel's results."""
    kwargs = {"block_size": block_size, "q_offset": q_offset, "key_padding_mask": key_padding_mask}
    out, lse = _kernel(q, k, v, keep, blocks_per_split=blocks_per_split, **kwargs)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    expected_out, expected_lse = _expected(q, k, v, keep, **kwargs)
    tol = LOOSE[q.dtype]
    torch.testing.assert_close(out.float(), expected_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, expected_lse, atol=1e-4, rtol=1e-4)
    return out, lse


# ----------------------------------------------------------------------------------------------------------------
# Kernel vs. reference
# ----------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize(("n_k", "block_size"), [(1, 16), (17, 16), (130, 32), (300, 16)])
def test_decode_ragged_cache_lengths(n_k: int, block_size: int) -> None:
    """The query is the newest token (q_offset = Nk - 1); cache lengths that end mid-block, down to one key."""
    q, k, v, keep = _inputs(n_k, block_size, n_k - 1, seed=n_k)
    _check(q, k, v, keep, block_size=block_size, q_offset=n_k - 1)
    # the dispatcher takes the same kernel
    out = block_sparse_decode(
        q, k, v, keep, block_size=block_size, scaling=32**-0.5, q_offset=n_k - 1, backend="triton"
    )
    torch.testing.assert_close(out, _kernel(q, k, v, keep, block_size=block_size, q_offset=n_k - 1)[0])


@needs_triton
@pytest.mark.parametrize(("n_k", "block_size", "q_offset"), [(130, 32, 40), (300, 16, 255), (45, 16, 0)])
def test_decode_earlier_position_ignores_later_keys(n_k: int, block_size: int, q_offset: int) -> None:
    """A query at an earlier position: keys after it (even in selected blocks) must not matter at all."""
    q, k, v, keep = _inputs(n_k, block_size, q_offset, p=0.7, seed=q_offset)
    keep[..., -1] = True  # a selected block wholly in the future
    out, lse = _check(q, k, v, keep, block_size=block_size, q_offset=q_offset)
    future = torch.randn(k[:, :, q_offset + 1 :].shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, q_offset + 1 :] = 100 * future
    v2[:, :, q_offset + 1 :] = -future
    out2, lse2 = _kernel(q, k2, v2, keep, block_size=block_size, q_offset=q_offset)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@needs_triton
def test_decode_split_sizes_agree() -> None:
    """1 block per split, 2, the planned default and more than there are blocks: the same result within 1e-5."""
    n_k, bs = 300, 16
    q, k, v, keep = _inputs(n_k, bs, n_k - 1, p=0.8, seed=21)
    width = int(keep.sum(-1).max())
    assert width > 4
    results = [
        _check(q, k, v, keep, block_size=bs, q_offset=n_k - 1, blocks_per_split=split)
        for split in (1, 2, None, width + 5)
    ]
    for out, lse in results[1:]:
        torch.testing.assert_close(out, results[0][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, results[0][1], atol=1e-5, rtol=1e-5)


@needs_triton
@pytest.mark.parametrize(("kv_heads", "dtype"), [(2, torch.float32), (1, torch.float16)])
def test_decode_grouped_query_attention(kv_heads: int, dtype: torch.dtype) -> None:
    """4 query heads reading 2 or 1 KV heads, each query head with its own selection."""
    q, k, v, keep = _inputs(130, 32, 129, h=4, kv_heads=kv_heads, dtype=dtype, seed=kv_heads)
    _check(q, k, v, keep, block_size=32, q_offset=129, blocks_per_split=2)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_key_padding(dtype: torch.dtype) -> None:
    """Left-padded batch rows: padded keys are ignored, whatever their values."""
    n_k, bs = 100, 16
    q, k, v, keep = _inputs(n_k, bs, n_k - 1, b=2, dtype=dtype, p=0.7, seed=31)
    keep[..., 0] = True  # the first block of row 1 is (mostly) padding
    mask = left_padding_mask([n_k, n_k - 37], n_k)
    out, _ = _check(q, k, v, keep, block_size=bs, q_offset=n_k - 1, key_padding_mask=mask, blocks_per_split=1)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, :37], v2[1, :, :37] = 50.0, -50.0
    out2, _ = _kernel(q, k2, v2, keep, block_size=bs, q_offset=n_k - 1, key_padding_mask=mask, blocks_per_split=1)
    assert torch.equal(out, out2)


@needs_triton
@pytest.mark.parametrize(
    ("head_dim", "dtype"),
    [(32, torch.float16), (32, torch.bfloat16), (64, torch.float32), (64, torch.bfloat16), (128, torch.float16)],
)
def test_decode_dtypes_and_head_dims(head_dim: int, dtype: torch.dtype) -> None:
    """Half-precision inputs (fp32 scores and accumulators) and head dims 32 / 64 / 128."""
    q, k, v, keep = _inputs(77, 16, 76, d=head_dim, dtype=dtype, seed=head_dim)
    _check(q, k, v, keep, block_size=16, q_offset=76, blocks_per_split=2)


@needs_triton
def test_decode_only_last_block() -> None:
    """A selection of just the ragged last block (6 keys)."""
    n_k, bs = 70, 16
    q, k, v, _ = _inputs(n_k, bs, n_k - 1, seed=41)
    keep = torch.zeros(1, 2, 1, 5, dtype=torch.bool, device=DEVICE)
    keep[..., -1] = True
    _check(q, k, v, keep, block_size=bs, q_offset=n_k - 1)


@needs_triton
@pytest.mark.parametrize("blocks_per_split", [1, None])
def test_decode_query_that_sees_no_key(blocks_per_split: int | None) -> None:
    """Row 1 selects only blocks that are all padding: zeros and lse = -inf (never NaN); row 0 is unaffected."""
    n_k, bs = 64, 16
    q, k, v, _ = _inputs(n_k, bs, n_k - 1, b=2, seed=43)
    keep = torch.tensor([True, True, False, False], device=DEVICE).expand(2, 2, 1, -1).contiguous()
    mask = left_padding_mask([n_k, 30], n_k)  # row 1: keys 0..33 padded, so blocks 0 and 1 hold none
    out, lse = _check(
        q, k, v, keep, block_size=bs, q_offset=n_k - 1, key_padding_mask=mask, blocks_per_split=blocks_per_split
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isneginf(lse[1]).all() and torch.isfinite(lse[0]).all()


@needs_triton
def test_decode_strided_cache_and_junk_slots() -> None:
    """A (B, N, H, D) cache read through a transposed view, int32 ids and unused slots holding junk ids."""
    n_k, bs, d = 90, 16, 32
    cache = torch.randn(1, n_k, 2, 2 * d, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    k, v = (cache[..., i * d : (i + 1) * d].transpose(1, 2) for i in range(2))
    q = torch.randn(1, 1, 2, d, generator=torch.Generator().manual_seed(8)).to(DEVICE).transpose(1, 2)
    assert not k.is_contiguous()
    keep = random_keep(1, 2, 1, n_k, bs, q_offset=n_k - 1, seed=7)
    indices, valid = selected_block_indices(keep)
    indices = torch.cat([indices.masked_fill(~valid, 2), torch.full_like(indices[..., :1], 3)], -1).to(torch.int32)
    out = block_sparse_decode_triton(
        q, k, v, indices, valid.sum(-1).int(), block_size=bs, scaling=0.2, q_offset=n_k - 1, blocks_per_split=1
    )
    expected = block_sparse_decode_reference(q, k, v, keep, block_size=bs, scaling=0.2, q_offset=n_k - 1)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def _row_start_expected(q, k, v, keep, starts, *, block_size: int, q_offset: int):
    """Float64 ground truth for per-row key starts: row b's keys are cache rows [start_b, Nk); its real key p sits in
    block p // block_size, and the query (real position q_offset - start_b) attends the real keys p <= its position
    in its kept blocks, a dense softmax. ``(out (B, H, 1, D) float64, lse (B, H, 1))`` on the CPU."""
    batch, heads, _, _ = q.shape
    group = heads // k.shape[1]
    out = torch.zeros(batch, heads, 1, q.shape[3], dtype=torch.float64)
    lse = torch.full((batch, heads, 1), float("-inf"), dtype=torch.float64)
    for b, start in enumerate(starts):
        real = torch.arange(k.shape[2] - start)
        for h in range(heads):
            kh, vh = (x[b, h // group, start:].double().cpu() for x in (k, v))
            allowed = keep[b, h, 0].cpu()[real // block_size] & (real <= q_offset - start)
            if not allowed.any():
                continue
            scores = (q[b, h, 0].double().cpu() @ kh.T) * q.shape[3] ** -0.5
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[b, h, 0] = torch.softmax(scores, -1) @ vh
            lse[b, h, 0] = torch.logsumexp(scores, -1)
    return out, lse


@needs_triton
@pytest.mark.parametrize(
    ("block_size", "kv_heads", "dtype"),
    [(16, 2, torch.float32), (32, 1, torch.float32), (64, 2, torch.float32), (16, 1, torch.bfloat16)],
)
@pytest.mark.parametrize("blocks_per_split", [1, None])
def test_decode_row_starts_lay_blocks_over_each_rows_real_keys(block_size, kv_heads, dtype, blocks_per_split) -> None:
    """Left-padded rows of different lengths (none, ragged, one block, one key): with ``row_starts`` each row's
    selection names blocks of its real keys, and the kernel equals a float64 dense softmax over them; grouped-query
    heads both with one list per KV group (one program serves the group) and a list per head."""
    n_k, heads = 150, 4
    starts = [0, 37, n_k - block_size, n_k - 1]
    q, k, v = qkv(len(starts), heads, 1, n_k, 32, dtype, seed=block_size, kv_heads=kv_heads)
    q_offset = n_k - 1
    n_blocks = math.ceil(n_k / block_size)
    gen = torch.Generator().manual_seed(block_size + 7)
    for shared in (False, True):
        keep = torch.rand(len(starts), heads, 1, n_blocks, generator=gen) < 0.6
        for b, start in enumerate(starts):  # the row's own (query) block, none past its real keys
            real_blocks = math.ceil((n_k - start) / block_size)
            keep[b, ..., real_blocks:] = False
            keep[b, ..., (q_offset - start) // block_size] = True
        if shared:  # every head of a KV group keeps the same blocks
            keep = keep[:, :: heads // kv_heads].repeat_interleave(heads // kv_heads, dim=1)
        keep = keep.to(DEVICE)
        indices, valid = selected_block_indices(keep)
        row_starts = torch.tensor(starts, device=DEVICE)
        out, lse = block_sparse_decode_triton(
            q, k, v, indices, valid.sum(-1), block_size=block_size, scaling=32**-0.5, q_offset=q_offset,
            blocks_per_split=blocks_per_split, return_lse=True, row_starts=row_starts, group_heads=shared,
        )  # fmt: skip
        expected = _row_start_expected(q, k, v, keep, starts, block_size=block_size, q_offset=q_offset)
        tol = LOOSE[dtype]
        torch.testing.assert_close(out.double().cpu(), expected[0], atol=tol, rtol=tol)
        torch.testing.assert_close(lse.double().cpu(), expected[1], atol=1e-4, rtol=1e-4)
        # the padding before each row's start is never read, whatever it holds
        k2, v2 = k.clone(), v.clone()
        for b, start in enumerate(starts):
            k2[b, :, :start], v2[b, :, :start] = 50.0, float("nan")
        out2 = block_sparse_decode_triton(
            q, k2, v2, indices, valid.sum(-1), block_size=block_size, scaling=32**-0.5, q_offset=q_offset,
            blocks_per_split=blocks_per_split, row_starts=row_starts, group_heads=shared,
        )  # fmt: skip
        assert torch.equal(out, out2)


@needs_triton
def test_decode_row_starts_of_zero_change_nothing() -> None:
    """``row_starts`` of zeros is bitwise the call without it, with and without a key padding mask; an earlier
    query position is counted from the start too (keys after it are ignored)."""
    n_k, bs = 100, 16
    q, k, v, keep = _inputs(n_k, bs, n_k - 1, b=2, p=0.7, seed=51)
    indices, valid = selected_block_indices(keep)
    mask = left_padding_mask([n_k, n_k - 20], n_k)
    zeros = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    for key_padding_mask in (None, mask):
        kwargs = dict(block_size=bs, scaling=0.2, q_offset=n_k - 1, key_padding_mask=key_padding_mask)
        plain = block_sparse_decode_triton(q, k, v, indices, valid.sum(-1), **kwargs)
        started = block_sparse_decode_triton(q, k, v, indices, valid.sum(-1), row_starts=zeros, **kwargs)
        assert torch.equal(plain, started)
    # row starts 30 and 0 with the query at cache position 70: row 0 sees real keys 0..40 of cache rows 30..70
    q_offset, starts = 70, [30, 0]
    keep = torch.ones(2, 2, 1, math.ceil(n_k / bs), dtype=torch.bool, device=DEVICE)
    indices, valid = selected_block_indices(keep)
    out, lse = block_sparse_decode_triton(
        q, k, v, indices, valid.sum(-1), block_size=bs, scaling=32**-0.5, q_offset=q_offset, return_lse=True,
        row_starts=torch.tensor(starts, device=DEVICE),
    )  # fmt: skip
    expected_out, expected_lse = _row_start_expected(q, k, v, keep, starts, block_size=bs, q_offset=q_offset)
    torch.testing.assert_close(out.double().cpu(), expected_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse.double().cpu(), expected_lse, atol=1e-4, rtol=1e-4)


@needs_triton
@pytest.mark.parametrize(
    ("row_starts", "match"),
    [
        (torch.tensor([0]), r"shape \(B,\)"),
        (torch.tensor([0.0, 1.0]), "integers"),
        (torch.tensor([0, 101]), r"\[0, Nk\]"),
        (torch.tensor([-1, 0]), r"\[0, Nk\]"),
    ],
)
def test_decode_row_starts_validation(row_starts, match: str) -> None:
    q, k, v, keep = _inputs(100, 16, 99, b=2, seed=53)
    indices, valid = selected_block_indices(keep)
    with pytest.raises(ValueError, match=match):
        block_sparse_decode_triton(
            q, k, v, indices, valid.sum(-1), block_size=16, scaling=0.2, q_offset=99, row_starts=row_starts.to(DEVICE)
        )


# ----------------------------------------------------------------------------------------------------------------
# The merge of split partials and split planning (plain PyTorch)
# ----------------------------------------------------------------------------------------------------------------


def test_merge_splits_equals_direct_softmax() -> None:
    """Partials built from disjoint key groups merge to the softmax over all keys, including empty groups.

    Group 1 of head (0, 0) and every group of head (1, 2) see no key (m = -inf, l = 0, acc = 0).
    """
    b, h, splits, keys, d = 2, 3, 4, 5, 8
    gen = torch.Generator().manual_seed(0)
    scores = 20 * torch.randn(b, h, splits, keys, generator=gen, dtype=torch.float64)  # widely spread maxima
    values = torch.randn(b, h, splits, keys, d, generator=gen, dtype=torch.float64)
    valid = torch.rand(b, h, splits, keys, generator=gen) < 0.7
    valid[..., 0] = True
    valid[0, 0, 1] = False
    valid[1, 2] = False
    masked = scores.masked_fill(~valid, float("-inf"))
    part_m = masked.amax(-1)
    p = torch.exp(masked - part_m.nan_to_num(neginf=0.0).unsqueeze(-1))  # exp(-inf) = 0 where masked
    part_l = p.sum(-1)
    part_acc = (p.unsqueeze(-1) * values).sum(-2)
    assert torch.isneginf(part_m[0, 0, 1]) and part_l[0, 0, 1] == 0

    out, lse = _merge_splits(part_acc, part_m, part_l)

    flat_scores, flat_values = masked.flatten(-2), values.flatten(-3, -2)
    expected_lse = torch.logsumexp(flat_scores, dim=-1)
    expected_out = (torch.softmax(flat_scores, dim=-1).unsqueeze(-2) @ flat_values).squeeze(-2).nan_to_num(0.0)
    torch.testing.assert_close(lse, expected_lse, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out, expected_out, atol=1e-12, rtol=1e-12)
    assert torch.isneginf(lse[1, 2]) and torch.equal(out[1, 2], torch.zeros(d, dtype=torch.float64))
    assert torch.isfinite(out).all()


def test_merge_splits_of_random_partials() -> None:
    """Arbitrary partials (acc, m, l > 0): out = Σ e^m acc / Σ e^m l and lse = logsumexp(m + log l)."""
    gen = torch.Generator().manual_seed(1)
    part_acc = torch.randn(3, 6, 16, generator=gen, dtype=torch.float64)
    part_m = 5 * torch.randn(3, 6, generator=gen, dtype=torch.float64)
    part_l = torch.rand(3, 6, generator=gen, dtype=torch.float64) + 0.1
    part_m[0, 2], part_l[0, 2], part_acc[0, 2] = float("-inf"), 0.0, 0.0
    out, lse = _merge_splits(part_acc, part_m, part_l)
    weights = torch.exp(part_m)
    expected = (weights.unsqueeze(-1) * part_acc).sum(-2) / (weights * part_l).sum(-1, keepdim=True)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(part_m + part_l.log(), dim=-1), atol=1e-12, rtol=1e-12)


def test_plan_splits_covers_the_width() -> None:
    """At least one block per split, splits that cover exactly the width, fewer splits when more programs run.

    Off CUDA the plan assumes 4 multiprocessors: it aims at ``PROGRAMS_PER_SM * 4`` programs in all, i.e. at most
    ``wanted`` splits per head, with the fewest blocks per split that stays within that.
    """
    cpu = torch.device("cpu")
    target = decode_module.PROGRAMS_PER_SM * 4
    for width in range(1, 41):
        previous = math.inf
        for programs in (0, 1, 2, 3, 8, 16, 64, 1000):
            per_split = plan_splits(width, programs, cpu)
            assert isinstance(per_split, int) and 1 <= per_split <= width
            splits = math.ceil(width / per_split)
            assert splits * per_split >= width and (splits - 1) * per_split < width
            assert splits <= previous
            previous = splits
            wanted = max(1, math.ceil(target / max(programs, 1)))
            assert splits <= wanted
            assert per_split == 1 or math.ceil(width / (per_split - 1)) > wanted
    assert plan_splits(40, 1, cpu) < 40  # a lone head is split across several programs


# ----------------------------------------------------------------------------------------------------------------
# Dispatch and validation
# ----------------------------------------------------------------------------------------------------------------


def test_auto_backend_uses_reference_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend='auto' never calls the kernel for CPU tensors (even under the interpreter)."""

    def _fail(*args, **kwargs):
        raise AssertionError("the decode kernel must not run for CPU tensors with backend='auto'")

    monkeypatch.setattr(decode_module, "block_sparse_decode_triton", _fail)
    q, k, v, keep = (x.cpu() for x in _inputs(50, 16, 37, seed=5))
    kwargs = {"block_size": 16, "scaling": 0.2, "q_offset": 37, "return_lse": True}
    out, lse = block_sparse_decode(q, k, v, keep, **kwargs)
    expected_out, expected_lse = block_sparse_decode_reference(q, k, v, keep, **kwargs)
    torch.testing.assert_close(out, expected_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, expected_lse, atol=0, rtol=0)


def _selection_inputs():
    q, k, v, keep = (x.cpu() for x in _inputs(50, 16, 49, seed=3))
    indices, valid = selected_block_indices(keep)
    return q, k, v, indices, valid.sum(-1)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda q, idx, cnt: (torch.cat([q, q], 2), idx, cnt), r"q must hold one token per head .*q\.shape\[2\] == 1"),
        (lambda q, idx, cnt: (q, idx, torch.zeros_like(cnt)), r"counts must be in \[1, K="),
        (lambda q, idx, cnt: (q, idx, cnt + idx.shape[-1]), r"counts must be in \[1, K="),
        (lambda q, idx, cnt: (q, idx + 10, cnt), r"indices must be key-block ids in \[0, Mk=4\)"),
    ],
)
def test_decode_kernel_validation(change, match: str) -> None:
    """The kernel entry point checks q and the selection before launching anything (no triton needed)."""
    q, k, v, indices, counts = _selection_inputs()
    q, indices, counts = change(q, indices, counts)
    with pytest.raises(ValueError, match=match):
        block_sparse_decode_triton(q, k, v, indices, counts, block_size=16, scaling=0.2, q_offset=49)


@needs_triton
@pytest.mark.parametrize("blocks_per_split", [0, -1, True, 1.5])
def test_decode_blocks_per_split_validation(blocks_per_split) -> None:
    """blocks_per_split must be an int >= 1 (not a bool) or None."""
    q, k, v, indices, counts = (x.to(DEVICE) for x in _selection_inputs())
    with pytest.raises(ValueError, match=r"blocks_per_split must be an int >= 1 or None, got "):
        block_sparse_decode_triton(
            q, k, v, indices, counts, block_size=16, scaling=0.2, q_offset=49, blocks_per_split=blocks_per_split
        )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda q, keep, mask: (torch.cat([q, q], 2), keep, mask), r"q must hold one token per head"),
        (lambda q, keep, mask: (q, keep, mask[:, :16]), r"key_padding_mask must have shape \(B, Nk\)=\(1, 50\)"),
        (lambda q, keep, mask: (q, keep, mask.int()), r"key_padding_mask\.dtype must be torch\.bool"),
        (lambda q, keep, mask: (q, keep[..., :2], mask), r"keep must have shape"),
    ],
)
def test_decode_dispatcher_validation_on_triton_backend(change, match: str) -> None:
    """backend='triton' checks q, keep and key_padding_mask before selecting blocks or launching the kernel."""
    q, k, v, keep = (x.cpu() for x in _inputs(50, 16, 48, seed=4))
    q, keep, mask = change(q, keep, torch.ones(1, 50, dtype=torch.bool))
    with pytest.raises(ValueError, match=match):
        block_sparse_decode(
            q, k, v, keep, block_size=16, scaling=0.2, q_offset=48, key_padding_mask=mask, backend="triton"
        )
