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

from ..validation import check_int
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
        **xgb_params: keyword arguments of ``xgboost.XGBRegressor``.
    """

    def __init__(self, **xgb_params: Any):
        self.xgb_params = {"n_jobs": 1, **xgb_params}
        shown = ", ".join(f"{key}={value}" for key, value in sorted(xgb_params.items()))
        self.name = f"xgboost({shown})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        from xgboost import XGBRegressor

        return fit_every_prefix(xs, ys, lambda: XGBRegressor(**self.xgb_params))
