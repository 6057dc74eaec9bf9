"""Max-L2 coarsening of queries and keys for CAB block-sparse attention.

For every (batch, head, block of ``block_size`` consecutive tokens) the row with the largest L2 norm represents
the block. Queries and keys are coarsened together, in one kernel launch.

Rules shared by the Triton kernel and the PyTorch reference (they must agree exactly):

* squared norms are accumulated in float32 whatever the input dtype (the square root is monotonic, so comparing
  squared norms selects the same row);
* the partial last block (``N`` not a multiple of ``block_size``) only considers its real rows;
* ties go to the **lowest** token index within the block;
* the selected rows are copied exactly, in the input dtype.

Inputs are expected to be finite: with NaNs the selected row is unspecified. The two implementations sum the ``D``
squares in different orders, so rows whose float32 squared norms differ by a rounding error only (about one ulp)
could in principle be ranked differently; exact ties (equal rows, sign flips) are always resolved identically.
"""

from __future__ import annotations

import math

import torch

from ._common import (
    BACKENDS,
    SUPPORTED_DTYPES,
    check_attention_tensor,
    check_kernel_runnable,
    check_matches_query,
    resolve_backend,
    tl,
    triton,
    triton_available,
)

__all__ = [
    "BACKENDS",
    "SUPPORTED_DTYPES",
    "coarsen_max_l2",
    "coarsen_max_l2_reference",
    "coarsen_max_l2_triton",
    "coarsen_one_max_l2",
    "triton_available",
]

