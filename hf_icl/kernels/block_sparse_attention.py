"""Forward block-sparse causal attention with an online softmax (flash-attention style), in Triton.

Each query block of ``block_size`` rows attends to the key blocks listed for it in ``indices`` (ascending, the first
``counts`` entries valid). One program handles one (batch * head, query block): it loads the query tile once, then
streams the selected key / value tiles, keeping a running row max ``m``, a running sum ``l`` and a rescaled fp32
accumulator, and finally writes ``acc / l`` in the input dtype (optionally also ``lse = m + log(l)`` in fp32).

Rules shared with the PyTorch reference (:func:`hf_icl.kernels.block_sparse_reference.block_sparse_attention`):

* query block ``i`` covers absolute positions ``q_offset + i * block_size ...``; ``q_offset`` is a multiple of
  ``block_size`` unless ``Nq == 1`` (decode, any offset);
* token-level causality: a key at a position after the query's position is masked (this only bites in the diagonal
  block, but is applied to every block); key rows past ``Nk`` are masked;
* scores, softmax statistics and the accumulator are float32 whatever the input dtype;
* an optional ``key_padding_mask (B, Nk)`` (True = real key) masks padded keys for every query;
* grouped-query attention: ``k`` / ``v`` may have ``H / g`` heads, query head ``h`` reading KV head ``h // g``.

A query row that can see no key at all (only possible when its selection misses every past block) gets zeros and
``lse = -inf``, never NaN.

Under ``TRITON_INTERPRET=1`` (triton 3.9) ``tl.dot`` on bf16 tiles returns wrong values, so the launcher sets the
``UPCAST_DOT`` constexpr there and the dot operands are cast to float32 first; on a GPU the same kernel runs native
fp16 / bf16 dots with fp32 accumulation.
"""

from __future__ import annotations

import math

import torch

from ._common import (
    BACKENDS,
    SUPPORTED_DTYPES,
    check_attention_tensor,
    check_kernel_runnable,
    check_key_padding_mask,
    check_matches_query,
    check_scaling,
    is_interpreted,
    resolve_backend,
    tl,
    triton,
)
from .block_sparse_reference import block_sparse_attention, selected_block_indices, token_mask

__all__ = [
    "BACKENDS",
    "BLOCK_SIZES",
    "HEAD_DIMS",
    "SUPPORTED_DTYPES",
    "block_sparse_attention_forward",
    "block_sparse_attention_reference",
    "block_sparse_attention_triton",
]

