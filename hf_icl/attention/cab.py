"""CAB as a transformers attention implementation: ``attn_implementation="cab"``.

Per layer and head: coarsen Q and K to one max-L2 row per block, score blocks causally, select
blocks with a policy (FRC, magnitude, hybrid, …) at the configured sparsity, then run exact
softmax attention over the selected key blocks only. Hyperparameters live on ``model.config``
as ``cab_*`` fields, so they survive ``save_pretrained``.

On CUDA (``cab_backend="auto"``) the sparse attention runs the Triton kernels: the flash-style
prefill kernel with its backward (so CAB can be fine-tuned) and the split-K decode kernel. The
PyTorch path (gathered blocks + SDPA) serves CPU tensors, attention dropout, head dims the kernels
do not cover and masks other than causal + key padding.

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
from ..kernels.block_sparse_reference import block_sparse_attention
from ..kernels.coarsen import coarsen_max_l2
from ..validation import check_choice, check_float, check_int
from .selection import (
    SELECTION_POLICIES,
    block_scores,
    causal_block_mask,
    reference_cab_v3_selection,
    select_blocks,
    true_block_mass,
)

NAME = "cab"
#: "reference" runs the research document's own (non-causal) selection, for honest comparisons;
#: "oracle" ranks blocks by their true attention mass (dense O(N²) scores: an evaluation upper bound, not a speed-up)
POLICIES = tuple(sorted(SELECTION_POLICIES)) + ("reference",)
BUDGETS = ("row", "global")
DECODE_MODES = ("sparse", "dense")


@dataclass(frozen=True)
class CABParams:
    """The ``cab_*`` fields of a model config, validated. Defaults apply to absent fields."""

    sparsity: float = 0.9
    block_size: int = 64
    policy: str = "hybrid"
    lam: float = 0.5
    budget: str = "row"
    sink_blocks: int = 1
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
        check_choice("cab_policy", self.policy, POLICIES)
        check_float("cab_lambda", self.lam, low=0.0)
        check_choice("cab_budget", self.budget, BUDGETS)
        check_int("cab_sink_blocks", self.sink_blocks, low=0)
        check_int("cab_min_seq_len", self.min_seq_len, low=0)
        check_choice("cab_decode", self.decode, DECODE_MODES)
        check_float("cab_magnitude_fraction", self.magnitude_fraction, low=0.0, high=1.0)
        check_choice("cab_backend", self.backend, BACKENDS)

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
    misaligned = n_q > 1 and q_offset % params.block_size  # chunked prefill not on a block boundary
    dense_decode = n_q < n_k and (params.decode == "dense" or params.policy == "reference")
    if n_k < params.min_seq_len or params.sparsity == 0 or misaligned or dense_decode:
        out = _dense_causal(
            query, expand_kv(key, query.shape[1]), expand_kv(value, query.shape[1]), mask, scaling, q_offset, dropout
        )
        return out.transpose(1, 2).contiguous(), None
    keep = select_cab_blocks(query, key, params, scaling, q_offset)
    sparse = {"block_size": params.block_size, "scaling": scaling, "q_offset": q_offset}
    key_padding = _kernel_key_padding(query, mask, params.backend, dropout, q_offset)
    if key_padding is not _NO_KERNEL:
        if n_q == 1:
            out = block_sparse_decode(query, key, value, keep, key_padding_mask=key_padding, backend="triton", **sparse)
        else:
            out = block_sparse_flash_attention(
                query, key, value, keep, key_padding_mask=key_padding, backend="triton", **sparse
            )
    else:
        heads = query.shape[1]
        out = block_sparse_attention(
            query, expand_kv(key, heads), expand_kv(value, heads), keep, attention_mask=mask, dropout=dropout, **sparse
        )
    return out.transpose(1, 2).contiguous(), None


#: returned by :func:`_kernel_key_padding` when the PyTorch path must run
_NO_KERNEL = object()


def _kernel_key_padding(query: torch.Tensor, mask: torch.Tensor | None, backend: str, dropout: float, q_offset: int):
    """The kernels' ``(B, Nk)`` key padding mask (None: no padding), or ``_NO_KERNEL`` to take the PyTorch path.

    ``backend="auto"`` takes the kernels when they can run this call exactly; ``"triton"`` insists and raises a
    ``ValueError`` naming what stands in the way.
    """
    if resolve_backend(backend, query) == "reference":
        return _NO_KERNEL
    reason = None
    if dropout:
        reason = f"attention dropout ({dropout}) is not implemented in the kernels; use model.eval() or dropout 0"
    elif query.shape[-1] not in HEAD_DIMS:
        reason = f"head_dim must be one of {list(HEAD_DIMS)}, got {query.shape[-1]}"
    key_padding = None if mask is None or reason else _key_padding_from_mask(mask, q_offset)
    if key_padding is _NO_KERNEL:
        reason = "the attention mask is not causal + key padding (e.g. a sliding window or a custom 4-D mask)"
    if reason is None:
        return key_padding
    if backend == "triton":
        raise ValueError(f"cab_backend='triton' cannot run this call: {reason}")
    return _NO_KERNEL


def _key_padding_from_mask(mask: torch.Tensor, q_offset: int):
    """A causal + key-padding bool ``(B, 1|H, Nq, Nk)`` mask → its ``(B, Nk)`` key mask; else ``_NO_KERNEL``.

    The last query row sees every key up to the newest, so it *is* the key mask; the whole mask must then equal
    causality & that row (one pass over a mask transformers has already materialised).
    """
    n_q, n_k = mask.shape[-2:]
    key_valid = mask[:, 0, -1, :]
    causal = (q_offset + torch.arange(n_q, device=mask.device))[:, None] >= torch.arange(n_k, device=mask.device)
    if not torch.equal(mask, (causal & key_valid[:, None, None, :]).expand(mask.shape)):
        return _NO_KERNEL
    return key_valid


def select_cab_blocks(query, key, params: CABParams, scaling: float, q_offset: int = 0) -> torch.Tensor:
    """Coarsen, score and select: the ``(B, H, Mq, Mk)`` bool block mask CAB attends over.

    ``policy="reference"`` (prefill only) is the document's ``run_cab_v3_pipeline`` selection: it scores
    future blocks and applies causality only afterwards, so an early query's block choice depends on
    later tokens. We add each row's diagonal block to it (the document does not), so no row is empty.
    """
    key = expand_kv(key, query.shape[1])  # grouped-query attention: each query head scores its KV head
    if params.policy == "reference":
        keep = reference_cab_v3_selection(query, key, params.sparsity, params.block_size, coarsen_max_l2)
        return keep | torch.eye(keep.shape[-1], dtype=torch.bool, device=keep.device)
    q_coarse, k_coarse = coarsen_max_l2(query, key, params.block_size)
    causal = causal_block_mask(q_coarse.shape[2], k_coarse.shape[2], q_offset // params.block_size, query.device)
    if params.policy == "oracle":
        scores = true_block_mass(query, key, scaling, params.block_size, q_offset)
    else:
        scores = block_scores(q_coarse, k_coarse, scaling, causal)
    return select_blocks(
        scores,
        causal,
        policy=params.policy,
        sparsity=params.sparsity,
        budget=params.budget,
        sink_blocks=params.sink_blocks,
        lam=params.lam,
        magnitude_fraction=params.magnitude_fraction,
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
    ``policy``, ``lam``, ``budget``, ``sink_blocks``, ``min_seq_len``, ``decode``,
    ``magnitude_fraction``, ``backend``); they are validated and stored on ``model.config``.
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
    return model
