"""Per-position ICL metrics as ``evaluate.Metric`` classes, defined locally (no Hub download).

This module imports ``evaluate`` and ``datasets``; :mod:`hf_icl.evaluation` only loads it when
one of its names is first used, so the package itself imports without them.

Each example is one prompt: ``predictions`` and ``references`` are its N per-position values.
Both metrics compute with the same functions as
:func:`~hf_icl.evaluation.evaluate_context_scaling`, so their numbers agree.

* ``ICLSquaredError``: ``compute(normalizer=d)`` returns ``{"squared_error": [N per-position
  means of (pred − y)² / normalizer], "mean": their average}``.
* ``ICLAccuracy``: ``compute(target_kind="binary" | "categorical")`` returns ``{"accuracy": [N
  per-position accuracies], "mean": ...}``. Binary predictions are logits or real values (> 0
  means +1, < 0 means −1, exactly 0 is wrong) against ±1 references; categorical predictions are class ids (e.g.
  ``logits.argmax(-1)``), rounded to the nearest integer.

Example::

    >>> import torch
    >>> metric = load_metric("icl_squared_error")
    >>> preds, ys = torch.zeros(4, 3), torch.ones(4, 3)
    >>> metric.add_batch(predictions=preds[:2], references=ys[:2])
    >>> metric.add_batch(predictions=preds[2:], references=ys[2:])
    >>> metric.compute(normalizer=2.0)
    {'squared_error': [0.5, 0.5, 0.5], 'mean': 0.5}
    >>> load_metric("icl_accuracy").compute(predictions=[[0.3, -2.0]], references=[[1.0, 1.0]])
    {'accuracy': [1.0, 0.0], 'mean': 0.5}
"""

from __future__ import annotations

from typing import Any

import datasets
import evaluate
import torch

from .metrics import correct, squared_error

_CITATION = """\
@inproceedings{garg2022can,
  title={What Can Transformers Learn In-Context? A Case Study of Simple Function Classes},
  author={Garg, Shivam and Tsipras, Dimitris and Liang, Percy and Valiant, Gregory},
  booktitle={Advances in Neural Information Processing Systems},
  year={2022}
}
"""

_INPUTS = """
Args:
    predictions: per prompt, the N predictions (one per position).
    references: per prompt, the N targets.
"""


def _per_prompt_features() -> datasets.Features:
    """One prompt per example: N float predictions and N float references."""
    values = datasets.List(datasets.Value("float64"))
    return datasets.Features({"predictions": values, "references": values})


def _as_matrix(rows: Any, what: str) -> torch.Tensor:
    """Stored per-prompt lists as a ``(prompts, N)`` float64 tensor; prompts must share N."""
    lengths = {len(row) for row in rows}
    if len(lengths) > 1:
        raise ValueError(f"every prompt's {what} must have the same length N, got lengths {sorted(lengths)}")
    return torch.tensor(rows, dtype=torch.float64)


def _summary(key: str, per_prompt: torch.Tensor) -> dict[str, Any]:
    per_position = per_prompt.mean(dim=0)
    return {key: per_position.tolist(), "mean": float(per_position.mean())}


class ICLSquaredError(evaluate.Metric):
    """Per-position squared error over prompts, divided by ``normalizer`` (d, or s for sparse tasks)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Per-position squared error of in-context predictions, divided by a normaliser.",
            citation=_CITATION,
            inputs_description=_INPUTS + "    normalizer: divides the squared errors (default 1).\n",
            features=_per_prompt_features(),
        )

    def _compute(self, predictions, references, normalizer: float = 1.0) -> dict[str, Any]:
        preds, ys = _as_matrix(predictions, "predictions"), _as_matrix(references, "references")
        return _summary("squared_error", squared_error(preds, ys, normalizer))


class ICLAccuracy(evaluate.Metric):
    """Per-position accuracy over prompts (binary: sign rule; categorical: class ids)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Per-position accuracy of in-context predictions.",
            citation=_CITATION,
            inputs_description=_INPUTS + "    target_kind: 'binary' (default) or 'categorical'.\n",
            features=_per_prompt_features(),
        )

    def _compute(self, predictions, references, target_kind: str = "binary") -> dict[str, Any]:
        preds, ys = _as_matrix(predictions, "predictions"), _as_matrix(references, "references")
        return _summary("accuracy", correct(preds, ys, target_kind))


METRIC_CLASSES: dict[str, type[evaluate.Metric]] = {
    "icl_squared_error": ICLSquaredError,
    "icl_accuracy": ICLAccuracy,
}


def load_metric(name: str, **kwargs: Any) -> evaluate.Metric:
    """Instantiate the metric ``name`` locally; ``kwargs`` go to ``evaluate.Metric`` (in-memory
    storage by default, so nothing is written to the cache folder)."""
    if name not in METRIC_CLASSES:
        raise ValueError(f"unknown ICL metric {name!r}; known metrics: {list(METRIC_CLASSES)}")
    kwargs.setdefault("keep_in_memory", True)
    return METRIC_CLASSES[name](**kwargs)
