"""The attention methods of :func:`hf_icl.evaluation.sparse_icl.sparse_icl_curves`: ``"dense"`` and every CAB method
(a policy of :data:`hf_icl.attention.cab.POLICIES`, or ``"quest"`` / ``"max_l2"``) under one budget, ``topk`` (key
blocks kept per query token) or ``row`` (the fraction of each token's visible blocks dropped)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..attention.cab import POLICIES
from ..validation import check_choice, check_float, check_int
from .cab_methods import SCORED_METHODS

__all__ = ["DENSE", "LEAST_SQUARES", "METHOD_NAMES", "SparseICLMethod", "sparse_icl_methods"]

#: the curve of the model under its own dense attention
DENSE = "dense"
#: the least-squares curve every run scores beside the model
LEAST_SQUARES = "least_squares"
#: CAB method names: CAB's policies and the scored aliases (``quest``, ``max_l2``: magnitude ranking of that score)
METHOD_NAMES = (*POLICIES, *SCORED_METHODS)
#: policies that rank blocks by the block score (``score``); the others ignore it
_SCORED_POLICIES = ("magnitude", "frc", "frc_low", "hybrid")


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
