"""Classical estimators configured for a task family (the Bayes-optimal ridge needs the prior)."""

from __future__ import annotations

from ..data.tasks import LinearRegression, NoisyLinearRegression, TaskFamily


def estimator_for_task(name: str, family: TaskFamily):
    """Build estimator ``name``; ``optimal_ridge`` takes the weight prior and noise from ``family``."""
    from ..estimators import get_estimator

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


def default_baselines(family: TaskFamily) -> dict:
    """The estimators a model trained on ``family`` is compared with by default.

    Regression: least squares, averaging and 3-NN (plus the Bayes ridge for noisy linear tasks);
    binary labels: least squares and 3-NN on the ±1 labels (their sign is the prediction);
    categorical labels: none (the chance rate is the reference).
    """
    if family.target_kind == "categorical":
        return {}
    names = ["least_squares", "knn"] if family.target_kind == "binary" else ["least_squares", "averaging", "knn"]
    if isinstance(family, NoisyLinearRegression):
        names.insert(1, "optimal_ridge")
    return {name: estimator_for_task(name, family) for name in names}
