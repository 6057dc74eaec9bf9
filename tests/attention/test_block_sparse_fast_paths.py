"""The block-sparse kernels' fast paths against the PyTorch reference: unmasked full key blocks, the causal mask on
the diagonal only, GQA heads stacked in one program, key tiles cut from / gathered across blocks; and the floor.

Every kernel case compares with :func:`hf_icl.kernels.block_sparse_reference.block_sparse_attention` (values) or
autograd through it (gradients) on fp32 copies, under ``TRITON_INTERPRET=1`` on tiny shapes. That the full-block path
is the one that runs is checked with the forward kernel's ``tile_counts`` diagnostic against a count by hand.
"""

from __future__ import annotations

import doctest
import importlib
import math

import pytest
import torch
from kernel_helpers import DEVICE, LOOSE, left_padding_mask, needs_triton, qkv

from hf_icl.kernels.block_sparse_attention import (
    TileConfig,
    _indices_shared_by_groups,
    block_sparse_attention_forward,
    block_sparse_attention_triton,
    expand_kv,
    forward_tile_config,
    resolve_group_heads,
    selection_lists,
    selection_shared_by_groups,
)
from hf_icl.kernels.block_sparse_backward import backward_tile_config, block_sparse_flash_attention
from hf_icl.kernels.block_sparse_decode import block_sparse_decode, block_sparse_decode_triton, decode_tile_config
from hf_icl.kernels.block_sparse_reference import block_sparse_attention, token_mask
from hf_icl.kernels.roofline import (
    H100_SXM,
    AttentionFloor,
    DevicePeaks,
    attended_pairs,
    block_sparse_floor,
    dense_causal_floor,
)

# the package re-exports functions under the submodules' names: import the modules by path
MODULES = [
    importlib.import_module(f"hf_icl.kernels.{name}")
    for name in ("block_sparse_attention", "block_sparse_backward", "block_sparse_decode", "roofline")
]

#: gradient tolerance relative to the largest expected entry (atol) and to each entry (rtol)
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_keep(
    b: int,
    h: int,
    kv_heads: int,
    n_q: int,
    n_k: int,
    bs: int,
    *,
    q_offset: int = 0,
    shared: bool = True,
    diagonal: bool = True,
    p: float = 0.5,
    seed: int = 0,
) -> torch.Tensor:
    """Random ``(b, h, Mq, Mk)`` selection. ``shared``: drawn per KV head and repeated over its query heads (a real
    copy, not a broadcast view); ``diagonal``: every query block keeps its diagonal key block, else never does (each
    row then keeps at least one other block, possibly in its future)."""
    m_q, m_k = math.ceil(n_q / bs), math.ceil(n_k / bs)
    gen = torch.Generator().manual_seed(seed + 77)
    drawn_heads = kv_heads if shared else h
    keep = torch.rand(b, drawn_heads, m_q, m_k, generator=gen) < p
    rows = torch.arange(m_q)
    diag = (q_offset + rows * bs) // bs
    keep[:, :, rows, diag] = diagonal
    if not diagonal:  # one more block per row that is not the diagonal: the row must list something
        other = (diag + 1 + torch.randint(0, m_k - 1, (m_q,), generator=gen)) % m_k
        keep[:, :, rows, other] = True
    if shared:
        keep = keep.repeat_interleave(h // kv_heads, dim=1)
    return keep.to(DEVICE)


def reference_out_lse(q, k, v, keep, bs: int, q_offset: int, key_padding_mask=None):
    """The reference's output and a dense masked logsumexp, on fp32 copies (GQA K / V expanded per query head)."""
    heads, n_q, n_k = q.shape[1], q.shape[2], k.shape[2]
    kf, vf = (expand_kv(x.float(), heads) for x in (k, v))
    scaling = q.shape[3] ** -0.5
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :].expand(-1, 1, n_q, -1)
    out = block_sparse_attention(
        q.float(), kf, vf, keep, block_size=bs, scaling=scaling, q_offset=q_offset, attention_mask=mask
    )
    allowed = token_mask(keep, bs, n_q, n_k, q_offset)
    if mask is not None:
        allowed = allowed & mask
    scores = (q.float() @ kf.transpose(-1, -2)) * scaling
    return out, torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def check_forward(q, k, v, keep, bs: int, q_offset: int = 0, **kernel_kwargs):
    """The Triton forward (through the kernel entry point) vs the reference: output and lse."""
    indices, counts = selection_lists(keep)
    out, lse = block_sparse_attention_triton(
        q, k, v, indices, counts, block_size=bs, scaling=q.shape[3] ** -0.5, q_offset=q_offset, return_lse=True,
        **kernel_kwargs,
    )  # fmt: skip
    expected_out, expected_lse = reference_out_lse(q, k, v, keep, bs, q_offset, kernel_kwargs.get("key_padding_mask"))
    assert out.dtype == q.dtype and out.shape == q.shape and torch.isfinite(out).all()
    tol = LOOSE[q.dtype]
    torch.testing.assert_close(out.float(), expected_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, expected_lse, atol=1e-4, rtol=1e-4)
    return out, lse


