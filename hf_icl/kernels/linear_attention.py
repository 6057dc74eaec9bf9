"""Causal linear attention in PyTorch, plus the single-token step and prompt state used for generation.

For queries and keys ``(B, H, T, D)`` and values ``(B, H, T, Dv)``, with a feature map φ applied to ``scale · q`` and
``scale · k`` (``scale`` defaults to ``1/sqrt(D)``)::

    S_t = Σ_{j≤t} φ(k_j) v_jᵀ      z_t = Σ_{j≤t} φ(k_j)      o_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps)

``normalize=False`` drops the denominator. The three modes compute the same function:

* ``"parallel"``: the masked quadratic form ``tril(φ(Q)φ(K)ᵀ) V``, O(T²·F) — the reference;
* ``"recurrent"``: an explicit scan over t carrying the state, O(T·F·Dv) but one Python step per token;
* ``"chunked"``: quadratic inside chunks of ``chunk_size`` tokens, the state carried across chunks,
  O(T·C·F + T·F·Dv) — the default.

All modes normalise the same way: a ones column is appended to v, so the last output column of the *unnormalised*
attention is the denominator ``φ(q_t)ᵀ z_t`` (the state ``z`` is the last column of ``S``). Any unnormalised kernel
(``backend="triton"`` or ``"fla"``) therefore serves both ``normalize`` settings.

The state and every accumulation are float32 for float16/bfloat16 inputs (float64 inputs stay float64); outputs
come back in the input dtype.

Example::

    >>> import torch
    >>> from hf_icl.kernels.linear_attention import causal_linear_attention, linear_attention_step
    >>> q, k = torch.randn(2, 4, 100, 16), torch.randn(2, 4, 100, 16)
    >>> v = torch.randn(2, 4, 100, 32)
    >>> o = causal_linear_attention(q, k, v, chunk_size=32)
    >>> o.shape
    torch.Size([2, 4, 100, 32])
    >>> torch.allclose(o, causal_linear_attention(q, k, v, mode="parallel"), atol=1e-5)
    True
    >>> state = None  # generation: one token at a time with a constant-size state
    >>> for t in range(100):
    ...     o_t, state = linear_attention_step(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)
    >>> torch.allclose(o_t, o[:, :, -1:], atol=1e-5)
    True
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..validation import check_choice, check_float, check_int
from ._common import check_4d_tensor

__all__ = [
    "BACKENDS",
    "FEATURE_MAPS",
    "MODES",
    "QUADRATIC_MAPS",
    "QUADRATIC_MAX_HEAD_DIM",
    "apply_feature_map",
    "causal_linear_attention",
    "feature_dim",
    "linear_attention_state",
    "linear_attention_step",
]

FEATURE_MAPS = ("squared_relu", "relu", "elu_plus_one", "identity", "quadratic", "quadratic_full")
#: the maps whose width grows with D²: [1, x, degree-2 products]
QUADRATIC_MAPS = ("quadratic", "quadratic_full")
MODES = ("parallel", "recurrent", "chunked")
BACKENDS = ("auto", "torch", "triton", "fla")
# The quadratic maps are 1 + D + D(D+1)/2 ("quadratic") or 1 + D + D² ("quadratic_full") wide: 561 or 1057 features
# at D = 32, so the state S (F × Dv per head) is already ~18-33× larger than the head itself; at D = 64 they would be
# 2145 or 4161 wide. Beyond 32 they are a memory trap, not a model.
QUADRATIC_MAX_HEAD_DIM = 32
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

State = tuple[torch.Tensor, torch.Tensor]


# ----------------------------------------------------------------------------------------------------------------
# Feature maps
# ----------------------------------------------------------------------------------------------------------------


def _quadratic(x: torch.Tensor) -> torch.Tensor:
    # The linear-attention study's map (its appendix): [1, x_1, …, x_D, x_i x_j for i ≤ j], the products in row-major
    # upper-triangle order x_1², x_1x_2, …, x_1x_D, x_2², …, x_D². Each off-diagonal product appears once, so
    # φ(q)·φ(k) = 1 + q·k + Σ_{i≤j} q_i q_j k_i k_j = 1 + q·k + ((q·k)² + Σ_i q_i² k_i²) / 2, not 1 + q·k + (q·k)².
    rows, cols = torch.triu_indices(x.shape[-1], x.shape[-1], device=x.device)
    return torch.cat([torch.ones_like(x[..., :1]), x, x[..., rows] * x[..., cols]], dim=-1)


def _quadratic_full(x: torch.Tensor) -> torch.Tensor:
    # [1, x, vec(x ⊗ x)]: every ordered product x_i x_j, so φ(q)·φ(k) = 1 + q·k + (q·k)², the degree-2 polynomial
    # kernel.
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
    return torch.cat([torch.ones_like(x[..., :1]), x, outer], dim=-1)


_FEATURE_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "squared_relu": lambda x: torch.relu(x).square(),
    "relu": torch.relu,
    "elu_plus_one": lambda x: F.elu(x) + 1.0,
    "identity": lambda x: x,
    "quadratic": _quadratic,
    "quadratic_full": _quadratic_full,
}


def _quadratic_width(feature_map: str, head_dim: int) -> int:
    products = head_dim * (head_dim + 1) // 2 if feature_map == "quadratic" else head_dim**2
    return 1 + head_dim + products


def feature_dim(feature_map: str, head_dim: int) -> int:
    """Width F of ``feature_map`` applied to vectors of ``head_dim`` D.

    D for the elementwise maps; ``1 + D + D(D+1)/2`` for ``"quadratic"`` (the products x_i x_j with i ≤ j) and
    ``1 + D + D²`` for ``"quadratic_full"`` (every ordered product). Raises ``ValueError`` for either quadratic map
    with ``head_dim > QUADRATIC_MAX_HEAD_DIM`` (32).
    """
    check_choice("feature_map", feature_map, FEATURE_MAPS)
    check_int("head_dim", head_dim, low=1)
    if feature_map not in QUADRATIC_MAPS:
        return head_dim
    width = _quadratic_width(feature_map, head_dim)
    if head_dim > QUADRATIC_MAX_HEAD_DIM:
        formula = "1 + D + D(D+1)/2" if feature_map == "quadratic" else "1 + D + D²"
        raise ValueError(
            f"feature_map={feature_map!r} supports head_dim <= {QUADRATIC_MAX_HEAD_DIM} (its width {formula} would be "
            f"{width}), got head_dim={head_dim}; use a smaller head_dim or another feature map"
        )
    return width


def apply_feature_map(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """φ(x) over the last dimension: ``(..., D)`` → ``(..., feature_dim(feature_map, D))``."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point torch.Tensor, got {_describe(x)}")
    feature_dim(feature_map, x.shape[-1])  # validates the name and the quadratic maps' width limit
    return _FEATURE_FNS[feature_map](x)


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def _describe(x) -> str:
    return f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def _check_tensor(name: str, x) -> None:
    """``x`` must be a 4-D ``(B, H, T, dim)`` tensor of a supported dtype with ≥ 1 token and ≥ 1 channel."""
    check_4d_tensor(name, x, INPUT_DTYPES, "(batch, heads, tokens, dim)")
    if x.shape[2] < 1 or x.shape[3] < 1:
        raise ValueError(f"{name} needs at least 1 token (dim 2) and 1 channel (dim 3), got shape {tuple(x.shape)}")


