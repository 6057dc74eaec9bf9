"""CAB decode from cached key-block summaries: the block statistics CAB's scores need live with the KV cache.

Without this module every decode step of every layer re-summarises the whole key cache (``O(N · D)``) before it
can pick blocks. Here a :class:`CABCache` (a ``transformers.DynamicCache``) keeps, per layer and per KV head, the
summaries of every *complete* key block (element-wise min and max keys for ``cab_score="bound"``, mean keys for
``"mean"`` and for the FRC policies' two-hop term, the largest-norm key for ``"max_l2"``) and summarises only the
blocks that an ``update()`` completes. A decode step then scores ``O(blocks · D)`` of metadata and runs the sparse
attention over the kept blocks. The summaries are
:func:`~hf_icl.kernels.token_selection.rule.key_block_summaries` of the new blocks, so they equal that function on the
whole cache; the selection from them is the rule of :mod:`hf_icl.kernels.token_selection.rule`
(candidates are complete blocks only, so the partial last block's summary is never needed: it scores as zeros).

How the attention function finds them. transformers hands an attention function the key tensor that the cache
layer's ``update()`` returned, not the cache. Each layer therefore *binds* its summaries to that exact tensor
object (and its in-place version counter); :func:`block_summaries_of` looks them up by identity. A key tensor
that no :class:`CABCacheLayer` produced (no cache, a plain ``DynamicCache``, keys a model changed after the
update) has none, and CAB recomputes as before. Beam-search reordering, ``crop``, batch repeats and selections
reorder or trim the summaries with the keys; ``reset``, offloading or anything else that replaces the keys
unseen leaves summaries that describe no current tensor, so the next ``update()`` recomputes them from scratch.
Summaries are never reused for a tensor they were not computed for.

Who builds them. ``generate`` on a model that went through :func:`~.cab.enable_cab` (or :func:`use_cab_cache`;
a model loaded with ``attn_implementation="cab"`` needs one of the two calls) makes a :class:`CABCache` instead of
its default ``DynamicCache``; a step-by-step ``forward`` loop passes ``past_key_values=CABCache(model.config)``.

What uses them. :func:`cached_block_selection` serves CAB calls whose queries continue a cache (decode and
chunked prefill) on unpadded batches; padded batches keep the uncached path (blocks are laid over each row's
real tokens, which a per-position summary cannot follow), as do the ``"oracle"`` policy (true attention mass
needs every key) and the first prefill (its whole-prompt selection stays with the rule's own path). FRC policies
also cache their block-to-block hop matrix, ``(B, Hk, Mk, Mk)`` floats per layer, recomputed only when the block
count changes.

Exactness. On CPU the cached path is bitwise the uncached one (the tests compare them). On CUDA min and max keys
are exact, but a mean key and a max-L2 norm are float sums that a block-at-a-time reduction may round differently
in the last bit from a whole-cache one (and the scores read strided buffers); a near-tie between two blocks could
then rank the other way, as between prefill and decode already (not measured: no GPU was available).

    >>> import torch, hf_icl
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = hf_icl.enable_cab(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)), block_size=16,
    ...                           min_seq_len=0)            # generate() now builds a CABCache
    >>> cache = CABCache(model.config)                       # or pass one yourself
    >>> _ = model(torch.arange(40)[None], past_key_values=cache)
    >>> cache.layers[0].summaries.n_blocks                   # 40 tokens: two complete 16-token blocks
    2
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch.utils.weak import WeakIdKeyDictionary
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

from ..kernels.token_selection.fused import fused_selection_unsupported, select_token_blocks_triton
from ..kernels.token_selection.policies import FRC_POLICIES
from ..kernels.token_selection.rule import apply_selection_rule, frc_hop_matrix, key_block_summaries, token_block_scores
from .cab_params import NAME, CABParams

__all__ = [
    "CABCache",
    "CABCacheLayer",
    "KeyBlockSummaries",
    "block_summaries_of",
    "cached_block_indices",
    "cached_block_selection",
    "select_blocks_from_summaries",
    "summary_kinds",
    "use_cab_cache",
]

#: key tensor (by identity, weakly) → the summaries bound to it; see :meth:`KeyBlockSummaries.describes`
_BOUND: WeakIdKeyDictionary = WeakIdKeyDictionary()


def summary_kinds(params) -> tuple[str, ...]:
    """The :func:`~hf_icl.kernels.token_selection.rule.key_block_summaries` kinds CAB's selection under ``params`` (a
    :class:`~.cab_params.CABParams`) reads: the score's, plus ``"mean"`` for the FRC policies' hop; none for the
    policies that read no keys (``dense``, ``streaming``) or all of them (``oracle``).

    >>> from hf_icl.attention.cab_params import CABParams
    >>> summary_kinds(CABParams(policy="hybrid", score="bound"))
    ('bound', 'mean')
    """
    if params.policy in ("dense", "streaming", "oracle"):
        return ()
    if params.policy in FRC_POLICIES and params.score != "mean":
        return (params.score, "mean")
    return (params.score,)


class KeyBlockSummaries:
    """One layer's summaries of its complete key blocks, ``(B, Hk, n_blocks, D)`` float32 per statistic.

    Stored in buffers with spare rows that stay zero, so a view with one more row is what the rule scores when
    the last block is partial (the partial block is never a candidate). ``extend`` summarises only the blocks that
    are new since the last call.

    >>> state = KeyBlockSummaries(block_size=16, kinds=("mean",))
    >>> keys = torch.randn(1, 2, 40, 8)
    >>> state.extend(keys)
    >>> state.n_blocks, state.describes(keys), state.for_scoring("mean", 3)[0].shape
    (2, True, torch.Size([1, 2, 3, 8]))
    """

    def __init__(self, block_size: int, kinds: tuple[str, ...]):
        self.block_size = block_size
        self.kinds = tuple(kinds)
        self.n_blocks = 0
        self._buffers: dict[str, tuple[torch.Tensor, ...]] = {}
        self._source = None  # weakref to the key tensor these summaries describe
        self._version = -1
        self._hop = None  # (key, hop matrix (B, Hk, Mk, Mk)) for the FRC policies

    # -- binding ------------------------------------------------------------------------------------------

    def describes(self, keys: torch.Tensor | None) -> bool:
        """Whether these summaries were computed for exactly this tensor object, unmodified since."""
        return (
            keys is not None and self._source is not None and self._source() is keys and keys._version == self._version
        )

    def bind(self, keys: torch.Tensor) -> None:
        """Declare that the summaries describe ``keys`` (its complete blocks) from now on."""
        if keys.shape[2] // self.block_size != self.n_blocks:
            raise ValueError(
                f"keys hold {keys.shape[2] // self.block_size} complete blocks of {self.block_size}, but the "
                f"summaries hold {self.n_blocks}: bind keys only after extend/truncate"
            )
        self._source, self._version = weakref.ref(keys), keys._version
        _BOUND[keys] = self

    # -- growing and editing ------------------------------------------------------------------------------

    def extend(self, keys: torch.Tensor) -> None:
        """Summarise the complete blocks of ``keys (B, Hk, N, D)`` beyond the ``n_blocks`` already held (the
        caller guarantees those describe the same prefix), then bind ``keys``."""
        complete = keys.shape[2] // self.block_size
        if complete > self.n_blocks:
            segment = keys[:, :, self.n_blocks * self.block_size : complete * self.block_size]
            for kind in self.kinds:
                self._write(kind, key_block_summaries(segment, self.block_size, kind))
            self.n_blocks = complete
            self._hop = None
        elif complete < self.n_blocks:
            self.truncate(complete)
        self.bind(keys)

    def _write(self, kind: str, new: tuple[torch.Tensor, ...]) -> None:
        start, count = self.n_blocks, new[0].shape[2]
        held = self._buffers.get(kind)
        if held is None or held[0].shape[2] < start + count + 1:  # keep >= 1 spare zero row
            capacity = max(2 * (start + count + 1), 8)
            grown = tuple(t.new_zeros(*t.shape[:2], capacity, t.shape[3]) for t in new)
            if held is not None:
                for old, fresh in zip(held, grown, strict=True):
                    fresh[:, :, :start] = old[:, :, :start]
            held = self._buffers[kind] = grown
        for buffer, rows in zip(held, new, strict=True):
            buffer[:, :, start : start + count] = rows

    def truncate(self, n_blocks: int) -> None:
        """Keep the first ``n_blocks`` blocks (after a ``crop``); the rest are zeroed again."""
        n_blocks = max(0, min(n_blocks, self.n_blocks))
        for held in self._buffers.values():
            for buffer in held:
                buffer[:, :, n_blocks : self.n_blocks] = 0
        self.n_blocks, self._hop = n_blocks, None

    def map_batch(self, edit) -> None:
        """Apply ``edit`` (a function of a tensor whose dim 0 is the batch) to every buffer: beam reordering,
        batch repeats and selections move the summaries with their keys."""
        self._buffers = {kind: tuple(edit(t) for t in held) for kind, held in self._buffers.items()}
        self._hop = None

    # -- reading ------------------------------------------------------------------------------------------

    def for_scoring(self, kind: str, n_blocks: int) -> tuple[torch.Tensor, ...]:
        """The ``kind`` summaries of the first ``n_blocks`` blocks as ``(B, Hk, n_blocks, D)`` views: the complete
        blocks, then zeros for a partial last one (``n_blocks <= self.n_blocks + 1``)."""
        if kind not in self.kinds or not self.n_blocks <= n_blocks <= self.n_blocks + 1:
            raise ValueError(
                f"summaries hold kinds {list(self.kinds)} for {self.n_blocks} complete blocks; asked for kind "
                f"{kind!r} over {n_blocks} blocks (allowed: {self.n_blocks} or {self.n_blocks + 1})"
            )
        if self.n_blocks == 0:  # nothing written yet: every block is partial (or absent)
            raise ValueError("no complete block has been summarised yet")
        return tuple(buffer[:, :, :n_blocks] for buffer in self._buffers[kind])

    def hop_matrix(self, score: str, n_blocks: int, scaling: float) -> torch.Tensor:
        """The FRC hop matrix ``(B, Hk, Mk, Mk)`` of :func:`~hf_icl.kernels.token_selection.rule.frc_hop_matrix` (per KV
        head), reused while the block count stays the same."""
        key = (score, n_blocks, self.n_blocks, float(scaling))
        if self._hop is None or self._hop[0] != key:
            summaries = self.for_scoring(score, n_blocks)
            means = self.for_scoring("mean", n_blocks)[0]
            self._hop = (key, frc_hop_matrix(summaries, means, scaling, summaries[0].shape[1]))
        return self._hop[1]


def block_summaries_of(keys: torch.Tensor) -> KeyBlockSummaries | None:
    """The summaries a :class:`CABCacheLayer` bound to this very key tensor, or None (not a cache's keys, or
    keys edited in place or replaced since)."""
    state = _BOUND.get(keys)
    return state if state is not None and state.describes(keys) else None


# -- the cache -----------------------------------------------------------------------------------------------


def _wanted(config) -> tuple[int, tuple[str, ...]] | None:
    """``(block_size, kinds)`` the model's CAB settings need, or None when CAB is off or reads no summaries."""

    if getattr(config, "_attn_implementation", None) != NAME:
        return None
    params = CABParams.from_config(config)
    kinds = summary_kinds(params)
    return (params.block_size, kinds) if kinds else None


