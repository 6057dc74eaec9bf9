"""Per-position scores of in-context predictions: normalised squared error or accuracy.

Every score here is computed per prompt and per position, ``(B, N)`` in float64, so that
averaging over prompts gives the curve and resampling prompts gives its bootstrap band.

Normalisation (Garg et al., 2022): squared errors are divided by the scale that the trivial
zero predictor's error grows with, so that it scores about 1 and curves are comparable across
dimensions:

* d for linear, noisy-linear, quadratic and ReLU-network regression (with w ~ N(0, I_d) and
  x ~ N(0, I_d), E[y²] = E‖w‖² = d);
* the sparsity s for sparse linear regression: only s weights are non-zero, so
  E[y²] = s·E[w_j²] = s and the zero predictor scores s/s ≈ 1 (dividing by d would make every
  error look d/s times smaller);
* 1 for families whose targets do not grow with d (decision trees: N(0, 1) leaves;
  sinusoids: y = a·sin(·)).

Every metric name says its normaliser (``squared_error/d``, ``squared_error/s``,
``squared_error/1``), and every place that reports an error (the trainer's evaluation, model
cards, ``hf-icl evaluate`` and ``hf-icl compare``, plots) takes it from :func:`metric_for_task`.

Classification is scored by accuracy with one decision rule for models and estimators alike:

* binary (±1 labels): a prediction ``p`` means +1 when ``p > 0``, −1 when ``p < 0``, and no label
  at all when ``p == 0``: an exact 0 is counted as wrong, as Garg et al. do (``sign(0) = 0``), so a
  predictor that has nothing to go on does not score 50 % by always answering 0;
* categorical: ``(B, N, C)`` logits mean ``argmax``; a ``(B, N)`` prediction (an estimator
  regressing the class ids) means the nearest integer class id.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> metric = metric_for_task(get_task("sparse_linear_regression", n_dims=8, sparsity=2))
    >>> metric.name, metric.normalizer
    ('squared_error/s', 2.0)
    >>> metric.per_prompt(torch.ones(1, 3), torch.zeros(1, 3))
    tensor([[0.5000, 0.5000, 0.5000]], dtype=torch.float64)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..data.tasks import (
    DecisionTree,
    LatentGroupSinusoid,
    Sinusoid,
    SparseLinearRegression,
    TaskFamily,
)

SQUARED_ERROR = "squared_error"
ACCURACY = "accuracy"
#: Families whose targets keep unit scale whatever the input dimension.
UNIT_SCALE_FAMILIES = (DecisionTree, Sinusoid, LatentGroupSinusoid)


def squared_error(preds: torch.Tensor, ys: torch.Tensor, normalizer: float = 1.0) -> torch.Tensor:
    """``(pred − y)² / normalizer`` in float64, elementwise.

    >>> squared_error(torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]]), normalizer=2.0)
    tensor([[0.5000, 2.0000]], dtype=torch.float64)
    """
    if preds.shape != ys.shape:
        raise ValueError(f"preds has shape {tuple(preds.shape)} but ys has shape {tuple(ys.shape)}")
    return (preds.double() - ys.double()).square() / normalizer


def predicted_labels(preds: torch.Tensor, target_kind: str) -> torch.Tensor:
    """The labels a prediction stands for (see the module docstring for the rule).

    >>> predicted_labels(torch.tensor([[-0.3, 0.0, 2.0]]), "binary")
    tensor([[-1.,  0.,  1.]])
    >>> predicted_labels(torch.tensor([[[0.1, 0.9], [2.0, -1.0]]]), "categorical")
    tensor([[1, 0]])
    """
    if target_kind == "binary":
        return torch.sign(preds).float()  # 0 stays 0: no label, never equal to a ±1 target
    if target_kind == "categorical":
        return preds.argmax(dim=-1) if preds.ndim == 3 else preds.round().long()
    raise ValueError(f"target_kind must be 'binary' or 'categorical' to have labels, got {target_kind!r}")


def correct(preds: torch.Tensor, ys: torch.Tensor, target_kind: str) -> torch.Tensor:
    """1.0 where the predicted label equals ``ys``, else 0.0 (float64, the shape of ``ys``)."""
    labels = predicted_labels(preds, target_kind)
    if labels.shape != ys.shape:
        raise ValueError(f"predicted labels have shape {tuple(labels.shape)} but ys has shape {tuple(ys.shape)}")
    return (labels.double() == ys.double()).double()


def normalizer_for(task: TaskFamily) -> float:
    """The squared-error normaliser of ``task``: s (sparse), 1 (unit-scale targets) or d."""
    return _normalizer(task)[0]


def _normalizer(task: TaskFamily) -> tuple[float, str]:
    """``(value, symbol)`` of the squared-error normaliser of ``task``."""
    if isinstance(task, SparseLinearRegression):
        return float(task.sparsity), "s"
    if isinstance(task, UNIT_SCALE_FAMILIES):
        return 1.0, "1"
    return float(task.n_dims), "d"


@dataclass(frozen=True)
class PositionMetric:
    """How one task is scored: per prompt and position, plus the trivial predictor's score.

    Args:
        target_kind: "regression", "binary" or "categorical" (the task's).
        normalizer: divides squared errors (regression only).
        n_classes: number of classes (categorical only), for the chance rate 1/C.
        normalizer_symbol: how names and labels write the normaliser ("d", "s", ...); its value by default.
    """

    target_kind: str
    normalizer: float = 1.0
    n_classes: int | None = None
    normalizer_symbol: str | None = None

    @property
    def name(self) -> str:
        """``squared_error/<normaliser>`` or ``accuracy``: the name every report uses."""
        if self.target_kind == "regression":
            return f"{SQUARED_ERROR}/{self.normalizer_label}"
        return ACCURACY

    def summary_name(self, where: str) -> str:
        """Name of one summary of the curve, e.g. ``error_last/d`` or ``accuracy_mean``."""
        if self.target_kind == "regression":
            return f"error_{where}/{self.normalizer_label}"
        return f"accuracy_{where}"

    @property
    def normalizer_label(self) -> str:
        return self.normalizer_symbol or f"{self.normalizer:g}"

    @property
    def higher_is_better(self) -> bool:
        return self.target_kind != "regression"

    @property
    def axis_label(self) -> str:
        if self.target_kind == "regression":
            shown = self.normalizer_label
            value = "" if shown == f"{self.normalizer:g}" else f" (= {self.normalizer:g})"
            return f"squared error / {shown}{value}"
        return "accuracy"

    def expected_output_shapes(self, batch: int, n_points: int) -> list[tuple[int, ...]]:
        """Shapes a predictor may return for ``batch`` prompts of ``n_points`` examples."""
        shapes = [(batch, n_points)]
        if self.target_kind == "categorical":
            shapes.append((batch, n_points, self.n_classes))
        return shapes

    def per_prompt(self, preds: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Score of every prompt at every position, ``(B, N)`` float64 on the device of ``preds``."""
        ys = ys.to(preds.device)
        if self.target_kind == "regression":
            return squared_error(preds, ys, self.normalizer)
        return correct(preds, ys, self.target_kind)

    def trivial_per_prompt(self, ys: torch.Tensor) -> torch.Tensor:
        """The trivial predictor's scores: always predicting 0 (regression), or the chance rate
        (0.5 for binary, 1/C for categorical), a constant that needs no predictions."""
        if self.target_kind == "regression":
            return squared_error(torch.zeros_like(ys), ys, self.normalizer)
        chance = 0.5 if self.target_kind == "binary" else 1.0 / self.n_classes
        return torch.full(ys.shape, chance, dtype=torch.float64, device=ys.device)


def metric_for_task(task: TaskFamily, normalizer: float | None = None) -> PositionMetric:
    """The metric of ``task``'s target kind; ``normalizer`` overrides :func:`normalizer_for`."""
    kind = task.target_kind
    if kind == "regression":
        if normalizer is None:
            value, symbol = _normalizer(task)
            return PositionMetric(kind, normalizer=value, normalizer_symbol=symbol)
        if isinstance(normalizer, bool) or not isinstance(normalizer, (int, float)) or not 0 < normalizer < math.inf:
            raise ValueError(f"normalizer must be a finite positive number, got {normalizer!r}")
        return PositionMetric(kind, normalizer=float(normalizer))
    if normalizer is not None:
        raise ValueError(f"normalizer only applies to regression tasks; {task.name} is scored by accuracy")
    return PositionMetric(kind, n_classes=getattr(task, "n_classes", None))
