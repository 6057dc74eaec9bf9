"""Sparse attention judged on in-context learning: an ICL model's error against the number of in-context examples
under CAB budgets and policies, beside the same model with dense attention and least squares.

One call, :func:`sparse_icl_curves`, scores on the *same* prompts (one :func:`evaluate_context_scaling` call, so every
difference between curves is paired):

* ``"dense"``: the model with its own (dense) attention implementation;
* one curve per CAB method (a policy of :data:`hf_icl.attention.cab.POLICIES`, or ``"quest"`` / ``"max_l2"``: the
  magnitude ranking of Quest's min/max-key bound or of each block's largest-norm key) and budget: ``budgets`` are
  key blocks kept per query token (``cab_budget="topk"``: sink and local window included, forced blocks kept even
  beyond it), ``row_sparsities`` the fraction of each token's visible blocks dropped (``cab_budget="row"``);
* ``"least_squares"``, the ``extra_predictors`` (e.g. a linear-attention GPT) and ``"trivial"``.

The model is switched for each call of each curve and put back afterwards (attention implementation, ``cab_*``
config fields, train/eval mode), also when a call raises. Short prefixes are never made dense
(``cab_min_seq_len = 0``): the budget binds from the first token whose visible blocks exceed it.

**Achieved sparsity** of a CAB curve is the share of causal (query token, key) pairs the selection skips, over every
query token of the prompt, every layer and every head: query token ``t`` has ``t + 1`` causal keys, a kept key block
``j`` contributes its keys ``<= t``. It is counted from the selection CAB actually makes on the first
``n_sparsity_prompts`` prompts: each layer's own selection, observed through
:func:`~hf_icl.attention.cab.observe_cab_selection` (nothing selects a second time). Under the
``topk`` and ``row`` budgets the rule fixes how many blocks each token keeps and every kept block but its own is
complete, so the count is the same for every prompt, layer and head.

**Departure from dense.** A curve's *late error* is its mean error over the last quarter of positions (``late_fraction``
of them: the examples where the budget binds hardest, e.g. 96–127 of 128); its *ratio to dense* is its late error over
dense's. A method *departs* from dense when ``|ratio - 1| > threshold`` (10 % by default). :meth:`SparseICLResult.
departures` walks each method's budgets from the least to the most sparse (by achieved sparsity) and reports the first
that departs and the sparsest one before it that does not (:func:`find_departure`).

Example::

    >>> import torch
    >>> from hf_icl import GPT2ICLConfig, GPT2ForInContextRegression
    >>> from hf_icl.data.tasks import get_task
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <...>
    >>> model = GPT2ForInContextRegression(GPT2ICLConfig(n_dims=3, n_points=24, n_embd=32, n_layer=1, n_head=2))
    >>> result = sparse_icl_curves(model, get_task("linear_regression", n_dims=3), budgets=[1, 3],
    ...                            policies=["streaming"], block_size=16, n_prompts=32, seed=0, n_bootstrap=20)
    >>> [m.label for m in result.methods]
    ['dense', 'cab-streaming@3blocks', 'cab-streaming@1blocks']
    >>> round(result.achieved_sparsity["cab-streaming@3blocks"], 6)  # 3 blocks of 16 cover all 48 tokens
    0.0
    >>> model.config._attn_implementation  # put back
    'sdpa'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ..attention.cab import NAME as CAB
from ..attention.cab import SCORES, CABSelection, enable_cab, observe_cab_selection
from ..data.tasks import TaskFamily, make_task
from ..estimators import get_estimator
from ..validation import check_choice, check_float, check_int
from .cab_methods import restoring_attention as _restoring
from .context_scaling import TRIVIAL, evaluate_context_scaling
from .predictors import Predictor, check_predictors, model_device, output_tensor
from .sparse_icl_methods import DENSE, LEAST_SQUARES, METHOD_NAMES, SparseICLMethod, sparse_icl_methods
from .sparse_icl_result import Departure, SparseICLResult, find_departure

__all__ = [
    "DENSE",
    "LEAST_SQUARES",
    "METHOD_NAMES",
    "Departure",
    "SparseICLMethod",
    "SparseICLResult",
    "causal_pairs_kept",
    "find_departure",
    "sparse_icl_curves",
    "sparse_icl_methods",
]


# -- achieved sparsity -------------------------------------------------------------------------------------------


def causal_pairs_kept(token_keep: torch.Tensor, *, block_size: int, n_keys: int) -> tuple[int, int]:
    """``(kept, causal)``: how many causal (query token, key) pairs a per-token block selection keeps, and how many
    there are. ``token_keep (B, H, Nq, Mk)`` bool; the queries are the last ``Nq`` of ``n_keys`` positions, with no
    padding. Query ``t`` has ``t + 1`` causal keys; a kept block ``j`` gives it ``clamp(t + 1 - j * block_size, 0,
    block_size)`` of them.

        >>> keep = torch.tensor([True, False, True]).expand(1, 1, 40, 3)  # every token keeps blocks 0 and 2
        >>> causal_pairs_kept(keep, block_size=16, n_keys=40)  # block 0 for all, block 2 for tokens 32..39
        (556, 820)
    """
    if token_keep.dim() != 4 or token_keep.dtype != torch.bool:
        raise ValueError(
            f"token_keep must be a (B, H, Nq, Mk) bool tensor, got {tuple(token_keep.shape)} {token_keep.dtype}"
        )
    batch, heads, n_q, n_blocks = token_keep.shape
    check_int("block_size", block_size, low=1)
    check_int("n_keys", n_keys, low=n_q)
    expected = -(-n_keys // block_size)
    if n_blocks != expected:
        raise ValueError(
            f"token_keep has {n_blocks} key blocks; {n_keys} keys in blocks of {block_size} make {expected}"
        )
    t = torch.arange(n_keys - n_q, n_keys, device=token_keep.device, dtype=torch.int64)
    starts = torch.arange(n_blocks, device=token_keep.device, dtype=torch.int64) * block_size
    per_block = (t[:, None] + 1 - starts).clamp(0, block_size)  # (Nq, Mk) causal keys of block j for query t
    kept = int((token_keep.to(torch.int64) * per_block).sum())
    causal = int((t + 1).sum()) * batch * heads
    return kept, causal


class _PairCounter:
    """An :func:`~hf_icl.attention.cab.observe_cab_selection` callback that counts the causal (query token, key)
    pairs CAB keeps, over every prefill call it sees, from the selection the call itself attended over."""

    def __init__(self):
        self.kept = 0
        self.causal = 0
        self.n_keys: int | None = None

    def __call__(self, call: CABSelection) -> None:
        if call.is_prefill:
            self.observe(call)

    def observe(self, call: CABSelection) -> None:
        if call.attention_mask is not None:
            raise ValueError(
                "counting CAB's achieved sparsity needs unpadded prompts (no attention mask); this call had one"
            )
        query, block_size = call.query, call.params.block_size
        n_q, n_k = query.shape[2], call.key.shape[2]
        keep = call.token_keep
        if keep is None:  # the dense route: every token keeps every block up to its own
            own = (torch.arange(n_k - n_q, n_k, device=query.device) // block_size)[:, None]
            n_blocks = -(-n_k // block_size)
            keep = (torch.arange(n_blocks, device=query.device) <= own).expand(query.shape[0], query.shape[1], -1, -1)
        kept, causal = causal_pairs_kept(keep, block_size=block_size, n_keys=n_k)
        self.kept += kept
        self.causal += causal
        self.n_keys = n_k

    @property
    def sparsity(self) -> float:
        if not self.causal:
            raise RuntimeError("no CAB attention call was observed: the model does not route attention through CAB")
        return 1.0 - self.kept / self.causal


# -- the model under one method, as a predictor ------------------------------------------------------------------


class _ModelUnder:
    """``model`` as a predictor ``(xs, ys) -> (B, N)`` under one attention method: switched for every call and put
    back afterwards (also on error). The first call of a CAB method also counts its achieved sparsity."""

    def __init__(self, model, method: SparseICLMethod, dense_implementation: str, cab: dict, n_count: int, kind: str):
        self.model, self.method = model, method
        self.dense_implementation = dense_implementation
        self.cab = cab
        self.n_count = n_count
        self.target_kind = kind
        self.achieved_sparsity: float | None = 0.0 if method.is_dense else None
        self.n_tokens: int | None = None

    @property
    def config(self):  # evaluate_context_scaling reads n_points and target_kind from it
        return self.model.config

    def __call__(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        model = self.model
        device = model_device(model, xs.device)
        xs, ys = xs.to(device), ys.to(device)
        with _restoring(model), torch.no_grad():
            model.eval()
            if self.method.is_dense:
                model.set_attn_implementation(self.dense_implementation)
            else:
                enable_cab(model, **self.cab)
                if self.achieved_sparsity is None:
                    counter = _PairCounter()
                    with observe_cab_selection(counter):
                        model(xs[: self.n_count], ys[: self.n_count])
                    self.achieved_sparsity, self.n_tokens = counter.sparsity, counter.n_keys
            output = model(xs, ys)
        return output_tensor(output, self.target_kind, self.method.label)


# -- the evaluation ----------------------------------------------------------------------------------------------


def _dense_implementation(model) -> str:
    current = getattr(model.config, "_attn_implementation", None)
    return "sdpa" if current in (None, CAB) or str(current).startswith("cab") else current


def sparse_icl_curves(
    model: nn.Module,
    task: TaskFamily | str | dict[str, Any],
    *,
    budgets: Iterable[int] = (2, 4, 8),
    policies: Iterable[str] = ("streaming", "magnitude", "oracle"),
    block_size: int = 16,
    n_prompts: int = 1000,
    seed: int = 0,
    n_points: int | None = None,
    score: str = "mean",
    sink_blocks: int = 1,
    local_blocks: int = 1,
    row_sparsities: Iterable[float] = (),
    extra_predictors: Mapping[str, Predictor] | None = None,
    batch_size: int | None = None,
    n_sparsity_prompts: int = 8,
    late_fraction: float = 0.25,
    n_bootstrap: int = 1000,
    model_name: str | None = None,
) -> SparseICLResult:
    """Score an ICL ``model`` under dense attention and under CAB at every (method, budget), beside least squares
    and ``extra_predictors``, on the same ``n_prompts`` prompts of ``task`` (regression tasks).

    Args:
        model: an ICL model whose attention goes through transformers' attention interface (e.g.
            ``GPT2ForInContextRegression``); it is left as it came (implementation, ``cab_*`` fields, mode).
        budgets: ``topk`` budgets, key blocks kept per query token (sink and local window included).
        policies: CAB method names, :data:`METHOD_NAMES` (CAB's policies, ``"quest"``, ``"max_l2"``).
        block_size: CAB's key-block size in tokens (a power of two in [16, 128]).
        n_prompts, seed, n_points: the prompts (``n_points`` defaults to the model's ``config.n_points``).
        score: the block score of the score-ranked policies (magnitude, frc, frc_low, hybrid): ``mean``, ``bound``
            (Quest) or ``max_l2``.
        sink_blocks, local_blocks: blocks always kept at the start and ending at each token's own block.
        row_sparsities: ``row`` budgets, the fraction of each token's visible blocks dropped.
        extra_predictors: more ``{name: model or estimator}`` curves (e.g. a linear-attention GPT).
        batch_size: prompts per forward pass (all at once by default).
        n_sparsity_prompts: prompts on which each CAB method's achieved sparsity is counted.
        late_fraction: the share of last positions whose mean error judges the departure from dense.
        n_bootstrap: bootstrap replicates of the bands.
        model_name: how titles name the model (its class name by default).
    """
    if not (isinstance(model, nn.Module) and hasattr(model, "config") and hasattr(model, "set_attn_implementation")):
        raise ValueError(
            f"model must be a transformers PreTrainedModel (an nn.Module with .config and .set_attn_implementation), "
            f"got {type(model).__name__}"
        )
    family = make_task(task)
    if family.target_kind != "regression":
        raise ValueError(
            f"task must be a regression task (errors are compared with dense), got {family.name!r} "
            f"with target_kind={family.target_kind!r}"
        )
    methods = sparse_icl_methods(policies, budgets, row_sparsities)
    check_int("block_size", block_size, low=16, high=128)
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two in [16, 128], got {block_size}")
    check_int("n_prompts", n_prompts, low=1)
    check_int("seed", seed)
    if n_points is not None:
        check_int("n_points", n_points, low=1)
    check_choice("score", score, SCORES)
    check_int("sink_blocks", sink_blocks, low=0)
    check_int("local_blocks", local_blocks, low=1)
    if batch_size is not None:
        check_int("batch_size", batch_size, low=1)
    check_int("n_sparsity_prompts", n_sparsity_prompts, low=1)
    late_fraction = check_float("late_fraction", late_fraction, low=0.0, high=1.0, low_inclusive=False)
    check_int("n_bootstrap", n_bootstrap, low=1)
    extras = {} if extra_predictors is None else check_predictors(extra_predictors)
    labels = [m.label for m in methods]
    for name in extras:
        if name in (*labels, LEAST_SQUARES, TRIVIAL):
            raise ValueError(f"extra_predictors may not use the name {name!r}: it is one of this run's curves")
    if model_name is not None and not isinstance(model_name, str):
        raise ValueError(f"model_name must be a string, got {model_name!r}")

    dense_implementation = _dense_implementation(model)
    cab = {"block_size": block_size, "score": score, "sink_blocks": sink_blocks, "local_blocks": local_blocks}
    under = {
        m.label: _ModelUnder(
            model,
            m,
            dense_implementation,
            {} if m.is_dense else m.cab_hyperparameters(**cab),
            n_sparsity_prompts,
            family.target_kind,
        )
        for m in methods
    }
    predictors = {**under, LEAST_SQUARES: get_estimator("least_squares"), **extras}
    with _restoring(model):
        curves = evaluate_context_scaling(
            predictors, family, n_prompts, seed, n_points=n_points, batch_size=batch_size, n_bootstrap=n_bootstrap
        )
    n = curves.n_points
    n_tokens = next((u.n_tokens for u in under.values() if u.n_tokens is not None), None)
    late_start = min(n - 1, n - math.ceil(late_fraction * n))
    settings = {
        "model": model_name or type(model).__name__,
        "task": family.name,
        "n_dims": getattr(family, "n_dims", None),
        "n_points": n,
        "n_tokens": n_tokens,
        "tokens_per_example": None if n_tokens is None else n_tokens / n,
        "block_size": block_size,
        "n_blocks": None if n_tokens is None else -(-n_tokens // block_size),
        "score": score,
        "sink_blocks": sink_blocks,
        "local_blocks": local_blocks,
        "min_seq_len": 0,
        "dense_implementation": dense_implementation,
        "n_prompts": n_prompts,
        "seed": seed,
        "n_sparsity_prompts": min(n_sparsity_prompts, n_prompts if batch_size is None else batch_size),
        "late_fraction": late_fraction,
    }
    achieved = {label: float(u.achieved_sparsity) for label, u in under.items()}
    return SparseICLResult(curves, methods, achieved, late_start, settings)
