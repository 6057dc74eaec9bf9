"""CAB's hyperparameters: the ``cab_*`` fields of a model config, validated once (:class:`CABParams`).

Its own module so that the attention function (:mod:`.cab`) and the decode cache (:mod:`.cab_cache`) both build on
it without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch.utils.weak import WeakIdKeyDictionary

from ..kernels._common import check_backend
from ..kernels.token_selection.policies import BUDGETS, SCORES, TOKEN_POLICIES
from ..validation import check_choice, check_float, check_int, did_you_mean

__all__ = [
    "BUDGETS",
    "CABParams",
    "DEFAULT_BUDGET",
    "DEFAULT_SPARSITY",
    "DEFAULT_TOPK",
    "DECODE_MODES",
    "NAME",
    "POLICIES",
    "cab_params_of",
    "config_field",
    "unknown_name_message",
]

NAME = "cab"
#: "oracle" ranks blocks by their true attention mass (dense O(N²) scores: an evaluation upper bound, not a speed-up)
POLICIES = TOKEN_POLICIES
DECODE_MODES = ("sparse", "dense")
#: values that earlier releases accepted and that cannot be causal, with why
_NOT_CAUSAL = {
    ("cab_budget", "global"): "one top-k over all rows lets later tokens change earlier tokens' blocks",
    ("cab_policy", "reference"): "the document's selection scores future blocks (it was retired)",
}


#: the budget enable_cab() uses when given neither a sparsity nor a block count: each query token keeps
#: DEFAULT_TOPK key blocks, sink and local window included (16 × 64 = 1,024 tokens; docs/results/niah.md)
DEFAULT_BUDGET = "topk"
DEFAULT_TOPK = 16
#: the row budget's sparsity when none is given
DEFAULT_SPARSITY = 0.9


@dataclass(frozen=True)
class CABParams:
    """The ``cab_*`` fields of a model config, validated. Defaults apply to absent fields."""

    #: None: ``DEFAULT_SPARSITY``; giving it (and no ``budget``, no ``topk``) means ``budget="row"``
    sparsity: float | None = None
    block_size: int = 64
    # the best measured on SmolLM2 passkey retrieval (docs/results/niah.md): magnitude ranking of mean-key scores
    policy: str = "magnitude"
    score: str = "mean"
    lam: float = 0.5
    #: None: ``"row"`` when only ``sparsity`` is given, else ``"topk"`` (the anchors' unit, the measured default)
    budget: str | None = None
    #: None: ``DEFAULT_TOPK``; giving it (and no ``budget``, no ``sparsity``) means ``budget="topk"``
    topk: int | None = None
    sink_blocks: int = 1
    # 1: a token's own block is its local window; 2 adds the block before it. Under the row budget at 90 % it
    # helped (SmolLM2 perplexity 1.70× → 1.33× dense: the fraction left no slot to score); under the default 16
    # blocks at 8k it does not (1.068× with 1, 1.070× with 2, 1.072× with 4: magnitude picks the block before anyway)
    local_blocks: int = 1
    min_seq_len: int = 1024
    decode: str = "sparse"
    magnitude_fraction: float = 0.5
    backend: str = "auto"

    def __post_init__(self):
        self._resolve_budget()
        if check_float("cab_sparsity", self.sparsity, low=0.0) >= 1:
            raise ValueError(
                f"cab_sparsity must be in [0, 1) (the fraction of causal blocks dropped), got {self.sparsity}"
            )
        check_int("cab_block_size", self.block_size, low=16, high=128)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"cab_block_size must be a power of two in [16, 128], got {self.block_size}")
        for field, value in (("cab_policy", self.policy), ("cab_budget", self.budget)):
            if (field, value) in _NOT_CAUSAL:
                allowed = POLICIES if field == "cab_policy" else BUDGETS
                raise ValueError(
                    f"{field}={value!r} is not causal ({_NOT_CAUSAL[field, value]}); allowed: {', '.join(allowed)}"
                )
        check_choice("cab_policy", self.policy, POLICIES)
        check_choice("cab_score", self.score, SCORES)
        check_float("cab_lambda", self.lam, low=0.0)
        check_choice("cab_budget", self.budget, BUDGETS)
        check_int("cab_topk", self.topk, low=1)
        check_int("cab_sink_blocks", self.sink_blocks, low=0)
        check_int("cab_local_blocks", self.local_blocks, low=1)
        check_int("cab_min_seq_len", self.min_seq_len, low=0)
        check_choice("cab_decode", self.decode, DECODE_MODES)
        check_float("cab_magnitude_fraction", self.magnitude_fraction, low=0.0, high=1.0)
        # "torch" (the PyTorch path); the old name "reference" still works, with a DeprecationWarning
        object.__setattr__(self, "backend", check_backend(self.backend, "cab_backend"))

    def _resolve_budget(self) -> None:
        """Fill ``budget``, ``sparsity`` and ``topk`` left None: a sparsity alone asks for the row budget, a block
        count alone (or neither) for the top-k budget; both without a budget is ambiguous."""
        if self.budget is None:
            if self.sparsity is not None and self.topk is not None:
                raise ValueError(
                    f"cab_sparsity={self.sparsity} and cab_topk={self.topk} are both given without cab_budget: set "
                    "cab_budget='row' (a fraction of each token's visible blocks) or 'topk' (a number of blocks)"
                )
            object.__setattr__(self, "budget", "row" if self.sparsity is not None else DEFAULT_BUDGET)
        if self.sparsity is None:
            object.__setattr__(self, "sparsity", DEFAULT_SPARSITY)
        if self.topk is None:
            object.__setattr__(self, "topk", DEFAULT_TOPK)

    def selection_rule(self) -> dict:
        """The fields of the per-token selection rule (the keywords of
        :func:`hf_icl.kernels.token_selection.rule.apply_selection_rule`)."""
        names = ("block_size", "policy", "budget", "sparsity", "topk", "sink_blocks", "local_blocks", "min_seq_len")
        return {name: getattr(self, name) for name in (*names, "lam", "magnitude_fraction")}

    @classmethod
    def from_config(cls, config) -> CABParams:
        """The validated ``cab_*`` fields of ``config``; a ``cab_*`` attribute CAB does not know (a typo such as
        ``config.cab_sparsty = 0.5``, which would otherwise run with the default) raises ``ValueError``."""
        defaults = cls.__dataclass_fields__
        stray = [key for key in getattr(config, "__dict__", {}) if key.startswith("cab_") and key not in _CONFIG_FIELDS]
        if stray:
            raise ValueError(
                unknown_name_message("model.config has an unknown CAB field", stray, sorted(_CONFIG_FIELDS))
            )
        return cls(**{name: getattr(config, config_field(name), defaults[name].default) for name in defaults})

    def to_config_fields(self) -> dict:
        return {config_field(name): value for name, value in asdict(self).items()}


def config_field(name: str) -> str:
    return "cab_lambda" if name == "lam" else f"cab_{name}"


#: the ``cab_*`` config fields, one per :class:`CABParams` field
_CONFIG_FIELDS = frozenset(config_field(name) for name in CABParams.__dataclass_fields__)


def unknown_name_message(what: str, unknown: list[str], allowed: list[str]) -> str:
    """``{what} 'x'; did you mean 'y'?`` for each unknown name, then the allowed names."""
    parts = []
    for name in unknown:
        close = did_you_mean(name, allowed)
        parts.append(f"{what} {name!r}" + (f" ({close})" if close else ""))
    return "; ".join(parts) + f"; allowed: {', '.join(allowed)}"


#: config object → (its cab_* fields when last parsed, the CABParams parsed from them)
_PARSED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def cab_params_of(config) -> CABParams:
    """:meth:`CABParams.from_config`, parsed once per config and again only when a ``cab_*`` field changes (every
    layer of every decode step asks)."""
    fields = tuple(sorted((k, v) for k, v in getattr(config, "__dict__", {}).items() if k.startswith("cab_")))
    try:
        held = _PARSED.get(config)
    except TypeError:  # an object weak references cannot point at (a plain namespace): parse every time
        return CABParams.from_config(config)
    if held is None or held[0] != fields:
        held = _PARSED[config] = (fields, CABParams.from_config(config))
    return held[1]
