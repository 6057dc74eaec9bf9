"""Block-sparse decode in Triton: one query token against a long KV cache, split-K over the selected blocks.

At decode a head has a single query row, so the prefill kernel's one-program-per-query-block grid would leave most
of the GPU idle. Here each (batch * head) spreads its selected cache blocks over ``num_splits`` programs; each
program runs an online softmax over its share (matrix-vector work, no ``tl.dot``: a 1-row tile is too small for
tensor cores) and writes a partial ``(acc, m, l)``. The partials are merged exactly in PyTorch:

    m = max_s m_s,   l = sum_s exp(m_s - m) l_s,   out = sum_s exp(m_s - m) acc_s / l,   lse = m + log(l)

Masking matches the prefill kernel: keys after the query's position ``q_offset`` (any offset), keys past ``Nk``
and padded keys are ignored; a query that sees no key gets zeros and ``lse = -inf``.
"""

from __future__ import annotations

import math

import torch

from ._common import check_attention_tensor, check_kernel_runnable, check_key_padding_mask, resolve_backend, tl, triton
from .block_sparse_attention import (
    _key_valid_tensor,
    block_sparse_attention_reference,
    validate_keep,
    validate_qkv,
    validate_selection,
)
from .block_sparse_reference import selected_block_indices

__all__ = ["block_sparse_decode", "block_sparse_decode_reference", "block_sparse_decode_triton", "plan_splits"]

#: programs to aim for per streaming multiprocessor when choosing the split count
PROGRAMS_PER_SM = 4


