"""Prompt layouts and prompt checks shared by every ICL model.

Prompts follow the package protocol: ``xs (B, N, d)`` and ``ys (B, N)``; the prediction at
position ``i`` may use the pairs ``j < i`` and ``x_i`` only. Both prompt formats below lay a
prompt out as a causal token sequence in which the token that predicts ``y_i`` comes before
any token holding ``y_i``, so one causal forward pass predicts every position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: What a model's targets are: real values (MSE), ±1 labels (BCE on one logit) or class ids (CE).
TARGET_KINDS = ("regression", "binary", "categorical")


def check_prompt(xs: torch.Tensor, ys: torch.Tensor, n_dims: int, max_points: int | None = None) -> None:
    """Raise a clear ``ValueError`` unless ``xs (B, N, n_dims)`` and ``ys (B, N)`` match."""
    if xs.ndim != 3 or xs.shape[-1] != n_dims:
        raise ValueError(f"xs must have shape (batch, n_points, {n_dims}), got {tuple(xs.shape)}")
    if ys.shape != xs.shape[:2]:
        raise ValueError(f"ys must have shape {tuple(xs.shape[:2])} to match xs, got {tuple(ys.shape)}")
    if max_points is not None and xs.shape[1] > max_points:
        raise ValueError(f"prompts have {xs.shape[1]} points but the model supports at most n_points={max_points}")


def encode_labels(ys: torch.Tensor, target_kind: str, n_classes: int) -> torch.Tensor:
    """Targets as token features: ``(B, N, 1)`` values, or ``(B, N, C)`` one-hot class ids."""
    if target_kind == "categorical":
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
