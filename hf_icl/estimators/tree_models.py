"""Tree ensembles from scikit-learn / XGBoost, fitted per prompt and per prefix.

These are the only estimators with Python loops over prompts and prefixes: the libraries fit
one model per call. They run on CPU numpy arrays and move the result back to the input's
device. The libraries are imported on first use, so ``import hf_icl.estimators`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..validation import check_choice, check_float, check_int, did_you_mean
from .base import InContextEstimator


def fit_every_prefix(xs: torch.Tensor, ys: torch.Tensor, make_model: Callable[[], Any]) -> torch.Tensor:
    """Fit ``make_model()`` on ``(x_j, y_j)_{j<i}`` and predict ``x_i``, for every prompt and
    position ``i >= 1``; position 0 predicts 0."""
    features = xs.detach().to("cpu", torch.float64).numpy()
    targets = ys.detach().to("cpu", torch.float64).numpy()
    preds = np.zeros(targets.shape)
    for prompt in range(features.shape[0]):
        for i in range(1, features.shape[1]):
            model = make_model().fit(features[prompt, :i], targets[prompt, :i])
            preds[prompt, i] = model.predict(features[prompt, i : i + 1])[0]
    return torch.from_numpy(preds).to(ys.device)


class DecisionTree(InContextEstimator):
    """``sklearn.tree.DecisionTreeRegressor`` fitted on each prefix.

    With a single example the tree is a constant, that example's ``y``. Position 0 predicts 0.

    Args:
        max_depth: maximum tree depth, or None for fully grown trees.
        random_state: seed of sklearn's feature permutation (which breaks ties between splits).
    """

    def __init__(self, max_depth: int | None = None, random_state: int = 0):
        self.max_depth = None if max_depth is None else check_int("max_depth", max_depth, low=1)
        self.random_state = check_int("random_state", random_state, low=0)
        self.name = f"decision_tree(max_depth={self.max_depth})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        from sklearn.tree import DecisionTreeRegressor

        def make_model():
            return DecisionTreeRegressor(max_depth=self.max_depth, random_state=self.random_state)

        return fit_every_prefix(xs, ys, make_model)


class XGBoost(InContextEstimator):
    """``xgboost.XGBRegressor(**xgb_params)`` fitted on each prefix. Position 0 predicts 0.

    ``n_jobs`` defaults to 1 (the data sets are tiny, so threads only add overhead).

    Args:
        **xgb_params: keyword arguments of ``xgboost.XGBRegressor``; names and the ranges of the numeric
            ones are checked here (``n_estimators=0`` would predict a constant), so a typo or an
            out-of-range value raises ``ValueError`` instead of being ignored with a warning.
    """

    def __init__(self, **xgb_params: Any):
        check_xgb_params(xgb_params)
        self.xgb_params = {"n_jobs": 1, **xgb_params}
        shown = ", ".join(f"{key}={value}" for key, value in sorted(xgb_params.items()))
        self.name = f"xgboost({shown})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        from xgboost import XGBRegressor

        return fit_every_prefix(xs, ys, lambda: XGBRegressor(**self.xgb_params))


#: ``xgboost.XGBRegressor``'s keyword arguments (its scikit-learn API, xgboost 2.x and 3.x) and the native
#: aliases it passes to the booster
XGB_PARAMETERS = (
    "max_depth max_leaves max_bin grow_policy learning_rate n_estimators verbosity objective booster tree_method "
    "n_jobs gamma min_child_weight max_delta_step subsample sampling_method colsample_bytree colsample_bylevel "
    "colsample_bynode reg_alpha reg_lambda scale_pos_weight base_score random_state missing num_parallel_tree "
    "monotone_constraints interaction_constraints importance_type device validate_parameters enable_categorical "
    "feature_types feature_weights max_cat_to_onehot max_cat_threshold multi_strategy eval_metric "
    "early_stopping_rounds callbacks eta lambda alpha min_split_loss seed nthread"
).split()
#: name -> (kind, low, high, low_inclusive) for the numeric parameters; None means xgboost's default
_XGB_RANGES = {
    "n_estimators": ("int", 1, None, True),
    "max_depth": ("int", 0, None, True),
    "max_leaves": ("int", 0, None, True),
    "max_bin": ("int", 2, None, True),
    "num_parallel_tree": ("int", 1, None, True),
    "random_state": ("int", 0, None, True),
    "seed": ("int", 0, None, True),
    "verbosity": ("int", 0, 3, True),
    "learning_rate": ("float", 0.0, 1.0, False),
    "eta": ("float", 0.0, 1.0, False),
    "subsample": ("float", 0.0, 1.0, False),
    "colsample_bytree": ("float", 0.0, 1.0, False),
    "colsample_bylevel": ("float", 0.0, 1.0, False),
    "colsample_bynode": ("float", 0.0, 1.0, False),
    "gamma": ("float", 0.0, None, True),
    "min_split_loss": ("float", 0.0, None, True),
    "min_child_weight": ("float", 0.0, None, True),
    "max_delta_step": ("float", 0.0, None, True),
    "reg_alpha": ("float", 0.0, None, True),
    "alpha": ("float", 0.0, None, True),
    "reg_lambda": ("float", 0.0, None, True),
    "lambda": ("float", 0.0, None, True),
    "scale_pos_weight": ("float", 0.0, None, False),
    "base_score": ("float", None, None, True),
}
_XGB_CHOICES = {
    "booster": ("gbtree", "gblinear", "dart"),
    "tree_method": ("auto", "exact", "approx", "hist"),
    "grow_policy": ("depthwise", "lossguide"),
}


def check_xgb_params(params: dict[str, Any]) -> None:
    """Raise ``ValueError`` for an ``XGBRegressor`` keyword that does not exist or a value out of its range."""
    for name, value in params.items():
        if name not in XGB_PARAMETERS:
            hint = f"{close} " if (close := did_you_mean(name, XGB_PARAMETERS)) else ""
            raise ValueError(
                f"xgboost got an unknown parameter {name!r}; {hint}allowed: XGBRegressor's keywords "
                f"({', '.join(XGB_PARAMETERS)})"
            )
        if value is None:
            continue
        if name in _XGB_RANGES:
            kind, low, high, low_inclusive = _XGB_RANGES[name]
            if kind == "int":
                check_int(name, value, low=low, high=high)
            else:
                check_float(name, value, low=low, high=high, low_inclusive=low_inclusive)
        elif name in ("n_jobs", "nthread"):
            if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
                raise ValueError(f"{name} must be an integer >= 1 (or -1: all cores), got {value!r}")
        elif name in _XGB_CHOICES:
            check_choice(name, value, _XGB_CHOICES[name])
