"""Linear task families: linear regression (noiseless, noisy, sparse), linear classification and quadratic
regression, registered as ``linear_regression``, ``noisy_linear_regression``, ``sparse_linear_regression``,
``linear_classification`` and ``quadratic_regression``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..validation import check_choice, check_float, check_int
from .task_family import TaskFamily, random_subset, register_task

#: ``NoisyLinearRegression.renormalize_ys``: off, a fixed factor (True is "fixed"), or per batch
RENORMALIZATIONS = (False, True, "fixed", "batch")


@register_task("linear_regression")
@dataclass(kw_only=True)
class LinearRegression(TaskFamily):
    """y = scale · wᵀx with w ~ N(0, I) (``weight_prior="standard"``) or N(0, I/d) (``"scaled"``)."""

    weight_prior: str = "standard"
    scale: float = 1.0

    def validate(self):
        check_choice("weight_prior", self.weight_prior, ("standard", "scaled"))
        check_float("scale", self.scale, low=0, low_inclusive=False)

    @property
    def weight_var(self) -> float:
        """Prior variance τ² of each weight coordinate."""
        return 1.0 if self.weight_prior == "standard" else 1.0 / self.n_dims

    def sample_task_params(self, batch_size, generator, device):
        w = torch.randn(batch_size, self.n_dims, generator=generator, device=device)
        return {"w": w * math.sqrt(self.weight_var)}

    def signal(self, xs, params):
        return self.scale * torch.einsum("bnd,bd->bn", xs, params["w"])


@register_task("noisy_linear_regression")
@dataclass(kw_only=True)
class NoisyLinearRegression(LinearRegression):
    """Linear regression plus N(0, σ²) label noise.

    ``noise_std`` is one σ, or a list of σ's of which each task draws one with
    ``noise_probs`` (uniform by default): the multi-noise-level task of Bai et al. used in
    the SGPT study. ``renormalize_ys`` rescales y so that its scale equals the noiseless signal's,
    S = E[(scale·wᵀx)²] (d for Garg et al.'s w ~ N(0, I), x ~ N(0, I)), keeping losses comparable
    with the noiseless family:

    * ``True`` or ``"fixed"``: by the constant √(S / (S + E σ²)), so E[y²] = S for every batch;
    * ``"batch"``: Garg et al.'s rule, by √S / std(y of the whole batch) — the factor depends on
      the other prompts of the batch (and is random), but matches their code number for number.
    """

    noise_std: float | tuple[float, ...] = 0.5
    noise_probs: tuple[float, ...] | None = None
    renormalize_ys: bool | str = False

    def validate(self):
        super().validate()
        check_choice("renormalize_ys", self.renormalize_ys, RENORMALIZATIONS)
        if isinstance(self.noise_std, (list, tuple)):  # lists from JSON/YAML compare equal to tuples
            self.noise_std = tuple(self.noise_std)
        if self.noise_probs is not None:
            self.noise_probs = tuple(self.noise_probs)
        stds = self.noise_std if isinstance(self.noise_std, tuple) else (self.noise_std,)
        if not stds:
            raise ValueError("noise_std must be a number or a non-empty list of numbers, got []")
        for s in stds:
            check_float("noise_std", s, low=0)
        if self.noise_probs is not None:
            probs = [check_float("noise_probs", p, low=0) for p in self.noise_probs]
            if len(probs) != len(stds) or abs(sum(probs) - 1) > 1e-6:
                raise ValueError(
                    f"noise_probs must have one probability per noise_std ({len(stds)}) summing to 1, "
                    f"got {self.noise_probs!r}"
                )

    @property
    def noise_levels(self) -> torch.Tensor:
        stds = self.noise_std if isinstance(self.noise_std, tuple) else (self.noise_std,)
        return torch.tensor(stds, dtype=torch.float32)

    @property
    def noise_weights(self) -> torch.Tensor:
        levels = self.noise_levels
        if self.noise_probs is None:
            return torch.full_like(levels, 1.0 / len(levels))
        return torch.tensor(self.noise_probs, dtype=torch.float32)

    @property
    def signal_variance(self) -> float:
        """S = E[(scale·wᵀx)²] = scale² τ² E‖x‖², the noiseless signal's second moment."""
        return self.scale**2 * self.weight_var * self.inputs.mean_square_norm(self.n_dims)

    @property
    def renormalization(self) -> float:
        """The fixed factor multiplying y (1 unless ``renormalize_ys`` is True or ``"fixed"``)."""
        if self.renormalize_ys not in (True, "fixed"):
            return 1.0
        noise_var = float((self.noise_weights * self.noise_levels**2).sum())
        return math.sqrt(self.signal_variance / (self.signal_variance + noise_var))

    def sample_task_params(self, batch_size, generator, device):
        params = super().sample_task_params(batch_size, generator, device)
        levels = self.noise_levels.to(device)
        if len(levels) == 1:
            params["noise_std"] = levels.expand(batch_size).clone()
        else:
            which = torch.multinomial(self.noise_weights.to(device), batch_size, replacement=True, generator=generator)
            params["noise_std"] = levels[which]
        return params

    def signal(self, xs, params):
        return self.renormalization * super().signal(xs, params)

    def observe(self, signal, params, generator):
        noise = torch.randn(signal.shape, generator=generator, device=signal.device)
        ys = signal + self.renormalization * params["noise_std"][:, None] * noise
        if self.renormalize_ys == "batch":  # Garg et al.: ys * √d / ys.std() over the whole batch
            factor = math.sqrt(self.signal_variance) / ys.std()
            params["signal"] = signal * factor  # the signal keeps its relation to ys
            ys = ys * factor
        return ys


@register_task("sparse_linear_regression")
@dataclass(kw_only=True)
class SparseLinearRegression(LinearRegression):
    """Linear regression whose weights keep ``sparsity`` random coordinates (the rest are 0).

    Under the dimension curriculum the support is drawn among the active coordinates (Garg et
    al.'s ``valid_coords``), so every prompt has exactly ``sparsity`` weights that act on inputs.
    """

    sparsity: int = 3

    def validate(self):
        super().validate()
        check_int("sparsity", self.sparsity, low=1, high=self.n_dims)

    def sample_task_params(self, batch_size, generator, device):
        w = super().sample_task_params(batch_size, generator, device)["w"]
        scores = torch.rand(batch_size, self.n_dims, generator=generator, device=device)
        return {"dense_w": w, "support_scores": scores}

    def restrict_to_active_dims(self, params, active_dims):
        support = random_subset(params["support_scores"], self.sparsity, active_dims, f"{self.name}'s sparsity")
        return {**params, "w": params["dense_w"] * support}


@register_task("linear_classification")
@dataclass(kw_only=True)
class LinearClassification(LinearRegression):
    """y = sign(wᵀx) ∈ {−1, +1} (sign(0) is +1)."""

    target_kind: ClassVar[str] = "binary"

    def observe(self, signal, params, generator):
        return torch.where(signal >= 0, 1.0, -1.0)


@register_task("quadratic_regression")
@dataclass(kw_only=True)
class QuadraticRegression(LinearRegression):
    """y = scale · wᵀ(x ⊙ x) / √3 (the √3 keeps E[y²] equal to the linear task's for Gaussian x)."""

    def signal(self, xs, params):
        return super().signal(xs.square(), params) / math.sqrt(3)
