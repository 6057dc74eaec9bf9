"""Nonlinear task families: a random two-layer ReLU network, decision trees, sinusoids (1-D, and a latent
group of noisy features) and categorical labels from linear or random-feature logits, registered as
``relu_2nn_regression``, ``decision_tree``, ``sinusoid``, ``latent_group_sinusoid`` and ``categorical``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..validation import check_choice, check_float, check_int, check_range
from .inputs import UniformInputs
from .task_family import Params, TaskFamily, random_subset, register_task


@register_task("relu_2nn_regression")
@dataclass(kw_only=True)
class Relu2NNRegression(TaskFamily):
    """y = scale · √(2/r) · Σ_j a_j ReLU(w_jᵀx), a_j, w_j ~ N(0, 1), width r = ``hidden_size``."""

    hidden_size: int = 100
    scale: float = 1.0

    def validate(self):
        check_int("hidden_size", self.hidden_size, low=1)
        check_float("scale", self.scale, low=0, low_inclusive=False)

    def sample_task_params(self, batch_size, generator, device):
        w1 = torch.randn(batch_size, self.n_dims, self.hidden_size, generator=generator, device=device)
        w2 = torch.randn(batch_size, self.hidden_size, generator=generator, device=device)
        return {"w1": w1, "w2": w2}

    def signal(self, xs, params):
        hidden = torch.relu(xs @ params["w1"])
        return self.scale * math.sqrt(2 / self.hidden_size) * torch.einsum("bnr,br->bn", hidden, params["w2"])


@register_task("decision_tree")
@dataclass(kw_only=True)
class DecisionTree(TaskFamily):
    """A full binary tree of ``depth`` levels: each node splits on one random coordinate
    (x[c] > 0 goes right), each of the 2^depth leaves holds an N(0, 1) value."""

    depth: int = 4

    def validate(self):
        check_int("depth", self.depth, low=1, high=16)

    def sample_task_params(self, batch_size, generator, device):
        n_inner = 2**self.depth - 1
        split_dims = torch.randint(self.n_dims, (batch_size, n_inner), generator=generator, device=device)
        leaf_values = torch.randn(batch_size, n_inner + 1, generator=generator, device=device)
        return {"split_dims": split_dims, "leaf_values": leaf_values}

    def leaf_index(self, xs: torch.Tensor, params: Params) -> torch.Tensor:
        """The leaf (0 … 2^depth − 1) each input falls in, ``(B, N)`` int64."""
        node = torch.zeros(xs.shape[:2], dtype=torch.long, device=xs.device)
        for _ in range(self.depth):  # one gather per level, never per sample
            coord = params["split_dims"].gather(1, node)
            goes_right = xs.gather(2, coord.unsqueeze(-1)).squeeze(-1) > 0
            node = 2 * node + 1 + goes_right.long()
        return node - (2**self.depth - 1)

    def signal(self, xs, params):
        return params["leaf_values"].gather(1, self.leaf_index(xs, params))


@dataclass(kw_only=True)
class _SinusoidParams(TaskFamily):
    """Shared amplitude / frequency / phase prior and label noise of the sinusoid families."""

    amplitude_range: tuple[float, float] = (0.5, 2.0)
    frequency_range: tuple[float, float] = (0.5, 2.5)
    phase_range: tuple[float, float] = (0.0, 2 * math.pi)
    noise_std: float = 0.2

    def validate(self):
        self.amplitude_range = check_range("amplitude_range", self.amplitude_range)
        self.frequency_range = check_range("frequency_range", self.frequency_range)
        self.phase_range = check_range("phase_range", self.phase_range)
        check_float("noise_std", self.noise_std, low=0)

    def sample_task_params(self, batch_size, generator, device):
        def uniform(bounds):
            lo, hi = bounds
            return lo + (hi - lo) * torch.rand(batch_size, generator=generator, device=device)

        return {
            "amplitude": uniform(self.amplitude_range),
            "frequency": uniform(self.frequency_range),
            "phase": uniform(self.phase_range),
        }

    def wave(self, z: torch.Tensor, params: Params) -> torch.Tensor:
        a, w, phi = (params[k][:, None] for k in ("amplitude", "frequency", "phase"))
        return a * torch.sin(w * z + phi)

    def observe(self, signal, params, generator):
        return signal + self.noise_std * torch.randn(signal.shape, generator=generator, device=signal.device)


@register_task("sinusoid")
@dataclass(kw_only=True)
class Sinusoid(_SinusoidParams):
    """1-D y = a·sin(ωx + φ) + noise, x ~ U[−3, 3] (the kernel-regression study's task)."""

    n_dims: int = 1
    inputs: Any = field(default_factory=lambda: UniformInputs(low=-3.0, high=3.0))

    def validate(self):
        super().validate()
        if self.n_dims != 1:
            raise ValueError(f"sinusoid is a 1-D task: n_dims must be 1, got {self.n_dims}")

    def signal(self, xs, params):
        return self.wave(xs[..., 0], params)


@register_task("latent_group_sinusoid")
@dataclass(kw_only=True)
class LatentGroupSinusoid(_SinusoidParams):
    """``group_size`` of ``n_dims`` features are noisy copies of a latent z ~ N(0, 1); the rest
    are N(0, distractor_std²) distractors; y = a·sin(bz + φ) + noise. The group is a task parameter,
    drawn among the active features under the dimension curriculum.

    The inputs are part of the task, so ``inputs`` must stay ``None``.
    """

    draws_own_inputs: ClassVar[bool] = True

    n_dims: int = 10
    inputs: Any = None
    group_size: int = 3
    feature_noise: float = 0.3
    distractor_std: float = 0.5
    noise_std: float = 0.1

    def validate(self):
        super().validate()
        check_int("group_size", self.group_size, low=1, high=self.n_dims)
        check_float("feature_noise", self.feature_noise, low=0)
        check_float("distractor_std", self.distractor_std, low=0)

    def sample_task_params(self, batch_size, generator, device):
        params = super().sample_task_params(batch_size, generator, device)
        params["group_scores"] = torch.rand(batch_size, self.n_dims, generator=generator, device=device)
        return params

    def restrict_to_active_dims(self, params, active_dims):
        group = random_subset(params["group_scores"], self.group_size, active_dims, f"{self.name}'s group_size")
        return {**params, "group": group}

    def sample_inputs(self, batch_size, n_points, params, generator, device):
        shape = (batch_size, n_points, self.n_dims)
        latent = torch.randn(batch_size, n_points, generator=generator, device=device)
        distractors = self.distractor_std * torch.randn(shape, generator=generator, device=device)
        copies = latent[..., None] + self.feature_noise * torch.randn(shape, generator=generator, device=device)
        params["latent"] = latent
        return torch.where(params["group"][:, None, :], copies, distractors)

    def signal(self, xs, params):
        return self.wave(params["latent"], params)


@register_task("categorical")
@dataclass(kw_only=True)
class Categorical(TaskFamily):
    """C-class labels drawn from softmax(logit_scale · (ψ(x)ᵀW + b)).

    ``function="linear"``: ψ(x) = x/√d. ``function="rbf"``: ψ are ``n_features`` random Fourier
    features of an RBF kernel with ``bandwidth`` (a random RKHS function), as in the functional-GD
    study of categorical ICL. W, b (and the features) are task parameters; labels are int64.
    """

    target_kind: ClassVar[str] = "categorical"

    n_classes: int = 5
    function: str = "linear"
    n_features: int = 64
    bandwidth: float = 1.0
    logit_scale: float = 3.0
    bias_std: float = 0.0

    def validate(self):
        check_int("n_classes", self.n_classes, low=2)
        check_choice("function", self.function, ("linear", "rbf"))
        check_int("n_features", self.n_features, low=1)
        check_float("bandwidth", self.bandwidth, low=0, low_inclusive=False)
        check_float("logit_scale", self.logit_scale, low=0)
        check_float("bias_std", self.bias_std, low=0)

    def sample_task_params(self, batch_size, generator, device):
        def normal(*shape):
            return torch.randn(batch_size, *shape, generator=generator, device=device)

        width = self.n_dims if self.function == "linear" else self.n_features
        params = {"weights": normal(width, self.n_classes), "bias": self.bias_std * normal(self.n_classes)}
        if self.function == "rbf":
            params["frequencies"] = normal(self.n_dims, self.n_features) / self.bandwidth
            params["phases"] = 2 * math.pi * torch.rand(batch_size, self.n_features, generator=generator, device=device)
        return params

    def features(self, xs: torch.Tensor, params: Params) -> torch.Tensor:
        if self.function == "linear":
            return xs / math.sqrt(self.n_dims)
        projection = xs @ params["frequencies"] + params["phases"][:, None, :]
        return math.sqrt(2 / self.n_features) * torch.cos(projection)

    def signal(self, xs, params):
        logits = self.features(xs, params) @ params["weights"] + params["bias"][:, None, :]
        return self.logit_scale * logits

    def observe(self, signal, params, generator):
        # Gumbel-max: argmax(logits + Gumbel noise) is an exact draw from softmax(logits).
        uniform = torch.rand(signal.shape, generator=generator, device=signal.device)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny)))
        return (signal + gumbel).argmax(dim=-1)
