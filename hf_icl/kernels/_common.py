"""What every Triton kernel module here shares: the optional triton import, input checks, dispatch."""

from __future__ import annotations

import torch

from ..deprecation import renamed_value
from ..validation import check_choice, check_scaling  # noqa: F401  (check_scaling: re-exported)

try:  # triton is optional (absent on macOS / Windows); the PyTorch paths never need it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the platform
    triton = None
    tl = None

#: ``backend=`` of every dispatcher: ``"auto"`` (Triton on CUDA, else PyTorch), ``"triton"`` or ``"torch"`` (PyTorch)
BACKENDS = ("auto", "triton", "torch")
#: old backend names → their names now (deprecated, accepted for one release): ``"reference"`` was the PyTorch path
BACKEND_ALIASES = {"reference": "torch"}
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_available() -> bool:
    """Whether triton could be imported."""
    return triton is not None


def check_attention_tensor(name: str, x) -> None:
    """``x`` must be a 4-D (batch, heads, tokens, head_dim) tensor of a supported dtype with ≥ 1 token."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D (batch, heads, tokens, head_dim), got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}.dtype must be one of {[str(d) for d in SUPPORTED_DTYPES]}, got {x.dtype}")
    if x.shape[2] < 1:
        raise ValueError(f"{name} must have at least 1 token (dim 2), got shape {tuple(x.shape)}")


def check_matches_query(q: torch.Tensor, name: str, x: torch.Tensor, *, grouped: bool = False) -> None:
    """``x`` (k or v) must share q's dtype, device, batch, heads and head_dim.

    With ``grouped`` (grouped-query attention) x may have fewer heads, as long as they divide q's heads.
    """
    if x.dtype != q.dtype:
        raise ValueError(f"q.dtype and {name}.dtype must be equal, got q.dtype={q.dtype} and {name}.dtype={x.dtype}")
    if x.device != q.device:
        raise ValueError(f"q and {name} must be on the same device, got {q.device} and {x.device}")
    shapes = f"q.shape={tuple(q.shape)} and {name}.shape={tuple(x.shape)}"
    for dim, label in ((0, "batch"), (3, "head_dim")) if grouped else ((0, "batch"), (1, "heads"), (3, "head_dim")):
        if q.shape[dim] != x.shape[dim]:
            raise ValueError(f"q and {name} must have equal {label} (dim {dim}), got {shapes}")
    if grouped and q.shape[1] % x.shape[1]:
        raise ValueError(f"{name}'s heads (dim 1) must divide q's heads (grouped-query attention), got {shapes}")


def check_key_padding_mask(key_padding_mask, q: torch.Tensor, k: torch.Tensor) -> None:
    """``key_padding_mask`` is None or a bool ``(B, Nk)`` tensor on q's device, True = a real (attendable) key."""
    if key_padding_mask is None:
        return
    if not isinstance(key_padding_mask, torch.Tensor):
        raise ValueError(f"key_padding_mask must be a torch.Tensor or None, got {type(key_padding_mask).__name__}")
    if key_padding_mask.dtype != torch.bool:
        raise ValueError(f"key_padding_mask.dtype must be torch.bool, got {key_padding_mask.dtype}")
    if key_padding_mask.device != q.device:
        raise ValueError(
            f"q and key_padding_mask must be on the same device, got {q.device} and {key_padding_mask.device}"
        )
    expected = (k.shape[0], k.shape[2])
    if tuple(key_padding_mask.shape) != expected:
        raise ValueError(f"key_padding_mask must have shape (B, Nk)={expected}, got {tuple(key_padding_mask.shape)}")


def check_backend(backend: str, name: str = "backend") -> str:
    """``backend`` checked against :data:`BACKENDS`; an old name (:data:`BACKEND_ALIASES`, ``"reference"``) is
    accepted with a ``DeprecationWarning`` and returned under its name now (``"torch"``)."""
    backend = renamed_value(name, backend, BACKEND_ALIASES, stacklevel=4)
    check_choice(name, backend, BACKENDS)
    return backend


def resolve_backend(backend: str, q) -> str:
    """``"triton"`` or ``"torch"``: ``"auto"`` → the Triton kernel for CUDA tensors when triton is importable, else
    the PyTorch path."""
    backend = check_backend(backend)
    if backend != "auto":
        return backend
    return "triton" if triton is not None and isinstance(q, torch.Tensor) and q.is_cuda else "torch"


def is_interpreted(kernel) -> bool:
    """Whether ``kernel`` runs in Triton's CPU interpreter.

    Triton reads ``TRITON_INTERPRET`` when a kernel is defined (at import), not at launch, so this is a property
    of the kernel object: setting the variable later has no effect.
    """
    return type(kernel).__name__ == "InterpretedFunction"


def check_kernel_runnable(kernel, q: torch.Tensor, entry_point: str) -> None:
    """Raise ``RuntimeError`` unless ``kernel`` can run on ``q``'s device."""
    if triton is None:
        raise RuntimeError(f"{entry_point} needs triton, which could not be imported; use backend='torch'")
    if not q.is_cuda and not is_interpreted(kernel):
        raise RuntimeError(
            f"{entry_point} needs CUDA tensors (got device {q.device}) unless TRITON_INTERPRET=1 was set "
            "before triton was imported; use backend='torch' on CPU"
        )
