"""Train the seeds of one ICL model in lockstep, as one stacked model (``torch.func`` model ensembling).

The linear-attention study trains every architecture with five seeds. Its models are small (10-point prompts,
batches of 32 or 64), so on a CPU one seed's step is mostly per-operation overhead; stacking the seeds' weights
(:func:`torch.func.stack_module_state`) and mapping one model's loss over them (:func:`torch.func.vmap`) runs the
seeds' matrix products as one batched product each. Every seed keeps exactly its own computation: its own initial
weights (``set_seed(seed)`` then the model is built, as :class:`~hf_icl.training.ICLTrainer` does), its own batches,
its own gradient clipping (by the norm of its own gradient) and its own Adam state (Adam is elementwise, so one
optimizer over the stacked tensors is one optimizer per seed).

The loop mirrors :class:`~hf_icl.training.ICLTrainer`'s step (AdamW without weight decay, i.e. Adam; the global-norm
clip; a constant learning rate) with the study's loss, MSE over every position divided by d. Dividing the loss by d
and clipping at 1 gives the same updates as the trainer's MSE clipped at d (Adam ignores the scale of its gradient
up to its eps); ``tests/reproduce/linear_attention/test_linear_attention.py`` checks the two loss trajectories agree.

Example::

    >>> import torch
    >>> fields = dict(n_dims=5, n_points=10, n_embd=8, n_layer=1, n_head=2, target_kind="regression")
    >>> ensemble = SeedEnsemble("linear_gpt", fields, seeds=(1, 2), learning_rate=1e-3)
    >>> xs, ys = torch.randn(2, 4, 10, 5), torch.randn(2, 4, 10)  # (seeds, batch, points, d)
    >>> ensemble.step(xs, ys).shape
    torch.Size([2])
    >>> ensemble.predict(xs[0], ys[0]).shape  # every seed on the same prompts
    torch.Size([2, 4, 10])
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch.func import functional_call, grad_and_value, stack_module_state, vmap

from ..modeling import build_model
from ..training.checkpoints import quiet_progress
from ..validation import check_float

#: the small constant torch.nn.utils.clip_grad_norm_ adds to the norm before dividing by it
CLIP_EPS = 1e-6


def build_seeded(model_type: str, fields: dict, seed: int, attn_implementation: str | None = None) -> torch.nn.Module:
    """The model :class:`~hf_icl.training.ICLTrainer` starts from for ``seed`` (the same weights, bit for bit)."""
    set_seed(seed)
    return build_model(model_type, None, attn_implementation, **fields)


def clip_per_seed(grads: dict[str, torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale each seed's gradient (dim 0 of every tensor) to global norm ≤ ``max_norm``, in place, as
    ``torch.nn.utils.clip_grad_norm_`` would for that seed alone; returns the ``(S,)`` norms before clipping."""
    squares = torch.stack([g.flatten(1).square().sum(1) for g in grads.values()])
    norms = squares.sum(0).sqrt()
    coef = (max_norm / (norms + CLIP_EPS)).clamp(max=1.0)
    for g in grads.values():
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))
    return norms


