"""The gd-icl study's measurements: accuracy and NLL at the query, the numbers a GD model learned, and the seeds'
mean ± 95 % interval as report text."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...modeling.gd_transformer import GDTransformerForInContextClassification
from ..report import seed_interval


# -- metrics -----------------------------------------------------------------------------------------------------------
def query_metrics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """Top-1 accuracy and mean NLL of class ``logits (P, C)`` for ``labels (P,)``.

    >>> query_metrics(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))[0]
    0.5
    """
    logits = logits.double()
    accuracy = float((logits.argmax(-1) == labels).double().mean())
    return accuracy, float(F.cross_entropy(logits, labels.long()))


@torch.no_grad()
def query_logits(model: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``model``'s logits ``(P, C)`` at the query of prompts ``xs (P, N + 1, d)``, ``ys (P, N + 1)`` (N context pairs,
    the document's protocol; the query's label is not read)."""
    n_context = xs.shape[1] - 1
    chunks = [model(xs[i : i + chunk], ys[i : i + chunk], n_context=n_context).logits for i in range(0, len(xs), chunk)]
    return torch.cat(chunks)[:, -1]


def model_query_metrics(model: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> tuple[float, float]:
    """Accuracy and NLL of ``model`` at the last position of prompts ``xs (P, N + 1, d)``, ``ys (P, N + 1)``."""
    return query_metrics(query_logits(model, xs, ys), ys[:, -1])


def interval_text(mean, half, digits: int = 3) -> str:
    mean, half = float(mean), float(half)
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def seed_stats(values) -> tuple[torch.Tensor, torch.Tensor]:
    return seed_interval(torch.as_tensor(values, dtype=torch.float64))


def mean_of(values) -> float:
    return float(torch.as_tensor(values, dtype=torch.float64).mean())


def learned_values(model: GDTransformerForInContextClassification) -> dict[str, float]:
    """η and h of a constructed model: head 1's output map writes ``η × identity`` into f; h is its bandwidth."""
    config = model.config
    weight = model.blocks[0].self_attention.update_output.weight.detach()
    latent = weight[config.n_dims : config.n_dims + config.embed_dim]
    return {"step_size": float(latent.diagonal().mean()), "bandwidth": config.bandwidth}
