"""CAB as a transformers attention implementation: ``attn_implementation="cab"``.

Per layer and head, every query token picks its own key blocks from the complete blocks before its own
(:mod:`.token_selection`: causal by construction, so teacher-forced logits equal step-by-step generation), always
keeping its own block and the sink blocks; then exact softmax attention runs over the chosen blocks only. Blocks,
sinks and budgets are laid over each row's real tokens, so a padded batch gives what each row gives alone.
Hyperparameters live on ``model.config`` as ``cab_*`` fields, so they survive ``save_pretrained``.

The PyTorch path (query tiles gather the union of their tokens' blocks, then mask per token) runs everywhere. On
CUDA (``cab_backend="auto"``) the Triton kernels run what they can express exactly: decode steps (one query, so
per-token and per-block selection coincide) and prefill under selections that are uniform within a block
(``streaming``, ``dense``), both without padding.

    >>> import hf_icl                                   # registers "cab"
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2))
    >>> model = hf_icl.enable_cab(model, sparsity=0.9, block_size=16)
    >>> model.config._attn_implementation, model.config.cab_sparsity
    ('cab', 0.9)
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..kernels._common import BACKENDS, resolve_backend
from ..kernels.block_sparse_attention import HEAD_DIMS, expand_kv
from ..kernels.block_sparse_backward import block_sparse_flash_attention
from ..kernels.block_sparse_decode import block_sparse_decode
from ..kernels.block_sparse_reference import token_sparse_attention
from ..kernels.token_selection_triton import fused_selection_unsupported
from ..validation import check_choice, check_float, check_int
from .token_selection import SCORES, TOKEN_POLICIES, select_token_blocks

NAME = "cab"
#: "oracle" ranks blocks by their true attention mass (dense O(N²) scores: an evaluation upper bound, not a speed-up)
POLICIES = TOKEN_POLICIES
BUDGETS = ("row", "topk")
DECODE_MODES = ("sparse", "dense")
#: selections identical for every token of a block (their kernels' prefill can run them)
_BLOCK_UNIFORM = ("streaming", "dense")
#: values that earlier releases accepted and that cannot be causal, with why
_NOT_CAUSAL = {
    ("cab_budget", "global"): "one top-k over all rows lets later tokens change earlier tokens' blocks",
    ("cab_policy", "reference"): (
        "the document's selection scores future blocks; it is kept for analysis as "
        "hf_icl.attention.reference_cab_v3_selection"
    ),
}


@dataclass(frozen=True)
class CABParams:
    """The ``cab_*`` fields of a model config, validated. Defaults apply to absent fields."""

    sparsity: float = 0.9
    block_size: int = 64
    # the best measured on SmolLM2 passkey retrieval (docs/results/niah.md): magnitude ranking of mean-key scores
    policy: str = "magnitude"
    score: str = "mean"
    lam: float = 0.5
    budget: str = "row"
    topk: int = 8
    sink_blocks: int = 1
    # 1: a token's own block is its local window; 2 adds the block before it (tokens early in their block then
    # still see up to a block of local context: SmolLM2's perplexity at 90 % went 1.70× → 1.33× dense)
    local_blocks: int = 1
    min_seq_len: int = 1024
    decode: str = "sparse"
    magnitude_fraction: float = 0.5
    backend: str = "auto"

    def __post_init__(self):
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
        check_choice("cab_backend", self.backend, BACKENDS)

    def selection_rule(self) -> dict:
        """The fields of the per-token selection rule (:func:`.token_selection.apply_selection_rule`'s keywords)."""
        names = ("block_size", "policy", "budget", "sparsity", "topk", "sink_blocks", "local_blocks", "min_seq_len")
        return {name: getattr(self, name) for name in (*names, "lam", "magnitude_fraction")}

    @classmethod
    def from_config(cls, config) -> CABParams:
        """The validated ``cab_*`` fields of ``config``; a ``cab_*`` attribute CAB does not know (a typo such as
        ``config.cab_sparsty = 0.5``, which would otherwise run with the default) raises ``ValueError``."""
        defaults = cls.__dataclass_fields__
        stray = [key for key in getattr(config, "__dict__", {}) if key.startswith("cab_") and key not in _CONFIG_FIELDS]
        if stray:
            raise ValueError(_unknown_message("model.config has an unknown CAB field", stray, sorted(_CONFIG_FIELDS)))
        return cls(**{name: getattr(config, config_field(name), defaults[name].default) for name in defaults})

    def to_config_fields(self) -> dict:
        return {config_field(name): value for name, value in asdict(self).items()}


def config_field(name: str) -> str:
    return "cab_lambda" if name == "lam" else f"cab_{name}"


#: the ``cab_*`` config fields, one per :class:`CABParams` field
_CONFIG_FIELDS = frozenset(config_field(name) for name in CABParams.__dataclass_fields__)


def _unknown_message(what: str, unknown: list[str], allowed: list[str]) -> str:
    """``{what} 'x'; did you mean 'y'?`` for each unknown name, then the allowed names."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), allowed, n=2, cutoff=0.6)
        parts.append(f"{what} {name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    return "; ".join(parts) + f"; allowed: {', '.join(allowed)}"


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
    params = CABParams.from_config(module.config)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    dropout = dropout if module.training else 0.0
    n_q, n_k = query.shape[2], key.shape[2]
    q_offset = n_k - n_q
    mask = _bool_mask(attention_mask)
    key_valid = None if mask is None else _key_padding_from_mask(mask, q_offset)
    if runs_dense(params, n_q, n_k):
        heads = query.shape[1]
        out = _dense_causal(query, expand_kv(key, heads), expand_kv(value, heads), mask, scaling, q_offset, dropout)
        return out.transpose(1, 2).contiguous(), None
    from .cab_cache import cached_block_selection  # cab_cache builds on this module

    # decode / chunked prefill on a CABCache: select from its incrementally kept block summaries
    token_keep = cached_block_selection(query, key, params, scaling, key_valid)
    if token_keep is None:
        token_keep = select_cab_blocks(query, key, params, scaling, key_valid=key_valid)
    kernel = _kernel_route(query, params, key_valid, dropout, q_offset)
    # streaming picks by position alone, so every head of a KV group keeps the same blocks and one program can serve
    # the group; the score policies select per query head (and detecting sharing would cost a device sync)
    shared = params.policy in _HEAD_INDEPENDENT
    sparse = {
        "block_size": params.block_size,
        "scaling": scaling,
        "q_offset": q_offset,
        "validate": False,
        "group_heads": shared,
    }
    if kernel == "decode":
        out = block_sparse_decode(query, key, value, token_keep, backend="triton", **sparse)
    elif kernel == "prefill":  # block-uniform: the first token of each query block speaks for the block
        keep = token_keep[:, :, :: params.block_size]
        out = block_sparse_flash_attention(query, key, value, keep, backend="triton", **sparse)
    else:
        out = token_sparse_attention(
            query,
            key,
            value,
            token_keep,
            block_size=params.block_size,
            scaling=scaling,
            key_valid=key_valid,
            dropout=dropout,
        )
    return out.transpose(1, 2).contiguous(), None


#: policies whose selection does not depend on the query head
_HEAD_INDEPENDENT = ("dense", "streaming")


def runs_dense(params: CABParams, n_q: int, n_k: int) -> bool:
    """Whether a call with ``n_q`` queries over ``n_k`` keys runs dense attention: every token would keep every
    visible block (all before ``cab_min_seq_len``, or a row budget at sparsity 0), or a dense decode step."""
    every_block = n_k <= params.min_seq_len or (params.budget == "row" and params.sparsity == 0)
    return every_block or (n_q < n_k and params.decode == "dense")


def _kernel_route(query: torch.Tensor, params: CABParams, key_valid, dropout: float, q_offset: int) -> str | None:
    """``"decode"`` / ``"prefill"`` when a Triton kernel runs this call exactly, else None (the PyTorch path).

    ``cab_backend="auto"`` takes a kernel when one can; ``"triton"`` insists and raises a ``ValueError`` naming
    what stands in the way.
    """
    if resolve_backend(params.backend, query) == "reference":
        return None
    n_q, block_size = query.shape[2], params.block_size
    uniform = params.policy in _BLOCK_UNIFORM and params.min_seq_len % block_size == 0
    reason = None
    if dropout:
        reason = f"attention dropout ({dropout}) is not implemented in the kernels; use model.eval() or dropout 0"
    elif query.shape[-1] not in HEAD_DIMS:
        reason = f"head_dim must be one of {list(HEAD_DIMS)}, got {query.shape[-1]}"
    elif key_valid is not None:
        reason = "padded batches run on the PyTorch path (blocks are laid over each row's real tokens)"
    elif n_q > 1 and not uniform:
        reason = (
            f"cab_policy={params.policy!r} selects per token; the prefill kernel takes one selection per query block "
            f"(policies {', '.join(_BLOCK_UNIFORM)} with cab_min_seq_len a multiple of cab_block_size)"
        )
    elif n_q > 1 and q_offset % block_size:
        reason = f"chunked prefill starting at position {q_offset}, not a multiple of cab_block_size={block_size}"
    if reason is None:
        return "decode" if n_q == 1 else "prefill"
    if params.backend == "triton":
        raise ValueError(f"cab_backend='triton' cannot run this call: {reason}")
    return None


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
    if given, must be ``Nk - Nq``); ``key_valid (B, Nk)`` marks real tokens. See :mod:`.token_selection`.
    """
    if q_offset is not None and q_offset != key.shape[2] - query.shape[2]:
        raise ValueError(
            f"q_offset must be Nk - Nq = {key.shape[2] - query.shape[2]} (queries are the last positions), "
            f"got {q_offset}"
        )
    backend = params.backend
    n_blocks = -(-key.shape[2] // params.block_size)
    if backend == "triton" and fused_selection_unsupported(query, n_blocks, params.policy, params.budget, key_valid):
        # cab_backend="triton" insists on the attention kernels (_kernel_route says what stops them); a selection
        # the fused kernel cannot run (padding, oracle) stays on PyTorch
        backend = "reference"
    return select_token_blocks(
        query,
        key,
        scaling=scaling,
        score=params.score,
        key_valid=key_valid,
        backend=backend,
        **params.selection_rule(),
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
    ``decode``, ``magnitude_fraction``, ``backend``); they are validated and stored on ``model.config``. A model
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
        raise ValueError(_unknown_message("enable_cab got an unknown keyword", unknown, allowed))
    current = CABParams.from_config(model.config)
    params = CABParams(**{**asdict(current), **hyperparameters})
    for field, value in params.to_config_fields().items():
        setattr(model.config, field, value)
    model.set_attn_implementation(NAME)
    if hasattr(model, "_prepare_cache_for_generation"):  # generate decodes from cached block summaries
        from .cab_cache import use_cab_cache  # cab_cache builds on this module

        use_cab_cache(model)
    return model
