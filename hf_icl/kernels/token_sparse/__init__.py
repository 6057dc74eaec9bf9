"""Per-token block-sparse causal attention: every query token attends the key blocks IT selected.

One op, laid out like flash-linear-attention's ``ops/`` folders:

* :mod:`.naive` — the reference: dense float64 softmax under the per-token mask (tests, small inputs);
* :mod:`.torch_path` — the PyTorch path (every device; autograd, dropout): key block by key block, the queries that
  chose a block attend to it, partial results merged per token; selection and execution range by range;
* :mod:`.triton_pairs`, :mod:`.triton_forward`, :mod:`.triton_backward` — the Triton kernels (forward, dq/dk/dv)
  taking the selection as block lists ``(indices, counts)``, the way the fused selection kernel emits them, with no
  host sync; grouped-query attention reads each K/V block once per group; per-row ``lengths`` serve padded batches;
* :mod:`.decode` — one query per head (a generation step): the split-K decode kernel on the same block lists.

The selection format: ``indices (B, H, Nq, W)`` int32, ascending block ids, the first ``counts[b, h, t]`` valid and
the rest repeating the last; ``counts (B, H, Nq)`` int32. ``token_keep (B, H, Nq, Mk)`` bool is the same selection
as a mask (:func:`keep_to_indices` converts).
"""

from __future__ import annotations

import torch

from .._common import check_backend, triton
from ..block_sparse_reference import keep_to_indices
from .decode import KERNEL_HEAD_DIMS, token_sparse_decode
from .naive import token_sparse_attention_naive
from .torch_path import attend_selected, query_range_length, query_ranges, token_sparse_attention_torch


def kernels_unsupported(
    device: torch.device, head_dim: int, dtype: torch.dtype, dropout: float = 0.0, *, cuda_only: bool = True
) -> str | None:
    """Why the Triton kernels cannot run a call (None when they can): no triton, not CUDA (with ``cuda_only``; the
    interpreter runs them on CPU otherwise), attention dropout, a head dim or dtype they lack."""
    if triton is None:
        return "triton could not be imported"
    if cuda_only and device.type != "cuda":
        return f"tensors on {device.type}: the kernels run on CUDA (backend 'triton' runs them interpreted)"
    if dropout:
        return f"attention dropout ({dropout}) is not implemented in the kernels; use model.eval() or dropout 0"
    if head_dim not in KERNEL_HEAD_DIMS:
        return f"head_dim must be one of {list(KERNEL_HEAD_DIMS)} for the kernels, got {head_dim}"
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {dtype} is not one the kernels take (float32, float16, bfloat16)"
    return None


def token_sparse_attention(
    query,
    key,
    value,
    token_keep,
    *,
    block_size: int,
    scaling: float,
    key_valid=None,
    dropout: float = 0.0,
    backend: str = "auto",
):
    """The op's one public entry: attention of every query ``(B, H, Nq, D)`` (the last ``Nq`` of the ``Nk``
    positions of ``key`` / ``value (B, H / g, Nk, D)``) over the key blocks it kept in ``token_keep (B, H, Nq, Mk)``
    bool, blocks laid over each row's real tokens (``key_valid (B, Nk)``, None: no padding). ``backend``: ``"auto"``
    runs the Triton kernels on CUDA when they apply (no padding, no dropout, a kernel head dim) and the PyTorch path
    otherwise; ``"triton"`` insists; ``"torch"`` is the PyTorch path. Returns ``(B, H, Nq, D)``.

        >>> q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
        >>> keep = torch.ones(1, 2, 40, 3, dtype=torch.bool)               # every block: dense causal attention
        >>> out = token_sparse_attention(q, k, v, keep, block_size=16, scaling=8 ** -0.5)
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
        True
    """
    backend = check_backend(backend)
    reason = None
    if backend != "torch":
        if key_valid is not None:
            reason = "padded batches take the PyTorch path here (CAB's attention call compacts them for the kernels)"
        else:
            reason = kernels_unsupported(
                query.device, query.shape[-1], query.dtype, dropout, cuda_only=backend == "auto"
            )
    if backend == "triton" and reason is not None:
        raise ValueError(f"backend='triton' cannot run this call: {reason}")
    if backend == "torch" or reason is not None:
        return token_sparse_attention_torch(
            query, key, value, token_keep, block_size=block_size, scaling=scaling, key_valid=key_valid, dropout=dropout
        )
    indices, counts = keep_to_indices(token_keep, token_keep.shape[-1])
    n_q, n_k = query.shape[2], key.shape[2]
    return token_sparse_attention_triton(
        query, key, value, indices, counts, block_size=block_size, scaling=scaling, q_offset=n_k - n_q
    )


def token_sparse_attention_triton(query, key, value, indices, counts, **options):
    """The Triton kernels (forward and backward): see :func:`.triton_backward.token_sparse_attention_triton`."""
    from .triton_backward import token_sparse_attention_triton as kernels  # defines kernels on first use

    return kernels(query, key, value, indices, counts, **options)


__all__ = [
    "KERNEL_HEAD_DIMS",
    "attend_selected",
    "keep_to_indices",
    "kernels_unsupported",
    "query_range_length",
    "query_ranges",
    "token_sparse_attention",
    "token_sparse_attention_naive",
    "token_sparse_attention_torch",
    "token_sparse_attention_triton",
    "token_sparse_decode",
]