class CABCacheLayer(DynamicLayer):
    """A ``DynamicLayer`` that keeps :class:`KeyBlockSummaries` of its keys up to date for CAB (see the module
    docstring). ``config`` is the model config whose ``cab_*`` fields say which summaries and block size; it is
    read at every ``update``, so ``enable_cab`` changes between calls take effect (with a recomputation)."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.summaries: KeyBlockSummaries | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        previous = self.keys
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        wanted = _wanted(self.config)
        state = self.summaries
        if wanted is None:
            self.summaries = None
        else:
            if state is None or (state.block_size, state.kinds) != wanted or not state.describes(previous):
                state = KeyBlockSummaries(*wanted)  # a new prompt, new settings or keys replaced behind our back
            state.extend(keys)
            self.summaries = state
        return keys, values

    def _edited(self, edit_keys, edit_summaries) -> None:
        """Run ``edit_keys()`` (the parent's edit of keys and values), then the same edit on the summaries if they
        described the keys before it; otherwise drop them (the next update recomputes)."""
        before = self.keys
        edit_keys()
        state = self.summaries
        if state is None or self.keys is before:
            return
        if state.describes(before) and self.keys is not None:
            edit_summaries(state)
            state.bind(self.keys)
        else:
            self.summaries = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        def edit(state):
            state.map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

        self._edited(lambda: super(CABCacheLayer, self).reorder_cache(beam_idx), edit)

    def crop(self, tokens_to_remove: int) -> None:
        def edit(state):
            state.truncate(self.keys.shape[2] // state.block_size)

        self._edited(lambda: super(CABCacheLayer, self).crop(tokens_to_remove), edit)

    def batch_repeat_interleave(self, repeats: int) -> None:
        def edit(state):
            state.map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

        self._edited(lambda: super(CABCacheLayer, self).batch_repeat_interleave(repeats), edit)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        def edit(state):
            state.map_batch(lambda t: t[indices, ...])

        self._edited(lambda: super(CABCacheLayer, self).batch_select_indices(indices), edit)

    def reset(self) -> None:
        super().reset()
        self.summaries = None


class CABCache(DynamicCache):
    """A ``DynamicCache`` whose full-attention layers are :class:`CABCacheLayer` s, for CAB's cached decode.

    ``config`` is the model's (text) config: its layer types shape the cache as ``DynamicCache(config=config)``
    would (sliding-window layers stay ordinary), its ``cab_*`` fields pick the summaries. ``generate`` builds one
    by itself on a model prepared by :func:`~.cab.enable_cab` (or :func:`use_cab_cache`); pass one as
    ``past_key_values`` to drive ``forward`` step by step.

    >>> from transformers import LlamaConfig
    >>> cache = CABCache(LlamaConfig(num_hidden_layers=2))
    >>> [type(layer).__name__ for layer in cache.layers]
    ['CABCacheLayer', 'CABCacheLayer']
    """

    def __init__(self, config: PretrainedConfig, offloading: bool = False):
        if not isinstance(config, PretrainedConfig):
            raise ValueError(
                f"config must be a transformers PretrainedConfig (the model's config), got {type(config).__name__}"
            )
        super().__init__(config=config, offloading=offloading)
        self.layers = [CABCacheLayer(config) if type(layer) is DynamicLayer else layer for layer in self.layers]
        if self.layer_class_to_replicate is not None:  # a config without layer types: layers appear lazily
            self.layer_class_to_replicate = partial(CABCacheLayer, config)


# -- generate builds a CABCache ------------------------------------------------------------------------------


class _PrepareCABCache:
    """Stands in for a model's ``_prepare_cache_for_generation``: the class's own method, then a fresh
    ``DynamicCache`` that ``generate`` made (not one the user passed) becomes a :class:`CABCache` while the
    model runs CAB. An object holding the model (not a closure), so ``copy.deepcopy`` and pickling follow it."""

    def __init__(self, model):
        self.model = model

    def __call__(self, generation_config, model_kwargs: dict, *args, **kwargs):

        model = self.model
        type(model)._prepare_cache_for_generation(model, generation_config, model_kwargs, *args, **kwargs)
        cache = model_kwargs.get("past_key_values")
        made_here = type(cache) is DynamicCache and not getattr(cache, "_is_user_defined", False)
        if made_here and not getattr(cache, "offloading", False) and model.config._attn_implementation == NAME:
            model_kwargs["past_key_values"] = CABCache(model.config.get_text_config(decoder=True))


def use_cab_cache(model):
    """Make ``model.generate`` decode CAB from cached block summaries (``enable_cab`` calls this for you).

    Returns ``model``. A ``past_key_values`` the caller passes is used as given (a plain ``DynamicCache`` then
    runs CAB without cached summaries: correct, slower); ``cache_implementation`` choices other than the default
    dynamic cache are left alone.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = use_cab_cache(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)))
    >>> type(model._prepare_cache_for_generation).__name__
    '_PrepareCABCache'
    """
    if not callable(getattr(model, "_prepare_cache_for_generation", None)) or not hasattr(model, "config"):
        raise ValueError(
            f"model must be a transformers model that can generate (a GenerationMixin with .config), "
            f"got {type(model).__name__}"
        )
    if not isinstance(model.__dict__.get("_prepare_cache_for_generation"), _PrepareCABCache):
        model._prepare_cache_for_generation = _PrepareCABCache(model)
    return model


# -- the selection -------------------------------------------------------------------------------------------


def cached_block_selection(
    query: torch.Tensor, key: torch.Tensor, params, scaling: float, key_valid: torch.Tensor | None = None
) -> torch.Tensor | None:
    """CAB's per-token selection ``(B, H, Nq, Mk)`` from the summaries bound to ``key``, or None when this call
    must take the uncached path: no summaries for this tensor (or not the ones ``params`` needs), a first prefill
    (``Nq == Nk``), padding in ``key_valid``, or the ``oracle`` policy. Arguments as for
    :func:`~.cab.select_cab_blocks`."""
    n_q, n_k = query.shape[2], key.shape[2]
    if n_q >= n_k or params.policy == "oracle":
        return None
    if key_valid is not None and (n_q == 1 or not bool(key_valid.all())):  # decode: no sync for a padded batch
        return None
    state = _usable_summaries(key, params, n_k)
    if state is None:
        return None
    return select_blocks_from_summaries(query, n_k, state, params, scaling)


def _usable_summaries(key: torch.Tensor, params, n_k: int) -> KeyBlockSummaries | None:
    """The summaries bound to ``key`` if they are the ones ``params`` reads, up to date, with ≥ 1 complete block."""
    state = block_summaries_of(key)
    if (
        state is None
        or state.block_size != params.block_size
        or not set(summary_kinds(params)) <= set(state.kinds)
        or state.n_blocks != n_k // params.block_size
        or state.n_blocks == 0  # no complete block yet: nothing to score, the uncached path is as cheap
    ):
        return None
    return state


def cached_block_indices(
    query: torch.Tensor, key: torch.Tensor, params, scaling: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused selection kernel on the summaries bound to ``key``: ``(indices, counts)`` block lists with no host
    sync, or None when this call must select from the keys (not a cache's keys, a first prefill, summaries missing,
    or a selection the kernel cannot run). Unpadded calls only."""
    n_q, n_k = query.shape[2], key.shape[2]
    n_blocks = -(-n_k // params.block_size)
    if n_q >= n_k or fused_selection_unsupported(query, n_blocks, params.policy, params.budget) is not None:
        return None
    state = _usable_summaries(key, params, n_k)
    if state is None:
        return None
    kinds = summary_kinds(params)
    summaries = state.for_scoring(params.score, n_blocks) if kinds else None
    hop = None
    if params.policy in FRC_POLICIES:
        hop = state.hop_matrix(params.score, n_blocks, scaling)  # per KV head
    _, indices, counts = select_token_blocks_triton(
        query, summaries, n_keys=n_k, scaling=scaling, hop=hop, return_indices=True, **params.selection_rule()
    )
    return indices, counts


def select_blocks_from_summaries(
    query: torch.Tensor, n_k: int, summaries: KeyBlockSummaries, params, scaling: float
) -> torch.Tensor:
    """The rule of :mod:`hf_icl.kernels.token_selection.rule` for unpadded queries that are the last ``Nq`` of
    ``n_k`` positions, scored against cached block summaries instead of the keys: ``(B, H, Nq, Mk)`` bool.
    ``params`` is a :class:`~.cab_params.CABParams` (any policy but ``oracle``).

    >>> from hf_icl.attention.cab_params import CABParams
    >>> state = KeyBlockSummaries(16, ("mean",))
    >>> state.extend(torch.randn(1, 1, 100, 8))
    >>> token_keep = select_blocks_from_summaries(torch.randn(1, 2, 1, 8), 100, state, CABParams(block_size=16,
    ...                                           sparsity=0.5, min_seq_len=0), scaling=0.35)
    >>> token_keep.shape, int(token_keep.sum(-1).max())                  # 7 visible blocks, half of them kept
    (torch.Size([1, 2, 1, 7]), 4)
    """
    batch, heads, n_q, _ = query.shape
    n_blocks = -(-n_k // params.block_size)
    q_pos = (n_k - n_q + torch.arange(n_q, device=query.device))[None, :]  # (1, Nq) real positions (no padding)

    def hop():  # per query head, as the rule multiplies it (same shapes, same rounding)
        matrix = summaries.hop_matrix(params.score, n_blocks, scaling)
        return matrix.repeat_interleave(heads // matrix.shape[1], dim=1)

    return apply_selection_rule(
        (batch, heads, n_q, n_blocks),
        q_pos,
        scores=lambda: token_block_scores(query, summaries.for_scoring(params.score, n_blocks), scaling),
        hop=hop,
        **params.selection_rule(),
    )
