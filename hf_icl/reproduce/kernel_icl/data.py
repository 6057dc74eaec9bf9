"""The kernel-ICL study's data (seed 000): the 1-D sin(x) prompt of Table 1, the context/query prompts the models train
and are evaluated on, Table 2's held-out tasks, and the trivial predictor's errors on them."""

from __future__ import annotations

import torch

from ...data.tasks import get_task
from ...evaluation.metrics import metric_for_task
from .specs import Scale


def sine_prompt(scale: Scale, seed: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """The document's 1-D test: context on linspace(−3, 3) with N(0, σ²) label noise drawn from ``seed``, queries on
    linspace(−3, 3) with clean targets sin(x). Shapes ``(1, n, 1)`` / ``(1, n)``."""
    generator = torch.Generator().manual_seed(seed)
    context_x = torch.linspace(-3, 3, scale.context_points, dtype=dtype)
    noise = torch.randn(scale.context_points, generator=generator, dtype=dtype)
    query_x = torch.linspace(-3, 3, scale.query_points, dtype=dtype)
    return {
        "context_x": context_x[None, :, None],
        "context_y": (torch.sin(context_x) + scale.noise_std * noise)[None],
        "query_x": query_x[None, :, None],
        "query_y": torch.sin(query_x)[None],
    }


def context_query_batch(task, batch: int, n_context: int, n_queries: int, generator) -> tuple[torch.Tensor, ...]:
    """Prompts of ``n_context`` noisy pairs followed by ``n_queries`` queries whose targets are the clean signal (the
    document's training and evaluation data)."""
    xs, ys, params = task.sample(batch, n_context + n_queries, generator=generator, return_params=True)
    targets = torch.cat([ys[:, :n_context], params["signal"][:, n_context:]], dim=1)
    return xs, targets


def table2_eval_batch(scale: Scale, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's held-out Table-2 tasks: ``xs (tasks, context + queries, d)`` and targets (noisy context labels,
    clean query targets)."""
    task = get_task("latent_group_sinusoid", n_dims=scale.n_dims)
    generator = torch.Generator().manual_seed(123 + seed)
    return context_query_batch(task, scale.eval_tasks, scale.eval_context, scale.eval_queries, generator)


# -- the trivial predictor -----------------------------------------------------------------------------------------
def zero_predictor_mse(task_name: str, n_dims: int, targets: torch.Tensor) -> torch.Tensor:
    """The zero predictor's MSE over the last dim of ``targets`` (the package's trivial predictor of a regression
    task, scored with the task's own metric, whose normaliser is 1 for the sinusoid families)."""
    metric = metric_for_task(get_task(task_name, n_dims=n_dims))
    return metric.trivial_per_prompt(targets.double()).mean(-1)


def table1_references(scale: Scale) -> dict[str, torch.Tensor]:
    """Per seed ``(seeds,)``: the zero predictor's and the context-mean predictor's MSE on Table 1's 100 queries,
    against the clean sine the methods are scored on."""
    zero, context_mean = [], []
    for seed in scale.seeds:
        data = sine_prompt(scale, seed)
        targets = data["query_y"][0]
        zero.append(float(zero_predictor_mse("sinusoid", 1, targets)))
        context_mean.append(float((data["context_y"][0].mean() - targets).square().mean()))
    return {
        "zero": torch.tensor(zero, dtype=torch.float64),
        "context_mean": torch.tensor(context_mean, dtype=torch.float64),
    }


def table2_references(scale: Scale) -> dict[str, torch.Tensor]:
    """Per seed and held-out task ``(seeds, tasks)``: the zero predictor's and the context-mean predictor's MSE on
    Table 2's query points, against the clean targets the models and KRR are scored on."""
    zero, context_mean = [], []
    n = scale.eval_context
    for seed in scale.seeds:
        _, ys = table2_eval_batch(scale, seed)
        targets = ys[:, n:].double()
        zero.append(zero_predictor_mse("latent_group_sinusoid", scale.n_dims, targets))
        context_mean.append((ys[:, :n].double().mean(1, keepdim=True) - targets).square().mean(1))
    return {"zero": torch.stack(zero), "context_mean": torch.stack(context_mean)}


def trivial_errors(scale: Scale) -> dict[str, torch.Tensor]:
    """The trivial (zero) predictor's MSE per seed ``(seeds,)`` on each table's evaluation data: data generation
    only, no training (what re-judges a finished run's claims)."""
    return {"table1": table1_references(scale)["zero"], "table2": table2_references(scale)["zero"].mean(1)}
