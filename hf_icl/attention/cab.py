"""CAB as a transformers attention implementation: ``attn_implementation="cab"``.

Per layer and head, every query token picks its own key blocks from the complete blocks before its own
(:mod:`hf_icl.kernels.token_selection.rule`: causal by construction, so teacher-forced logits equal step-by-step
generation), always keeping its own block and the sink blocks; then exact softmax attention runs over the chosen
blocks only, with work that follows the selected (token, block) pairs (:mod:`hf_icl.kernels.token_sparse`). Blocks,
sinks and budgets are laid over each row's real tokens, so a padded batch gives what each row gives alone.
Hyperparameters live on ``model.config`` as ``cab_*`` fields (:mod:`.cab_params`), so they survive ``save_pretrained``.

Each call is routed once, by :func:`cab_route`, from (device, policy, padding, dtype, head dim, dropout):

* ``dense``: every token would keep every visible block (short sequences, sparsity 0) or a dense decode step;
* ``triton_prefill`` / ``triton_decode`` (CUDA, ``cab_backend`` ``"auto"`` or ``"triton"``): the fused selection
  kernel emits each token's block list, and the key-block-major kernels (prefill) or the split-K decode kernel
  consume it with no host sync; a padded prefill is compacted to its real tokens first; a left-padded batch's decode
  step selects with the PyTorch rule (over each row's real tokens) and runs the split-K kernel from each row's first
  real key (``row_starts``), see :func:`cab_route`;
* ``torch``: the PyTorch path (``cab_backend="torch"``, CPU, dropout, head dims the kernels lack, the ``oracle``
  policy, a padded batch's chunked prefill, a padded decode step whose rows are not left-padded), selection and
  execution range by range. The route's ``reason`` says what kept the kernels out; ``cab_backend="triton"`` raises
  it as a ``ValueError``.

Evaluations that need the selection (achieved sparsity, the NIAH preservation score) observe it: inside
:func:`observe_cab_selection`, every call hands its callback a :class:`CABSelection` with the per-token selection
it attended over, so nothing selects a second time.

    >>> import hf_icl                                   # registers "cab"
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2))
    >>> model = hf_icl.enable_cab(model, sparsity=0.9, block_size=16)
    >>> model.config._attn_implementation, model.config.cab_sparsity
    ('cab', 0.9)
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import asdict, dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..kernels.block_sparse_attention import expand_kv
from ..kernels.block_sparse_reference import real_positions
from ..kernels.token_selection.fused import fused_rule_unsupported, fused_selection_unsupported, selection_width
from ..kernels.token_selection.rule import (  # noqa: F401  (SCORES: re-exported)
    SCORES,
    fused_block_selector,
    select_token_blocks,
    select_token_blocks_fused,
    token_block_selector,
)
from ..kernels.token_sparse import (
    attend_selected,
    keep_to_indices,
    kernels_unsupported,
    query_range_length,
    query_ranges,
    token_sparse_attention_triton,
    token_sparse_decode,
)
from .cab_cache import cached_block_indices, cached_block_selection, use_cab_cache
from .cab_observer import CABSelection, is_observed, notify_observers, observe_cab_selection  # noqa: F401
from .cab_params import (  # noqa: F401  (re-exported: the public names of CAB's parameters)
    BUDGETS,
    DECODE_MODES,
    NAME,
    POLICIES,
    CABParams,
    cab_params_of,
    config_field,
    unknown_name_message,
)

ROUTES = ("dense", "torch", "triton_prefill", "triton_decode")


@dataclass(frozen=True)
class CABRoute:
    """How one attention call runs: ``name`` (one of :data:`ROUTES`), ``reason`` (why the Triton kernels do not run
    it, on the ``torch`` route) and ``compact`` (a padded prefill compacted to its real tokens for the kernels)."""

    name: str
    reason: str | None = None
    compact: bool = False


def cab_route(
    params: CABParams,
    *,
    device: torch.device,
    n_q: int,
    n_k: int,
    head_dim: int,
    dtype: torch.dtype,
    padded: bool,
    dropout: float = 0.0,
    left_padded: bool = True,
) -> CABRoute:
    """The one place a call's route is decided (see the module docstring). ``cab_backend="triton"`` on a call the
    kernels cannot run raises ``ValueError`` naming what stands in the way.

    Padding (``padded``: the call has a key padding mask). A padded prefill (``n_q == n_k``) is compacted to its real
    tokens (``compact``). A padded chunked prefill (``1 < n_q < n_k``) takes the PyTorch path. A padded decode step
    (``n_q == 1``) takes the split-K kernel on the assumption that every row is *left-padded* as transformers'
    ``generate`` pads a batch: row b's real tokens are the one contiguous run ``[start_b, n_k)`` ending at the newest
    position (its padding, if any, all before ``start_b``). The route cannot see the mask's values, so the caller
    checks that assumption (:func:`cab_attention_forward` does it with one host sync, only for a padded decode step
    on this route) and passes ``left_padded=False`` when it fails; that call then takes the PyTorch path.
    """
    if runs_dense(params, n_q, n_k):
        return CABRoute("dense")
    reason = _why_not_kernels(params, device, n_q, n_k, head_dim, dtype, padded, dropout, left_padded)
    if reason is None:
        if n_q == 1:
            return CABRoute("triton_decode")
        return CABRoute("triton_prefill", compact=padded)
    if params.backend == "triton":
        raise ValueError(f"cab_backend='triton' cannot run this call: {reason}")
    return CABRoute("torch", reason)


def _why_not_kernels(params, device, n_q, n_k, head_dim, dtype, padded, dropout, left_padded=True) -> str | None:
    if params.backend == "torch":
        return "cab_backend='torch' asks for the PyTorch path"
    reason = kernels_unsupported(device, head_dim, dtype, dropout, cuda_only=params.backend == "auto")
    if reason is not None:
        return reason
    unfused = fused_rule_unsupported(-(-n_k // params.block_size), params.policy, params.budget)
    if unfused is not None:
        return f"the fused selection cannot run it: {unfused}"
    if padded and 1 < n_q < n_k:
        return (
            "a padded batch's chunked prefill (each row's queries sit at their own positions; only a prefill "
            "(n_q == n_k) is compacted to real tokens and only a left-padded decode step (n_q == 1) runs per-row "
            "key starts)"
        )
    if padded and n_q == 1 and not left_padded:
        return (
            "a padded batch's decode step whose rows are not left-padded (the decode kernel takes each row's real "
            "tokens as one contiguous run ending at the newest position, as transformers' generate pads)"
        )
    return None


def _left_padding_starts(key_valid: torch.Tensor) -> torch.Tensor | None:
    """Each row's first real key ``(B,)`` long if every row of ``key_valid (B, Nk)`` is left-padded (its real
    tokens one contiguous run ending at the last position), else None."""
    starts = key_valid.to(torch.uint8).argmax(-1)  # the first True (argmax returns the first maximum)
    left_padded = key_valid.sum(-1) == key_valid.shape[-1] - starts  # so [start, Nk) are all real
    # The one host sync of a padded decode step on the kernel route: transformers hands a mask, not a promise of
    # left padding, and a row laid out otherwise would put its blocks in the wrong place. (A row with no real
    # token fails too: argmax gives 0 and its sum is 0.)
    return starts if bool(left_padded.all()) else None


def _bool_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask transformers passes (bool from ``sdpa_mask``, or additive float) as bool, True = attend."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask == 0


def _dense_causal(query, key, value, mask, scaling, q_offset, dropout):
    if mask is None and q_offset:  # cached queries: causality relative to their absolute positions
        positions = torch.arange(query.shape[2], device=query.device) + q_offset
        mask = positions[:, None] >= torch.arange(key.shape[2], device=query.device)
    is_causal = mask is None and query.shape[2] > 1
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scaling
    )


def cab_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls: ``(B, H, T, D)`` tensors in, ``(B, T, H, D)`` out."""
    params = cab_params_of(module.config)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    dropout = dropout if module.training else 0.0
    n_q, n_k = query.shape[2], key.shape[2]
    q_offset = n_k - n_q
    mask = _bool_mask(attention_mask)
    key_valid = None if mask is None else _key_padding_from_mask(mask, q_offset)
    route_of = partial(
        cab_route,
        params,
        device=query.device,
        n_q=n_q,
        n_k=n_k,
        head_dim=query.shape[-1],
        dtype=query.dtype,
        padded=key_valid is not None,
        dropout=dropout,
    )
    route = route_of()
    row_starts = None
    if route.name == "triton_decode" and key_valid is not None:  # the route assumed left padding: check it
        row_starts = _left_padding_starts(key_valid)
        if row_starts is None:
            route = route_of(left_padded=False)
    if route.name == "dense" and n_q == n_k:
        _warn_if_short(module.config, params, n_k)
    record = is_observed()  # the selection is assembled whole only while someone observes it
    token_keep = None
    if route.name == "dense":
        heads = query.shape[1]
        out = _dense_causal(query, expand_kv(key, heads), expand_kv(value, heads), mask, scaling, q_offset, dropout)
    elif route.name == "torch":
        out, token_keep = _torch_route(query, key, value, params, scaling, key_valid, dropout, record)
    elif route.name == "triton_decode":
        if row_starts is None:
            indices, counts = _kernel_selection(query, key, params, scaling)
        else:  # left-padded rows: the PyTorch rule over each row's real tokens (no host sync on CUDA), as lists
            token_keep = token_block_selector(
                query, key, scaling=scaling, score=params.score, key_valid=key_valid, **params.selection_rule()
            )(0, 1)
            indices, counts = keep_to_indices(token_keep, _width(params, n_k))
        out = token_sparse_decode(
            query,
            key,
            value,
            indices,
            counts,
            block_size=params.block_size,
            scaling=scaling,
            q_offset=q_offset,
            group_heads=params.policy in _HEAD_INDEPENDENT,
            row_starts=row_starts,
        )
        if record and row_starts is None:
            token_keep = _listed_to_token_keep(indices, counts, -(-n_k // params.block_size))
    else:
        compact = key_valid if route.compact else None
        out, token_keep = _triton_prefill(query, key, value, params, scaling, compact, record)
    if record:
        notify_observers(CABSelection(module, query, key, attention_mask, params, scaling, route.name, token_keep))
    return out.transpose(1, 2).contiguous(), None


def _listed_to_token_keep(indices: torch.Tensor, counts: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """Block lists ``indices (B, H, Nq, W)`` with ``counts (B, H, Nq)`` → the bool selection ``(B, H, Nq, Mk)``
    (unused slots repeat a kept id, so they are counted, not written)."""
    valid = torch.arange(indices.shape[-1], device=indices.device) < counts.unsqueeze(-1)
    hits = torch.zeros(*indices.shape[:-1], n_blocks, dtype=torch.int32, device=indices.device)
    return hits.scatter_add_(-1, indices.long(), valid.int()) > 0


#: policies whose selection does not depend on the query head
_HEAD_INDEPENDENT = ("dense", "streaming")


def _torch_route(
    query, key, value, params: CABParams, scaling, key_valid, dropout, record: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Selection and execution range by range on the PyTorch path (decode and chunked prefill on a CABCache select
    from its cached block summaries). Returns the output and, with ``record``, the whole per-token selection."""
    token_keep = cached_block_selection(query, key, params, scaling, key_valid)
    pieces = []
    if token_keep is not None:
        select = lambda start, stop: token_keep[:, :, start:stop]  # noqa: E731
    else:
        rule = params.selection_rule()
        selector = token_block_selector(query, key, scaling=scaling, score=params.score, key_valid=key_valid, **rule)

        def select(start: int, stop: int) -> torch.Tensor:
            piece = selector(start, stop)
            if record:
                pieces.append(piece)
            return piece

    out = attend_selected(
        query, key, value, select, block_size=params.block_size, scaling=scaling, key_valid=key_valid, dropout=dropout
    )
    if record and token_keep is None:
        token_keep = torch.cat(pieces, dim=2)
    return out, token_keep if record else None


def _kernel_selection(query, key, params: CABParams, scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's kept blocks as ``(indices, counts)`` from the fused kernel (on a CABCache's summaries when it
    holds them), with no host sync."""
    cached = cached_block_indices(query, key, params, scaling)
    if cached is not None:
        return cached
    return select_token_blocks_fused(query, key, scaling=scaling, score=params.score, **params.selection_rule())


#: bound on one range's kernel buffers (fp32 partial outputs of every (token, kept block) pair and the selection)
_KERNEL_RANGE_BYTES = 1 << 30


def _triton_prefill(
    query, key, value, params: CABParams, scaling, key_valid, record: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The key-block-major kernels, query range by query range (each range's partial results and selection are
    bounded by ``_KERNEL_RANGE_BYTES``; the key summaries are computed once). A padded prefill runs on its real
    tokens moved to the front of each row (the selection on them is each row's own, since blocks are laid over real
    tokens), then is moved back. Returns the output and, with ``record``, the whole per-token selection."""
    n_q, n_k = query.shape[2], key.shape[2]
    q_offset = n_k - n_q
    lengths = None
    if key_valid is not None:
        _, key_index, lengths = real_positions(key_valid, n_q, n_k, query.device)
        query, key, value = (_gather_tokens(x, key_index) for x in (query, key, value))
    cached = cached_block_indices(query, key, params, scaling)
    select = None
    if cached is None:
        select = fused_block_selector(key, scaling=scaling, score=params.score, **params.selection_rule())
    pieces, selections = [], []
    n_blocks = -(-n_k // params.block_size)
    for start, stop in query_ranges(n_q, _kernel_range_length(query, n_k, params)):
        end = q_offset + stop  # keys up to the range's last query
        if cached is not None:
            indices, counts = (x[:, :, start:stop] for x in cached)
        else:
            indices, counts = select(query[:, :, start:stop], end)
        if record:
            selections.append(_listed_to_token_keep(indices, counts, n_blocks))
        pieces.append(
            token_sparse_attention_triton(
                query[:, :, start:stop],
                key[:, :, :end],
                value[:, :, :end],
                indices,
                counts,
                block_size=params.block_size,
                scaling=scaling,
                q_offset=q_offset + start,
                lengths=lengths,
                validate=False,
            )
        )
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
    token_keep = torch.cat(selections, dim=2) if record else None
    if key_valid is None:
        return out, token_keep
    real_index = (key_valid.long().cumsum(-1) - 1).clamp_min(0)  # where each position's token went
    padding = ~key_valid[:, None, :, None]
    if token_keep is not None:  # back to each position; a padded query attends nothing
        token_keep = _gather_tokens(token_keep, real_index).masked_fill(padding, False)
    return _gather_tokens(out, real_index).masked_fill(padding, 0.0), token_keep


def _kernel_range_length(query: torch.Tensor, n_k: int, params: CABParams) -> int:
    """Queries per kernel range: a multiple of the block size whose fp32 partials and selection fit in
    ``_KERNEL_RANGE_BYTES``."""
    batch, heads, _, dim = query.shape
    width, n_blocks = _width(params, n_k), -(-n_k // params.block_size)
    per_token = batch * heads * (width * (dim + 1) * 4 + n_blocks)
    return max(params.block_size, _KERNEL_RANGE_BYTES // per_token // params.block_size * params.block_size)


def run_selection_only(query: torch.Tensor, key: torch.Tensor, params: CABParams, scaling: float) -> int:
    """The selection of one unpadded prefill call alone, range by range exactly as :func:`cab_attention_forward`
    runs it on its route (the fused kernel's lists per kernel range, or the PyTorch rule per executor range), so a
    benchmark can time its share of the call. Returns how many ranges ran (0: the call runs dense)."""
    n_q, n_k = query.shape[2], key.shape[2]
    route = cab_route(
        params, device=query.device, n_q=n_q, n_k=n_k, head_dim=query.shape[-1], dtype=query.dtype, padded=False
    )
    if route.name == "dense":
        return 0
    rule = params.selection_rule()
    if route.name == "torch":
        select = token_block_selector(query, key, scaling=scaling, score=params.score, **rule)
        bounds = query_ranges(n_q, _torch_range_length(query, n_k, params))
        for start, stop in bounds:
            select(start, stop)
    else:
        select_lists = fused_block_selector(key, scaling=scaling, score=params.score, **rule)
        bounds = query_ranges(n_q, _kernel_range_length(query, n_k, params))
        for start, stop in bounds:
            select_lists(query[:, :, start:stop], n_k - n_q + stop)
    return len(bounds)


def _torch_range_length(query: torch.Tensor, n_k: int, params: CABParams) -> int:
    """Queries per range on the PyTorch path (what :func:`attend_selected` takes by default)."""
    n_blocks = -(-n_k // params.block_size)
    return query_range_length(query.shape[0], query.shape[1], query.shape[2], n_blocks, params.block_size)


def _gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x (B, H, N, D)`` with its tokens taken at ``index (B, N)`` per row."""
    return x.gather(2, index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[-1]))


#: id -> weak reference of the configs whose short-prompt warning was given (once per model, not per layer or call;
#: configs are unhashable, and a dead config's id may be reused: the reference tells)
_WARNED_SHORT: dict[int, weakref.ref] = {}


def _warn_if_short(config, params: CABParams, n_k: int) -> None:
    """Say once per model that a prefill ran dense only because it is shorter than ``cab_min_seq_len`` (a user who
    asked for sparsity would otherwise see logits identical to dense attention and no word why)."""
    if n_k > params.min_seq_len:
        return
    seen = _WARNED_SHORT.get(id(config))
    if (seen is not None and seen() is config) or runs_dense(replace(params, min_seq_len=0), n_k, n_k):
        return  # told already (every later layer and call lands here first), or dense by its budget anyway
    _WARNED_SHORT[id(config)] = weakref.ref(config)
    warnings.warn(
        f"CAB ran dense attention: the prompt has {n_k} tokens, at most cab_min_seq_len={params.min_seq_len} "
        "(prompts that short run dense by design); set cab_min_seq_len=0 (enable_cab(model, min_seq_len=0)) to "
        "apply the sparsity to short prompts too. This warning is given once per model.",
        UserWarning,
        stacklevel=2,
    )


def runs_dense(params: CABParams, n_q: int, n_k: int) -> bool:
    """Whether a call with ``n_q`` queries over ``n_k`` keys runs dense attention: every token would keep every
    visible block (all before ``cab_min_seq_len``, a row budget at sparsity 0, or a top-k budget covering every
    block), or a dense decode step."""
    if params.budget == "row":
        every_block = params.sparsity == 0
    else:  # a budget of at least every block the last token sees
        every_block = params.topk * params.block_size >= n_k
    every_block = every_block or n_k <= params.min_seq_len
    return every_block or (n_q < n_k and params.decode == "dense")


def _key_padding_from_mask(mask: torch.Tensor, q_offset: int) -> torch.Tensor:
    """A causal + key-padding bool ``(B, 1|H, Nq, Nk)`` mask → its ``(B, Nk)`` key mask (True = real token).

    The last query row sees every key up to the newest, so it *is* the key mask; the whole mask must then equal
    causality & that row (one pass over a mask transformers has already materialised). Other masks (sliding
    windows, custom 4-D masks) raise: CAB's blocks are laid over the real tokens of a causal sequence.
    """
    n_q, n_k = mask.shape[-2:]
    key_valid = mask[:, 0, -1, :]
    causal = (q_offset + torch.arange(n_q, device=mask.device))[:, None] >= torch.arange(n_k, device=mask.device)
    if not torch.equal(mask, (causal & key_valid[:, None, None, :]).expand(mask.shape)):
        raise ValueError(
            "CAB attention takes causal masks with key padding only; this call's attention mask is neither "
            "(e.g. a sliding window or a custom 4-D mask): use another attn_implementation for it"
        )
    return key_valid


def select_cab_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    params: CABParams,
    scaling: float,
    q_offset: int | None = None,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-token selection CAB attends over: ``(B, H, Nq, Mk)`` bool, query token t attends key block j.

    ``query (B, H, Nq, D)`` are the last ``Nq`` of the ``Nk`` positions of ``key (B, Hk, Nk, D)`` (``q_offset``,
    if given, must be ``Nk - Nq``); ``key_valid (B, Nk)`` marks real tokens. See
    :mod:`hf_icl.kernels.token_selection.rule`. (The attention call itself never holds this whole tensor: it selects
    range by range, or as block lists.)
    """
    _check_offset(query, key, q_offset)
    backend = params.backend
    n_blocks = -(-key.shape[2] // params.block_size)
    if backend == "triton" and fused_selection_unsupported(query, n_blocks, params.policy, params.budget, key_valid):
        backend = "torch"  # a selection the fused kernel cannot run (padding, oracle) stays on PyTorch
    return select_token_blocks(
        query,
        key,
        scaling=scaling,
        score=params.score,
        key_valid=key_valid,
        backend=backend,
        **params.selection_rule(),
    )


def select_cab_block_indices(
    query: torch.Tensor,
    key: torch.Tensor,
    params: CABParams,
    scaling: float,
    key_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same selection as block lists: ``indices (B, H, Nq, W)`` int32 (ascending kept block ids, the first
    ``counts`` valid, the rest repeating the last) and ``counts (B, H, Nq)`` int32; ``W`` is
    :func:`~hf_icl.kernels.token_selection.fused.selection_width`. On CUDA (and unpadded) the fused kernel emits
    them directly; elsewhere the PyTorch rule runs range by range and each range's bool selection is listed."""
    n_q, n_k = query.shape[2], key.shape[2]
    n_blocks = -(-n_k // params.block_size)
    rule = params.selection_rule()
    unfused = fused_selection_unsupported(query, n_blocks, params.policy, params.budget, key_valid)
    if params.backend != "torch" and unfused is None and (query.is_cuda or params.backend == "triton"):
        return select_token_blocks_fused(query, key, scaling=scaling, score=params.score, **rule)
    if params.backend == "triton" and unfused is not None:
        raise ValueError(f"cab_backend='triton' cannot run this selection: {unfused}")
    width = _width(params, n_k) if params.policy != "oracle" else n_blocks
    select = token_block_selector(query, key, scaling=scaling, score=params.score, key_valid=key_valid, **rule)
    ranges = query_ranges(n_q, _torch_range_length(query, n_k, params))
    pieces = [keep_to_indices(select(start, stop), width) for start, stop in ranges]
    return torch.cat([p[0] for p in pieces], dim=2), torch.cat([p[1] for p in pieces], dim=2)


def _width(params: CABParams, n_k: int) -> int:
    n_blocks = -(-n_k // params.block_size)
    names = ("block_size", "policy", "budget", "sparsity", "topk", "sink_blocks", "local_blocks", "min_seq_len")
    return selection_width(n_blocks, n_keys=n_k, **{name: getattr(params, name) for name in names})


def _check_offset(query, key, q_offset) -> None:
    if q_offset is not None and q_offset != key.shape[2] - query.shape[2]:
        raise ValueError(
            f"q_offset must be Nk - Nq = {key.shape[2] - query.shape[2]} (queries are the last positions), "
            f"got {q_offset}"
        )


def register_cab() -> None:
    """Register ``"cab"`` with transformers (attention function + its mask function)."""
    AttentionInterface.register(NAME, cab_attention_forward)
    # With sdpa's mask function transformers hands us a bool mask when padding needs one, and
    # None otherwise (then causality is ours to apply, which the executor always does).
    AttentionMaskInterface.register(NAME, sdpa_mask)


def enable_cab(model, **hyperparameters):
    """Switch ``model`` (any transformers model using the attention interface) to CAB attention.

    Keyword arguments are the ``cab_*`` fields without the prefix (``sparsity``, ``block_size``,
    ``policy``, ``score``, ``lam``, ``budget``, ``topk``, ``sink_blocks``, ``local_blocks``, ``min_seq_len``,
    ``decode``, ``magnitude_fraction``, ``backend``); they are validated and stored on ``model.config``. Without
    ``budget``, a ``sparsity`` alone selects the row budget (that fraction of each token's visible blocks dropped)
    and a ``topk`` alone the top-k budget; with neither, the model keeps its budget (by default top-k, 16 blocks
    per query token, sink and local window included). A model
    that generates also gets :func:`~.cab_cache.use_cab_cache`: ``generate`` then keeps CAB's key-block summaries
    in its cache, so a decode step no longer re-summarises the whole cache.
    """
    if not hasattr(model, "config") or not hasattr(model, "set_attn_implementation"):
        raise ValueError(
            f"model must be a transformers PreTrainedModel (with .config and .set_attn_implementation), "
            f"got {type(model).__name__}"
        )
    allowed = list(CABParams.__dataclass_fields__)
    unknown = [name for name in hyperparameters if name not in allowed]
    if unknown:
        raise ValueError(unknown_name_message("enable_cab got an unknown keyword", unknown, allowed))
    current = asdict(CABParams.from_config(model.config))
    if "budget" not in hyperparameters:  # a sparsity alone means the row budget, a block count alone top-k
        given = [name for name in ("sparsity", "topk") if name in hyperparameters]
        if len(given) == 2:
            raise ValueError(
                f"enable_cab got sparsity={hyperparameters['sparsity']} and topk={hyperparameters['topk']} without "
                "budget: pass budget='row' (a fraction of each token's visible blocks) or budget='topk' (blocks)"
            )
        if given:
            current["budget"] = "row" if given == ["sparsity"] else "topk"
    params = CABParams(**{**current, **hyperparameters})
    for field, value in params.to_config_fields().items():
        setattr(model.config, field, value)
    model.set_attn_implementation(NAME)
    if hasattr(model, "_prepare_cache_for_generation"):  # generate decodes from cached block summaries
        use_cab_cache(model)
    return model
