"""Input distributions for in-context prompts.

Each distribution draws ``xs`` of shape ``(B, N, d)`` on the requested device from a
``torch.Generator``, so a seed fixes every number. Distributions are small dataclasses that
round-trip through :meth:`InputDistribution.to_dict` / :func:`make_inputs`, which is how
``datasets`` builder configs and YAML files carry them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch

from ..registry import named_registration
from ..validation import check_float, check_int, check_range

INPUT_REGISTRY: dict[str, type[InputDistribution]] = {}


#: class decorator adding an input distribution to :data:`INPUT_REGISTRY` under a name: ``@register_inputs("uniform")``
register_inputs = named_registration(INPUT_REGISTRY)


@dataclass(kw_only=True)
class InputDistribution(ABC):
    """Base class: ``sample(B, N, d, generator, device) -> (B, N, d)`` float32."""

    name: ClassVar[str] = "base"

    @abstractmethod
    def sample(
        self, batch_size: int, n_points: int, n_dims: int, generator: torch.Generator | None, device
    ) -> torch.Tensor:
        """Draw ``(batch_size, n_points, n_dims)`` inputs."""

    def check_dims(self, n_dims: int) -> None:
        """Raise if this distribution cannot produce ``n_dims``-dimensional inputs."""

    @abstractmethod
    def mean_square_norm(self, n_dims: int) -> float:
        """E‖x‖², used to renormalise targets to unit scale."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


def _float_tuple(name: str, values: Any) -> tuple[float, ...]:
    """``values`` as a tuple of floats, or a ValueError naming ``name``."""
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of numbers, got {values!r}") from None


def _standard_normal(batch_size, n_points, n_dims, generator, device) -> torch.Tensor:
    return torch.randn(batch_size, n_points, n_dims, generator=generator, device=device)


@register_inputs("gaussian")
@dataclass(kw_only=True)
class GaussianInputs(InputDistribution):
    """Isotropic N(0, scale² I); ``scale`` ≠ 1 gives Garg et al.'s scaled-input prompts."""

    scale: float = 1.0

    def __post_init__(self):
        check_float("GaussianInputs.scale", self.scale, low=0, low_inclusive=False)

    def sample(self, batch_size, n_points, n_dims, generator, device):
        return self.scale * _standard_normal(batch_size, n_points, n_dims, generator, device)

    def mean_square_norm(self, n_dims):
        return self.scale**2 * n_dims


@register_inputs("diagonal")
@dataclass(kw_only=True)
class DiagonalGaussianInputs(InputDistribution):
    """N(0, diag(variances)): anisotropic inputs, e.g. ``variances=(0.5, 1, 1.5, 1, 1.75)``."""

    variances: tuple[float, ...]

    def __post_init__(self):
        self.variances = _float_tuple("DiagonalGaussianInputs.variances", self.variances)
        if not self.variances or any(not (v > 0 and math.isfinite(v)) for v in self.variances):
            raise ValueError(
                f"DiagonalGaussianInputs.variances must be a non-empty list of positive numbers, got {self.variances!r}"
            )

    def check_dims(self, n_dims):
        if len(self.variances) != n_dims:
            raise ValueError(
                f"DiagonalGaussianInputs.variances has {len(self.variances)} entries but n_dims is {n_dims}; "
                f"give one variance per input dimension"
            )

    def sample(self, batch_size, n_points, n_dims, generator, device):
        self.check_dims(n_dims)
        std = torch.tensor(self.variances, device=device).sqrt()
        return _standard_normal(batch_size, n_points, n_dims, generator, device) * std

    def mean_square_norm(self, n_dims):
        return float(sum(self.variances))


