"""Who sees the selection CAB computed: :func:`observe_cab_selection` and the :class:`CABSelection` it hands over.

CAB's attention call (:mod:`hf_icl.attention.cab`) asks :func:`is_observed` whether to assemble its whole per-token
selection, and hands it to :func:`notify_observers` after it ran; evaluations (achieved sparsity, the NIAH
preservation score) count or score it there, so nothing selects a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .cab_params import CABParams


@dataclass(frozen=True)
class CABSelection:
    """One CAB attention call as an :func:`observe_cab_selection` callback sees it, after the call ran.

    ``query (B, H, Nq, D)`` and ``key (B, Hk, Nk, D)`` as the call got them (queries are the last ``Nq`` positions),
    ``attention_mask`` as transformers passed it, the call's :class:`CABParams`, ``scaling`` and ``route`` (one of
    :data:`hf_icl.attention.cab.ROUTES`), and ``token_keep``: the per-token selection the call attended over,
    ``(B, H, Nq, Mk)`` bool (query token ``t`` attends key block ``j``; blocks laid over real tokens), or None on the
    ``dense`` route (every visible block kept).
    """

    module: torch.nn.Module
    query: torch.Tensor
    key: torch.Tensor
    attention_mask: torch.Tensor | None
    params: CABParams
    scaling: float
    route: str
    token_keep: torch.Tensor | None

    @property
    def is_prefill(self) -> bool:
        """A prompt's first forward: every position at once (``1 < Nq == Nk``)."""
        return 1 < self.query.shape[2] == self.key.shape[2]


#: the callbacks of the active observe_cab_selection blocks, in the order they were entered
_OBSERVERS: list[Callable[[CABSelection], None]] = []


@contextmanager
def observe_cab_selection(callback: Callable[[CABSelection], None]) -> Iterator[Callable[[CABSelection], None]]:
    """While active, every CAB attention call (every layer, prefill and decode) calls ``callback`` with a
    :class:`CABSelection`: the selection the call itself computed and attended over, so an evaluation can score or
    count it without selecting again. Without an observer the call never holds its whole selection (it selects
    range by range, or as block lists); with one, it is assembled (``B·H·Nq·Mk`` bools per call).

    >>> counts = []
    >>> with observe_cab_selection(lambda call: counts.append(call.route)):
    ...     pass                                            # run a CAB model here
    """
    if not callable(callback):
        raise ValueError(f"callback must be callable (it gets a CABSelection), got {type(callback).__name__}")
    _OBSERVERS.append(callback)
    try:
        yield callback
    finally:
        for i in range(len(_OBSERVERS) - 1, -1, -1):  # this block's own entry, even if the callback is entered twice
            if _OBSERVERS[i] is callback:
                del _OBSERVERS[i]
                break


def is_observed() -> bool:
    """True while at least one :func:`observe_cab_selection` block is active."""
    return bool(_OBSERVERS)


def notify_observers(call: CABSelection) -> None:
    """Hand one finished CAB call to every active observer, in the order their blocks were entered."""
    for callback in tuple(_OBSERVERS):
        callback(call)
