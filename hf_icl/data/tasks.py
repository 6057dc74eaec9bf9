"""Function classes for in-context learning prompts: every task family, looked up by name.

The families live beside this module, one kind to a file: :mod:`~hf_icl.data.task_family` (the
:class:`TaskFamily` base, how every family samples, the registry and :func:`iterate_prompts`),
:mod:`~hf_icl.data.linear_tasks` and :mod:`~hf_icl.data.nonlinear_tasks`. This module imports them all (so every
family is registered) and is where they are imported from; :func:`get_task` and :func:`make_task` build one.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> task = get_task("noisy_linear_regression", n_dims=5, noise_std=(0.1, 0.5))
    >>> xs, ys = task.sample(8, 11, generator=torch.Generator().manual_seed(0))
    >>> xs.shape, ys.shape
    (torch.Size([8, 11, 5]), torch.Size([8, 11]))
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ..validation import did_you_mean
from .linear_tasks import (
    RENORMALIZATIONS,
    LinearClassification,
    LinearRegression,
    NoisyLinearRegression,
    QuadraticRegression,
    SparseLinearRegression,
)
from .nonlinear_tasks import Categorical, DecisionTree, LatentGroupSinusoid, Relu2NNRegression, Sinusoid
from .task_family import (
    TASK_REGISTRY,
    Params,
    TaskFamily,
    iterate_prompts,
    random_subset,
    register_task,
    resolve_generator,
)

__all__ = [
    "RENORMALIZATIONS",
    "TASK_REGISTRY",
    "Categorical",
    "DecisionTree",
    "LatentGroupSinusoid",
    "LinearClassification",
    "LinearRegression",
    "NoisyLinearRegression",
    "Params",
    "QuadraticRegression",
    "Relu2NNRegression",
    "Sinusoid",
    "SparseLinearRegression",
    "TaskFamily",
    "available_tasks",
    "get_task",
    "iterate_prompts",
    "make_task",
    "random_subset",
    "register_task",
    "resolve_generator",
]


def available_tasks() -> list[str]:
    """Names of every registered task family."""
    return sorted(TASK_REGISTRY)


def get_task(name: str, **kwargs) -> TaskFamily:
    """Build the task family registered as ``name`` with hyperparameters ``kwargs``."""
    if name not in TASK_REGISTRY:
        hint = f"{close} " if (close := did_you_mean(name, TASK_REGISTRY)) else ""
        raise ValueError(f"unknown task family {name!r}; {hint}known task families: {available_tasks()}")
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
