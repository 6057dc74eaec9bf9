"""A two-layer ReLU network fitted by Adam to every prefix of every prompt, all in parallel."""

from __future__ import annotations

import math

import torch

from ..validation import check_float, check_int
from ._prefix import earlier_mask, prefix_counts
from .base import InContextEstimator


class TwoLayerNN(InContextEstimator):
    """Garg et al.'s neural-network baseline: ``f(x) = w2ᵀ relu(W1 x + b1) + b2``.

    One network per prompt AND per prefix (parameters with leading dims ``(B, N)``), each
    trained for ``steps`` full-batch Adam steps on the mean squared error over its own examples
    ``j < i``; all are trained at once (their losses are summed, and Adam is per-coordinate, so
    each network follows its own Adam trajectory). Initialisation is PyTorch's default
    ``Linear`` one, drawn from a ``torch.Generator`` seeded with ``seed``, so results are
    deterministic. Position 0 (no examples) predicts 0 rather than an untrained network.

    Training runs in float32 (or the input dtype if wider). Memory is ``O(B N² hidden)``.

    Args:
        hidden: number of hidden units.
        steps: number of Adam steps.
        lr: Adam learning rate.
        seed: seed of the initialisation.
    """

    def __init__(self, hidden: int = 100, steps: int = 1000, lr: float = 5e-3, seed: int = 0):
        self.hidden = check_int("hidden", hidden, low=1)
        self.steps = check_int("steps", steps, low=0)
        self.lr = check_float("lr", lr, low=0.0, low_inclusive=False)
        self.seed = check_int("seed", seed, low=0)
        self.name = f"two_layer_nn(hidden={self.hidden}, steps={self.steps})"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(xs.dtype, torch.float32)
        xs, ys = xs.to(dtype), ys.to(dtype)
        batch, n_points, _ = xs.shape
        params = self._initial_parameters(xs)
        usable = earlier_mask(n_points, xs.device).to(dtype)
        n_examples = prefix_counts(n_points, xs).clamp_min(1)
        optimizer = torch.optim.Adam(params, lr=self.lr)
        with torch.enable_grad():
            for _ in range(self.steps):
                outputs = _forward(params, xs)  # (B, N prefixes, N points)
                per_net_mse = ((outputs - ys.unsqueeze(1)).square() * usable).sum(-1) / n_examples
                optimizer.zero_grad(set_to_none=True)
                per_net_mse.sum().backward()
                optimizer.step()
        with torch.no_grad():
            preds = _forward(params, xs).diagonal(dim1=-2, dim2=-1)  # net i at its own x_i
        if not torch.isfinite(preds).all():
            raise ValueError(
                f"two_layer_nn diverged: Adam with lr={self.lr:g} for {self.steps} steps made some networks' "
                "predictions non-finite; use a smaller lr"
            )
        return torch.where(prefix_counts(n_points, xs) > 0, preds, 0.0)

    def _initial_parameters(self, xs: torch.Tensor) -> list[torch.Tensor]:
        """``[W1 (B,N,h,d), b1 (B,N,h), w2 (B,N,h), b2 (B,N)]``, uniform in ``±1/sqrt(fan_in)``."""
        batch, n_points, n_dims = xs.shape
        generator = torch.Generator(device=xs.device).manual_seed(self.seed)
        lead = (batch, n_points)
        shapes_and_fan_in = [
            ((*lead, self.hidden, n_dims), n_dims),
            ((*lead, self.hidden), n_dims),
            ((*lead, self.hidden), self.hidden),
            (lead, self.hidden),
        ]
        params = []
        for shape, fan_in in shapes_and_fan_in:
            bound = 1.0 / math.sqrt(fan_in)
            uniform = torch.rand(shape, generator=generator, device=xs.device, dtype=xs.dtype)
            params.append(((2 * uniform - 1) * bound).requires_grad_())
        return params


def _forward(params: list[torch.Tensor], xs: torch.Tensor) -> torch.Tensor:
    """Outputs ``(B, N, N)``: entry ``[b, i, j]`` is prefix ``i``'s network applied to ``x_j``."""
    first_weight, first_bias, second_weight, second_bias = params
    hidden = torch.relu(torch.einsum("bihd,bjd->bijh", first_weight, xs) + first_bias.unsqueeze(2))
    return torch.einsum("bijh,bih->bij", hidden, second_weight) + second_bias.unsqueeze(-1)