def _check_same(first: str, a: torch.Tensor, second: str, b: torch.Tensor, dims: tuple[int, ...]) -> None:
    """``a`` and ``b`` share dtype, device and the sizes of ``dims``."""
    if a.dtype != b.dtype:
        raise ValueError(f"{first}.dtype and {second}.dtype must be equal, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{first} and {second} must be on the same device, got {a.device} and {b.device}")
    if any(a.shape[d] != b.shape[d] for d in dims):
        raise ValueError(
            f"{first} and {second} must have equal sizes in dims {list(dims)}, "
            f"got {first}.shape={tuple(a.shape)} and {second}.shape={tuple(b.shape)}"
        )


def _check_kv(k, v, key_mask) -> None:
    _check_tensor("k", k)
    _check_tensor("v", v)
    _check_same("k", k, "v", v, dims=(0, 1, 2))  # (B, H, T); v may have its own width Dv
    if key_mask is None:
        return
    if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
        raise ValueError(f"key_mask must be None or a torch.bool tensor (True = real token), got {_describe(key_mask)}")
    if tuple(key_mask.shape) != (k.shape[0], k.shape[2]):
        raise ValueError(f"key_mask must have shape (B, T)={(k.shape[0], k.shape[2])}, got {tuple(key_mask.shape)}")
    if key_mask.device != k.device:
        raise ValueError(f"key_mask and k must be on the same device, got {key_mask.device} and {k.device}")


