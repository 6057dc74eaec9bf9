"""Function classes for in-context learning prompts.

A task family is a dataclass of its hyperparameters. ``family.sample(B, N, generator=g)``
returns ``xs (B, N, d)`` and ``ys (B, N)`` drawn on ``g``'s device, with no Python loop over
the batch; a seed therefore fixes every number. Sampling happens in three stages, always in
this order, so the random stream is well defined:

1. task parameters (fresh per prompt, or indices into a fixed pool of ``n_tasks`` tasks),
   then fitted to the active coordinates (families that pick coordinates, such as sparse
   regression's support, pick them among the first ``n_dims_truncated`` only, as Garg et al.'s
   ``valid_coords`` does),
2. inputs (from the family's input distribution; ``n_dims_truncated`` zeroes the trailing
   coordinates, Garg et al.'s curriculum),
3. targets: a noiseless ``signal`` (regression value or class logits) and its noisy ``observe``-d
   version.

With ``n_tasks=T`` the pool is drawn once, on the CPU, from ``pool_seed``, so it is the same
on every device and every process; each prompt then picks a task from it with ``generator``.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> task = get_task("noisy_linear_regression", n_dims=5, noise_std=(0.1, 0.5))
    >>> xs, ys = task.sample(8, 11, generator=torch.Generator().manual_seed(0))
    >>> xs.shape, ys.shape
    (torch.Size([8, 11, 5]), torch.Size([8, 11]))
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch

from ..validation import check_choice, check_device, check_float, check_int, check_range
from .inputs import InputDistribution, UniformInputs, make_inputs

TASK_REGISTRY: dict[str, type[TaskFamily]] = {}
#: ``NoisyLinearRegression.renormalize_ys``: off, a fixed factor (True is "fixed"), or per batch
RENORMALIZATIONS = (False, True, "fixed", "batch")
Params = dict[str, torch.Tensor]


def register_task(name: str):
    """Class decorator adding a task family to :data:`TASK_REGISTRY` under ``name``."""

    def wrap(cls):
        cls.name = name
        TASK_REGISTRY[name] = cls
        return cls

    return wrap


def resolve_generator(
    generator: torch.Generator | None, seed: int | None, device: str | torch.device | None
) -> tuple[torch.Generator | None, torch.device]:
    """Pick the generator and device for a draw; a generator fixes the device it lives on."""
    if generator is not None and seed is not None:
        raise ValueError("pass either generator= or seed=, not both")
    check_device("device", device)  # cuda on a CPU-only machine is a clear error, not torch's assertion
    if seed is not None:
        check_int("seed", seed, low=0)
        device = torch.device(device or "cpu")
        return torch.Generator(device=device).manual_seed(seed), device
    if generator is None:
        return None, torch.device(device or "cpu")
    requested = None if device is None else torch.device(device)
    mismatch = requested is not None and (
        requested.type != generator.device.type
        or (requested.index is not None and requested.index != (generator.device.index or 0))
    )
    if mismatch:
        raise ValueError(
            f"device={device!r} does not match the generator's device {generator.device}; torch draws "
            f"on the generator's device, so create the generator there"
        )
    return generator, generator.device


@dataclass(kw_only=True)
class TaskFamily(ABC):
    """Base class of every function class.

    Args:
        n_dims: input dimension d.
        inputs: input distribution (an :class:`~hf_icl.data.inputs.InputDistribution`, its
            registered name, or its ``to_dict()``).
        n_tasks: size T of a fixed task pool (task-scaling studies); ``None`` draws a fresh
            task for every prompt.
        pool_seed: seed of the fixed pool.
    """

    name: ClassVar[str] = "base"
    #: "regression" (float ys), "binary" (±1 float ys) or "categorical" (int64 class ids).
    target_kind: ClassVar[str] = "regression"
    #: True for families whose inputs are part of the task (then ``inputs`` must be None).
    draws_own_inputs: ClassVar[bool] = False

    n_dims: int
    inputs: Any = "gaussian"
    n_tasks: int | None = None
    pool_seed: int = 0
    _pools: dict[str, Params] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_int("n_dims", self.n_dims, low=1)
        if self.n_tasks is not None:
            check_int("n_tasks", self.n_tasks, low=1)
        check_int("pool_seed", self.pool_seed, low=0)
        if self.draws_own_inputs:
            if self.inputs is not None:
                raise ValueError(
                    f"{self.name} draws its own inputs as part of the task; inputs must be None, got {self.inputs!r}"
                )
        else:
            self.inputs = make_inputs(self.inputs)
            self.inputs.check_dims(self.n_dims)
        self.validate()

    def validate(self) -> None:
        """Family-specific checks of the hyperparameters (run at construction)."""

    # -- the three stages a family defines -------------------------------------------------
    @abstractmethod
    def sample_task_params(self, batch_size: int, generator, device) -> Params:
        """Draw ``batch_size`` independent tasks; every tensor's leading dim is the batch."""

    def restrict_to_active_dims(self, params: Params, active_dims: int) -> Params:
        """Fit drawn task parameters to the first ``active_dims`` coordinates, the only ones that carry
        input under the dimension curriculum; most families need nothing (the default)."""
        return params

    def sample_inputs(self, batch_size: int, n_points: int, params: Params, generator, device):
        """Draw ``xs``; families whose inputs depend on the task override this."""
        return self.inputs.sample(batch_size, n_points, self.n_dims, generator, device)

    @abstractmethod
    def signal(self, xs: torch.Tensor, params: Params) -> torch.Tensor:
        """The noiseless target: ``(B, N)`` regression values or ``(B, N, C)`` class logits."""

    def observe(self, signal: torch.Tensor, params: Params, generator) -> torch.Tensor:
        """Turn the signal into observed ``ys`` (noise, signs, label draws); identity by default."""
        return signal

    # -- sampling ----------------------------------------------------------------------------
    def task_pool(self, device: str | torch.device = "cpu") -> Params:
        """The fixed pool of ``n_tasks`` tasks (drawn on the CPU from ``pool_seed``, cached)."""
        if self.n_tasks is None:
            raise ValueError(f"{self.name} has n_tasks=None: tasks are fresh per prompt, there is no pool")
        key = str(torch.device(device))
        if key not in self._pools:
            cpu_pool = self._pools.get("cpu")
            if cpu_pool is None:
                gen = torch.Generator().manual_seed(self.pool_seed)
                cpu_pool = self._pools["cpu"] = self.sample_task_params(self.n_tasks, gen, torch.device("cpu"))
            self._pools[key] = {k: v.to(device) for k, v in cpu_pool.items()}
        return self._pools[key]

    def draw_tasks(self, batch_size: int, generator, device) -> Params:
        """Task parameters for a batch: fresh, or picked from the pool (with ``task_id``)."""
        if self.n_tasks is None:
            return self.sample_task_params(batch_size, generator, device)
        ids = torch.randint(self.n_tasks, (batch_size,), generator=generator, device=device)
        params = {k: v[ids] for k, v in self.task_pool(device).items()}
        params["task_id"] = ids
        return params

    def sample(
        self,
        batch_size: int,
        n_points: int,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        device: str | torch.device | None = None,
        n_dims_truncated: int | None = None,
        return_params: bool = False,
    ):
        """Draw ``batch_size`` prompts of ``n_points`` examples each.

        Returns ``(xs, ys)``, or ``(xs, ys, params)`` with ``return_params=True``; ``params``
        holds the task parameters, the noiseless ``signal`` and, for pooled tasks, ``task_id``.
        """
        check_int("batch_size", batch_size, low=1)
        check_int("n_points", n_points, low=1)
        if n_dims_truncated is not None:
            check_int("n_dims_truncated", n_dims_truncated, low=1, high=self.n_dims)
        generator, device = resolve_generator(generator, seed, device)

        params = self.draw_tasks(batch_size, generator, device)
        params = self.restrict_to_active_dims(params, self.n_dims if n_dims_truncated is None else n_dims_truncated)
        xs = self.sample_inputs(batch_size, n_points, params, generator, device)
        if n_dims_truncated is not None and n_dims_truncated < self.n_dims:
            xs[..., n_dims_truncated:] = 0
        params["signal"] = self.signal(xs, params)
        ys = self.observe(params["signal"], params, generator)
        return (xs, ys, params) if return_params else (xs, ys)

    # -- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-data description: ``make_task(family.to_dict())`` rebuilds an equal family."""
        out: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            if f.init:
                value = getattr(self, f.name)
                out[f.name] = value.to_dict() if isinstance(value, InputDistribution) else value
        return out


