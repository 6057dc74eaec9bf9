"""The study's prompts: the task, the fixed training set, the evaluation sets of a group, the batches of every seed
at a step, and the document's test loss (the query's squared error / d) with the trivial predictor's."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ...data.tasks import get_task
from ...evaluation.ood import ANISOTROPIC_VARIANCES, ood_task
from ...training.trainer import step_seed
from .document import N_DIMS, N_POINTS
from .specs import GroupSpec


def study_task():
    """Noiseless linear regression, y = wᵀx with w ~ N(0, I_5) and x ~ N(0, I_5)."""
    return get_task("linear_regression", n_dims=N_DIMS)


def anisotropic_weight_prompts(
    n_prompts: int, n_points: int, seed: int, variances: Sequence[float] = ANISOTROPIC_VARIANCES, return_w=False
):
    """The shift the study's *code* evaluates (its generate_data.py): x ~ N(0, I), w ~ N(0, diag(variances)).
    The document's text puts the same variances on x instead (:func:`evaluation_sets`' ``anisotropic``)."""
    generator = torch.Generator().manual_seed(seed)
    xs = torch.randn(n_prompts, n_points, len(variances), generator=generator)
    w = torch.randn(n_prompts, len(variances), generator=generator) * torch.tensor(variances).sqrt()
    ys = torch.einsum("bnd,bd->bn", xs, w)
    return (xs, ys, w) if return_w else (xs, ys)


def training_prompts(spec: GroupSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fixed training set (the same for every seed and group), or None for fresh prompts every step."""
    if spec.train_pool is None:
        return None
    return study_task().sample(spec.train_pool, N_POINTS, seed=spec.data_seed)


def evaluation_sets(spec: GroupSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The prompts every model is scored on: the test set, the two anisotropic shifts, and training prompts."""
    task, n = study_task(), spec.test_prompts
    pool = training_prompts(spec)
    if pool is None:
        train = task.sample(spec.train_eval_prompts, N_POINTS, seed=spec.data_seed + 4)
    else:
        train = tuple(t[: spec.train_eval_prompts] for t in pool)
    return {
        "test": task.sample(n, N_POINTS, seed=spec.data_seed + 1),
        "anisotropic": ood_task(task, "anisotropic").sample(n, N_POINTS, seed=spec.data_seed + 2),
        "anisotropic_w": anisotropic_weight_prompts(n, N_POINTS, seed=spec.data_seed + 3),
        "train": train,
    }


def draw_batches(task, pool, batch_size: int, seeds: Sequence[int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch per seed, ``(S, B, N, d)`` and ``(S, B, N)``. Each seed's generator is seeded as the trainer seeds
    step ``step`` of a run with that seed, so with fresh prompts the batches are ``ICLTrainer``'s; with a pool, the
    batch is drawn from it with replacement, as the study's code does."""
    xs, ys = [], []
    for seed in seeds:
        generator = torch.Generator().manual_seed(step_seed(seed, 0, step))
        if pool is None:
            x, y = task.sample(batch_size, N_POINTS, generator=generator)
        else:
            index = torch.randint(pool[0].shape[0], (batch_size,), generator=generator)
            x, y = pool[0][index], pool[1][index]
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


def query_errors(predictions: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The document's test loss per prompt: the last (query) point's squared error / d, in float64."""
    return (predictions[..., -1].double() - ys[..., -1].double()).square() / N_DIMS


def trivial_errors(spec: GroupSpec) -> dict[str, float]:
    """The trivial predictor's loss on each evaluation set of ``spec``: ŷ = 0, the best prediction that ignores the
    context (E[y | x] = 0 for w ~ N(0, I)); about 1 isotropic and 1.15 anisotropic (E[y²]/d = tr Σ / d)."""
    return dict(_trivial_errors(spec.test_prompts, spec.train_pool, spec.train_eval_prompts, spec.data_seed))


@functools.cache
def _trivial_errors(test_prompts: int, train_pool: int | None, train_eval_prompts: int, data_seed: int) -> tuple:
    # the evaluation sets depend on these fields only; any recipe and depth gives the same prompts
    spec = GroupSpec("linear", 1, 8, (0,), 1, 1, train_pool, test_prompts, train_eval_prompts, data_seed)
    sets = evaluation_sets(spec)
    return tuple((name, float(query_errors(torch.zeros_like(ys), ys).mean())) for name, (_, ys) in sets.items())
