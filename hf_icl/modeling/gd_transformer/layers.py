"""Layers shared by the functional-GD classification transformer and the functional-GD language model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...validation import check_float, check_int


class GDFeedForward(nn.Module):
    """LayerNorm, Linear, GELU, Linear (the caller adds the output to its input: a residual feed-forward layer).

    Args:
        width: the width of the vectors it reads and writes (the classification model's state, the language
            model's latent f).
        hidden_width: hidden units.
        eps: the LayerNorm's epsilon.

    >>> import torch
    >>> GDFeedForward(6, 24)(torch.randn(2, 3, 6)).shape
    torch.Size([2, 3, 6])
    """

    def __init__(self, width: int, hidden_width: int, eps: float = 1e-5):
        super().__init__()
        check_int("width", width, low=1)
        check_int("hidden_width", hidden_width, low=1)
        check_float("eps", eps, low=0, low_inclusive=False)
        self.norm = nn.LayerNorm(width, eps=eps)
        self.fc_in = nn.Linear(width, hidden_width)
        self.fc_out = nn.Linear(hidden_width, width)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(self.norm(states))))