BLOCK_SIZES = (16, 32, 64, 128)
HEAD_DIM_RANGE = (32, 256)
# Columns loaded per step: keeps a (128, chunk) fp32 tile small enough for registers on GPUs.
_MAX_D_CHUNK = 64


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def _validate(q: torch.Tensor, k: torch.Tensor, block_size: int) -> None:
    """Raise ``ValueError`` naming the argument, the value and what is allowed."""
    check_attention_tensor("q", q)
    check_attention_tensor("k", k)
    check_matches_query(q, "k", k)
    head_dim = q.shape[3]
    if not HEAD_DIM_RANGE[0] <= head_dim <= HEAD_DIM_RANGE[1]:
        raise ValueError(f"head_dim (q.shape[3]) must be in [{HEAD_DIM_RANGE[0]}, {HEAD_DIM_RANGE[1]}], got {head_dim}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in BLOCK_SIZES:
        raise ValueError(
            f"block_size must be a power of two in [16, 128] (one of {list(BLOCK_SIZES)}), got {block_size!r}"
        )


# ----------------------------------------------------------------------------------------------------------------
# PyTorch reference
# ----------------------------------------------------------------------------------------------------------------


def coarsen_one_max_l2(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Max-L2 row of every block of ``x`` (B, H, N, D) -> (B, H, ceil(N / block_size), D), any head dim."""
    batch, heads, n, dim = x.shape
    n_blocks = math.ceil(n / block_size)
    x32 = x.float()
    # fp32 squared norms (B, H, N). On CPU one batched dot per row is ~5x faster than square().sum() (no
    # (B, H, N, D) temporary); on CUDA a matmul could run in TF32, so there the plain sum is kept.
    if x.device.type == "cpu":
        sq_norms = torch.einsum("bhnd,bhnd->bhn", x32, x32)
    else:
        sq_norms = x32.square().sum(dim=-1)
    # -inf padding: a padded slot can never win against a real row (norms are >= 0).
    padded = torch.nn.functional.pad(sq_norms, (0, n_blocks * block_size - n), value=-math.inf)
    blocks = padded.view(batch, heads, n_blocks, block_size)
    best = blocks.amax(dim=-1, keepdim=True)
    # torch.argmax does not promise which index wins a tie: take the smallest position holding the max explicitly.
    positions = torch.arange(block_size, device=x.device)
    first = torch.where(blocks == best, positions, block_size).amin(dim=-1)
    index = first + torch.arange(n_blocks, device=x.device) * block_size
    index = index.clamp_(max=n - 1)  # only reachable with NaN norms; keeps gather in range
    return torch.gather(x, 2, index.unsqueeze(-1).expand(batch, heads, n_blocks, dim))


def coarsen_max_l2_reference(q: torch.Tensor, k: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch max-L2 coarsening of ``q`` (B, H, Nq, D) and ``k`` (B, H, Nk, D).

    Returns ``(q_coarse, k_coarse)`` of shapes (B, H, ceil(Nq / block_size), D) and (B, H, ceil(Nk / block_size), D):
    exact copies of the selected rows (largest fp32 L2 norm in each block, lowest index on ties).
    """
    _validate(q, k, block_size)
    return coarsen_one_max_l2(q, block_size), coarsen_one_max_l2(k, block_size)


# ----------------------------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------------------------

_coarsen_max_l2_kernel = None  # the Triton kernel, defined below when triton imports

if triton is not None:

    @triton.jit
    def _coarsen_block(
        src, dst, bh, blk, heads, n_tokens, head_dim,
        s_b, s_h, s_n, s_d, o_b, o_h, o_n, o_d,  # src / dst strides
        BLOCK_SIZE: tl.constexpr, D_CHUNK: tl.constexpr,
    ):  # fmt: skip
        """Copy the max-L2 row of token block ``blk`` of (batch, head) ``bh`` from ``src`` to ``dst``."""
        # int64 offsets: B * H * N * D can exceed 2**31 for long KV caches.
        b = (bh // heads).to(tl.int64)
        h = (bh % heads).to(tl.int64)
        src_base = src + b * s_b + h * s_h
        rows = blk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        row_ok = rows < n_tokens
        row_off = rows.to(tl.int64) * s_n
        cols = tl.arange(0, D_CHUNK)

        sq = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for d0 in range(0, head_dim, D_CHUNK):
            col_ok = (d0 + cols) < head_dim
            ptrs = src_base + row_off[:, None] + (d0 + cols).to(tl.int64)[None, :] * s_d
            x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
            sq += tl.sum(x * x, axis=1)
        # Rows past the end of a partial block must never win.
        sq = tl.where(row_ok, sq, float("-inf"))
        best = tl.max(sq, axis=0)
        # Lowest index among the maxima: the tie rule shared with the reference.
        winner = tl.min(tl.where(sq == best, rows, n_tokens), axis=0)
        winner = tl.minimum(winner, n_tokens - 1)  # only reachable with NaN norms; keeps the load in range

        src_row = src_base + winner.to(tl.int64) * s_n
        dst_row = dst + b * o_b + h * o_h + blk.to(tl.int64) * o_n
        for d0 in range(0, head_dim, D_CHUNK):
            d = d0 + cols
            col_ok = d < head_dim
            vals = tl.load(src_row + d.to(tl.int64) * s_d, mask=col_ok)
            tl.store(dst_row + d.to(tl.int64) * o_d, vals, mask=col_ok)

    @triton.jit
    def _coarsen_max_l2_kernel(
        q, k, q_out, k_out,                                          # tensors
        heads, n_q, n_k, head_dim, q_blocks, k_blocks, q_programs,  # shapes
        qs_b, qs_h, qs_n, qs_d, ks_b, ks_h, ks_n, ks_d,              # q / k strides
        qo_b, qo_h, qo_n, qo_d, ko_b, ko_h, ko_n, ko_d,              # q_out / k_out strides
        BLOCK_SIZE: tl.constexpr, D_CHUNK: tl.constexpr,
    ):  # fmt: skip
        """One program per (batch * head, block) of q, then one per (batch * head, block) of k."""
        pid = tl.program_id(0)
        # A flat grid (q programs first) avoids idle programs when Nq and Nk differ a lot (decode vs. KV cache).
        if pid < q_programs:
            _coarsen_block(
                q, q_out, pid // q_blocks, pid % q_blocks, heads, n_q, head_dim,
                qs_b, qs_h, qs_n, qs_d, qo_b, qo_h, qo_n, qo_d, BLOCK_SIZE, D_CHUNK,
            )  # fmt: skip
        else:
            p = pid - q_programs
            _coarsen_block(
                k, k_out, p // k_blocks, p % k_blocks, heads, n_k, head_dim,
                ks_b, ks_h, ks_n, ks_d, ko_b, ko_h, ko_n, ko_d, BLOCK_SIZE, D_CHUNK,
            )  # fmt: skip


def coarsen_max_l2_triton(q: torch.Tensor, k: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton max-L2 coarsening of ``q`` and ``k`` in one launch; same contract as :func:`coarsen_max_l2_reference`.

    Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``. Strided (non-contiguous) inputs are read
    in place; the outputs are contiguous.
    """
    _validate(q, k, block_size)
    check_kernel_runnable(_coarsen_max_l2_kernel, q, "coarsen_max_l2_triton")
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    q_blocks, k_blocks = math.ceil(n_q / block_size), math.ceil(n_k / block_size)
    q_out = torch.empty(batch, heads, q_blocks, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(batch, heads, k_blocks, head_dim, dtype=k.dtype, device=k.device)
    q_programs = batch * heads * q_blocks
    n_programs = q_programs + batch * heads * k_blocks
    if n_programs == 0:  # batch or heads is 0
        return q_out, k_out
    d_chunk = min(_MAX_D_CHUNK, triton.next_power_of_2(head_dim))
    _coarsen_max_l2_kernel[(n_programs,)](
        q, k, q_out, k_out,
        heads, n_q, n_k, head_dim, q_blocks, k_blocks, q_programs,
        *q.stride(), *k.stride(), *q_out.stride(), *k_out.stride(),
        BLOCK_SIZE=block_size, D_CHUNK=d_chunk, num_warps=4,
    )  # fmt: skip
    return q_out, k_out


# ----------------------------------------------------------------------------------------------------------------
# Dispatcher
# ----------------------------------------------------------------------------------------------------------------


def coarsen_max_l2(
    q: torch.Tensor, k: torch.Tensor, block_size: int, *, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Max-L2 coarsening of ``q`` (B, H, Nq, D) and ``k`` (B, H, Nk, D) into one row per ``block_size`` tokens.

    ``backend="auto"`` uses the Triton kernel for CUDA tensors when triton is importable and the PyTorch path
    otherwise; ``"triton"`` or ``"torch"`` force one. See the module docstring for the selection rules.
    """
    if resolve_backend(backend, q) == "triton":
        return coarsen_max_l2_triton(q, k, block_size)
    return coarsen_max_l2_reference(q, k, block_size)
