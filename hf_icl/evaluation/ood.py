"""Out-of-distribution prompts: Garg et al.'s distribution-shift tests as task-family variants.

:func:`ood_task` returns a copy of a family with one thing changed (its inputs, the scale of its
targets, or its label noise); everything else, including a task pool, is kept. Evaluate a model
trained on the original family on the variant with
:func:`~hf_icl.evaluation.evaluate_context_scaling`.

Kinds (:data:`OOD_KINDS`), with their keyword arguments:

* ``"scaled_x"`` (``k=2``): inputs multiplied by k, e.g. N(0, I) → N(0, k²I).
* ``"scaled_y"`` (``k=2``): targets multiplied by k, via the family's ``scale`` (linear and
  ReLU-network families; label noise, if any, keeps its level).
* ``"skewed_covariance"`` (``rotation_seed=0``): x ~ N(0, Σ) with eigenvalues ∝ 1/i², scaled to
  trace d (so E‖x‖² = d, as for N(0, I)), in a random basis.
* ``"half_subspace"`` (``subspace_dim=d//2``, ``match_norm=False``, ``rotation_seed=0``): x confined
  to a random subspace. By default x is the projection of an N(0, I) input onto it (unit variance
  along the subspace, so E‖x‖² = d/2); ``match_norm=True`` rescales to E‖x‖² = d.
* ``"noisy_labels"`` (``noise_std=1.0``, ``renormalize_ys=None``): N(0, σ²) label noise, for (noisy)
  linear regression; ``renormalize_ys`` (see :class:`~hf_icl.data.tasks.NoisyLinearRegression`) rescales
  the labels, ``None`` keeps a noisy family's own setting (off for plain linear regression).
* ``"anisotropic"`` (``variances=(0.5, 1, 1.5, 1, 1.75)``): x ~ N(0, diag(variances)), the
  linear-attention study's shift, the variances tiled or truncated to d.

Example::

    >>> from hf_icl.data.tasks import get_task
    >>> ood_task(get_task("linear_regression", n_dims=4), "scaled_x", k=3).inputs
    GaussianInputs(scale=3.0)
    >>> ood_task(get_task("linear_regression", n_dims=4), "anisotropic").inputs.variances
    (0.5, 1.0, 1.5, 1.0)
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from itertools import cycle, islice
from typing import Any

from ..data.inputs import (
    CovarianceGaussianInputs,
    DiagonalGaussianInputs,
    GaussianInputs,
    InputDistribution,
    UniformInputs,
)
from ..data.tasks import RENORMALIZATIONS, LinearRegression, NoisyLinearRegression, TaskFamily, make_task
from ..validation import check_choice, check_float, check_int

#: The linear-attention study's diagonal input variances (tiled or truncated to d).
ANISOTROPIC_VARIANCES = (0.5, 1.0, 1.5, 1.0, 1.75)


def scaled_inputs(inputs: InputDistribution, k: float) -> InputDistribution:
    """The distribution of ``k · x`` for ``x ~ inputs``."""
    if isinstance(inputs, GaussianInputs):
        return GaussianInputs(scale=inputs.scale * k)
    if isinstance(inputs, DiagonalGaussianInputs):
        return DiagonalGaussianInputs(variances=[v * k**2 for v in inputs.variances])
    if isinstance(inputs, CovarianceGaussianInputs) and inputs.spectrum is not None:
        return dataclasses.replace(inputs, spectrum=[v * k**2 for v in inputs.spectrum])
    if isinstance(inputs, CovarianceGaussianInputs):
        return dataclasses.replace(inputs, covariance=[[c * k**2 for c in row] for row in inputs.covariance])
    if isinstance(inputs, UniformInputs):
        return UniformInputs(low=inputs.low * k, high=inputs.high * k)
    raise ValueError(f"scaled_x does not know how to scale {type(inputs).__name__} inputs")


def check_inputs_shiftable(task: TaskFamily) -> None:
    """Raise for families whose inputs are part of the task (their distribution cannot be swapped)."""
    if task.draws_own_inputs:
        raise ValueError(f"{task.name} draws its own inputs as part of the task; its inputs cannot be shifted")


def with_inputs(task: TaskFamily, inputs: InputDistribution) -> TaskFamily:
    """``task`` with another input distribution."""
    check_inputs_shiftable(task)
    return dataclasses.replace(task, inputs=inputs)


def _scaled_x(task: TaskFamily, k: float = 2.0) -> TaskFamily:
    k = check_float("k", k, low=0, low_inclusive=False)
    check_inputs_shiftable(task)
    return with_inputs(task, scaled_inputs(task.inputs, k))


def _scaled_y(task: TaskFamily, k: float = 2.0) -> TaskFamily:
    k = check_float("k", k, low=0, low_inclusive=False)
    if not hasattr(task, "scale"):
        raise ValueError(f"scaled_y needs a family with a 'scale' hyperparameter (linear families), got {task.name}")
    return dataclasses.replace(task, scale=task.scale * k)


def _skewed_covariance(task: TaskFamily, rotation_seed: int = 0) -> TaskFamily:
    d = task.n_dims
    raw = [1.0 / i**2 for i in range(1, d + 1)]
    spectrum = [d * v / sum(raw) for v in raw]  # trace d, like N(0, I_d)
    return with_inputs(task, CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=rotation_seed))


def _half_subspace(
    task: TaskFamily, subspace_dim: int | None = None, match_norm: bool = False, rotation_seed: int = 0
) -> TaskFamily:
    d = task.n_dims
    subspace_dim = max(1, d // 2) if subspace_dim is None else check_int("subspace_dim", subspace_dim, low=1, high=d)
    variance = d / subspace_dim if match_norm else 1.0
    spectrum = [variance] * subspace_dim + [0.0] * (d - subspace_dim)
    return with_inputs(task, CovarianceGaussianInputs(spectrum=spectrum, rotation_seed=rotation_seed))


def _noisy_labels(task: TaskFamily, noise_std: float = 1.0, renormalize_ys: bool | str | None = None) -> TaskFamily:
    noise_std = check_float("noise_std", noise_std, low=0)
    if renormalize_ys is not None:
        check_choice("renormalize_ys", renormalize_ys, RENORMALIZATIONS)
    if type(task) is NoisyLinearRegression:
        keep = {} if renormalize_ys is None else {"renormalize_ys": renormalize_ys}
        return dataclasses.replace(task, noise_std=noise_std, noise_probs=None, **keep)
    if type(task) is LinearRegression:
        kept = {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init}
        return NoisyLinearRegression(**kept, noise_std=noise_std, renormalize_ys=renormalize_ys or False)
    raise ValueError(
        f"noisy_labels is defined for linear_regression and noisy_linear_regression, got {task.name}; "
        f"families with their own noise (e.g. sinusoids) take noise_std directly"
    )


def _anisotropic(task: TaskFamily, variances: tuple[float, ...] = ANISOTROPIC_VARIANCES) -> TaskFamily:
    tiled = list(islice(cycle(variances), task.n_dims))
    return with_inputs(task, DiagonalGaussianInputs(variances=tiled))


_BUILDERS: dict[str, Callable[..., TaskFamily]] = {
    "scaled_x": _scaled_x,
    "scaled_y": _scaled_y,
    "skewed_covariance": _skewed_covariance,
    "half_subspace": _half_subspace,
    "noisy_labels": _noisy_labels,
    "anisotropic": _anisotropic,
}
#: Every kind :func:`ood_task` accepts.
OOD_KINDS: tuple[str, ...] = tuple(_BUILDERS)


def ood_task(task: TaskFamily | str | dict[str, Any], kind: str, **kwargs: Any) -> TaskFamily:
    """A shifted copy of ``task`` (see the module docstring for ``kind`` and its ``kwargs``)."""
    if kind not in _BUILDERS:
        raise ValueError(f"unknown OOD kind {kind!r}; known kinds: {list(OOD_KINDS)}")
    build = _BUILDERS[kind]
    family = make_task(task)
    try:
        inspect.signature(build).bind(family, **kwargs)
    except TypeError as err:  # an unexpected keyword argument
        raise ValueError(f"bad arguments for OOD kind {kind!r}: {err}") from None
    return build(family, **kwargs)