def stacked_optimizer_step(
    optimizer: torch.optim.Optimizer, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], max_grad_norm
) -> None:
    """Clip each seed's gradient (``max_grad_norm`` > 0), hand the gradients to ``params`` and step ``optimizer``."""
    if max_grad_norm > 0:
        clip_per_seed(grads, max_grad_norm)
    for name, param in params.items():
        # vmap can hand back a gradient in another memory layout than its parameter (wpe's comes transposed), and
        # fused AdamW (torch 2.13, CPU) then silently applies the wrong update: give it the parameter's layout
        param.grad = grads[name].contiguous()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class SeedEnsemble:
    """``len(seeds)`` independent copies of one ICL model, trained and evaluated as one stacked model.

    Args:
        model_type, fields: as :func:`hf_icl.modeling.build_model` takes them (no size preset).
        seeds: one model per seed, initialised as ``ICLTrainer`` would initialise it.
        learning_rate: Adam's (constant) step size.
        max_grad_norm: per-seed gradient clipping of the training loss (0: off).
        loss_per_dim: train on the model's loss divided by d (the linear-attention study's MSE / d); False: the
            model's loss as it is.
        forward_kwargs: extra keyword arguments of every forward call (e.g. ``{"n_context": 100}`` for the
            kernel-ICL models' context/query protocol).
        attn_implementation: for ``gpt2_icl`` use ``"eager"``: SDPA has no batching rule on the CPU and falls back
            to a Python loop under ``vmap``.
    """

    def __init__(
        self,
        model_type: str,
        fields: dict,
        seeds: Sequence[int],
        learning_rate: float,
        *,
        max_grad_norm: float = 1.0,
        loss_per_dim: bool = True,
        forward_kwargs: dict | None = None,
        attn_implementation: str | None = None,
    ):
        if not seeds:
            raise ValueError("seeds must name at least one seed, got an empty sequence")
        check_float("learning_rate", learning_rate, low=0, low_inclusive=False)
        self.max_grad_norm = check_float("max_grad_norm", max_grad_norm, low=0)
        self.seeds = tuple(seeds)
        self.loss_per_dim = loss_per_dim
        self.forward_kwargs = {"check_inputs": False, **(forward_kwargs or {})}
        self.model_type, self.fields, self.attn_implementation = model_type, dict(fields), attn_implementation
        models = [build_seeded(model_type, fields, seed, attn_implementation) for seed in self.seeds]
        self._check_deterministic(models[0])
        # the stateless template: eval() is safe because every dropout is 0 (checked above)
        self.template = copy.deepcopy(models[0]).to("meta").eval()
        trainable = {name for name, p in models[0].named_parameters() if p.requires_grad}
        params, buffers = stack_module_state(models)
        self.params = {k: v.detach() for k, v in params.items() if k in trainable}
        self.frozen = {k: v.detach() for k, v in params.items() if k not in trainable}
        self.buffers = {k: v.detach() for k, v in buffers.items()}
        # the trainer's optimizer (AdamW with weight_decay=0 is Adam), elementwise, hence per seed
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=learning_rate, weight_decay=0.0, fused=True)
        self._grads = vmap(grad_and_value(self._loss))
        self._predict = vmap(self._predictions, in_dims=(0, 0, 0, None, None))

    @staticmethod
    def _check_deterministic(model: torch.nn.Module) -> None:
        # vmap would need randomness="different" for dropout, and seeds would then share one random stream
        rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
        if rates:
            raise ValueError(f"SeedEnsemble trains models without dropout, got dropout rates {sorted(set(rates))}")

    @property
    def size(self) -> int:
        return len(self.seeds)

    def _call(self, params, frozen, buffers, xs, ys):
        return functional_call(self.template, (params, frozen, buffers), (xs, ys), self.forward_kwargs)

    def _loss(self, params, frozen, buffers, xs, ys):
        loss = self._call(params, frozen, buffers, xs, ys).loss
        return loss / xs.shape[-1] if self.loss_per_dim else loss

    def _predictions(self, params, frozen, buffers, xs, ys):
        return self._call(params, frozen, buffers, xs, ys).predictions

    def step(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """One Adam step of every seed on its own batch ``xs (S, B, N, d)``, ``ys (S, B, N)``; returns the ``(S,)``
        training losses (see ``loss_per_dim``) before the step."""
        if xs.shape[0] != self.size or ys.shape[0] != self.size:
            raise ValueError(f"xs and ys need one batch per seed (dim 0 = {self.size}), got {tuple(xs.shape)}")
        grads, losses = self._grads(self.params, self.frozen, self.buffers, xs, ys)
        stacked_optimizer_step(self.optimizer, self.params, grads, self.max_grad_norm)
        return losses.detach()

    @torch.no_grad()
    def predict(self, xs: torch.Tensor, ys: torch.Tensor, chunk: int = 256) -> torch.Tensor:
        """Every seed's predictions ``(S, B, N)`` on the same prompts ``xs (B, N, d)``, ``ys (B, N)``, ``chunk``
        prompts at a time (on a CPU, 256 ran 2.5× faster than 1024: the activations stay in cache)."""
        parts = [
            self._predict(self.params, self.frozen, self.buffers, xs[i : i + chunk], ys[i : i + chunk])
            for i in range(0, xs.shape[0], chunk)
        ]
        return torch.cat(parts, dim=1)

    def models(self) -> list[torch.nn.Module]:
        """One ordinary model per seed holding that seed's current weights (to save, or to use alone)."""
        out = []
        for i in range(self.size):
            model = build_model(self.model_type, None, self.attn_implementation, **self.fields)
            state = {k: v[i].clone() for k, v in (self.params | self.frozen | self.buffers).items()}
            model.load_state_dict(state)
            out.append(model.eval())
        return out

    def save_models(self, run_dir: str | Path) -> list[torch.nn.Module]:
        """``save_pretrained`` every seed's model to ``run_dir/seed{seed}`` (no progress bar per model: one-tick bars
        for every seed would bury the log); returns the models."""
        models = self.models()
        with quiet_progress():
            for seed, model in zip(self.seeds, models, strict=True):
                model.save_pretrained(Path(run_dir) / f"seed{seed}")
        return models
