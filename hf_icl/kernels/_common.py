"""What every Triton kernel module here shares: the optional triton import, input checks, dispatch."""

from __future__ import annotations

import torch

from ..deprecation import renamed_value
from ..validation import check_choice, check_scaling

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
#: dtypes of the block lists ``indices`` / ``counts``
INDEX_DTYPES = (torch.int32, torch.int64)


def triton_available() -> bool:
    """Whether triton could be imported."""
    return triton is not None


def describe(x) -> str:
    """An argument as an error message names it: a tensor's dtype, shape and device, else its type (None as is)."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return repr(x) if x is None else type(x).__name__


def check_4d_tensor(name: str, x, dtypes: tuple, layout: str = "(batch, heads, tokens, head_dim)") -> None:
    """``x`` must be a 4-D tensor (its dims: ``layout``) of one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name}.dtype must be one of {[str(d) for d in dtypes]}, got {x.dtype}")


def check_attention_tensor(name: str, x) -> None:
    """``x`` must be a 4-D (batch, heads, tokens, head_dim) tensor of a supported dtype with ≥ 1 token."""
    check_4d_tensor(name, x, SUPPORTED_DTYPES)
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


def check_qkv(q, k, v, *, scaling, head_dims: tuple[int, ...], block_size, block_sizes: tuple[int, ...]) -> None:
    """The attention kernels' shared checks: q / k / v tensors (k / v may hold fewer, grouped-query heads, and equal
    shapes), the scale, a head dim among ``head_dims`` and a block size among ``block_sizes``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_attention_tensor(name, x)
    check_scaling(scaling)
    check_matches_query(q, "k", k, grouped=True)
    check_matches_query(q, "v", v, grouped=True)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have equal shapes, got k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}")
    if q.shape[3] not in head_dims:
        raise ValueError(f"head_dim (q.shape[3]) must be one of {list(head_dims)}, got {q.shape[3]}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in block_sizes:
        raise ValueError(f"block_size must be one of {list(block_sizes)}, got {block_size!r}")


def check_block_lists(q: torch.Tensor, indices, counts, leading: tuple[int, int, int], rows: str, slots: str) -> None:
    """The block lists ``indices (B, H, rows, slots)`` and ``counts (B, H, rows)``: int32 / int64 tensors on q's
    device with the leading dims ``leading``; ``rows`` / ``slots`` name the last dims in the messages. No values."""
    for name, x, rank in (("indices", indices, 4), ("counts", counts, 3)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name}.dtype must be one of {[str(d) for d in INDEX_DTYPES]}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"q and {name} must be on the same device, got {q.device} and {x.device}")
        if x.dim() != rank or tuple(x.shape[:3]) != leading:
            shape = f"(B, H, {rows}, {slots})" if rank == 4 else f"(B, H, {rows})"
            raise ValueError(f"{name} must have shape {shape} with (B, H, {rows})={leading}, got {tuple(x.shape)}")


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