def _check_qkv(q, k, v, key_mask) -> None:
    _check_tensor("q", q)
    _check_kv(k, v, key_mask)
    _check_same("q", q, "k", k, dims=(0, 1, 2, 3))


def _check_options(feature_map: str, head_dim: int, scale, eps=1e-6, normalize=True) -> float:
    """Validate the options shared by every entry point; return the resolved ``scale``."""
    feature_dim(feature_map, head_dim)
    check_float("eps", eps, low=0.0, low_inclusive=False)
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a bool, got {normalize!r}")
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    return check_float("scale", scale, low=0.0, low_inclusive=False)


def _check_state(state, shape_s: tuple[int, ...], device: torch.device) -> None:
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise ValueError(f"state must be None or a pair (S, z), got {type(state).__name__}")
    for name, x, shape in (("S", state[0], shape_s), ("z", state[1], shape_s[:-1])):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"state's {name} must be a floating-point torch.Tensor, got {_describe(x)}")
        if tuple(x.shape) != shape:
            raise ValueError(f"state's {name} must have shape {shape} (B, H, F[, Dv]), got {tuple(x.shape)}")
        if x.device != device:
            raise ValueError(f"state's {name} must be on the inputs' device {device}, got {x.device}")


# ----------------------------------------------------------------------------------------------------------------
# Unnormalised causal linear attention: o_t = Σ_{j≤t} (φq_t · φk_j) v_j on feature-mapped inputs
# ----------------------------------------------------------------------------------------------------------------