_block_sparse_decode_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _block_sparse_decode_kernel(
        q,
        k,
        v,
        part_acc,
        part_m,
        part_l,
        indices,
        counts,
        key_valid,
        heads,
        kv_group,
        n_k,
        q_pos,
        scaling,
        blocks_per_split,
        num_splits,
        qs_b,
        qs_h,
        qs_d,
        ks_b,
        ks_h,
        ks_n,
        ks_d,
        vs_b,
        vs_h,
        vs_n,
        vs_d,
        is_b,
        is_h,
        is_k,
        cs_b,
        cs_h,
        kvs_b,
        kvs_n,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):
        """One program per (split, batch * head): online softmax over blocks [split * bps, (split + 1) * bps)."""
        split = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // heads
        h = bh % heads
        h_kv = h // kv_group
        cols = tl.arange(0, BLOCK_D).to(tl.int64)
        key_rows = tl.arange(0, BLOCK_N)

        query = tl.load(q + b * qs_b + h * qs_h + cols * qs_d).to(tl.float32)
        count = tl.load(counts + b * cs_b + h * cs_h)
        start = split * blocks_per_split
        stop = tl.minimum(start + blocks_per_split, count)

        m_i = tl.full([], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([], dtype=tl.float32)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for j in range(start, stop):
            k_idx = tl.load(indices + b * is_b + h * is_h + j * is_k) * BLOCK_N + key_rows
            k_ok = (k_idx >= 0) & (k_idx < n_k) & (k_idx <= q_pos)
            if HAS_KEY_MASK:
                k_ok = k_ok & (tl.load(key_valid + b * kvs_b + k_idx.to(tl.int64) * kvs_n, mask=k_ok, other=0) != 0)
            k_off = k_idx.to(tl.int64)[:, None]
            k_tile = tl.load(
                k + b * ks_b + h_kv * ks_h + k_off * ks_n + cols[None, :] * ks_d, mask=k_ok[:, None], other=0.0
            )
            s = tl.sum(k_tile.to(tl.float32) * query[None, :], axis=1) * scaling
            s = tl.where(k_ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet: exp gives 0, not NaN
            p = tl.exp(s - m_safe)
            alpha = tl.exp(m_i - m_safe)
            v_tile = tl.load(
                v + b * vs_b + h_kv * vs_h + k_off * vs_n + cols[None, :] * vs_d, mask=k_ok[:, None], other=0.0
            )
            acc = acc * alpha + tl.sum(p[:, None] * v_tile.to(tl.float32), axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new

        slot = bh * num_splits + split
        tl.store(part_acc + slot * BLOCK_D + cols, acc)
        tl.store(part_m + slot, m_i)
        tl.store(part_l + slot, l_i)


def plan_splits(width: int, programs: int, device: torch.device) -> int:
    """Blocks per split so that ``programs`` (batch * heads) × splits fills the GPU about ``PROGRAMS_PER_SM`` deep."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4  # the interpreter: any small number exercises the merge
    wanted = max(1, math.ceil(PROGRAMS_PER_SM * sms / max(programs, 1)))
    return max(1, math.ceil(width / wanted))


def _merge_splits(
    part_acc: torch.Tensor, part_m: torch.Tensor, part_l: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax merge of per-split partials ``(…, S, D)``, ``(…, S)``, ``(…, S)`` → ``out (…, D)``, ``lse (…)``."""
    m = part_m.amax(-1, keepdim=True)
    weights = torch.exp(part_m - m.nan_to_num(0.0, neginf=0.0))  # splits that saw nothing weigh exp(-inf) = 0
    total = (weights * part_l).sum(-1)
    seen = total > 0
    out = (weights.unsqueeze(-1) * part_acc).sum(-2) / torch.where(seen, total, 1.0).unsqueeze(-1)
    lse = torch.where(seen, m.squeeze(-1) + torch.log(torch.where(seen, total, 1.0)), float("-inf"))
    return out, lse


def block_sparse_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int,
    key_padding_mask: torch.Tensor | None = None,
    blocks_per_split: int | None = None,
    return_lse: bool = False,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Split-K decode of ``q (B, H, 1, D)`` at absolute position ``q_offset`` over ``k`` / ``v (B, H / g, Nk, D)``.

    ``indices (B, H, 1, K)`` / ``counts (B, H, 1)`` list each head's cache blocks (the selection layout);
    ``blocks_per_split`` (default: :func:`plan_splits`) sets how many blocks one program reads. ``validate=False``
    skips the input checks (and their device syncs) for selections valid by construction. Returns ``out``
    (B, H, 1, D) in q's dtype, and the fp32 ``lse`` (B, H, 1) if asked.
    """
    if validate:
        if q.dim() == 4 and q.shape[2] != 1:
            raise ValueError(f"q must hold one token per head for decode (q.shape[2] == 1), got {tuple(q.shape)}")
        validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
        validate_selection(q, k, indices, counts, block_size)
        check_key_padding_mask(key_padding_mask, q, k)
    check_kernel_runnable(_block_sparse_decode_kernel, q, "block_sparse_decode_triton")
    batch, heads, _, head_dim = q.shape
    width = indices.shape[-1]
    if blocks_per_split is None:
        blocks_per_split = plan_splits(width, batch * heads, q.device)
    elif isinstance(blocks_per_split, bool) or not isinstance(blocks_per_split, int) or blocks_per_split < 1:
        raise ValueError(f"blocks_per_split must be an int >= 1 or None, got {blocks_per_split!r}")
    num_splits = math.ceil(width / blocks_per_split)
    part_acc = torch.empty(batch, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    part_m = torch.empty(batch, heads, num_splits, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    key_valid = _key_valid_tensor(key_padding_mask, q)
    if batch * heads > 0:
        _block_sparse_decode_kernel[(num_splits, batch * heads)](
            q,
            k,
            v,
            part_acc,
            part_m,
            part_l,
            indices,
            counts,
            key_valid,
            heads,
            heads // k.shape[1],
            k.shape[2],
            q_offset,
            float(scaling),
            blocks_per_split,
            num_splits,
            q.stride(0),
            q.stride(1),
            q.stride(3),
            *k.stride(),
            *v.stride(),
            indices.stride(0),
            indices.stride(1),
            indices.stride(3),
            counts.stride(0),
            counts.stride(1),
            *key_valid.stride(),
            BLOCK_N=block_size,
            BLOCK_D=head_dim,
            HAS_KEY_MASK=key_padding_mask is not None,
            num_warps=4,
        )
    out, lse = _merge_splits(part_acc, part_m, part_l)
    out = out.to(q.dtype).unsqueeze(2)
    return (out, lse.unsqueeze(2)) if return_lse else out


def _check_single_query(q) -> None:
    """Decode attends ONE query token per head: ``q`` must be ``(B, H, 1, D)``."""
    check_attention_tensor("q", q)
    if q.shape[2] != 1:
        raise ValueError(f"q must hold one token per head for decode (q.shape[2] == 1), got {tuple(q.shape)}")


def block_sparse_decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int,
    key_padding_mask: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PyTorch path: the prefill reference with a single query row (which allows any ``q_offset``)."""
    _check_single_query(q)
    return block_sparse_attention_reference(
        q,
        k,
        v,
        keep,
        block_size=block_size,
        scaling=scaling,
        q_offset=q_offset,
        return_lse=return_lse,
        key_padding_mask=key_padding_mask,
    )


def block_sparse_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int,
    key_padding_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over the cache blocks kept by ``keep (B, H, 1, Mk)``: split-K kernel on CUDA, else reference.

    ``validate=False`` skips the kernel path's input checks and their device syncs (for a caller that built ``keep``).
    """
    kwargs = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset, "return_lse": return_lse}
    _check_single_query(q)
    if resolve_backend(backend, q) == "reference":
        return block_sparse_decode_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **kwargs)
    if validate:
        validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
        validate_keep(q, k, keep, block_size)
        check_key_padding_mask(key_padding_mask, q, k)  # the kernel call below skips its own checks
    indices, valid = selected_block_indices(keep)
    return block_sparse_decode_triton(
        q, k, v, indices, valid.sum(-1), key_padding_mask=key_padding_mask, validate=False, **kwargs
    )