INDEX_DTYPES = (torch.int32, torch.int64)
BLOCK_SIZES = (16, 32, 64, 128)
HEAD_DIMS = (32, 64, 128)


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, q_offset: int, *, scaling) -> None:
    """Raise ``ValueError`` naming the argument, the value and what is allowed (q / k / v, block size, offset,
    scaling). Shapes and scalars only: no device sync."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_attention_tensor(name, x)
    check_scaling(scaling)
    check_matches_query(q, "k", k, grouped=True)
    check_matches_query(q, "v", v, grouped=True)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have equal shapes, got k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"head_dim (q.shape[3]) must be one of {list(HEAD_DIMS)}, got {q.shape[3]}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {list(BLOCK_SIZES)}, got {block_size!r}")
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an int >= 0, got {q_offset!r}")
    if q.shape[2] > 1 and q_offset % block_size != 0:
        raise ValueError(
            f"q_offset must be a multiple of block_size={block_size} unless Nq == 1 (decode), "
            f"got q_offset={q_offset} with Nq={q.shape[2]}"
        )


def validate_selection(
    q: torch.Tensor,
    k: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    block_size: int,
) -> None:
    """Check ``indices (B, H, Mq, K)`` and ``counts (B, H, Mq)`` against ``q`` / ``k`` (shapes, dtypes, values).

    The value checks (``1 <= counts <= K``, ``0 <= indices < Mk``) read the tensors, one device sync each.
    """
    batch, heads, n_q, _ = q.shape
    q_blocks, k_blocks = math.ceil(n_q / block_size), math.ceil(k.shape[2] / block_size)
    for name, x, rank in (("indices", indices, 4), ("counts", counts, 3)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name}.dtype must be one of {[str(d) for d in INDEX_DTYPES]}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"q and {name} must be on the same device, got {q.device} and {x.device}")
        expected = (batch, heads, q_blocks)
        if x.dim() != rank or tuple(x.shape[:3]) != expected:
            shape = "(B, H, Mq, K)" if rank == 4 else "(B, H, Mq)"
            raise ValueError(f"{name} must have shape {shape} with (B, H, Mq)={expected}, got {tuple(x.shape)}")
    width = indices.shape[3]
    if width < 1:
        raise ValueError(f"indices must list at least one key block (K >= 1), got shape {tuple(indices.shape)}")
    if counts.numel() and (int(counts.min()) < 1 or int(counts.max()) > width):
        raise ValueError(f"counts must be in [1, K={width}], got values in [{int(counts.min())}, {int(counts.max())}]")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= k_blocks):
        raise ValueError(
            f"indices must be key-block ids in [0, Mk={k_blocks}), got values in "
            f"[{int(indices.min())}, {int(indices.max())}]"
        )


def validate_keep(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, block_size: int) -> None:
    """Check the bool block mask ``keep (B, H, Mq, Mk)``; every query block must keep at least one key block."""
    if not isinstance(keep, torch.Tensor):
        raise ValueError(f"keep must be a torch.Tensor, got {type(keep).__name__}")
    if keep.dtype != torch.bool:
        raise ValueError(f"keep.dtype must be torch.bool, got {keep.dtype}")
    if keep.device != q.device:
        raise ValueError(f"q and keep must be on the same device, got {q.device} and {keep.device}")
    expected = (q.shape[0], q.shape[1], math.ceil(q.shape[2] / block_size), math.ceil(k.shape[2] / block_size))
    if tuple(keep.shape) != expected:
        raise ValueError(f"keep must have shape (B, H, Mq, Mk)={expected}, got {tuple(keep.shape)}")
    if keep.numel() and not bool(keep.any(-1).all()):
        raise ValueError("keep must select at least one key block in every query block row, got an empty row")


# ----------------------------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------------------------

_block_sparse_attention_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _block_sparse_attention_kernel(
        q,
        k,
        v,
        out,
        lse,
        indices,
        counts,
        key_valid,
        heads,
        kv_group,
        n_q,
        n_k,
        q_offset,
        scaling,
        qs_b,
        qs_h,
        qs_n,
        qs_d,
        ks_b,
        ks_h,
        ks_n,
        ks_d,
        vs_b,
        vs_h,
        vs_n,
        vs_d,
        os_b,
        os_h,
        os_n,
        os_d,
        ls_b,
        ls_h,
        ls_n,
        is_b,
        is_h,
        is_m,
        is_k,
        cs_b,
        cs_h,
        cs_m,
        kvs_b,
        kvs_n,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        UPCAST_DOT: tl.constexpr,
        RETURN_LSE: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
    ):
        """One program per (query block, batch * head): online softmax over the selected key blocks."""
        blk = tl.program_id(0)
        bh = tl.program_id(1)
        # int64 offsets: B * H * N * D can exceed 2**31 for long KV caches.
        b = (bh // heads).to(tl.int64)
        h = (bh % heads).to(tl.int64)
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows within this (b, h)
        row_ok = rows < n_q
        q_pos = q_offset + rows  # absolute query positions
        cols = tl.arange(0, BLOCK_D).to(tl.int64)
        key_rows = tl.arange(0, BLOCK_N)

        q_ptrs = q + b * qs_b + h * qs_h + rows.to(tl.int64)[:, None] * qs_n + cols[None, :] * qs_d
        q_tile = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        if UPCAST_DOT:
            q_tile = q_tile.to(tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        k_base = k + b * ks_b + (h // kv_group) * ks_h
        v_base = v + b * vs_b + (h // kv_group) * vs_h
        sel_base = indices + b * is_b + h * is_h + blk.to(tl.int64) * is_m
        count = tl.load(counts + b * cs_b + h * cs_h + blk.to(tl.int64) * cs_m)
        for j in range(count):
            kb = tl.load(sel_base + j * is_k)
            k_idx = kb * BLOCK_N + key_rows  # absolute key positions of this block
            k_ok = (k_idx >= 0) & (k_idx < n_k)
            if HAS_KEY_MASK:
                k_ok = k_ok & (tl.load(key_valid + b * kvs_b + k_idx.to(tl.int64) * kvs_n, mask=k_ok, other=0) != 0)
            k_off = k_idx.to(tl.int64)[:, None]
            k_tile = tl.load(k_base + k_off * ks_n + cols[None, :] * ks_d, mask=k_ok[:, None], other=0.0)
            v_tile = tl.load(v_base + k_off * vs_n + cols[None, :] * vs_d, mask=k_ok[:, None], other=0.0)
            if UPCAST_DOT:
                k_tile = k_tile.to(tl.float32)
                v_tile = v_tile.to(tl.float32)

            s = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee") * scaling  # fp32 (BLOCK_M, BLOCK_N)
            allowed = k_ok[None, :] & (k_idx[None, :] <= q_pos[:, None])
            s = tl.where(allowed, s, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # A row with nothing allowed so far keeps m = -inf: subtract 0 instead, so exp gives 0, not NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]
            if UPCAST_DOT:
                acc += tl.dot(p, v_tile, input_precision="ieee")
            else:
                acc += tl.dot(p.to(v_tile.dtype), v_tile, input_precision="ieee")
            m_i = m_new

        has_keys = l_i > 0.0
        result = acc / tl.where(has_keys, l_i, 1.0)[:, None]  # rows that saw no key stay 0
        o_ptrs = out + b * os_b + h * os_h + rows.to(tl.int64)[:, None] * os_n + cols[None, :] * os_d
        tl.store(o_ptrs, result.to(out.dtype.element_ty), mask=row_ok[:, None])
        if RETURN_LSE:
            row_lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
            tl.store(lse + b * ls_b + h * ls_h + rows.to(tl.int64) * ls_n, row_lse, mask=row_ok)


def block_sparse_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    counts: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int = 0,
    return_lse: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton block-sparse causal attention of ``q (B, H, Nq, D)`` over ``k`` / ``v (B, H / g, Nk, D)``.

    Args:
        indices: ``(B, H, Mq, K)`` int32 / int64 key-block ids per query block, ascending; the first
            ``counts[b, h, i]`` are used (see :func:`hf_icl.kernels.block_sparse_reference.selected_block_indices`).
        counts: ``(B, H, Mq)`` number of valid ids per query block, in ``[1, K]``.
        block_size: tokens per block (16, 32, 64 or 128), for queries and keys alike.
        scaling: softmax scale applied to ``q @ k^T``.
        q_offset: absolute position of query 0 (a multiple of ``block_size`` unless ``Nq == 1``).
        return_lse: also return the float32 log-sum-exp ``(B, H, Nq)`` of the scaled, masked scores.
        key_padding_mask: optional bool ``(B, Nk)``, False for padded keys (masked for every query).
        validate: check the inputs first; ``False`` skips the checks and their device syncs, for selections made by
            :func:`~hf_icl.kernels.block_sparse_reference.selected_block_indices` (valid by construction).

    Returns the ``(B, H, Nq, D)`` output in the input dtype (contiguous), and ``lse`` if asked. Runs on CUDA
    tensors, or on CPU tensors under ``TRITON_INTERPRET=1``; strided inputs are read in place.
    """
    if validate:
        validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
        validate_selection(q, k, indices, counts, block_size)
        check_key_padding_mask(key_padding_mask, q, k)
    check_kernel_runnable(_block_sparse_attention_kernel, q, "block_sparse_attention_triton")
    key_valid = _key_valid_tensor(key_padding_mask, q)
    batch, heads, n_q, head_dim = q.shape
    q_blocks = math.ceil(n_q / block_size)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(batch, heads, n_q, dtype=torch.float32, device=q.device)
    if batch * heads > 0:
        _block_sparse_attention_kernel[(q_blocks, batch * heads)](
            q,
            k,
            v,
            out,
            lse,
            indices,
            counts,
            key_valid,
            heads,
            heads // k.shape[1],
            n_q,
            k.shape[2],
            q_offset,
            float(scaling),
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *out.stride(),
            *lse.stride(),
            *indices.stride(),
            *counts.stride(),
            *key_valid.stride(),
            BLOCK_M=block_size,
            BLOCK_N=block_size,
            BLOCK_D=head_dim,
            UPCAST_DOT=is_interpreted(_block_sparse_attention_kernel),
            RETURN_LSE=return_lse,
            HAS_KEY_MASK=key_padding_mask is not None,
            **launch_config(block_size, head_dim),
        )
    return (out, lse) if return_lse else out


