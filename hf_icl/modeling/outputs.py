"""What every ICL model shares: the output type, prompt formats and prediction heads.

Prompts follow the package protocol: ``xs (B, N, d)`` and ``ys (B, N)``; the prediction at
position ``i`` may use the pairs ``j < i`` and ``x_i`` only. Both prompt formats below lay a
prompt out as a causal token sequence in which the token that predicts ``y_i`` comes before
any token holding ``y_i``, so one causal forward pass predicts every position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

PROBLEM_TYPES = ("regression", "binary", "categorical")


@dataclass
class ICLOutput(ModelOutput):
    """Output of an in-context learner.

    Args:
        loss: scalar training loss over the chosen positions (when ``ys`` were given).
        predictions: ``(B, N)`` regression values, or binary logits for ``problem_type="binary"``.
        logits: ``(B, N, C)`` class logits for ``problem_type="categorical"``.
        hidden_states / attentions: per-layer tensors when asked for.
    """

    loss: torch.Tensor | None = None
    predictions: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def check_prompt(xs: torch.Tensor, ys: torch.Tensor, n_dims: int, max_points: int | None = None) -> None:
    """Raise a clear ``ValueError`` unless ``xs (B, N, n_dims)`` and ``ys (B, N)`` match."""
    if xs.ndim != 3 or xs.shape[-1] != n_dims:
        raise ValueError(f"xs must have shape (batch, n_points, {n_dims}), got {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ValueError(f"ys must have shape {tuple(xs.shape[:2])} to match xs, got {tuple(ys.shape)}")
    if max_points is not None and xs.shape[1] > max_points:
        raise ValueError(f"prompts have {xs.shape[1]} points but the model supports at most n_points={max_points}")


def encode_labels(ys: torch.Tensor, problem_type: str, n_classes: int) -> torch.Tensor:
    """Targets as token features: ``(B, N, 1)`` values, or ``(B, N, C)`` one-hot class ids."""
    if problem_type == "categorical":
        return F.one_hot(ys.long(), n_classes).to(torch.get_default_dtype())
    return ys.unsqueeze(-1).float()


class InterleavedPrompt:
    """Garg et al.'s layout: x_1, y_1, x_2, y_2, … with y tokens zero-padded to the token width.

    Token ``2i`` holds ``x_i`` and predicts ``y_i``; token ``2i+1`` holds ``y_i``.
    """

    def __init__(self, n_dims: int, label_width: int):
        self.n_dims = n_dims
        self.label_width = label_width
        self.token_width = max(n_dims, label_width)

    def tokens(self, xs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch, n_points, _ = xs.shape
        x_tokens = F.pad(xs, (0, self.token_width - self.n_dims))
        y_tokens = F.pad(labels.to(xs.dtype), (0, self.token_width - labels.shape[-1]))
        return torch.stack((x_tokens, y_tokens), dim=2).reshape(batch, 2 * n_points, self.token_width)

    @staticmethod
    def query_positions(n_points: int) -> slice:
        return slice(0, 2 * n_points, 2)


class ConcatenatedPrompt:
    """Tokens ``[x_i, y_i]``, each preceded by its query token ``[x_i, 0]``.

    The sequence is q_1, c_1, q_2, c_2, … with q_i = [x_i, 0] and c_i = [x_i, y_i]; q_i predicts
    y_i. Under a causal mask q_i already cannot see c_i; :meth:`context_mask` additionally hides
    the other queries, for models whose attention must only mix labelled examples.
    """

    def __init__(self, n_dims: int, label_width: int):
        self.n_dims = n_dims
        self.label_width = label_width
        self.token_width = n_dims + label_width

    def tokens(self, xs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch, n_points, _ = xs.shape
        context = torch.cat((xs, labels.to(xs.dtype)), dim=-1)
        query = F.pad(xs, (0, self.label_width))
        return torch.stack((query, context), dim=2).reshape(batch, 2 * n_points, self.token_width)

    @staticmethod
    def query_positions(n_points: int) -> slice:
        return slice(0, 2 * n_points, 2)

    @staticmethod
    def context_mask(n_points: int, device=None) -> torch.Tensor:
        """``(2N, 2N)`` bool, True where attention is allowed: every token sees earlier context
        tokens and itself, never another query token."""
        length = 2 * n_points
        idx = torch.arange(length, device=device)
        causal = idx[:, None] >= idx[None, :]
        is_context_key = (idx % 2 == 1)[None, :]
        return causal & (is_context_key | (idx[:, None] == idx[None, :]))


PROMPT_FORMATS = {"interleaved": InterleavedPrompt, "concatenated": ConcatenatedPrompt}


class ICLHead(nn.Module):
    """Read-out from hidden states at the query tokens, and the loss of each problem type.

    ``regression``: MSE; ``binary``: BCE on one logit with ±1 targets (Garg et al.'s linear
    classification); ``categorical``: cross-entropy over ``n_classes`` logits.
    """

    def __init__(self, hidden_size: int, problem_type: str, n_classes: int):
        super().__init__()
        self.problem_type = problem_type
        self.read_out = nn.Linear(hidden_size, n_classes if problem_type == "categorical" else 1)

    def forward(self, hidden: torch.Tensor, ys: torch.Tensor | None, loss_mask: torch.Tensor | None) -> ICLOutput:
        out = self.read_out(hidden)
        if self.problem_type == "categorical":
            predictions, logits = None, out
        else:
            predictions, logits = out.squeeze(-1), None
        loss = None if ys is None else self.loss(out, ys, loss_mask)
        return ICLOutput(loss=loss, predictions=predictions, logits=logits)

    def loss(self, out: torch.Tensor, ys: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
        out = out.float()
        if self.problem_type == "regression":
            per_position = (out.squeeze(-1) - ys.float()).square()
        elif self.problem_type == "binary":
            per_position = F.binary_cross_entropy_with_logits(out.squeeze(-1), (ys.float() + 1) / 2, reduction="none")
        else:
            per_position = F.cross_entropy(out.transpose(1, 2), ys.long(), reduction="none")
        if loss_mask is None:
            return per_position.mean()
        weights = loss_mask.to(per_position.dtype).expand_as(per_position)
        return (per_position * weights).sum() / weights.sum().clamp_min(1)


def loss_mask_for(positions, n_points: int, device) -> torch.Tensor | None:
    """Turn ``loss_positions`` (None, a bool mask over N, or position indices) into a (N,) mask."""
    if positions is None:
        return None
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype == torch.bool:
        if positions.shape != (n_points,):
            raise ValueError(f"a boolean loss_positions must have shape ({n_points},), got {tuple(positions.shape)}")
        return positions
    if positions.numel() == 0 or positions.min() < 0 or positions.max() >= n_points:
        raise ValueError(f"loss_positions must be indices in [0, {n_points - 1}], got {positions.tolist()}")
    return torch.zeros(n_points, dtype=torch.bool, device=device).index_fill_(0, positions.long().flatten(), True)