@register_inputs("full_covariance")
@dataclass(kw_only=True)
class CovarianceGaussianInputs(InputDistribution):
    """N(0, Σ) with Σ = Q diag(spectrum) Qᵀ, Q a random rotation fixed by ``rotation_seed``.

    Give either ``spectrum`` (the eigenvalues) or an explicit ``covariance`` matrix.
    """

    spectrum: tuple[float, ...] | None = None
    covariance: tuple[tuple[float, ...], ...] | None = None
    rotation_seed: int = 0
    _factor: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if (self.spectrum is None) == (self.covariance is None):
            raise ValueError("CovarianceGaussianInputs needs exactly one of spectrum= or covariance=")
        check_int("CovarianceGaussianInputs.rotation_seed", self.rotation_seed, low=0)
        if self.spectrum is not None:
            self.spectrum = _float_tuple("CovarianceGaussianInputs.spectrum", self.spectrum)
            if not self.spectrum or any(not (v >= 0 and math.isfinite(v)) for v in self.spectrum):
                raise ValueError(
                    f"CovarianceGaussianInputs.spectrum must be non-negative numbers, got {self.spectrum!r}"
                )
        else:
            name = "CovarianceGaussianInputs.covariance"
            try:
                rows = [_float_tuple(name, row) for row in self.covariance]
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a square matrix of numbers, got {self.covariance!r}") from None
            self.covariance = tuple(rows)
            if any(len(row) != len(rows) for row in rows):
                raise ValueError(f"{name} must be a square matrix, got rows of lengths {[len(r) for r in rows]}")
            cov = torch.tensor(self.covariance, dtype=torch.float64)
            if cov.numel() == 0:
                raise ValueError(
                    f"CovarianceGaussianInputs.covariance must be a square matrix, got shape {tuple(cov.shape)}"
                )
            if not torch.allclose(cov, cov.T) or torch.linalg.eigvalsh(cov).min() < -1e-9:
                raise ValueError("CovarianceGaussianInputs.covariance must be symmetric positive semi-definite")

    @property
    def dim(self) -> int:
        return len(self.spectrum) if self.spectrum is not None else len(self.covariance)

    def check_dims(self, n_dims):
        if self.dim != n_dims:
            raise ValueError(f"CovarianceGaussianInputs describes {self.dim}-dimensional inputs but n_dims is {n_dims}")

    def factor(self) -> torch.Tensor:
        """A matrix F (float64, CPU) with F Fᵀ = Σ; x = F z for z ~ N(0, I)."""
        if self._factor is None:
            if self.spectrum is not None:
                gen = torch.Generator().manual_seed(self.rotation_seed)
                q, r = torch.linalg.qr(torch.randn(self.dim, self.dim, generator=gen, dtype=torch.float64))
                q = q * torch.sign(torch.diagonal(r))  # makes Q Haar-distributed
                self._factor = q * torch.tensor(self.spectrum, dtype=torch.float64).sqrt()
            else:
                vals, vecs = torch.linalg.eigh(torch.tensor(self.covariance, dtype=torch.float64))
                self._factor = vecs * vals.clamp_min(0).sqrt()
        return self._factor

    def covariance_matrix(self) -> torch.Tensor:
        f = self.factor()
        return f @ f.T

    def sample(self, batch_size, n_points, n_dims, generator, device):
        self.check_dims(n_dims)
        f = self.factor().to(device=device, dtype=torch.float32)
        return _standard_normal(batch_size, n_points, n_dims, generator, device) @ f.T

    def mean_square_norm(self, n_dims):
        return float(torch.trace(self.covariance_matrix()))

    def to_dict(self):
        return {
            "name": self.name,
            "spectrum": self.spectrum,
            "covariance": self.covariance,
            "rotation_seed": self.rotation_seed,
        }


@register_inputs("uniform")
@dataclass(kw_only=True)
class UniformInputs(InputDistribution):
    """Each coordinate uniform on [low, high)."""

    low: float = -1.0
    high: float = 1.0

    def __post_init__(self):
        self.low, self.high = check_range("UniformInputs (low, high)", (self.low, self.high))

    def sample(self, batch_size, n_points, n_dims, generator, device):
        u = torch.rand(batch_size, n_points, n_dims, generator=generator, device=device)
        return self.low + (self.high - self.low) * u

    def mean_square_norm(self, n_dims):
        return n_dims * (self.high**3 - self.low**3) / (3 * (self.high - self.low))


def make_inputs(spec: InputDistribution | str | dict[str, Any]) -> InputDistribution:
    """Build an input distribution from an instance, a registered name, or a ``to_dict()`` dict."""
    if isinstance(spec, InputDistribution):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(
            f"inputs must be an InputDistribution, a name in {sorted(INPUT_REGISTRY)}, or a dict with a "
            f"'name' key; got {spec!r}"
        )
    kwargs = dict(spec)
    name = kwargs.pop("name")
    if name not in INPUT_REGISTRY:
        raise ValueError(f"unknown input distribution {name!r}; known: {sorted(INPUT_REGISTRY)}")
    try:
        return INPUT_REGISTRY[name](**kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for input distribution {name!r}: {err}") from None
