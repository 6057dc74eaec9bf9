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
``n_sparsity_prompts`` prompts (each layer's real queries and keys, through :func:`select_cab_blocks`). Under the
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attention.cab import NAME as CAB
from ..attention.cab import (
    POLICIES,
    SCORES,
    cab_params_of,
    enable_cab,
    runs_dense,
    select_cab_blocks,
)
from ..data.tasks import TaskFamily, make_task
from ..estimators import get_estimator
from ..validation import check_choice, check_float, check_int
from .cab_methods import PROBE, SCORED_METHODS, probing, use_probe
from .cab_methods import restoring_attention as _restoring
from .context_scaling import TRIVIAL, ContextScalingResult, evaluate_context_scaling
from .plotting import BASELINE_STYLES, band_label, draw_band_curve, new_panels, save_figure
from .predictors import Predictor, check_predictors, model_device, output_tensor

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

#: the curve of the model under its own dense attention
DENSE = "dense"
#: the least-squares curve every run scores beside the model
LEAST_SQUARES = "least_squares"
#: CAB method names: CAB's policies and the scored aliases (``quest``, ``max_l2``: magnitude ranking of that score)
METHOD_NAMES = (*POLICIES, *SCORED_METHODS)
#: policies that rank blocks by the block score (``score``); the others ignore it
_SCORED_POLICIES = ("magnitude", "frc", "frc_low", "hybrid")


# -- methods -----------------------------------------------------------------------------------------------------


def _format_fraction(value: float) -> str:
    return f"{value:.2f}" if round(value, 2) == value else f"{value:g}"


@dataclass(frozen=True)
class SparseICLMethod:
    """One curve's attention: ``"dense"``, or CAB method ``name`` under ONE budget, ``kept_blocks`` (the ``topk``
    budget: key blocks each query token keeps, forced ones included) or ``sparsity`` (the ``row`` budget: the
    fraction of each token's visible blocks dropped)."""

    name: str = DENSE
    kept_blocks: int | None = None
    sparsity: float | None = None

    def __post_init__(self):
        check_choice("name", self.name, (DENSE, *METHOD_NAMES))
        if self.kept_blocks is not None:
            check_int("kept_blocks", self.kept_blocks, low=1)
        if self.sparsity is not None:
            sparsity = check_float("sparsity", self.sparsity, low=0.0, low_inclusive=False)
            if sparsity >= 1:
                raise ValueError(f"sparsity must be in (0, 1) (the fraction of visible blocks dropped), got {sparsity}")
            object.__setattr__(self, "sparsity", sparsity)
        budgets = (self.kept_blocks is not None) + (self.sparsity is not None)
        if self.name == DENSE and budgets:
            raise ValueError(
                f"the dense method takes no budget, got kept_blocks={self.kept_blocks}, sparsity={self.sparsity}"
            )
        if self.name != DENSE and budgets != 1:
            raise ValueError(
                f"CAB method {self.name!r} needs exactly one of kept_blocks or sparsity, got "
                f"kept_blocks={self.kept_blocks}, sparsity={self.sparsity}"
            )

    @property
    def is_dense(self) -> bool:
        return self.name == DENSE

    @property
    def policy(self) -> str | None:
        """The CAB policy (``"magnitude"`` for ``quest`` and ``max_l2``); None for dense."""
        return None if self.is_dense else SCORED_METHODS.get(self.name, (self.name,))[0]

    @property
    def budget(self) -> str | None:
        """``"topk"``, ``"row"`` or None (dense)."""
        if self.is_dense:
            return None
        return "topk" if self.kept_blocks is not None else "row"

    def score(self, default: str) -> str | None:
        """The block score this method ranks by (``default``: the run's), or None when its policy uses none."""
        if self.name in SCORED_METHODS:
            return SCORED_METHODS[self.name][1]
        return default if self.policy in _SCORED_POLICIES else None

    @property
    def label(self) -> str:
        """``"dense"``, ``"cab-<name>@<k>blocks"`` or ``"cab-<name>@row<sparsity>"``."""
        if self.is_dense:
            return DENSE
        budget = (
            f"{self.kept_blocks}blocks" if self.kept_blocks is not None else f"row{_format_fraction(self.sparsity)}"
        )
        return f"cab-{self.name}@{budget}"

    def budget_text(self, block_size: int, tokens_per_example: float | None) -> str:
        """The budget in words, e.g. ``"4 blocks (64 tokens = 32 examples)"`` or ``"row budget, 75% dropped"``."""
        if self.is_dense:
            return "dense"
        if self.kept_blocks is None:
            return f"row budget, {100 * self.sparsity:g}% of visible blocks dropped"
        tokens = self.kept_blocks * block_size
        examples = f" = {tokens / tokens_per_example:g} examples" if tokens_per_example else ""
        return f"{self.kept_blocks} block{'s' * (self.kept_blocks != 1)} ({tokens} tokens{examples})"

    def cab_hyperparameters(self, *, block_size: int, score: str, sink_blocks: int, local_blocks: int) -> dict:
        """The :func:`enable_cab` keywords of this method."""
        if self.is_dense:
            raise ValueError("the dense method runs no CAB")
        params = {
            "policy": self.policy,
            "score": self.score(score) or score,
            "block_size": block_size,
            "sink_blocks": sink_blocks,
            "local_blocks": local_blocks,
            "min_seq_len": 0,
            "budget": self.budget,
        }
        if self.kept_blocks is not None:
            params["topk"] = self.kept_blocks
        else:
            params["sparsity"] = self.sparsity
        return params


def _check_unique(name: str, values: list) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat values, got {values}")


def sparse_icl_methods(
    policies: Iterable[str], budgets: Iterable[int] = (), row_sparsities: Iterable[float] = ()
) -> list[SparseICLMethod]:
    """Dense once, then every method name at every ``topk`` budget (``budgets``, descending: the least sparse
    first) and every row sparsity (ascending)."""
    policies, budgets, row_sparsities = (
        _as_list("policies", policies),
        _as_list("budgets", budgets),
        _as_list("row_sparsities", row_sparsities),
    )
    if not policies:
        raise ValueError("policies must name at least one CAB method, got []")
    for i, policy in enumerate(policies):
        check_choice(f"policies[{i}]", policy, METHOD_NAMES)
    for i, kept in enumerate(budgets):
        check_int(f"budgets[{i}]", kept, low=1)
    for i, sparsity in enumerate(row_sparsities):
        if check_float(f"row_sparsities[{i}]", sparsity, low=0.0, low_inclusive=False) >= 1:
            raise ValueError(
                f"row_sparsities[{i}] must be in (0, 1) (the fraction of visible blocks dropped), got {sparsity}"
            )
    if not (budgets or row_sparsities):
        raise ValueError("budgets and row_sparsities must not both be empty: give at least one budget")
    for name, values in (("policies", policies), ("budgets", budgets), ("row_sparsities", row_sparsities)):
        _check_unique(name, values)
    cab = [
        method
        for policy in policies
        for method in (
            *(SparseICLMethod(policy, kept_blocks=int(k)) for k in sorted(budgets, reverse=True)),
            *(SparseICLMethod(policy, sparsity=float(s)) for s in sorted(row_sparsities)),
        )
    ]
    return [SparseICLMethod(), *cab]


def _as_list(name: str, values) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must be a sequence, got {values!r}")
    return list(values)


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
    """Counts the causal (query token, key) pairs CAB keeps, over every attention call it watches."""

    def __init__(self):
        self.kept = 0
        self.causal = 0
        self.n_keys: int | None = None

    def observe(self, module, query: torch.Tensor, key: torch.Tensor, attention_mask, scaling: float | None) -> None:
        if attention_mask is not None:
            raise ValueError(
                "counting CAB's achieved sparsity needs unpadded prompts (no attention mask); this call had one"
            )
        params = cab_params_of(module.config)
        n_q, n_k = query.shape[2], key.shape[2]
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        n_blocks = -(-n_k // params.block_size)
        if runs_dense(params, n_q, n_k):
            own = (torch.arange(n_k - n_q, n_k, device=query.device) // params.block_size)[:, None]
            keep = (torch.arange(n_blocks, device=query.device) <= own).expand(query.shape[0], query.shape[1], -1, -1)
        else:
            keep = select_cab_blocks(query, key, params, scaling)
        kept, causal = causal_pairs_kept(keep, block_size=params.block_size, n_keys=n_k)
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
                    use_probe(model)
                    with probing(counter):
                        model(xs[: self.n_count], ys[: self.n_count])
                    model.set_attn_implementation(CAB)
                    self.achieved_sparsity, self.n_tokens = counter.sparsity, counter.n_keys
            output = model(xs, ys)
        return output_tensor(output, self.target_kind, self.method.label)


# -- departure from dense ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Departure:
    """Where one method's error leaves dense: ``departs`` is the least sparse budget whose late error differs from
    dense's by more than ``threshold`` (relative), ``within`` the sparsest budget before it (every less sparse one
    within the threshold too); either is None when there is none."""

    departs: str | None
    within: str | None
    threshold: float

    def to_dict(self) -> dict:
        return {"departs": self.departs, "within": self.within, "threshold": self.threshold}


#: slack for a ratio that is ``1 + threshold`` up to float rounding
_ROUNDING = 1e-12


def find_departure(entries: Sequence[tuple[str, float, float]], threshold: float = 0.10) -> Departure:
    """The :class:`Departure` of one method's budgets ``entries = [(label, achieved_sparsity, ratio_to_dense)]``:
    walking from the least to the most sparse (ties keep their order), the first entry with ``|ratio - 1| >
    threshold`` departs; the entry before it is the sparsest within.

        >>> find_departure([("k8", 0.5, 1.02), ("k4", 0.75, 1.08), ("k2", 0.87, 1.6)])
        Departure(departs='k2', within='k4', threshold=0.1)
    """
    threshold = check_float("threshold", threshold, low=0.0, low_inclusive=False)
    checked = []
    for i, entry in enumerate(entries):
        try:
            label, achieved, ratio = entry
        except (TypeError, ValueError):
            raise ValueError(
                f"entries[{i}] must be (label, achieved_sparsity, ratio_to_dense), got {entry!r}"
            ) from None
        check_float(f"entries[{i}] achieved_sparsity", achieved, low=0.0, high=1.0)
        check_float(f"entries[{i}] ratio_to_dense", ratio, low=0.0)
        checked.append((str(label), float(achieved), float(ratio)))
    within = None
    for label, _, ratio in sorted(checked, key=lambda entry: entry[1]):
        if abs(ratio - 1.0) > threshold + _ROUNDING:  # a ratio of exactly 1 + threshold is within
            return Departure(label, within, threshold)
        within = label
    return Departure(None, within, threshold)


# -- the result --------------------------------------------------------------------------------------------------


@dataclass
class SparseICLResult:
    """The curves of :func:`sparse_icl_curves` and what they say.

    Attributes:
        curves: the :class:`ContextScalingResult` (dense, every CAB method, least squares, extras, trivial).
        methods: dense and the CAB methods, in evaluation order.
        achieved_sparsity: ``{label: share of causal (query token, key) pairs skipped}`` (dense: 0).
        late_start: first position of the late window (the departure is judged on positions ``late_start..N-1``).
        settings: the run's settings (block size, score, sinks, local window, tokens, prompts, seed, task).
    """

    curves: ContextScalingResult
    methods: list[SparseICLMethod]
    achieved_sparsity: dict[str, float]
    late_start: int
    settings: dict[str, Any]

    @property
    def n_points(self) -> int:
        return self.curves.n_points

    @property
    def tokens_per_example(self) -> float | None:
        return self.settings.get("tokens_per_example")

    def late_error(self, name: str) -> float:
        """Mean error of curve ``name`` over the late window."""
        return float(self.curves.values[name][self.late_start :].mean())

    def ratio_to_dense(self, name: str) -> float:
        """:meth:`late_error` of ``name`` over dense's."""
        dense = self.late_error(DENSE)
        if not dense > 0:
            raise ValueError(f"dense's late error is {dense}: a ratio to it is undefined")
        return self.late_error(name) / dense

    def method_names(self) -> list[str]:
        """The CAB method names, in order (one figure panel each)."""
        return list(dict.fromkeys(m.name for m in self.methods if not m.is_dense))

    def departures(self, threshold: float = 0.10) -> dict[str, Departure]:
        """``{method name: Departure}`` (see the module docstring)."""
        return {
            name: find_departure(
                [
                    (m.label, self.achieved_sparsity[m.label], self.ratio_to_dense(m.label))
                    for m in self.methods
                    if m.name == name
                ],
                threshold,
            )
            for name in self.method_names()
        }

    @property
    def baselines(self) -> list[str]:
        """The non-model curves and extras: least squares, the extra predictors, trivial."""
        labels = {m.label for m in self.methods}
        return [name for name in self.curves.predictors if name not in labels]

    def default_examples(self) -> list[int]:
        n = self.n_points
        return sorted({e for e in (8, 16, 32, 64, n - 1) if 0 <= e < n})

    def to_markdown(self, examples: Sequence[int] | None = None, threshold: float = 0.10) -> str:
        """One row per curve: method, budget, achieved sparsity, error at ``examples`` in-context examples, late
        error and its ratio to dense; then one line per method saying where it departs."""
        examples = self.default_examples() if examples is None else list(examples)
        for i, e in enumerate(examples):
            check_int(f"examples[{i}]", e, low=0, high=self.n_points - 1)
        late = f"mean {self.late_start}–{self.n_points - 1}"
        head = [
            "curve",
            "method",
            "budget",
            "achieved sparsity",
            *(f"{e} ex." for e in examples),
            late,
            "ratio to dense",
        ]
        lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
        by_label = {m.label: m for m in self.methods}
        for name in self.curves.predictors:
            method = by_label.get(name)
            if method is None:
                kind, budget, achieved = name, "—", "—"
            else:
                kind = "dense" if method.is_dense else method.name
                budget = method.budget_text(self.settings["block_size"], self.tokens_per_example)
                achieved = f"{100 * self.achieved_sparsity[name]:.1f}%"
            cells = [f"{float(self.curves.values[name][e]):.3g}" for e in examples]
            ratio = self.ratio_to_dense(name)
            lines.append(
                f"| {name} | {kind} | {budget} | {achieved} | "
                + " | ".join(cells)
                + f" | {self.late_error(name):.3g} | {ratio:.3g} |"
            )
        lines.append("")
        for name, departure in self.departures(threshold).items():
            lines.append(f"- {name}: " + _departure_sentence(departure, self.achieved_sparsity))
        return "\n".join(lines)

    def to_dict(self, threshold: float = 0.10) -> dict[str, Any]:
        """Everything, JSON-ready: settings, curves with bands, per-method numbers, departures."""
        c = self.curves
        return {
            "settings": dict(self.settings),
            "metric": c.metric.name,
            "n_prompts": c.n_prompts,
            "confidence": list(c.confidence),
            "late_positions": [self.late_start, self.n_points - 1],
            "curves": {
                name: {
                    "value": c.values[name].tolist(),
                    "lower": c.lower[name].tolist(),
                    "upper": c.upper[name].tolist(),
                }
                for name in c.predictors
            },
            "methods": [
                {
                    "label": m.label,
                    "name": m.name,
                    "policy": m.policy,
                    "score": None if m.is_dense else m.score(self.settings["score"]),
                    "budget": m.budget,
                    "kept_blocks": m.kept_blocks,
                    "sparsity": m.sparsity,
                    "achieved_sparsity": self.achieved_sparsity[m.label],
                    "late_error": self.late_error(m.label),
                    "ratio_to_dense": self.ratio_to_dense(m.label),
                }
                for m in self.methods
            ],
            "baselines": {
                name: {"late_error": self.late_error(name), "ratio_to_dense": self.ratio_to_dense(name)}
                for name in self.baselines
            },
            "departures": {name: d.to_dict() for name, d in self.departures(threshold).items()},
        }

    def plot(self, path: str | Path, *, title: str | None = None, columns: int = 3, dpi: int = 120) -> Path:
        """Error against the number of in-context examples, one panel per CAB method: dense, least squares, the
        extra predictors, the trivial predictor and every budget of that method (labelled with its achieved
        sparsity), the late window shaded. A log error axis; least squares (≈ 0 past d examples on noiseless
        tasks) may leave it at the bottom."""
        columns = check_int("columns", columns, low=1)
        dpi = check_int("dpi", dpi, low=10)
        names = self.method_names()
        columns = min(columns, len(names))
        rows = -(-len(names) // columns)
        fig, axes = new_panels(columns, (6.5 * columns, 7.0 * rows), rows=rows, sharey=True)
        c = self.curves
        x = torch.arange(self.n_points)
        model_curves = [c.values[m.label] for m in self.methods]
        shown = [*model_curves, *(c.values[b] for b in self.baselines if b != LEAST_SQUARES)]
        floor = min(float(v[v > 0].min()) for v in shown if bool((v > 0).any()))
        ceiling = max(float(v.max()) for v in (*model_curves, c.values[TRIVIAL]))
        import matplotlib

        colormap = matplotlib.colormaps["viridis"]
        settings = self.settings
        for ax, name in zip(axes, names, strict=False):
            ax.grid(True, alpha=0.3)
            ax.axvspan(
                self.late_start,
                self.n_points - 1,
                color="tab:blue",
                alpha=0.07,
                linewidth=0,
                label=f"late window ({self.late_start}–{self.n_points - 1} examples)",
            )
            for i, base in enumerate(self.baselines):
                style = BASELINE_STYLES[0] if base == TRIVIAL else BASELINE_STYLES[1 + i % (len(BASELINE_STYLES) - 1)]
                color = "0.5" if base == TRIVIAL else ("0.2" if base == LEAST_SQUARES else f"C{i + 3}")
                text = {TRIVIAL: "trivial (predict 0)", LEAST_SQUARES: "least squares"}.get(base, base)
                ax.plot(x.tolist(), c.values[base].tolist(), linestyle=style, color=color, label=text)
            draw_band_curve(
                ax,
                x,
                c.values[DENSE],
                c.lower[DENSE],
                c.upper[DENSE],
                color="black",
                linewidth=2.0,
                label="dense attention",
            )
            mine = sorted((m for m in self.methods if m.name == name), key=lambda m: self.achieved_sparsity[m.label])
            for j, m in enumerate(mine):
                share = self.achieved_sparsity[m.label]
                label = (
                    f"{m.budget_text(settings['block_size'], self.tokens_per_example)}, {100 * share:.1f}% sparse, "
                    f"×{self.ratio_to_dense(m.label):.2f} dense"
                )
                color = colormap(0.15 + 0.75 * j / max(1, len(mine) - 1))
                draw_band_curve(
                    ax,
                    x,
                    c.values[m.label],
                    c.lower[m.label],
                    c.upper[m.label],
                    color=color,
                    marker=".",
                    markersize=3,
                    label=label,
                )
            score = mine[0].score(settings["score"]) if mine else None
            ax.set_title(f"CAB policy {name!r}" + (f" (block score {score!r})" if score else ""))
            ax.set_xlabel("number of in-context examples")
            ax.set_ylabel(c.metric.axis_label)
            ax.set_yscale("log")
            ax.set_ylim(floor / 3, ceiling * 2)
            ax.xaxis.get_major_locator().set_params(integer=True)
            handles, labels = ax.get_legend_handles_labels()
            from matplotlib.patches import Patch

            handles.append(Patch(facecolor="0.5", alpha=0.2, linewidth=0))
            labels.append(band_label(c.confidence))
            ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1)
        for ax in axes[len(names) :]:
            ax.set_visible(False)
        examples = (
            f" = {settings['block_size'] / self.tokens_per_example:g} examples" if self.tokens_per_example else ""
        )
        fig.suptitle(
            title
            or (
                f"{settings.get('model', 'ICL model')} on {c.task_name}, {c.n_prompts} prompts: error vs in-context "
                f"examples under CAB (blocks of {settings['block_size']} tokens{examples}, "
                f"sink {settings['sink_blocks']}, local {settings['local_blocks']})"
            )
        )
        return save_figure(fig, path, dpi=dpi)


def _departure_sentence(departure: Departure, achieved: Mapping[str, float]) -> str:
    pct = f"{100 * departure.threshold:g}%"
    within = (
        f"within {pct} of dense down to {departure.within} ({100 * achieved[departure.within]:.1f}% sparse)"
        if departure.within
        else f"no budget within {pct} of dense"
    )
    if departure.departs is None:
        return within + "; no budget departs"
    return within + f"; departs at {departure.departs} ({100 * achieved[departure.departs]:.1f}% sparse)"


# -- the evaluation ----------------------------------------------------------------------------------------------


def _dense_implementation(model) -> str:
    current = getattr(model.config, "_attn_implementation", None)
    return "sdpa" if current in (None, CAB, PROBE) or str(current).startswith("cab") else current


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