# ----------------------------------------------------------------------------------------------------------------
# Forward: values over block sizes, head dims, GQA ratios, ragged Nk, offsets, diagonal in / out, dtypes
# ----------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize(
    ("bs", "head_dim", "n_q", "n_k", "q_offset", "diagonal"),
    [
        (16, 32, 40, 40, 0, True),  # ragged self-attention
        (16, 64, 32, 75, 32, True),  # chunked prefill after a cached prefix, ragged Nk
        (32, 128, 40, 72, 32, False),  # selections without the diagonal block
        (64, 64, 64, 150, 64, True),  # a large block: cut into several key tiles (D = 64 streams 128-key tiles)
    ],
)
def test_forward_matches_reference(dtype, group, bs, head_dim, n_q, n_k, q_offset, diagonal):
    """Default tiles, the group's heads sharing a selection (stacked in one program when group > 1)."""
    heads = 4
    q, k, v = qkv(1, heads, n_q, n_k, head_dim, dtype, seed=bs + group, kv_heads=heads // group)
    keep = make_keep(1, heads, heads // group, n_q, n_k, bs, q_offset=q_offset, diagonal=diagonal, seed=group)
    check_forward(q, k, v, keep, bs, q_offset)


@needs_triton
@pytest.mark.parametrize(
    ("bs", "block_n", "heads_per_program"),
    [(16, 16, 1), (16, 64, 2), (16, 128, 4), (32, 16, 2), (64, 32, 4), (32, 64, 1)],
)
def test_forward_tile_shapes(bs: int, block_n: int, heads_per_program: int):
    """Key tiles that cut a block (block_n < bs), gather several (block_n > bs) or match it; 1, 2 or 4 stacked heads
    of a 4-head group; a ragged Nk whose last block ends mid-tile, and a diagonal block mid-list."""
    n_q, n_k, offset = 2 * bs, 5 * bs - 7, 2 * bs
    q, k, v = qkv(2, 4, n_q, n_k, 32, seed=block_n, kv_heads=1)
    keep = make_keep(2, 4, 1, n_q, n_k, bs, q_offset=offset, p=0.7, seed=bs + block_n)
    tiles = TileConfig(block_n=block_n, heads_per_program=heads_per_program)
    check_forward(q, k, v, keep, bs, offset, tiles=tiles, group_heads=True)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_three_stacked_heads(dtype):
    """A group of 3 (SmolLM2's 9 / 3): 3 query blocks stacked, padded to a power-of-two tile."""
    q, k, v = qkv(1, 6, 40, 40, 64, dtype, seed=3, kv_heads=2)
    keep = make_keep(1, 6, 2, 40, 40, 16, seed=3)
    assert forward_tile_config(16, 64, 3).heads_per_program == 3
    check_forward(q, k, v, keep, 16)


@needs_triton
@pytest.mark.parametrize("group_heads", [None, False])
def test_forward_heads_that_differ_fall_back(group_heads):
    """Per-query-head selections (CAB's score policies): detection falls back to one head per program."""
    q, k, v = qkv(1, 4, 48, 48, 32, seed=5, kv_heads=2)
    keep = make_keep(1, 4, 2, 48, 48, 16, shared=False, p=0.6, seed=5)
    assert not selection_shared_by_groups(keep, 2)
    check_forward(q, k, v, keep, 16, group_heads=group_heads)


@needs_triton
def test_forward_broadcast_selection_and_dispatcher():
    """A selection broadcast over heads (stride 0, as CAB's streaming policy returns it) through the dispatcher."""
    q, k, v = qkv(1, 4, 40, 40, 32, seed=6, kv_heads=2)
    keep = make_keep(1, 1, 1, 40, 40, 16, seed=6).expand(1, 4, -1, -1)
    assert keep.stride(1) == 0 and selection_shared_by_groups(keep, 2)
    out = block_sparse_attention_forward(q, k, v, keep, block_size=16, scaling=32**-0.5, backend="triton")
    torch.testing.assert_close(out, reference_out_lse(q, k, v, keep, 16, 0)[0], atol=1e-4, rtol=1e-4)


@needs_triton
def test_forward_key_padding_takes_the_masked_path():
    """With a key padding mask no block is full: the values still match, and every tile is a masked one."""
    q, k, v = qkv(2, 2, 48, 48, 32, seed=8, kv_heads=1)
    keep = make_keep(2, 2, 1, 48, 48, 16, p=0.8, seed=8)
    mask = left_padding_mask([48, 30], 48)
    tile_counts = torch.full((2, 2, 3, 2), -1, dtype=torch.int32, device=DEVICE)
    check_forward(q, k, v, keep, 16, key_padding_mask=mask, tile_counts=tile_counts)
    assert (tile_counts[:, 0, :, 0] == 0).all() and (tile_counts[:, 0, :, 1] > 0).all()


# ----------------------------------------------------------------------------------------------------------------
# The full-block path is the one taken
# ----------------------------------------------------------------------------------------------------------------


def expected_tile_counts(keep, bs: int, n_k: int, q_offset: int, block_n: int) -> torch.Tensor:
    """By hand: per (b, h, query block), the tiles made of full blocks (kept, wholly at or before the block's first
    query and inside Nk: a prefix of the ascending list) and the masked tiles covering the rest of the list."""
    b_size, heads, m_q, m_k = keep.shape
    counts = torch.zeros(b_size, heads, m_q, 2, dtype=torch.int32)
    for b in range(b_size):
        for h in range(heads):
            for i in range(m_q):
                listed = [j for j in range(m_k) if keep[b, h, i, j]]
                first_query = q_offset + i * bs
                full = [j for j in listed if (j + 1) * bs - 1 <= first_query and (j + 1) * bs <= n_k]
                assert full == listed[: len(full)]  # ascending ids: the full blocks lead the list
                full_tiles = len(full) * bs // block_n
                counts[b, h, i, 0] = full_tiles
                counts[b, h, i, 1] = math.ceil((len(listed) * bs - full_tiles * block_n) / block_n)
    return counts


@needs_triton
@pytest.mark.parametrize(
    ("bs", "block_n", "n_k", "q_offset", "heads_per_program"),
    [(16, 16, 80, 0, 1), (16, 64, 125, 48, 2), (32, 16, 96, 32, 2), (16, 32, 64, 0, 1)],
)
def test_full_block_path_is_taken(bs, block_n, n_k, q_offset, heads_per_program):
    """The kernel's tile counts equal the hand count, so dense-enough rows run most of their tiles unmasked."""
    n_q = n_k - q_offset
    q, k, v = qkv(1, 2, n_q, n_k, 32, seed=n_k, kv_heads=1)
    keep = make_keep(1, 2, 1, n_q, n_k, bs, q_offset=q_offset, p=0.8, seed=n_k)
    tile_counts = torch.full((1, 2, keep.shape[2], 2), -1, dtype=torch.int32, device=DEVICE)
    tiles = TileConfig(block_n=block_n, heads_per_program=heads_per_program)
    check_forward(q, k, v, keep, bs, q_offset, tiles=tiles, tile_counts=tile_counts)
    expected = expected_tile_counts(keep.cpu(), bs, n_k, q_offset, block_n)
    written = range(0, 2, heads_per_program)  # each program writes at its first head
    assert torch.equal(tile_counts[:, written].cpu(), expected[:, written])
    assert int(expected[..., 0].sum()) > 0  # the case exercises the unmasked path
    if heads_per_program == 2:
        assert (tile_counts[:, 1] == -1).all()  # one program served both heads


@needs_triton
def test_dense_selection_runs_all_but_the_diagonal_unmasked():
    """A dense causal selection over 6 blocks of 16 with 16-key tiles: query block i runs i full tiles, 1 masked."""
    q, k, v = qkv(1, 1, 96, 96, 32, seed=12)
    keep = torch.ones(1, 1, 6, 6, dtype=torch.bool, device=DEVICE).tril()
    tile_counts = torch.zeros(1, 1, 6, 2, dtype=torch.int32, device=DEVICE)
    check_forward(q, k, v, keep, 16, tiles=TileConfig(block_n=16), tile_counts=tile_counts)
    assert tile_counts[0, 0].tolist() == [[i, 1] for i in range(6)]


# ----------------------------------------------------------------------------------------------------------------
# Decode: stacked GQA heads, full blocks, masked tail
# ----------------------------------------------------------------------------------------------------------------


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize(("n_k", "bs", "q_offset", "head_dim"), [(130, 32, 129, 64), (77, 16, 50, 128)])
def test_decode_matches_reference(dtype, group, n_k, bs, q_offset, head_dim):
    """Shared selections per KV group (one program per group), a ragged cache, and a query before its end (later
    keys, even in kept blocks, are masked); 2 blocks per split so the splits are merged."""
    heads = 4
    q, k, v = qkv(2, heads, 1, n_k, head_dim, dtype, seed=group, kv_heads=heads // group)
    keep = make_keep(2, heads, heads // group, 1, n_k, bs, q_offset=q_offset, p=0.6, seed=n_k + group)
    keep[..., -1] = True  # the ragged last block, in the future when q_offset < Nk - 1
    indices, counts = selection_lists(keep)
    kwargs = {"block_size": bs, "scaling": head_dim**-0.5, "q_offset": q_offset, "return_lse": True}
    out, lse = block_sparse_decode_triton(q, k, v, indices, counts, blocks_per_split=2, **kwargs)
    expected_out, expected_lse = reference_out_lse(q, k, v, keep, bs, q_offset)
    tol = LOOSE[dtype]
    torch.testing.assert_close(out.float(), expected_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, expected_lse, atol=1e-4, rtol=1e-4)


@needs_triton
@pytest.mark.parametrize("heads_per_program", [1, 3])
def test_decode_key_padding_and_group_of_three(heads_per_program):
    """Key padding (masked path everywhere) with a group of 3 stacked heads or one head per program."""
    q, k, v = qkv(2, 6, 1, 70, 32, seed=9, kv_heads=2)
    keep = make_keep(2, 6, 2, 1, 70, 16, q_offset=69, p=0.7, seed=9)
    keep[..., 0] = True
    mask = left_padding_mask([70, 40], 70)
    tiles = TileConfig(block_n=16, heads_per_program=heads_per_program)
    kwargs = {"block_size": 16, "scaling": 32**-0.5, "q_offset": 69, "key_padding_mask": mask}
    out = block_sparse_decode_triton(q, k, v, *selection_lists(keep), tiles=tiles, **kwargs)
    torch.testing.assert_close(out, reference_out_lse(q, k, v, keep, 16, 69, mask)[0], atol=1e-4, rtol=1e-4)


@needs_triton
def test_decode_dispatcher_with_broadcast_selection():
    """The decode dispatcher on a selection broadcast over heads lists it once and stacks each group's heads."""
    q, k, v = qkv(1, 4, 1, 90, 32, seed=10, kv_heads=1)
    keep = make_keep(1, 1, 1, 1, 90, 16, q_offset=89, seed=10).expand(1, 4, -1, -1)
    out = block_sparse_decode(q, k, v, keep, block_size=16, scaling=32**-0.5, q_offset=89, backend="triton")
    torch.testing.assert_close(out, reference_out_lse(q, k, v, keep, 16, 89)[0], atol=1e-4, rtol=1e-4)
    assert decode_tile_config(16, 4).heads_per_program == 4


# ----------------------------------------------------------------------------------------------------------------
# Backward: gradients through the autograd op
# ----------------------------------------------------------------------------------------------------------------


def _grads(q, k, v, keep, dout, backend: str, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = block_sparse_flash_attention(*leaves, keep, backend=backend, **kwargs)
    out.backward(dout)
    return [out.detach()] + [x.grad for x in leaves]


def check_gradients(q, k, v, keep, bs: int, q_offset: int = 0, **kwargs):
    """out, dq, dk, dv of the Triton op vs autograd through the reference on fp32 copies."""
    settings = {"block_size": bs, "scaling": q.shape[3] ** -0.5, "q_offset": q_offset}
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(q.dtype).to(q.device)
    actual = _grads(q, k, v, keep, dout, "triton", **settings, **kwargs)
    expected = _grads(q.float(), k.float(), v.float(), keep, dout.float(), "torch", **settings)
    tol = GRAD_TOL[q.dtype]
    for name, got, want, like in zip(("out", "dq", "dk", "dv"), actual, expected, (q, q, k, v), strict=True):
        assert got.dtype == like.dtype and got.shape == like.shape, name
        scale = max(float(want.abs().max()), 1.0)
        torch.testing.assert_close(got.float(), want, atol=tol * scale, rtol=tol, msg=name)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize(
    ("bs", "head_dim", "n_q", "n_k", "q_offset", "diagonal"),
    [(16, 32, 40, 40, 0, True), (16, 64, 32, 75, 32, False), (32, 128, 40, 72, 32, True)],
)
def test_gradients_match_reference(dtype, group, bs, head_dim, n_q, n_k, q_offset, diagonal):
    """Shared selections (the group's heads stacked; dk / dv summed in the program when it holds the group)."""
    heads = 4
    q, k, v = qkv(1, heads, n_q, n_k, head_dim, dtype, seed=group + bs, kv_heads=heads // group)
    keep = make_keep(1, heads, heads // group, n_q, n_k, bs, q_offset=q_offset, diagonal=diagonal, seed=group)
    check_gradients(q, k, v, keep, bs, q_offset)


@needs_triton
def test_gradients_with_part_of_a_group_per_program_and_heads_that_differ():
    """A group of 4 served 2 heads per program (fp32 parts summed afterwards), and per-head selections (fallback)."""
    q, k, v = qkv(1, 4, 48, 48, 64, seed=21, kv_heads=1)
    shared = make_keep(1, 4, 1, 48, 48, 16, p=0.7, seed=21)
    assert backward_tile_config(16, 128, 4).heads_per_program == 4  # 64 rows fit the D = 128 cap
    assert backward_tile_config(64, 128, 4).heads_per_program == 1
    from hf_icl.kernels.block_sparse_backward import block_sparse_attention_backward_triton

    settings = {"block_size": 16, "scaling": 0.125}
    out, lse = block_sparse_attention_forward(q, k, v, shared, return_lse=True, backend="triton", **settings)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    halves = block_sparse_attention_backward_triton(
        q, k, v, out, lse, dout, shared, tiles=TileConfig(block_n=16, heads_per_program=2), **settings
    )
    whole = block_sparse_attention_backward_triton(q, k, v, out, lse, dout, shared, **settings)
    expected = _grads(q, k, v, shared, dout, "torch", **settings)[1:]
    for got_half, got_whole, want in zip(halves, whole, expected, strict=True):
        torch.testing.assert_close(got_half, want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_whole, want, atol=1e-5, rtol=1e-4)
    check_gradients(q, k, v, make_keep(1, 4, 1, 48, 48, 16, shared=False, seed=22), 16)


@needs_triton
def test_gradients_key_padding_and_broadcast_selection():
    """Key padding (no full blocks) on a head-broadcast selection over a GQA group of 2."""
    q, k, v = qkv(2, 2, 40, 40, 32, seed=23, kv_heads=1)
    keep = make_keep(2, 1, 1, 40, 40, 16, p=0.7, seed=23).expand(2, 2, -1, -1)
    mask = left_padding_mask([40, 25], 40)
    settings = {"block_size": 16, "scaling": 32**-0.5}
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    actual = _grads(q, k, v, keep, dout, "triton", key_padding_mask=mask, **settings)
    expected = _grads(q, k, v, keep, dout, "torch", key_padding_mask=mask, **settings)
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Which heads share, tile configs, validation
# ----------------------------------------------------------------------------------------------------------------


def test_group_sharing_detection():
    keep = make_keep(1, 4, 2, 32, 32, 16, seed=1).cpu()
    assert selection_shared_by_groups(keep, 2) and selection_shared_by_groups(keep, 4)
    assert not selection_shared_by_groups(make_keep(1, 4, 2, 64, 64, 16, shared=False, p=0.5, seed=2).cpu(), 2)
    indices, counts = selection_lists(keep)
    assert _indices_shared_by_groups(indices, counts, 2)
    junk = indices.clone()
    junk[:, 1, 0, counts[0, 1, 0] :] = 99  # slots past counts may hold anything
    assert _indices_shared_by_groups(junk, counts, 2)
    if counts[0, 1, 0] > 0:
        junk[:, 1, 0, 0] = 99  # a listed id that differs does count
        assert not _indices_shared_by_groups(junk, counts, 2)
    with pytest.raises(ValueError, match="kv_heads must divide the 4 query heads of keep, got 3"):
        selection_shared_by_groups(keep, 3)


def test_group_heads_argument():
    keep = make_keep(1, 4, 2, 64, 64, 16, shared=False, p=0.5, seed=2).cpu()
    indices, counts = selection_lists(keep)
    assert resolve_group_heads(None, indices, counts, 2, check=True) is False
    assert resolve_group_heads(False, indices, counts, 2, check=True) is False
    assert resolve_group_heads(True, indices, counts, 2, check=False) is True  # trusted without a check
    with pytest.raises(ValueError, match="group_heads=True needs every query head of a KV-head group"):
        resolve_group_heads(True, indices, counts, 2, check=True)
    with pytest.raises(ValueError, match="group_heads must be None, True or False, got 1"):
        resolve_group_heads(1, indices, counts, 2, check=True)


def test_tile_configs_per_head_dim():
    """Defaults keyed by D: 128-key tiles for D <= 64, 64-key tiles and fewer stages for D = 128; stacked heads
    divide the group and stay within the row cap; one head per program without a shared selection."""
    small, large = forward_tile_config(64, 64, 4), forward_tile_config(64, 128, 4)
    assert (small.block_n, large.block_n) == (128, 64) and large.num_stages < small.num_stages
    assert (small.heads_per_program, large.heads_per_program) == (4, 2)
    for block_size in (16, 32, 64, 128):
        for head_dim in (32, 64, 128):
            for group in (1, 2, 3, 4, 6, 8):
                for make in (forward_tile_config, backward_tile_config):
                    tiles = make(block_size, head_dim, group)
                    assert group % tiles.heads_per_program == 0
                    assert tiles.heads_per_program == 1 or tiles.rows(block_size) <= 256
                assert forward_tile_config(block_size, head_dim).heads_per_program == 1


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"block_n": 48}, r"block_n must be one of \[16, 32, 64, 128\], got 48"),
        ({"block_n": 64, "heads_per_program": 0}, "heads_per_program must be an int >= 1, got 0"),
        ({"block_n": 64, "num_warps": 3}, r"num_warps must be one of \[1, 2, 4, 8, 16\], got 3"),
        ({"block_n": 64, "num_stages": 0}, "num_stages must be an int >= 1, got 0"),
    ],
)
def test_tile_config_validation(fields, match):
    with pytest.raises(ValueError, match=match):
        TileConfig(**fields)


@needs_triton
def test_kernel_argument_validation():
    """Stacked heads that do not divide the group, or stacking heads that differ; a malformed tile_counts."""
    q, k, v = qkv(1, 4, 32, 32, 32, seed=1, kv_heads=2)
    keep = make_keep(1, 4, 2, 32, 32, 16, seed=1)
    indices, counts = selection_lists(keep)
    kwargs = {"block_size": 16, "scaling": 0.2}
    with pytest.raises(ValueError, match="tiles.heads_per_program must divide 2"):
        block_sparse_attention_triton(
            q, k, v, indices, counts, tiles=TileConfig(block_n=16, heads_per_program=4), **kwargs
        )
    with pytest.raises(ValueError, match="tiles.heads_per_program must divide 1"):
        block_sparse_attention_triton(
            q, k, v, indices, counts, group_heads=False, tiles=TileConfig(block_n=16, heads_per_program=2), **kwargs
        )
    differing = make_keep(1, 4, 2, 32, 32, 16, shared=False, p=0.5, seed=3)
    assert not selection_shared_by_groups(differing, 2)
    with pytest.raises(ValueError, match="group_heads=True needs"):
        block_sparse_attention_triton(q, k, v, *selection_lists(differing), group_heads=True, **kwargs)
    with pytest.raises(ValueError, match=r"tile_counts must be None or a contiguous int32 tensor \(1, 4, 2, 2\)"):
        block_sparse_attention_triton(q, k, v, indices, counts, tile_counts=torch.zeros(1, 4, 2, 2), **kwargs)
    one_row = torch.tensor([[True, False], [True, True]] * 2, device=DEVICE).view(1, 4, 1, 2)  # heads 0, 1 differ
    dispatchers = [
        lambda: block_sparse_attention_forward(q, k, v, differing, group_heads=True, backend="triton", **kwargs),
        lambda: block_sparse_flash_attention(q, k, v, differing, group_heads=True, backend="triton", **kwargs),
        lambda: block_sparse_decode(
            q[:, :, :1], k, v, one_row, group_heads=True, q_offset=20, backend="triton", **kwargs
        ),
    ]
    for call in dispatchers:  # the dispatchers check a vouched-for sharing before any kernel runs
        with pytest.raises(ValueError, match="group_heads=True needs"):
            call()
    with pytest.raises(ValueError, match="tiles must be a TileConfig or None, got dict"):
        block_sparse_attention_triton(q, k, v, indices, counts, tiles={"block_n": 16}, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# The floor against a count by hand
# ----------------------------------------------------------------------------------------------------------------


def floor_by_hand(keep, bs, n_q, n_k, q_offset, head_dim, kv_heads, size, group_reads):
    """Loops over every (b, h, query, key): attended pairs, and each kept block with work read per reader."""
    batch, heads, m_q, m_k = keep.shape
    group = heads // kv_heads
    pairs, tile_reads, needed = 0, {}, set()
    for b in range(batch):
        for h in range(heads):
            for t in range(n_q):
                for s in range(n_k):
                    if keep[b, h, t // bs, s // bs] and s <= q_offset + t:
                        pairs += 1
                        reader = (b, h // group) if group_reads else (b, h)
                        tile_reads[(reader, t // bs, s // bs)] = min(bs, n_k - (s // bs) * bs)
                        needed.add((b, h // group, s // bs))
    tokens = sum(tile_reads.values())
    needed_tokens = sum(min(bs, n_k - j * bs) for _, _, j in needed)
    q_and_out = 2 * batch * heads * n_q * head_dim
    return (
        4 * head_dim * pairs,
        size * (q_and_out + 2 * head_dim * tokens),
        size * (q_and_out + 2 * head_dim * needed_tokens),
    )


@pytest.mark.parametrize(
    ("heads", "kv_heads", "n_q", "n_k", "q_offset", "bs", "shared"),
    [(2, 2, 13, 13, 0, 4, True), (4, 2, 8, 19, 8, 4, True), (4, 1, 9, 17, 8, 8, False), (2, 1, 1, 11, 7, 4, False)],
)
def test_floor_matches_a_count_by_hand(heads, kv_heads, n_q, n_k, q_offset, bs, shared):
    keep = make_keep(2, heads, kv_heads, n_q, n_k, bs, q_offset=q_offset, shared=shared, p=0.5, seed=n_k).cpu()
    keep[0, 0, 0, -1] = True  # a kept block wholly in the future: no work, no bytes
    floor = block_sparse_floor(
        keep, block_size=bs, n_q=n_q, n_k=n_k, head_dim=8, q_offset=q_offset, kv_heads=kv_heads, element_size=2
    )
    flops, moved, compulsory = floor_by_hand(keep, bs, n_q, n_k, q_offset, 8, kv_heads, 2, group_reads=shared)
    assert (floor.flops, floor.bytes, floor.compulsory_bytes) == (flops, moved, compulsory)
    if not shared or heads == kv_heads:  # forcing per-head reads of a shared selection counts each head's reads
        return
    per_head = block_sparse_floor(
        keep, block_size=bs, n_q=n_q, n_k=n_k, head_dim=8, q_offset=q_offset, kv_heads=kv_heads, group_reads=False
    )
    assert per_head.bytes == floor_by_hand(keep, bs, n_q, n_k, q_offset, 8, kv_heads, 2, group_reads=False)[1]
    assert per_head.bytes > floor.bytes and per_head.flops == floor.flops


def test_attended_pairs_closed_form_and_dense_floor():
    for bs, n_q, n_k, offset in ((4, 9, 9, 0), (8, 5, 21, 16), (4, 1, 10, 3), (16, 16, 16, 0)):
        pairs = attended_pairs(bs, n_q, n_k, offset)
        by_hand = torch.zeros_like(pairs)
        for t in range(n_q):
            for s in range(min(n_k, offset + t + 1)):
                by_hand[t // bs, s // bs] += 1
        assert torch.equal(pairs, by_hand)
    dense = dense_causal_floor(batch=2, heads=4, n=10, head_dim=16, kv_heads=2, element_size=2)
    assert dense.flops == 4 * 16 * 2 * 4 * 55
    assert dense.bytes == dense.compulsory_bytes == 2 * 2 * 10 * 16 * (4 + 4 + 2 + 2)
    keep = torch.ones(2, 4, 3, 3, dtype=torch.bool).tril()  # dense selection: the same FLOPs as dense attention
    sparse = block_sparse_floor(keep, block_size=4, n_q=10, n_k=10, head_dim=16, kv_heads=2)
    assert sparse.flops == dense.flops and sparse.compulsory_bytes == dense.compulsory_bytes


def test_roofline_time_bound_and_fraction():
    floor = AttentionFloor(bytes=3.35e9, flops=0.5e12, compulsory_bytes=1e8)
    assert floor.seconds(H100_SXM) == pytest.approx(1e-3) and floor.bound(H100_SXM) == "memory"
    assert floor.seconds(H100_SXM, compulsory=True) == pytest.approx(0.5e12 / H100_SXM.flop_rate)
    assert floor.bound(H100_SXM, compulsory=True) == "compute"
    assert floor.fraction(4e-3, H100_SXM) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="measured_seconds must be a positive number, got 0"):
        floor.fraction(0, H100_SXM)
    with pytest.raises(ValueError, match="bandwidth must be a positive finite number, got -1"):
        DevicePeaks(bandwidth=-1, flop_rate=1e12)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"keep": torch.ones(1, 1, 2, 2)}, r"keep must be a bool \(B, H, Mq, Mk\) tensor"),
        ({"n_k": 40}, r"keep must have \(Mq, Mk\)=\(2, 3\) for n_q=32, n_k=40, got \(2, 2\)"),
        ({"block_size": 0}, "block_size must be an int >= 1, got 0"),
        ({"kv_heads": 3}, "kv_heads must divide the 2 query heads of keep, got 3"),
        ({"group_reads": "yes"}, "group_reads must be None, True or False, got 'yes'"),
        ({"q_offset": -16}, "q_offset must be an int >= 0, got -16"),
    ],
)
def test_floor_validation(change, match):
    kwargs = {"keep": torch.ones(1, 2, 2, 2, dtype=torch.bool), "block_size": 16, "n_q": 32, "n_k": 32, "head_dim": 8}
    kwargs.update(change)
    with pytest.raises(ValueError, match=match):
        block_sparse_floor(**kwargs)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_docstring_examples(module):
    assert doctest.testmod(module, raise_on_error=True).attempted > 0
