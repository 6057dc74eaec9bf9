"""Classical estimators configured for a task family (the Bayes predictors need the prior, the classifiers the
label set)."""

from __future__ import annotations

from ..data.tasks import LinearRegression, NoisyLinearRegression, TaskFamily


def estimator_for_task(name: str, family: TaskFamily):
    """Build estimator ``name`` for ``family``: ``optimal_ridge`` takes the weight prior and noise from it,
    ``dmmse`` its finite task pool (:func:`~hf_icl.estimators.dmmse_for_task`), ``logistic_regression`` its
    labels (±1 for binary families, ``n_classes`` class ids for categorical ones); every other name is built
    with its defaults."""
    from ..estimators import dmmse_for_task, get_estimator

    if name == "dmmse":
        return dmmse_for_task(family)
    if name == "logistic_regression":
        if family.target_kind == "regression":
            raise ValueError(
                f"logistic_regression classifies binary or categorical labels; {family.name} is a regression task"
            )
        return get_estimator(name, n_classes=family.n_classes if family.target_kind == "categorical" else None)
    if name != "optimal_ridge":
        return get_estimator(name)
    if not isinstance(family, NoisyLinearRegression):
        kind = "noiseless (it equals least_squares there)" if isinstance(family, LinearRegression) else "non-linear"
        raise ValueError(f"optimal_ridge is the Bayes predictor of noisy linear regression; {family.name} is {kind}")
    return get_estimator(
        name,
        weight_var=family.weight_var * family.scale**2,
        noise_std=family.noise_std,
        noise_probs=family.noise_probs,
    )


def has_dmmse(family: TaskFamily) -> bool:
    """Whether ``family`` has a finite task pool with labels linear in a weight vector, so that ``dmmse`` (the
    Bayes predictor of that pool) applies."""
    if family.n_tasks is None or family.target_kind != "regression" or not isinstance(family, LinearRegression):
        return False
    return getattr(family, "renormalize_ys", False) != "batch"


def default_baselines(family: TaskFamily) -> dict:
    """The estimators a model trained on ``family`` is compared with by default.

    Regression: least squares, averaging and 3-NN, plus the Bayes ridge for noisy linear tasks and dMMSE (the
    Bayes predictor of the pool) for linear families with a finite task pool (``n_tasks``);
    binary labels: least squares and 3-NN on the ±1 labels (their sign is the prediction) and logistic
    regression (its logit);
    categorical labels: logistic regression over the ``n_classes`` classes (its log-probabilities).
    """
    if family.target_kind == "categorical":
        names = ["logistic_regression"]
    elif family.target_kind == "binary":
        names = ["least_squares", "logistic_regression", "knn"]
    else:
        names = ["least_squares", "averaging", "knn"]
        if has_dmmse(family):
            names.insert(1, "dmmse")
        if isinstance(family, NoisyLinearRegression):
            names.insert(1, "optimal_ridge")
    return {name: estimator_for_task(name, family) for name in names}
