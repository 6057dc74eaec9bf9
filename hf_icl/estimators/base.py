"""The estimator protocol: ``estimator(xs, ys) -> preds`` for every prefix, and
``estimator.predict_queries(context_xs, context_ys, query_xs)`` for a context/query split, with input validation."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class InContextEstimator(ABC):
    """Base class of every in-context estimator.

    An estimator maps a batch of prompts ``xs (B, N, d)``, ``ys (B, N)`` to predictions
    ``(B, N)``, where position ``i`` is predicted from the pairs ``j < i`` and ``x_i`` only
    (``ys[:, i:]`` is never used for position ``i``). Position 0 has no examples and predicts 0,
    the prior mean of y (a finite task pool's estimator predicts that pool's mean; a classifier that
    returns class scores ``(B, N, C)`` predicts the uniform distribution). The output has the dtype and
    device of ``xs``.

    :meth:`predict_queries` is the context/query form of the same estimator (the kernel-regression
    document's ``fit(context).predict(queries)``): every query is predicted from all the context pairs.

    Subclasses set :attr:`name` (a short label for tables, e.g. ``"ridge(λ=0.1)"``) and implement
    :meth:`_predict`, which receives validated inputs. They may override :meth:`_predict_queries` with a
    closed form; the default reuses :meth:`_predict`, so every estimator supports both forms.
    """

    name: str = "estimator"
    #: how many ``[context, query]`` prompts the default :meth:`_predict_queries` hands to :meth:`_predict`
    #: at once: memory then grows with this number (times what one prompt of ``n + 1`` points costs), not with
    #: ``B · Q``
    query_chunk_size: int = 64

    def __call__(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Validate the prompt batch and return the predictions at every position."""
        validate_prompts(xs, ys)
        return self._predict(xs, ys).to(xs.dtype)

    @abstractmethod
    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Predictions ``(B, N)`` for validated ``xs (B, N, d)`` and ``ys (B, N)``."""

    def predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        """Predict every query from all the context pairs.

        Query ``q`` of prompt ``b`` is predicted from the ``n`` pairs ``(context_xs[b], context_ys[b])`` and
        ``query_xs[b, q]`` alone: queries never see each other (nor any label of their own). This equals the
        all-prefix prediction at the last position of the prompt ``[context, query_q]``.

        Args:
            context_xs: ``(B, n, d)`` float, ``n >= 1``.
            context_ys: ``(B, n)``, the dtype and device of ``context_xs``.
            query_xs: ``(B, Q, d)``, the dtype and device of ``context_xs``.

        Returns:
            ``(B, Q)`` predictions in the dtype and device of ``query_xs``.

        >>> import torch
        >>> from hf_icl.estimators import Ridge
        >>> context_xs = torch.randn(2, 20, 3, dtype=torch.float64)
        >>> context_ys = context_xs.sum(-1)  # y = x₁ + x₂ + x₃
        >>> queries = torch.ones(2, 5, 3, dtype=torch.float64)
        >>> preds = Ridge(lam=1e-9).predict_queries(context_xs, context_ys, queries)
        >>> preds.shape, torch.allclose(preds, torch.full((2, 5), 3.0, dtype=torch.float64))
        (torch.Size([2, 5]), True)
        """
        validate_queries(context_xs, context_ys, query_xs)
        return self._predict_queries(context_xs, context_ys, query_xs).to(query_xs.dtype)

    def _predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        """Predictions ``(B, Q)`` for validated inputs.

        The reference implementation, right for every estimator: the ``B · Q`` prompts ``[context, query_q]``
        (the query carries a dummy label 0, which the protocol never reads) go through :meth:`_predict`
        :attr:`query_chunk_size` at a time, and the prediction at their last position is kept.
        """
        batch, n_queries = query_xs.shape[:2]
        predictions = []
        for start in range(0, batch * n_queries, self.query_chunk_size):
            flat = torch.arange(start, min(start + self.query_chunk_size, batch * n_queries), device=query_xs.device)
            prompt, query = flat // n_queries, flat % n_queries
            xs = torch.cat([context_xs[prompt], query_xs[prompt, query].unsqueeze(1)], dim=1)
            ys = torch.cat([context_ys[prompt], context_ys.new_zeros(len(flat), 1)], dim=1)
            predictions.append(self._predict(xs, ys)[:, -1])
        return torch.cat(predictions).reshape(batch, n_queries)

    def __repr__(self) -> str:
        return f"{type(self).__name__}<{self.name}>"


def validate_prompts(xs: torch.Tensor, ys: torch.Tensor, names: tuple[str, str] = ("xs", "ys")) -> None:
    """Raise ``ValueError`` (naming the argument, what was received and what is allowed) unless
    ``xs`` is a finite ``(B, N, d)`` float tensor and ``ys`` a finite ``(B, N)`` tensor of the same
    dtype and device, with ``B, N, d >= 1``. ``names`` are the two arguments' names in the errors."""
    x_name, y_name = names
    for arg, value in ((x_name, xs), (y_name, ys)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{arg} must be a torch.Tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise ValueError(f"{arg} must have a floating-point dtype, got {value.dtype}")
    if xs.ndim != 3 or min(xs.shape) < 1:
        raise ValueError(f"{x_name} must have shape (B, N, d) with B, N, d >= 1, got {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ValueError(
            f"{y_name} must have shape (B, N) = {tuple(xs.shape[:2])} to match {x_name} {tuple(xs.shape)}, "
            f"got {tuple(ys.shape)}"
        )
    _check_same_kind(y_name, ys, x_name, xs)
    for arg, value in ((x_name, xs), (y_name, ys)):
        _check_finite(arg, value)


def validate_queries(context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor) -> None:
    """Raise ``ValueError`` (naming the argument, what was received and what is allowed) unless the context
    is a valid prompt batch (:func:`validate_prompts`) and ``query_xs`` a finite ``(B, Q, d)`` float tensor,
    ``Q >= 1``, with the batch size, input dimension, dtype and device of ``context_xs``."""
    validate_prompts(context_xs, context_ys, names=("context_xs", "context_ys"))
    if not isinstance(query_xs, torch.Tensor):
        raise ValueError(f"query_xs must be a torch.Tensor, got {type(query_xs).__name__}")
    batch, _, n_dims = context_xs.shape
    if query_xs.ndim != 3 or query_xs.shape[0] != batch or query_xs.shape[2] != n_dims or query_xs.shape[1] < 1:
        raise ValueError(
            f"query_xs must have shape (B, Q, d) = ({batch}, Q, {n_dims}) with Q >= 1 to match context_xs "
            f"{tuple(context_xs.shape)}, got {tuple(query_xs.shape)}"
        )
    _check_same_kind("query_xs", query_xs, "context_xs", context_xs)
    _check_finite("query_xs", query_xs)


def _check_same_kind(arg: str, value: torch.Tensor, reference_arg: str, reference: torch.Tensor) -> None:
    if value.dtype != reference.dtype or value.device != reference.device:
        raise ValueError(
            f"{arg} must have the dtype and device of {reference_arg} ({reference.dtype} on {reference.device}), "
            f"got {value.dtype} on {value.device}"
        )


def _check_finite(arg: str, value: torch.Tensor) -> None:
    if not torch.isfinite(value).all():
        bad = value[~torch.isfinite(value)][0].item()
        raise ValueError(f"{arg} must contain only finite values, got {bad}")
