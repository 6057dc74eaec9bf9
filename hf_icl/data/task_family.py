"""The base of every task family: :class:`TaskFamily`, its registry, and the prompt stream.

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

Families register themselves with :func:`register_task`; :func:`hf_icl.data.tasks.get_task` builds one by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch

from ..registry import named_registration
from ..validation import check_device, check_int
from .inputs import InputDistribution, make_inputs

TASK_REGISTRY: dict[str, type[TaskFamily]] = {}
Params = dict[str, torch.Tensor]


#: class decorator adding a task family to :data:`TASK_REGISTRY` under a name: ``@register_task("linear_regression")``
register_task = named_registration(TASK_REGISTRY)


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