def iterate_prompts(
    family: TaskFamily,
    n_prompts: int,
    n_points: int,
    *,
    seed: int,
    batch_size: int = 1024,
    device: str | torch.device = "cpu",
    n_dims_truncated: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, Params]]:
    """Yield ``n_prompts`` prompts in chunks of ``batch_size`` from one generator seeded ``seed``.

    This is the stream that the ``datasets`` builders materialise, so a dataset on disk and
    this stream with the same arguments hold the same numbers.
    """
    check_int("n_prompts", n_prompts, low=1)
    check_int("batch_size", batch_size, low=1)
    generator, device = resolve_generator(None, seed, device)
    for start in range(0, n_prompts, batch_size):
        size = min(batch_size, n_prompts - start)
        yield family.sample(size, n_points, generator=generator, n_dims_truncated=n_dims_truncated, return_params=True)


def random_subset(scores: torch.Tensor, size: int, active_dims: int, owner: str) -> torch.Tensor:
    """``(B, d)`` bool masks of ``size`` coordinates among the first ``active_dims``: those with the
    highest ``scores`` (i.i.d. uniform per task, so every subset is equally likely). Scores are
    task parameters, so a pooled task keeps its subset at every curriculum stage it fits in."""
    if size > active_dims:
        raise ValueError(
            f"{owner} needs at least {size} active input dimensions, got n_dims_truncated={active_dims}; "
            f"start the dimension curriculum at >= {size}"
        )
    members = scores[:, :active_dims].topk(size, dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(1, members, True)


# ---------------------------------------------------------------------------------------------
# Linear families
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Nonlinear families
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Registry access
# ---------------------------------------------------------------------------------------------


def available_tasks() -> list[str]:
    """Names of every registered task family."""
    return sorted(TASK_REGISTRY)


def get_task(name: str, **kwargs) -> TaskFamily:
    """Build the task family registered as ``name`` with hyperparameters ``kwargs``."""
    if name not in TASK_REGISTRY:
        raise ValueError(f"unknown task family {name!r}; known task families: {available_tasks()}")
    cls = TASK_REGISTRY[name]
    known = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(f"{name} has no parameter(s) {unknown}; its parameters are {sorted(known)}")
    try:
        return cls(**kwargs)
    except TypeError as err:  # a missing required argument, e.g. n_dims
        raise ValueError(f"cannot build task family {name!r}: {err}") from None


def make_task(spec: TaskFamily | str | dict[str, Any]) -> TaskFamily:
    """Build a family from an instance, a name (needs no required args) or a ``to_dict()`` dict."""
    if isinstance(spec, TaskFamily):
        return spec
    if isinstance(spec, str):
        return get_task(spec)
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"a task spec must be a TaskFamily, a name or a dict with a 'name' key; got {spec!r}")
    kwargs = dict(spec)
    return get_task(kwargs.pop("name"), **kwargs)
