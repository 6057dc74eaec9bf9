"""Look up estimators by name."""

from __future__ import annotations

import inspect
from typing import Any

from ..validation import did_you_mean
from .base import InContextEstimator
from .dmmse import DMMSE
from .kernel_ridge import KernelRidge
from .knn import KNN
from .lasso import Lasso
from .least_squares import LeastSquares
from .logistic_regression import LogisticRegression
from .moments import Averaging, OneStepGD
from .nadaraya_watson import NadarayaWatson
from .optimal_ridge import OptimalRidge
from .ridge import Ridge
from .tree_models import DecisionTree, XGBoost
from .two_layer_nn import TwoLayerNN

ESTIMATORS: dict[str, type[InContextEstimator]] = {
    "least_squares": LeastSquares,
    "ridge": Ridge,
    "optimal_ridge": OptimalRidge,
    "lasso": Lasso,
    "knn": KNN,
    "averaging": Averaging,
    "one_step_gd": OneStepGD,
    "nadaraya_watson": NadarayaWatson,
    "kernel_ridge": KernelRidge,
    "two_layer_nn": TwoLayerNN,
    "decision_tree": DecisionTree,
    "xgboost": XGBoost,
    "dmmse": DMMSE,
    "logistic_regression": LogisticRegression,
}


def available_estimators() -> list[str]:
    """Names accepted by :func:`get_estimator`."""
    return list(ESTIMATORS)


def get_estimator(name: str, **kwargs: Any) -> InContextEstimator:
    """Construct the estimator registered as ``name`` with ``kwargs``.

    Raises:
        ValueError: if ``name`` is unknown (the message lists the known names), or ``kwargs`` miss a
            required argument or name one the estimator does not take.
    """
    if name not in ESTIMATORS:
        hint = f"{close} " if (close := did_you_mean(name, ESTIMATORS)) else ""
        raise ValueError(f"unknown estimator {name!r}; {hint}known estimators: {', '.join(ESTIMATORS)}")
    cls = ESTIMATORS[name]
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments for estimator {name!r} {inspect.signature(cls)}: {err}") from None
    return cls(**kwargs)
