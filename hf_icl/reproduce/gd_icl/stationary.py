"""The categorical document's theorem, measured: the GD construction is a stationary point of the loss of the
attention model (seed 004, Theorems 1-2).

The measurement is the gradient of the query cross-entropy with respect to the transformer's attention parameters
(every parameter but the class embeddings ``W_e``, which the theorem takes as given) at a GD model, estimated on
fresh prompts of the task it was trained on: the prompts are split into chunks, the mean of the chunk gradients is
the estimate and its standard error the noise floor. A stationary point's gradient is zero, so its estimate is
within the noise: ``‖mean‖ / ‖standard error‖`` is about 1 for a zero gradient (each coordinate's mean is then
noise of the size of its standard error) and grows with the number of prompts for a nonzero one. Whether the
prompts are enough to see a gradient at all is checked on a control: the same model with every step size η scaled
by :data:`CONTROL_STEP_FACTOR` (:func:`with_step_size_scaled`), a departure from the learned construction along one
of the directions its training optimised; if the test cannot tell that control's gradient from zero either, the
measurement cannot decide.

The theorem assumes rotationally invariant inputs and exact expectations; the synthetic task's inputs are uniform on
a cube, which is not rotationally invariant, so a nonzero gradient here does not contradict the theorem by itself:
the report says so beside the number.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from ...validation import check_int

#: the ratio ‖mean gradient‖ / ‖its standard error‖ below which a gradient counts as zero at the prompts used
STATIONARY_RATIO = 3.0
#: parameters the theorem takes as given (not part of the stationarity claim)
GIVEN = ("class_embedding.weight",)
#: the control's departure from the construction: every block's step size η times this
CONTROL_STEP_FACTOR = 1.5


@dataclass(frozen=True)
class Stationarity:
    """The loss gradient at a model: its estimated norm, the norm of its standard error, and their ratio."""

    gradient_norm: float
    noise_floor: float
    n_prompts: int

    @property
    def ratio(self) -> float:
        return self.gradient_norm / self.noise_floor if self.noise_floor > 0 else math.inf

    @property
    def stationary(self) -> bool:
        return self.ratio <= STATIONARY_RATIO


def loss_gradient(
    model: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor, n_context: int, chunks: int = 20
) -> Stationarity:
    """The gradient of ``model``'s query cross-entropy on prompts ``xs (P, N, d)``, ``ys (P, N)`` (``n_context``
    context pairs, then queries) with respect to every parameter but :data:`GIVEN`, from ``chunks`` equal chunks of
    the prompts: the mean chunk gradient's norm and the norm of its standard error.

    >>> import torch
    >>> from hf_icl.modeling.gd_transformer import GDTransformerForInContextClassification
    >>> model = GDTransformerForInContextClassification.from_gd_construction(1, 0.5, "rbf", torch.randn(4, 3),
    ...                                                                      n_dims=2)
    >>> xs, ys = torch.randn(40, 6, 2), torch.randint(3, (40, 6))
    >>> result = loss_gradient(model, xs, ys, n_context=5, chunks=4)
    >>> result.n_prompts, result.noise_floor > 0
    (40, True)
    """
    check_int("chunks", chunks, low=2)
    if xs.shape[0] < chunks:
        raise ValueError(f"chunks must be at most the number of prompts ({xs.shape[0]}), got {chunks}")
    names = [name for name, _ in model.named_parameters() if name not in GIVEN]
    per_chunk = []
    size = xs.shape[0] // chunks
    for c in range(chunks):
        rows = slice(c * size, (c + 1) * size)
        model.zero_grad(set_to_none=True)
        model(xs[rows], ys[rows], n_context=n_context).loss.backward()
        parameters = dict(model.named_parameters())
        per_chunk.append(torch.cat([parameters[n].grad.detach().double().flatten() for n in names]))
    model.zero_grad(set_to_none=True)
    gradients = torch.stack(per_chunk)  # (chunks, parameters)
    mean = gradients.mean(0)
    standard_error = gradients.std(0, correction=1) / math.sqrt(chunks)
    return Stationarity(float(mean.norm()), float(standard_error.norm()), size * chunks)


def with_step_size_scaled(model: torch.nn.Module, factor: float) -> torch.nn.Module:
    """A copy of a GD-constructed model whose every block takes ``factor`` × its step: head 1's output map (``η``
    times the identity into f in the construction) scaled by ``factor``; the model itself is left alone."""
    shifted = copy.deepcopy(model)
    with torch.no_grad():
        for block in shifted.blocks:
            block.self_attention.update_output.weight.mul_(factor)
    return shifted
