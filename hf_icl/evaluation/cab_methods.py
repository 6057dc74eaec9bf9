"""CAB's evaluation helpers, shared by needle-in-a-haystack (:mod:`.niah`) and perplexity (:mod:`.perplexity`).

* the method grid: :class:`NIAHMethod` (dense ``"sdpa"``, or a CAB policy under a sparsity or a number of kept
  blocks) and :func:`niah_methods` (policies × sparsities × kept blocks);
* switching a model between them: :func:`apply_method`, inside :func:`restoring_attention` (which puts the
  attention implementation, the ``cab_*`` config fields and the train/eval mode back);
* what a CAB forward selected, observed through :func:`hf_icl.attention.cab.observe_cab_selection` (CAB hands each
  call's own selection to the observer, so nothing selects twice): :class:`SelectionCounter` (achieved sparsity)
  and :class:`PreservationProbe` (:func:`needle_preservation`, the share of the dense attention on the needle that
  the selection keeps), entered with :func:`observing`.

    >>> [m.label for m in niah_methods(["frc"], [0.5], kept_blocks=[16])]
    ['sdpa', 'cab-frc@0.50', 'cab-frc@16blocks']
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import attention_preservation, token_keep_mask
from ..attention.cab import POLICIES, CABParams, CABSelection, enable_cab, observe_cab_selection
from ..validation import check_choice, check_float, check_int

__all__ = [
    "CAB_FIELDS_SET_BY_RUN",
    "DEFAULT_POLICIES",
    "DEFAULT_SPARSITIES",
    "DENSE",
    "METHOD_NAMES",
    "SCORED_METHODS",
    "NIAHMethod",
    "PreservationProbe",
    "SelectionCounter",
    "apply_method",
    "causal_pairs",
    "check_methods",
    "model_device",
    "needle_preservation",
    "niah_methods",
    "observing",
    "other_cab_fields",
    "restoring_attention",
]

#: The dense reference method (PyTorch SDPA).
DENSE = "sdpa"
DEFAULT_POLICIES = ("frc", "frc_low", "magnitude", "hybrid", "streaming", "oracle")
DEFAULT_SPARSITIES = (0.5, 0.75, 0.9, 0.95)
#: method names that are a policy with a block score of their own: (policy, score)
SCORED_METHODS = {"quest": ("magnitude", "bound"), "max_l2": ("magnitude", "max_l2")}
#: every method name: dense, CAB's policies, and the scored aliases
METHOD_NAMES = (DENSE, *POLICIES, *SCORED_METHODS)


# -- methods -------------------------------------------------------------------------------------


def _format_sparsity(sparsity: float) -> str:
    return f"{sparsity:.2f}" if round(sparsity, 2) == sparsity else f"{sparsity:g}"


@dataclass(frozen=True)
class NIAHMethod:
    """An attention method to evaluate: dense ``"sdpa"``, or a CAB policy under a budget.

    ``name``: ``"sdpa"``, a key of :data:`hf_icl.attention.cab.POLICIES` (ranked by the model's ``cab_score``,
    ``"mean"`` by default), ``"quest"`` (magnitude ranking of Quest's min/max-key bound) or ``"max_l2"`` (magnitude
    ranking of each block's largest-norm key, the CAB document's coarsening). The budget is either ``sparsity``
    (the fraction of each token's visible blocks dropped, ``cab_budget="row"``) or ``kept_blocks`` (the number of
    key blocks every query token attends, sink and local window included, ``cab_budget="topk"``: the anchors'
    unit, e.g. 16 blocks of 64 = 1,024 tokens), never both; dense has neither.
    """

    name: str = DENSE
    sparsity: float = 0.0
    kept_blocks: int | None = None

    def __post_init__(self):
        check_choice("method", self.name, METHOD_NAMES)
        sparsity = check_float("sparsity", self.sparsity, low=0.0)
        if sparsity >= 1:
            raise ValueError(f"sparsity must be in [0, 1) (the fraction of causal blocks dropped), got {sparsity}")
        if self.kept_blocks is not None:
            check_int("kept_blocks", self.kept_blocks, low=1)
            if sparsity:
                raise ValueError(
                    f"give a method sparsity or kept_blocks, not both; got sparsity={sparsity}, "
                    f"kept_blocks={self.kept_blocks}"
                )
        if self.name == DENSE and (sparsity != 0 or self.kept_blocks is not None):
            raise ValueError(
                f"method {DENSE!r} is dense attention: its sparsity must be 0 and kept_blocks None, got "
                f"sparsity={sparsity}, kept_blocks={self.kept_blocks}"
            )
        object.__setattr__(self, "sparsity", sparsity)

    @property
    def is_dense(self) -> bool:
        return self.name == DENSE

    @property
    def policy(self) -> str:
        """The CAB policy (``"sdpa"`` for the dense method; ``"magnitude"`` for ``quest`` and ``max_l2``)."""
        return SCORED_METHODS.get(self.name, (self.name,))[0]

    @property
    def score(self) -> str | None:
        """The block score this method insists on, or None (the model's ``cab_score``)."""
        return SCORED_METHODS[self.name][1] if self.name in SCORED_METHODS else None

    @property
    def budget(self) -> str | None:
        """``"topk"`` for a method with ``kept_blocks``; None otherwise (the run's budget, ``"row"`` by default)."""
        return None if self.kept_blocks is None else "topk"

    @property
    def label(self) -> str:
        """The method's key in records: ``"sdpa"``, ``"cab-<name>@<sparsity>"`` (``"cab-frc@0.90"``) or
        ``"cab-<name>@<kept_blocks>blocks"`` (``"cab-quest@16blocks"``)."""
        if self.is_dense:
            return DENSE
        budget = f"{self.kept_blocks}blocks" if self.kept_blocks is not None else _format_sparsity(self.sparsity)
        return f"cab-{self.name}@{budget}"

    def record_fields(self) -> dict[str, Any]:
        """What a result record says about the method: label, policy, score, sparsity (None under a block budget)
        and kept blocks."""
        return {
            "method": self.label,
            "policy": self.policy,
            "score": self.score,
            "sparsity": None if self.kept_blocks is not None else self.sparsity,
            "kept_blocks": self.kept_blocks,
        }


def check_methods(methods) -> list[NIAHMethod]:
    """``methods`` as a list: non-empty, every item a :class:`NIAHMethod`, no label twice."""
    methods = list(methods)
    if not methods:
        raise ValueError("methods must be a non-empty list of NIAHMethod, got []")
    for i, method in enumerate(methods):
        if not isinstance(method, NIAHMethod):
            raise ValueError(f"methods[{i}] must be a NIAHMethod (see niah_methods), got {method!r}")
    labels = [method.label for method in methods]
    if len(set(labels)) != len(labels):
        raise ValueError(f"methods must not repeat, got {labels}")
    return methods


def niah_methods(
    policies: Iterable[str] = DEFAULT_POLICIES,
    sparsities: Iterable[float] = DEFAULT_SPARSITIES,
    kept_blocks: Iterable[int] = (),
) -> list[NIAHMethod]:
    """Dense ``"sdpa"`` once, then every CAB method name (a policy, ``"quest"`` or ``"max_l2"``) at every sparsity
    and every ``kept_blocks`` budget (name by name)."""
    policies, sparsities, kept_blocks = list(policies), list(sparsities), list(kept_blocks)
    for i, policy in enumerate(policies):
        check_choice(f"policies[{i}]", policy, METHOD_NAMES[1:])
    for i, sparsity in enumerate(sparsities):
        if check_float(f"sparsities[{i}]", sparsity, low=0.0) >= 1:
            raise ValueError(
                f"sparsities[{i}] must be in [0, 1) (the fraction of causal blocks dropped), got {sparsity}"
            )
    for i, kept in enumerate(kept_blocks):
        check_int(f"kept_blocks[{i}]", kept, low=1)
    if policies and not (sparsities or kept_blocks):
        raise ValueError(
            f"sparsities or kept_blocks must not both be empty when policies are given, got policies={policies}"
        )
    for name, values in (("policies", policies), ("sparsities", sparsities), ("kept_blocks", kept_blocks)):
        if len(set(values)) != len(values):
            raise ValueError(f"{name} must not repeat values, got {values}")
    cab = [
        method
        for policy in policies
        for method in (
            *(NIAHMethod(policy, float(s)) for s in sparsities),
            *(NIAHMethod(policy, kept_blocks=int(k)) for k in kept_blocks),
        )
    ]
    return [NIAHMethod(), *cab]


# -- switching a model -----------------------------------------------------------------------------


@contextmanager
def restoring_attention(model) -> Iterator[None]:
    """Put back the attention implementation, the ``cab_*`` config fields and the train/eval mode afterwards."""
    config = model.config
    implementation = config._attn_implementation
    missing = object()
    fields = {name: getattr(config, name, missing) for name in CABParams().to_config_fields()}
    was_training = model.training
    try:
        yield
    finally:
        for name, value in fields.items():
            if value is missing:
                if hasattr(config, name):
                    delattr(config, name)
            else:
                setattr(config, name, value)
        if implementation is not None and config._attn_implementation != implementation:
            model.set_attn_implementation(implementation)
        model.train(was_training)


#: the CAB fields an evaluation sets itself (per method, or fixed for the evaluation); the others come from the config
CAB_FIELDS_SET_BY_RUN = ("sparsity", "policy", "block_size", "budget", "min_seq_len", "decode")


def apply_method(model, method: NIAHMethod, block_size: int, budget: str) -> None:
    """Switch ``model`` to ``method``: dense SDPA, or CAB with ``block_size``, every window sparse
    (``cab_min_seq_len=0``) and sparse decoding. ``budget`` (the run's) applies to methods given by a sparsity; a
    method's own block budget and block score override the config's."""
    if method.is_dense:
        model.set_attn_implementation(DENSE)
        return
    own = {"score": method.score} if method.score is not None else {}
    if method.kept_blocks is not None:
        own.update(budget="topk", topk=method.kept_blocks)
    enable_cab(
        model,
        **{
            "sparsity": method.sparsity,
            "policy": method.policy,
            "block_size": block_size,
            "budget": budget,
            "min_seq_len": 0,
            "decode": "sparse",
            **own,
        },
    )


def other_cab_fields(config) -> dict[str, Any]:
    """CAB's hyperparameters that an evaluation does not set, as the model's config holds them (defaults if
    absent; ``config=None``: every default).

    Every field of :class:`~hf_icl.attention.cab.CABParams` but :data:`CAB_FIELDS_SET_BY_RUN`, so fields CAB gains
    later are recorded (and keep results of different settings apart) without a change here.
    """
    params = CABParams() if config is None else CABParams.from_config(config)
    return {name: getattr(params, name) for name in params.__dataclass_fields__ if name not in CAB_FIELDS_SET_BY_RUN}


def model_device(model) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


# -- what CAB selected ----------------------------------------------------------------------------


def needle_preservation(
    query: torch.Tensor,
    key: torch.Tensor,
    token_keep: torch.Tensor,
    *,
    block_size: int,
    scaling: float,
    needle_start: int,
    needle_end: int,
    last_rows: int,
) -> torch.Tensor:
    """Share of the dense attention on the needle that a per-token selection keeps, for the last queries.

    ``query (B, H, Nq, D)`` at absolute positions ``Nk - Nq …``, ``key (B, H or KV heads, Nk, D)``, ``token_keep``
    the per-token selection CAB attends over, ``(B, H, Nq, Mk)`` (what :class:`~hf_icl.attention.cab.CABSelection`
    carries, :func:`~hf_icl.attention.cab.select_cab_blocks`). The dense causal probabilities of the last
    ``last_rows`` queries are computed here, ``O(last_rows × Nk)`` per head, and scored with
    :func:`~hf_icl.attention.preservation.attention_preservation` over the keys ``[needle_start, needle_end)``.
    Returns ``(B, H)`` float32 in ``[0, 1]``.
    """
    n_q, n_k = query.shape[2], key.shape[2]
    if token_keep.shape[2] != n_q:
        raise ValueError(
            f"token_keep must be a per-token selection (B, H, {n_q}, Mk), got shape {tuple(token_keep.shape)}"
        )
    q_offset = n_k - n_q
    rows = max(1, min(last_rows, n_q))
    first = n_q - rows  # first scored query, relative to the queries
    heads = query.shape[1]
    key = key if key.shape[1] == heads else key.repeat_interleave(heads // key.shape[1], dim=1)  # grouped heads
    logits = torch.matmul(query[:, :, first:].float(), key.float().transpose(-1, -2)) * scaling  # (B, H, R, Nk)
    positions = q_offset + first + torch.arange(rows, device=query.device)
    causal = positions[:, None] >= torch.arange(n_k, device=query.device)
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    # the scored queries are the last positions, as token_keep_mask takes them
    kept = token_keep_mask(token_keep[:, :, first:], block_size, n_k)
    needle = torch.zeros(n_k, dtype=torch.bool, device=query.device)
    needle[needle_start:needle_end] = True
    return attention_preservation(probs, kept, needle)


def causal_pairs(token_keep: torch.Tensor, block_size: int) -> tuple[int, int]:
    """(kept, total) causal (query token, key block) pairs of a prefill's per-token selection, over all heads (a
    key block is causal for a query when it is not after the query's own block)."""
    n_q, n_blocks = token_keep.shape[2], token_keep.shape[3]
    device = token_keep.device
    causal = (torch.arange(n_q, device=device) // block_size)[:, None] >= torch.arange(n_blocks, device=device)
    kept = int((token_keep & causal).sum())
    return kept, int(causal.sum()) * token_keep.shape[0] * token_keep.shape[1]


class SelectionCounter:
    """An :func:`~hf_icl.attention.cab.observe_cab_selection` callback that counts, over the CAB prefills it sees
    (``1 < Nq == Nk``), the causal (query token, key block) pairs their selection keeps."""

    def __init__(self):
        self.kept = self.total = 0
        self.calls = 0

    def __call__(self, call: CABSelection) -> None:
        if call.is_prefill:
            self.count(call)

    def count(self, call: CABSelection) -> None:
        """Count one call's pairs (a call on the dense route keeps every causal pair)."""
        self.calls += 1
        if call.token_keep is None:
            batch, heads, n = call.query.shape[:3]
            pairs = batch * heads * sum(t // call.params.block_size + 1 for t in range(n))
            kept = total = pairs
        else:
            kept, total = causal_pairs(call.token_keep, call.params.block_size)
        self.kept, self.total = self.kept + kept, self.total + total

    def check_seen(self) -> None:
        """Raise when no CAB call was observed (the model does not route attention through CAB)."""
        if not self.calls:
            raise RuntimeError(
                "no attention call reached the CAB probe: the model does not route attention through "
                "transformers' AttentionInterface (set_attn_implementation), so CAB cannot be evaluated on it"
            )

    def achieved_sparsity(self) -> float:
        """The share of causal (query token, key block) pairs dropped, over every call, head and query."""
        self.check_seen()
        return 1.0 - self.kept / self.total if self.total else 0.0


class PreservationProbe(SelectionCounter):
    """Watches the teacher-forced CAB forward over prompt + answer, one attention call per layer.

    Per layer it scores :func:`needle_preservation` of the call's own selection on the prompt's queries and keys
    (the first ``prompt_length``; the answer's rows are not scored) and counts the (query token, key block) pairs
    the selection drops, for :meth:`achieved_sparsity`.
    """

    def __init__(self, needle_start: int, needle_end: int, last_rows: int, prompt_length: int):
        super().__init__()
        self.needle = (needle_start, needle_end)
        self.last_rows = last_rows
        self.prompt_length = prompt_length
        self.scores: list[float] = []

    def count(self, call: CABSelection) -> None:
        super().count(call)
        if call.token_keep is None:  # dense attention keeps everything
            self.scores.append(1.0)
            return
        prompt = min(self.prompt_length, call.query.shape[2])
        score = needle_preservation(
            call.query[:, :, :prompt],
            call.key[:, :, :prompt],
            call.token_keep[:, :, :prompt],
            block_size=call.params.block_size,
            scaling=call.scaling,
            needle_start=self.needle[0],
            needle_end=self.needle[1],
            last_rows=self.last_rows,
        )
        self.scores.append(float(score.mean()))

    def value(self) -> float:
        """The preservation score averaged over layers (and heads)."""
        self.check_seen()
        return sum(self.scores) / len(self.scores)


def observing(probe: SelectionCounter | None):
    """A context in which ``probe`` observes every CAB call's selection (nothing for ``None``: a dense method)."""
    return nullcontext() if probe is None else observe_cab_selection(probe)
