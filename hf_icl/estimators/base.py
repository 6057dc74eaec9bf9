"""The estimator protocol: ``estimator(xs, ys) -> preds``, with input validation."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class InContextEstimator(ABC):
    """Base class of every in-context estimator.

    An estimator maps a batch of prompts ``xs (B, N, d)``, ``ys (B, N)`` to predictions
    ``(B, N)``, where position ``i`` is predicted from the pairs ``j < i`` and ``x_i`` only
    (``ys[:, i:]`` is never used for position ``i``). Position 0 has no examples and predicts 0,
    the prior mean of y. The output has the dtype and device of ``xs``.

    Subclasses set :attr:`name` (a short label for tables, e.g. ``"ridge(λ=0.1)"``) and implement
    :meth:`_predict`, which receives validated inputs.
    """

    name: str = "estimator"

    def __call__(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Validate the prompt batch and return the predictions at every position."""
        validate_prompts(xs, ys)
        return self._predict(xs, ys).to(xs.dtype)

    @abstractmethod
    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Predictions ``(B, N)`` for validated ``xs (B, N, d)`` and ``ys (B, N)``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}<{self.name}>"


def validate_prompts(xs: torch.Tensor, ys: torch.Tensor) -> None:
    """Raise ``ValueError`` (naming the argument, what was received and what is allowed) unless
    ``xs`` is a finite ``(B, N, d)`` float tensor and ``ys`` a finite ``(B, N)`` tensor of the same
    dtype and device, with ``B, N, d >= 1``."""
    for arg, value in (("xs", xs), ("ys", ys)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{arg} must be a torch.Tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise ValueError(f"{arg} must have a floating-point dtype, got {value.dtype}")
    if xs.ndim != 3 or min(xs.shape) < 1:
        raise ValueError(f"xs must have shape (B, N, d) with B, N, d >= 1, got {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ValueError(
            f"ys must have shape (B, N) = {tuple(xs.shape[:2])} to match xs {tuple(xs.shape)}, got {tuple(ys.shape)}"
        )
    if ys.dtype != xs.dtype or ys.device != xs.device:
        raise ValueError(
            f"ys must have the dtype and device of xs ({xs.dtype} on {xs.device}), got {ys.dtype} on {ys.device}"
        )
    for arg, value in (("xs", xs), ("ys", ys)):
        if not torch.isfinite(value).all():
            bad = value[~torch.isfinite(value)][0].item()
            raise ValueError(f"{arg} must contain only finite values, got {bad}")
