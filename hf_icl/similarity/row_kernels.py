"""Attention scores as kernels between query and key rows: dot product, RBF, and the angular kernels of the
kernel-regression document (seed 000): cosine, Cayley (squared angle) and geometric-algebra (inner + wedge).

Every function maps ``q (..., M, D)`` and ``k (..., N, D)`` to scores ``(..., M, N)``; a softmax over the last
axis turns them into attention weights (a Nadaraya–Watson smoother). Parameters may be Python numbers or tensors
(learnable ones). Every parameter is checked finite (and positive where it divides: temperature, bandwidth): a NaN
β or scale would otherwise turn every score NaN silently. Numbers always; tensors when they live on the CPU, where
reading them is free; a tensor on an accelerator (a device sync per call) or inside a ``torch.func`` transform
(``vmap`` cannot read values) is not read: the trainer's divergence check catches a parameter that went NaN.

Numerics. The angular kernels work on unit rows, ``x / max(|x|, eps)``, so a zero row becomes the zero vector
(cosine 0 with everything) instead of NaN. The cosine is clamped to ``[-1 + eps, 1 - eps]`` before ``θ = arccos``
and ``sin θ = √(1 - cos²θ)``: both have infinite slope at ±1, and the clamp keeps values and gradients finite for
parallel and antiparallel rows (their gradient through the clamp is then zero).
"""

from __future__ import annotations

import torch

from ..validation import check_choice, check_float

__all__ = [
    "EPS",
    "ROW_KERNELS",
    "WEDGE_MODES",
    "cayley_scores",
    "clamped_cosine",
    "cosine_scores",
    "dot_product_scores",
    "ga_scores",
    "rbf_scores",
    "row_kernel_scores",
    "sine_of",
    "unit_rows",
]

#: the row kernels of the document's ``UnifiedICL`` (``softmax`` is the scaled dot product)
ROW_KERNELS = ("softmax", "cosine", "cayley", "ga")
#: the GA kernel's wedge term: ``"penalty"`` −β₂ sin θ (the document's 1-D table); ``"well"`` −β₂ (sin θ − μ)²
#: (the form its column attention uses: a well at sin θ = μ)
WEDGE_MODES = ("penalty", "well")
#: default clamp of norms and cosines (the document's column attention and ``UnifiedICL`` use 1e-6)
EPS = 1e-6


def _positive(name: str, value) -> None:
    _finite(name, value, positive=True)


def _finite(name: str, value, positive: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` and the value unless it is finite (and > 0 with ``positive``); a tensor
    is read only on the CPU (see the module docstring)."""
    if not isinstance(value, torch.Tensor):
        check_float(name, value, low=0.0 if positive else None, low_inclusive=False)
    elif _readable(value):
        detached = value.detach()
        bad = ~torch.isfinite(detached) | (detached <= 0 if positive else False)
        if bool(bad.any()):
            shown = detached[bad].flatten()[0].item()
            allowed = "a finite positive number" if positive else "finite"
            raise ValueError(f"{name} must be {allowed}, got {shown} (a tensor of shape {tuple(value.shape)})")


def _readable(value: torch.Tensor) -> bool:
    """A tensor whose value can be read for free: on the CPU and not a ``torch.func`` transform's wrapper (``vmap``
    and ``grad`` cannot read values)."""
    try:
        from torch._C._functorch import is_functorch_wrapped_tensor
    except ImportError:  # pragma: no cover - older torch
        return value.device.type == "cpu"
    return value.device.type == "cpu" and not is_functorch_wrapped_tensor(value)


def unit_rows(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``x / max(|x|, eps)`` along the last axis (a zero row stays zero)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def clamped_cosine(q: torch.Tensor, k: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``cos θ`` between every query and key row, clamped to ``[-1 + eps, 1 - eps]``."""
    return (unit_rows(q, eps) @ unit_rows(k, eps).transpose(-1, -2)).clamp(-1 + eps, 1 - eps)


def sine_of(cosine: torch.Tensor) -> torch.Tensor:
    """``sin θ = √(1 - cos²θ)`` for θ in [0, π] (the magnitude of the wedge of two unit vectors)."""
    return (1 - cosine.square()).clamp_min(0).sqrt()


def dot_product_scores(q: torch.Tensor, k: torch.Tensor, scale=1.0) -> torch.Tensor:
    """``scale · qᵀk``: softmax attention (scale 1 on raw inputs is the document's "raw attention ICL")."""
    _finite("scale", scale)
    return (q @ k.transpose(-1, -2)) * scale


def rbf_scores(q: torch.Tensor, k: torch.Tensor, bandwidth=1.0) -> torch.Tensor:
    """``-|q - k|² / (2 bandwidth²)``: its softmax is Nadaraya–Watson with the Gaussian kernel."""
    _positive("bandwidth", bandwidth)
    distances = torch.cdist(q, k, compute_mode="donot_use_mm_for_euclid_dist")
    return -distances.square() / (2 * bandwidth**2)


def cosine_scores(q: torch.Tensor, k: torch.Tensor, temperature=0.1, eps: float = EPS) -> torch.Tensor:
    """``cos θ / T``."""
    _positive("temperature", temperature)
    return clamped_cosine(q, k, eps) / temperature


def cayley_scores(q: torch.Tensor, k: torch.Tensor, temperature=0.1, eps: float = EPS) -> torch.Tensor:
    """``-θ² / (2T²)`` with ``θ = arccos(cos θ)``: a Gaussian kernel in the angle on the sphere."""
    _positive("temperature", temperature)
    theta = torch.acos(clamped_cosine(q, k, eps))
    return -theta.square() / (2 * temperature**2)


def ga_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    beta1=4.0,
    beta2=1.0,
    temperature=1.0,
    wedge_mode: str = "penalty",
    wedge_mu=0.5,
    eps: float = EPS,
) -> torch.Tensor:
    """Geometric-algebra scores, inner (``cos θ``) plus wedge (``sin θ``) part, divided by ``T``.

    ``wedge_mode="penalty"``: ``(β₁ cos θ - β₂ sin θ) / T``; ``"well"``: ``(β₁ cos θ - β₂ (sin θ - μ)²) / T``.
    """
    check_choice("wedge_mode", wedge_mode, WEDGE_MODES)
    _positive("temperature", temperature)
    for name, value in (("beta1", beta1), ("beta2", beta2), ("wedge_mu", wedge_mu)):
        _finite(name, value)
    cosine = clamped_cosine(q, k, eps)
    sine = sine_of(cosine)
    wedge = sine if wedge_mode == "penalty" else (sine - wedge_mu).square()
    return (beta1 * cosine - beta2 * wedge) / temperature


def row_kernel_scores(q: torch.Tensor, k: torch.Tensor, kernel: str, **params) -> torch.Tensor:
    """Scores of the named row kernel (:data:`ROW_KERNELS`, or ``"rbf"``); ``params`` are that kernel's keyword
    arguments (``softmax`` takes ``scale``)."""
    functions = {
        "softmax": dot_product_scores,
        "cosine": cosine_scores,
        "cayley": cayley_scores,
        "ga": ga_scores,
        "rbf": rbf_scores,
    }
    check_choice("kernel", kernel, sorted(functions))
    return functions[kernel](q, k, **params)
