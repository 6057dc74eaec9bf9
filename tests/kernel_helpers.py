"""Shared helpers of the Triton kernel tests (forward, backward, split-K decode): device, skip marker, random inputs,
a spy on the entry a route takes.

Imported as ``from kernel_helpers import ...`` from any folder of tests/ (``pythonpath = ["tests"]`` in pyproject.toml).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from hf_icl.kernels import triton_available

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LOOSE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}

needs_triton = pytest.mark.skipif(
    not triton_available() or not (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()),
    reason="Triton kernels need CUDA or TRITON_INTERPRET=1 (set before triton is imported)",
)


def qkv(
    b: int,
    h: int,
    n_q: int,
    n_k: int,
    d: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    kv_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q (b, h, n_q, d) and k / v (b, kv_heads or h, n_k, d), drawn in fp32 then cast (same on any device)."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads = h if kv_heads is None else kv_heads
    q = torch.randn(b, h, n_q, d, generator=gen)
    k = torch.randn(b, kv_heads, n_k, d, generator=gen)
    v = torch.randn(b, kv_heads, n_k, d, generator=gen)
    return tuple(x.to(dtype).to(DEVICE) for x in (q, k, v))


def random_keep(
    b: int, h: int, n_q: int, n_k: int, block_size: int, q_offset: int = 0, p: float = 0.5, seed: int = 0
) -> torch.Tensor:
    """Random bool (b, h, Mq, Mk) block mask that always keeps each query block's diagonal key block."""
    m_q, m_k = math.ceil(n_q / block_size), math.ceil(n_k / block_size)
    gen = torch.Generator().manual_seed(seed + 1000)
    keep = torch.rand(b, h, m_q, m_k, generator=gen) < p
    diagonal = (q_offset + torch.arange(m_q) * block_size) // block_size  # key block holding the first query
    keep[:, :, torch.arange(m_q), diagonal] = True
    return keep.to(DEVICE)


def left_padding_mask(lengths: list[int], n_k: int) -> torch.Tensor:
    """Bool (len(lengths), n_k) key padding mask, True = real key: row b holds its ``lengths[b]`` real keys last."""
    positions = torch.arange(n_k)
    return torch.stack([positions >= n_k - length for length in lengths]).to(DEVICE)


def record_keyword(monkeypatch, module, name: str, keyword: str) -> list:
    """Wrap ``module.name`` so that every call appends its ``keyword`` argument to the returned list and then runs as
    before (the spy goes with ``monkeypatch``)."""
    seen, original = [], getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(kwargs[keyword])
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen
