"""Run models and estimators on a fixed set of prompts and score them position by position.

A *predictor* is either

* an ICL model, a ``torch.nn.Module`` called as ``model(xs, ys)`` that returns an
  :class:`~hf_icl.modeling.heads.ICLOutput` (or a plain tensor). It runs in eval mode under
  ``torch.no_grad()`` on its own device, with ONE forward pass per batch of prompts (a causal
  model predicts every position at once), and its training flag is restored afterwards; or
* any callable ``(xs, ys) -> (B, N)`` such as an estimator from :mod:`hf_icl.estimators`. It
  runs without ``no_grad`` (some estimators fit with autograd) on ``device``, and receives
  ``ys`` as floats in the dtype of ``xs`` (class ids as floats for categorical tasks), as the
  estimator protocol requires.

Only the ``(B, N)`` float64 scores are kept, on the CPU, never the predictions.

Example::

    >>> import torch
    >>> from hf_icl.evaluation.metrics import PositionMetric
    >>> xs, ys = torch.randn(6, 4, 2), torch.randn(6, 4)
    >>> scores = score_predictor(lambda xs, ys: ys, xs, ys, PositionMetric("regression"), name="copy")
    >>> scores.shape, float(scores.abs().max())
    (torch.Size([6, 4]), 0.0)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..validation import check_device, check_int
from .metrics import PositionMetric

Predictor = Callable[[torch.Tensor, torch.Tensor], Any]


def check_predictors(predictors: Mapping[str, Predictor], *, reserved: tuple[str, ...] = ()) -> dict[str, Predictor]:
    """A plain dict of ``predictors``, or a ``ValueError`` if it is empty, not a mapping of
    names to callables, or uses a ``reserved`` name."""
    if not isinstance(predictors, Mapping) or not predictors:
        raise ValueError(f"expected a non-empty mapping of names to models or estimators, got {predictors!r}")
    for name, predictor in predictors.items():
        if not isinstance(name, str):
            raise ValueError(f"predictor names must be strings, got {name!r}")
        if name in reserved:
            raise ValueError(f"the predictor name {name!r} is reserved for the baseline row; rename it")
        if not callable(predictor):
            raise ValueError(f"predictor {name!r} must be a model or a callable (xs, ys) -> preds, got {predictor!r}")
    return dict(predictors)


def model_config_value(predictor: Predictor, field: str) -> Any:
    """``predictor.config.<field>`` for a model that has one, else ``None``."""
    return getattr(getattr(predictor, "config", None), field, None)


def resolve_n_points(predictors: Mapping[str, Predictor], n_points: int | None) -> int:
    """``n_points`` if given, else the shortest ``config.n_points`` among the models (every model
    can then read the prompts); a ``ValueError`` when neither exists."""
    if n_points is not None:
        return check_int("n_points", n_points, low=1)
    known = [value for p in predictors.values() if (value := model_config_value(p, "n_points")) is not None]
    if not known:
        raise ValueError(
            "n_points is required: none of the predictors is a model whose config has n_points "
            f"(predictors: {sorted(predictors)})"
        )
    return min(known)


def check_target_kinds(predictors: Mapping[str, Predictor], target_kind: str) -> None:
    """Raise if a model's ``config.target_kind`` differs from the task's."""
    for name, predictor in predictors.items():
        kind = model_config_value(predictor, "target_kind")
        if kind is not None and kind != target_kind:
            raise ValueError(f"model {name!r} was built for target_kind={kind!r} but the task's is {target_kind!r}")


def model_device(model: nn.Module, fallback: torch.device) -> torch.device:
    """The device of the model's first parameter (or buffer); ``fallback`` for stateless modules."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return fallback if first is None else first.device


@contextmanager
def evaluation_mode(model: nn.Module):
    """Eval mode and ``no_grad`` for the duration; the training flag is restored even on error."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def output_tensor(output: Any, target_kind: str, name: str) -> torch.Tensor:
    """The tensor to score in a model's output: ``.logits`` for categorical tasks, else
    ``.predictions``; a plain tensor is taken as is."""
    if isinstance(output, torch.Tensor):
        return output
    preferred = ("logits", "predictions") if target_kind == "categorical" else ("predictions", "logits")
    for field in preferred:
        value = getattr(output, field, None)
        if value is not None:
            return value
    raise ValueError(
        f"predictor {name!r} returned {type(output).__name__} with neither .predictions nor .logits; "
        f"expected a tensor or an ICLOutput"
    )


def check_output_shape(preds: torch.Tensor, metric: PositionMetric, ys: torch.Tensor, name: str) -> None:
    """Raise a ``ValueError`` naming the predictor unless ``preds`` has an allowed shape."""
    allowed = metric.expected_output_shapes(*ys.shape)
    if not isinstance(preds, torch.Tensor) or tuple(preds.shape) not in allowed:
        got = tuple(preds.shape) if isinstance(preds, torch.Tensor) else type(preds).__name__
        wanted = " or ".join(str(shape) for shape in allowed)
        raise ValueError(f"predictor {name!r} returned {got}; expected shape {wanted} (prompts, positions[, classes])")


def score_predictor(
    predictor: Predictor,
    xs: torch.Tensor,
    ys: torch.Tensor,
    metric: PositionMetric,
    *,
    name: str,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Scores ``(P, N)`` float64 (CPU) of one predictor on prompts ``xs (P, N, d)``, ``ys (P, N)``,
    fed in chunks of ``batch_size`` prompts (all at once by default)."""
    n_prompts = xs.shape[0]
    batch_size = n_prompts if batch_size is None else check_int("batch_size", batch_size, low=1)
    device = check_device("device", device) or torch.device("cpu")
    is_model = isinstance(predictor, nn.Module)
    if is_model:
        device = model_device(predictor, device)
    chunks = []
    for start in range(0, n_prompts, batch_size):
        xs_chunk, ys_chunk = xs[start : start + batch_size].to(device), ys[start : start + batch_size].to(device)
        if is_model:
            with evaluation_mode(predictor):
                preds = output_tensor(predictor(xs_chunk, ys_chunk), metric.target_kind, name)
        else:
            preds = predictor(xs_chunk, ys_chunk.to(xs_chunk.dtype))
        check_output_shape(preds, metric, ys_chunk, name)
        check_finite_predictions(preds, metric.target_kind, name, start)
        chunks.append(metric.per_prompt(preds.detach(), ys_chunk).cpu())
    return torch.cat(chunks)


def check_finite_predictions(preds: torch.Tensor, target_kind: str, name: str, first_prompt: int = 0) -> None:
    """Raise a ``ValueError`` naming the predictor, the prompt and the position of its first non-finite prediction
    (one device sync per batch): a NaN would otherwise become a NaN curve, or a silently wrong accuracy. Class
    logits may be ``-inf`` (a log-probability of 0); NaN and ``+inf`` are refused there too. ``first_prompt`` is the
    batch's offset in the evaluation set, so the prompt number is the set's."""
    bad = torch.isnan(preds) | (preds == torch.inf) if target_kind == "categorical" else ~torch.isfinite(preds)
    if not bool(bad.any()):
        return
    index = tuple(bad.nonzero()[0].tolist())
    raise ValueError(
        f"predictor {name!r} returned a non-finite prediction {preds[index].item()} for prompt "
        f"{first_prompt + index[0]}, position {index[1]} (preds[{', '.join(map(str, index))}] of its batch); "
        "a NaN or inf prediction cannot be scored (it would draw a NaN curve): check the predictor and its inputs"
    )


def score_predictors(
    predictors: Mapping[str, Predictor],
    xs: torch.Tensor,
    ys: torch.Tensor,
    metric: PositionMetric,
    *,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`score_predictor` for each named predictor, all on the same prompts."""
    return {
        name: score_predictor(predictor, xs, ys, metric, name=name, batch_size=batch_size, device=device)
        for name, predictor in predictors.items()
    }