def _parallel(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = phi_q @ phi_k.transpose(-1, -2)  # (B, H, T, T)
    return scores.tril() @ v  # tril keeps j ≤ t, the diagonal included


def _recurrent(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    batch, heads, tokens, width = phi_q.shape
    state = phi_q.new_zeros(batch, heads, width, v.shape[-1])  # S (and z, v's ones column)
    outputs = []
    for t in range(tokens):
        state = state + phi_k[:, :, t, :, None] * v[:, :, t, None, :]  # out of place: autograd keeps each S_t
        outputs.append(phi_q[:, :, t, None, :] @ state)
    return torch.cat(outputs, dim=2)


def _chunked(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    batch, heads, tokens, width = phi_q.shape
    size = min(chunk_size, tokens)
    chunks = -(-tokens // size)
    pad = chunks * size - tokens
    # Zero rows appended after the last token: later than every real token, so causality keeps them out of real
    # outputs (and φ was already applied, so they are exact zeros, not φ(0)).
    qc, kc, vc = (F.pad(x, (0, 0, 0, pad)).reshape(batch, heads, chunks, size, x.shape[-1]) for x in (phi_q, phi_k, v))
    within = (qc @ kc.transpose(-1, -2)).tril() @ vc
    contribution = kc.transpose(-1, -2) @ vc  # (B, H, chunks, F, Dv): what each chunk adds to S
    # The state carried into chunk i is the sum over chunks < i: an exclusive prefix sum.
    carried = torch.cat([torch.zeros_like(contribution[:, :, :1]), contribution[:, :, :-1].cumsum(dim=2)], dim=2)
    out = within + qc @ carried
    return out.reshape(batch, heads, chunks * size, -1)[:, :, :tokens]


def _triton_chunked(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, chunk_size: int) -> torch.Tensor:
    try:  # lazy: the Triton module (and triton itself) are optional
        from .linear_attention_triton import causal_linear_attention_triton
    except ImportError as err:
        raise ImportError(
            "backend='triton' needs hf_icl.kernels.linear_attention_triton and triton, which could not be imported "
            f"({err}); use backend='torch'"
        ) from err
    return causal_linear_attention_triton(phi_q, phi_k, v, chunk_size=chunk_size)


def _fla_chunked(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # Untested here: flash-linear-attention is not installed in this project's CI (it needs a CUDA GPU).
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError as err:
        raise ImportError(
            "backend='fla' needs flash-linear-attention, which could not be imported: pip install hf-icl[fla] "
            f"(or pip install flash-linear-attention); or use backend='torch' ({err})"
        ) from err
    heads, tokens = phi_q.shape[1], phi_q.shape[2]
    # Recent fla rejects T < H (it suspects a head-first layout): pad zero tokens at the end, harmless by causality.
    pad = max(0, heads - tokens)
    q, k, v = (F.pad(x, (0, 0, 0, pad)).transpose(1, 2).contiguous() for x in (phi_q, phi_k, v))  # (B, T, H, ·)
    # head_first exists in older releases (default True in some), is deprecated in newer ones, absent in forks.
    layout = {"head_first": False} if "head_first" in inspect.signature(chunk_linear_attn).parameters else {}
    # φ and the scale were already applied, and normalisation is ours (the ones column): turn both off in fla.
    out, _ = chunk_linear_attn(q, k, v, scale=1.0, normalize=False, **layout)
    return out.transpose(1, 2)[:, :, :tokens]


def _resolve_backend(backend: str, device: torch.device | str) -> str:
    """The backend ``backend="auto"`` runs on ``device``: ``"torch"``, on CPU and (for now) on CUDA too.

    On CPU the Triton kernel only runs interpreted and fla not at all, so PyTorch is the only real choice. On CUDA
    the choice waits for ``hf-icl bench linear-attention`` on a GPU to show a kernel faster than PyTorch's chunked
    form at every length and dtype; explicit ``"triton"`` / ``"fla"`` run them already.
    """
    check_choice("backend", backend, BACKENDS)
    # CPU, and CUDA until a GPU benchmark decides: PyTorch's chunked form.
    return "torch" if backend == "auto" else backend


def _unnormalised(phi_q, phi_k, v, mode: str, backend: str, chunk_size: int) -> torch.Tensor:
    if backend == "triton":
        return _triton_chunked(phi_q, phi_k, v, chunk_size)
    if backend == "fla":
        return _fla_chunked(phi_q, phi_k, v)
    if mode == "parallel":
        return _parallel(phi_q, phi_k, v)
    if mode == "recurrent":
        return _recurrent(phi_q, phi_k, v)
    return _chunked(phi_q, phi_k, v, chunk_size)


# ----------------------------------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------------------------------


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float32 for half precision and float32, float64 kept (the tests' exact references)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _features(x: torch.Tensor, feature_map: str, scale: float, real: torch.Tensor | None) -> torch.Tensor:
    x = x.to(_work_dtype(x.dtype))
    if real is not None:  # zero padded inputs first, so garbage (even NaN) there cannot reach values or gradients
        x = x.masked_fill(~real, 0.0)
    return _FEATURE_FNS[feature_map](x * scale)


def causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: str = "squared_relu",
    eps: float = 1e-6,
    normalize: bool = True,
    mode: str = "chunked",
    backend: str = "auto",
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Causal linear attention ``o_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps)`` (see the module docstring).

    Args:
        q, k: ``(B, H, T, D)``; multiplied by ``scale`` (default ``1/sqrt(D)``) before the feature map.
        v: ``(B, H, T, Dv)``.
        feature_map: one of ``FEATURE_MAPS``: ``"squared_relu"`` (ReLU(x)², the default), ``"relu"``,
            ``"elu_plus_one"``, ``"identity"``, ``"quadratic"`` ([1, x, x_i x_j for i ≤ j], the linear-attention
            study's appendix map) or ``"quadratic_full"`` ([1, x, vec(x ⊗ x)], kernel 1 + q·k + (q·k)²); the two
            quadratic maps need ``D <= QUADRATIC_MAX_HEAD_DIM``.
        eps: > 0, added to the denominator.
        normalize: divide by ``φ(q_t)ᵀ z_t + eps``; False returns ``φ(q_t)ᵀ S_t``.
        mode: one of ``MODES``; all are differentiable and agree.
        backend: ``"auto"`` / ``"torch"`` (PyTorch), ``"triton"`` (``hf_icl.kernels.linear_attention_triton``) or
            ``"fla"`` (flash-linear-attention); the last two only with ``mode="chunked"``.
        key_mask: optional ``(B, T)`` bool, True = real token. Padded tokens add nothing to the state and their
            outputs are 0.
        chunk_size: tokens per chunk for ``mode="chunked"``; T need not be a multiple.

    Returns:
        ``(B, H, T, Dv)`` in the input dtype.
    """
    _check_qkv(q, k, v, key_mask)
    scale = _check_options(feature_map, q.shape[-1], scale, eps, normalize)
    check_choice("mode", mode, MODES)
    check_choice("backend", backend, BACKENDS)
    check_int("chunk_size", chunk_size, low=1)
    if backend in ("triton", "fla") and mode != "chunked":
        raise ValueError(
            f"backend={backend!r} only supports mode='chunked', got mode={mode!r}; "
            "use backend='torch' (or 'auto') for the parallel and recurrent modes"
        )

    real = None if key_mask is None else key_mask[:, None, :, None]  # (B, 1, T, 1)
    phi_q = _features(q, feature_map, scale, real)
    phi_k = _features(k, feature_map, scale, real)
    values = v.to(phi_k.dtype)
    if normalize:  # the ones column accumulates z: the last output column is the denominator φ(q_t)ᵀ z_t
        values = torch.cat([values, torch.ones_like(values[..., :1])], dim=-1)
    # Padded tokens are zeroed after φ, since φ(0) ≠ 0 for elu_plus_one and the quadratic maps. Zeroing v and its
    # ones column alone would already remove them from S and z; φ(k) is zeroed too so no kernel ever sees φ(0) there.
    if real is not None:
        phi_k = phi_k.masked_fill(~real, 0.0)
        values = values.masked_fill(~real, 0.0)

    out = _unnormalised(phi_q, phi_k, values, mode, _resolve_backend(backend, q.device), chunk_size)
    if normalize:
        out = out[..., :-1] / (out[..., -1:] + eps)
    if real is not None:
        out = out.masked_fill(~real, 0.0)
    return out.to(q.dtype)


def linear_attention_state(
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: str = "squared_relu",
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
) -> State:
    """The state ``(S, z)`` after a whole prompt, to seed :func:`linear_attention_step` after a prefill.

    ``S = Σ_j φ(k_j) v_jᵀ`` is ``(B, H, F, Dv)`` and ``z = Σ_j φ(k_j)`` is ``(B, H, F)``, float32 (float64 for
    float64 inputs), summed over the real tokens of ``key_mask`` only.
    """
    _check_kv(k, v, key_mask)
    scale = _check_options(feature_map, k.shape[-1], scale)
    real = None if key_mask is None else key_mask[:, None, :, None]
    phi_k = _features(k, feature_map, scale, real)
    values = v.to(phi_k.dtype)
    if real is not None:
        phi_k = phi_k.masked_fill(~real, 0.0)
        values = values.masked_fill(~real, 0.0)
    return phi_k.transpose(-1, -2) @ values, phi_k.sum(dim=2)


def linear_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: State | None,
    *,
    feature_map: str = "squared_relu",
    eps: float = 1e-6,
    normalize: bool = True,
    scale: float | None = None,
) -> tuple[torch.Tensor, State]:
    """One generation step: add token t to the state, then attend with its query.

    Args:
        q, k: ``(B, H, 1, D)``; v: ``(B, H, 1, Dv)``.
        state: ``(S, z)`` with S ``(B, H, F, Dv)`` and z ``(B, H, F)``, or None for an empty state.

    Returns:
        ``(o, (S_new, z_new))``: o ``(B, H, 1, Dv)`` in the input dtype; the state in float32 (float64 for
        float64 inputs), the same as :func:`linear_attention_state` over all tokens so far.
    """
    _check_qkv(q, k, v, None)
    if q.shape[2] != 1:
        raise ValueError(f"linear_attention_step takes one token (dim 2 of size 1), got q.shape={tuple(q.shape)}")
    scale = _check_options(feature_map, q.shape[-1], scale, eps, normalize)
    phi_q = _features(q, feature_map, scale, None)
    phi_k = _features(k, feature_map, scale, None)
    batch, heads, _, width = phi_k.shape
    if state is None:
        s = phi_k.new_zeros(batch, heads, width, v.shape[-1])
        z = phi_k.new_zeros(batch, heads, width)
    else:
        _check_state(state, (batch, heads, width, v.shape[-1]), q.device)
        s, z = (x.to(phi_k.dtype) for x in state)
    s = s + phi_k.transpose(-1, -2) @ v.to(phi_k.dtype)  # outer product φ(k_t) v_tᵀ
    z = z + phi_k[:, :, 0]
    out = phi_q @ s  # (B, H, 1, Dv)
    if normalize:
        out = out / ((phi_q[:, :, 0] * z).sum(dim=-1)[..., None, None] + eps)
    return out.to(q.dtype), (s, z)