def kernels_runnable(device: torch.device | str) -> bool:
    """Whether the block-sparse kernels can run on tensors of ``device``: CUDA, or CPU under the interpreter."""
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or is_interpreted(_block_sparse_attention_kernel)


def launch_config(block_size: int, head_dim: int) -> dict[str, int]:
    """Warps and pipeline stages per program: 4 warps for tiles up to 64 × 64, else 8 (larger accumulators);
    2 stages for 128 × 128 tiles, whose K / V buffers would not fit 3 deep in shared memory."""
    return {
        "num_warps": 4 if block_size * head_dim <= 64 * 64 else 8,
        "num_stages": 2 if block_size * head_dim >= 128 * 128 else 3,
    }


def _key_valid_tensor(key_padding_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The kernel's int8 ``(B, Nk)`` key-validity operand; a 1 × 1 placeholder when there is no mask (unread)."""
    if key_padding_mask is None:
        return torch.ones(1, 1, dtype=torch.int8, device=q.device)
    return key_padding_mask.to(torch.int8)


def padding_attention_mask(key_padding_mask: torch.Tensor | None, n_q: int) -> torch.Tensor | None:
    """``(B, Nk)`` key padding → the reference's bool ``(B, 1, Nq, Nk)`` attention mask (the same for every query)."""
    return None if key_padding_mask is None else key_padding_mask[:, None, None, :].expand(-1, 1, n_q, -1)


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query K / V ``(B, H / g, N, D)`` → ``(B, H, N, D)`` by repeating each KV head g times (references)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


# ----------------------------------------------------------------------------------------------------------------
# PyTorch reference and dispatcher
# ----------------------------------------------------------------------------------------------------------------


def _reference_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain masked ``logsumexp`` (B, H, Nq) fp32 over the kept blocks and the causal mask (dense, O(Nq * Nk))."""
    allowed = token_mask(keep, block_size, q.shape[2], k.shape[2], q_offset)
    if key_padding_mask is not None:
        allowed = allowed & padding_attention_mask(key_padding_mask, q.shape[2])
    scores = (q.float() @ expand_kv(k, q.shape[1]).float().transpose(-1, -2)) * scaling
    return torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int = 0,
    return_lse: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PyTorch path: :func:`hf_icl.kernels.block_sparse_reference.block_sparse_attention`, plus a dense masked lse."""
    validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
    validate_keep(q, k, keep, block_size)
    check_key_padding_mask(key_padding_mask, q, k)
    heads = q.shape[1]
    out = block_sparse_attention(
        q,
        expand_kv(k, heads),
        expand_kv(v, heads),
        keep,
        block_size=block_size,
        scaling=scaling,
        q_offset=q_offset,
        attention_mask=padding_attention_mask(key_padding_mask, q.shape[2]),
    )
    if not return_lse:
        return out
    lse = _reference_lse(
        q, k, keep, block_size=block_size, scaling=scaling, q_offset=q_offset, key_padding_mask=key_padding_mask
    )
    return out, lse


def block_sparse_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    q_offset: int = 0,
    return_lse: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse causal attention selected by the bool block mask ``keep (B, H, Mq, Mk)``.

    ``backend="auto"`` runs the Triton kernel on CUDA tensors when triton is importable and the PyTorch reference
    otherwise; ``"triton"`` or ``"reference"`` force one. Returns ``out`` (B, H, Nq, D), and the fp32 ``lse``
    (B, H, Nq) when ``return_lse`` is set. Not differentiable through the kernel: training goes through
    :func:`hf_icl.kernels.block_sparse_backward.block_sparse_flash_attention`.
    """
    kwargs = {"block_size": block_size, "scaling": scaling, "q_offset": q_offset, "return_lse": return_lse}
    if resolve_backend(backend, q) == "reference":
        return block_sparse_attention_reference(q, k, v, keep, key_padding_mask=key_padding_mask, **kwargs)
    validate_qkv(q, k, v, block_size, q_offset, scaling=scaling)
    validate_keep(q, k, keep, block_size)
    check_key_padding_mask(key_padding_mask, q, k)  # the kernel call below skips its own checks
    indices, valid = selected_block_indices(keep)
    return block_sparse_attention_triton(
        q, k, v, indices, valid.sum(-1), key_padding_mask=key_padding_mask, validate=False, **kwargs
    )
