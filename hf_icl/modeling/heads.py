"""The output type and prediction heads shared by every ICL model, and loss masks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from .initialization import icl_io_layer


@dataclass
class ICLOutput(ModelOutput):
    """Output of an in-context learner.

    Args:
        loss: scalar training loss over the chosen positions (when ``ys`` were given).
        predictions: ``(B, N)`` regression values, or binary logits for ``target_kind="binary"``.
        logits: ``(B, N, C)`` class logits for ``target_kind="categorical"``.
        hidden_states / attentions: per-layer tensors when asked for.
    """

    loss: torch.Tensor | None = None
    predictions: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class ICLHead(nn.Module):
    """Read-out from hidden states at the query tokens, and the loss of each target kind.

    ``regression``: MSE; ``binary``: BCE on one logit with ±1 targets (Garg et al.'s linear
    classification); ``categorical``: cross-entropy over ``n_classes`` logits. ``io_layer=True`` flags ``read_out``
    for the config's ``io_init`` (:func:`~hf_icl.modeling.initialization.icl_io_layer`).
    """

    def __init__(self, hidden_size: int, target_kind: str, n_classes: int, *, io_layer: bool = False):
        super().__init__()
        self.target_kind = target_kind
        width = n_classes if target_kind == "categorical" else 1
        self.read_out = icl_io_layer(hidden_size, width) if io_layer else nn.Linear(hidden_size, width)

    def forward(self, hidden: torch.Tensor, ys: torch.Tensor | None, loss_mask: torch.Tensor | None) -> ICLOutput:
        out = self.read_out(hidden)
        if self.target_kind == "categorical":
            predictions, logits = None, out
        else:
            predictions, logits = out.squeeze(-1), None
        loss = None if ys is None else self.loss(out, ys, loss_mask)
        return ICLOutput(loss=loss, predictions=predictions, logits=logits)

    def predict(
        self,
        hidden: torch.Tensor,
        ys: torch.Tensor | None,
        loss_positions: torch.Tensor | list[int] | None,
        hidden_states: tuple[torch.Tensor, ...] | None = None,
        attentions: tuple[torch.Tensor, ...] | None = None,
    ) -> ICLOutput:
        """A model's output from the hidden states ``(B, N, H)`` of its N query tokens: the head, its loss over
        ``loss_positions`` (:func:`loss_mask_for`), and the backbone's ``hidden_states`` / ``attentions``."""
        out = self(hidden, ys, loss_mask_for(loss_positions, hidden.shape[1], hidden.device))
        out.hidden_states, out.attentions = hidden_states, attentions
        return out

    def loss(self, out: torch.Tensor, ys: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
        out = out.float()
        if self.target_kind == "regression":
            per_position = (out.squeeze(-1) - ys.float()).square()
        elif self.target_kind == "binary":
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
    if positions.numel() and (positions.is_floating_point() or positions.is_complex()):
        raise ValueError(
            f"loss_positions must be a bool mask of shape ({n_points},) or integer indices, got dtype {positions.dtype}"
        )
    if positions.dtype == torch.bool:
        if positions.shape != (n_points,):
            raise ValueError(f"a boolean loss_positions must have shape ({n_points},), got {tuple(positions.shape)}")
        return positions
    if positions.numel() == 0 or positions.min() < 0 or positions.max() >= n_points:
        raise ValueError(f"loss_positions must be indices in [0, {n_points - 1}], got {positions.tolist()}")
    return torch.zeros(n_points, dtype=torch.bool, device=device).index_fill_(0, positions.long().flatten(), True)
