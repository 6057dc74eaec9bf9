"""Classical in-context estimators: baselines that read a prompt and predict every position.

Protocol
--------
A batch of prompts is ``xs (B, N, d)`` (float) and ``ys (B, N)`` (same dtype and device). Every
estimator is a callable ``estimator(xs, ys) -> preds (B, N)``: position ``i`` is predicted from
the examples ``(x_j, y_j)_{j<i}`` and ``x_i`` only, for all positions in one call. Estimators
are vectorised over the batch and over prefixes (all prefixes share one factorisation or one
cumulative sum), except :class:`DecisionTree` and :class:`XGBoost`, which fit one library model
per prompt and prefix on CPU. Outputs have the dtype and device of ``xs``; delicate linear
algebra runs in float64 internally (float32 on MPS, which has no float64). Invalid inputs raise
``ValueError`` naming the argument, what was received and what is allowed.

Few examples
------------
Position 0 has no examples and predicts 0 (the prior mean of y) for every estimator but two:
:class:`DMMSE`, whose prior is a finite pool of tasks, predicts the pool's mean weight times ``x_0``;
:class:`LogisticRegression` predicts the uniform distribution (a binary logit of exactly 0, or
``-log C`` for every class). Beyond that each estimator uses whatever examples exist, with these conventions:

* :class:`LeastSquares`: the minimum-norm least-squares solution (fewer examples than
  dimensions, or collinear inputs, leave the fit underdetermined);
* :class:`Ridge`, :class:`KernelRidge`, :class:`OptimalRidge`, :class:`Lasso`: their usual
  penalised fits on the ``i`` available examples (Lasso's ``1/(2n)`` uses ``n = i``);
* :class:`KNN`: with fewer than ``k`` examples, the mean of all of them;
* :class:`Averaging`: the mean over the ``i`` examples; :class:`OneStepGD`: the plain sum;
* :class:`NadarayaWatson`: the kernel average over the available examples (Hilbert kernel: an
  exact duplicate of ``x_i`` takes all the weight; angular kernels: cosine, Cayley, GA);
* :class:`TwoLayerNN`, :class:`DecisionTree`, :class:`XGBoost`: fitted to the ``i`` examples;
* :class:`DMMSE`: the posterior mean over its task pool (Raventós et al.'s dMMSE; the exact σ → 0 limit on
  noiseless pools); :func:`dmmse_for_task` builds it from a task family's ``n_tasks`` pool;
* :class:`LogisticRegression`: L2-regularised (``C``), no intercept, over the whole label set, so prefixes that
  have seen one class, or not every class, still have a unique finite fit. It is the one classifier: ±1
  labels give ``(B, N)`` logits, class ids (``n_classes=C``) give ``(B, N, C)`` log-probabilities.

Context and queries
-------------------
``estimator.predict_queries(context_xs (B, n, d), context_ys (B, n), query_xs (B, Q, d)) -> (B, Q)``
predicts every query from all ``n`` context pairs (queries never see each other), as the kernel-regression
document's ``fit(context).predict(queries)``. Ridge, kernel ridge, Nadaraya–Watson and dMMSE do it in closed
form and logistic regression with one fit per prompt (its output is ``(B, Q)`` logits or ``(B, Q, C)``
log-probabilities); every other estimator through the all-prefix protocol on the prompts ``[context, query]``.

Features
--------
:class:`RandomFourierFeatures` is a fixed input embedding and :class:`OnFeatures` runs any estimator on
embedded inputs (the document's angular kernels on random Fourier features).

Example::

    >>> import torch
    >>> from hf_icl.estimators import get_estimator
    >>> xs = torch.randn(4, 11, 3)
    >>> ys = xs @ torch.randn(3)
    >>> get_estimator("least_squares")(xs, ys).shape
    torch.Size([4, 11])
"""

from .base import InContextEstimator
from .dmmse import DMMSE, dmmse_for_task
from .features import OnFeatures, RandomFourierFeatures
from .kernel_ridge import KernelRidge
from .knn import KNN
from .lasso import Lasso
from .least_squares import LeastSquares
from .linear_probe import linear_probe
from .logistic_regression import LogisticRegression, LogisticRegressionConvergenceWarning
from .moments import Averaging, OneStepGD
from .nadaraya_watson import NadarayaWatson
from .optimal_ridge import OptimalRidge
from .registry import available_estimators, get_estimator
from .ridge import Ridge
from .tree_models import DecisionTree, XGBoost
from .two_layer_nn import TwoLayerNN

__all__ = [
    "DMMSE",
    "Averaging",
    "DecisionTree",
    "InContextEstimator",
    "KNN",
    "KernelRidge",
    "Lasso",
    "LeastSquares",
    "LogisticRegression",
    "LogisticRegressionConvergenceWarning",
    "NadarayaWatson",
    "OnFeatures",
    "OneStepGD",
    "OptimalRidge",
    "RandomFourierFeatures",
    "Ridge",
    "TwoLayerNN",
    "XGBoost",
    "available_estimators",
    "dmmse_for_task",
    "get_estimator",
    "linear_probe",
]
