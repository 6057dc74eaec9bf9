"""CAB as a transformers attention implementation: ``attn_implementation="cab"``.

Per layer and head: coarsen Q and K to one max-L2 row per block, score blocks causally, select
blocks with a policy (FRC, magnitude, hybrid, …) at the configured sparsity, then run exact
softmax attention over the selected key blocks only. Hyperparameters live on ``model.config``
as ``cab_*`` fields, so they survive ``save_pretrained``.

    >>> import hf_icl                                   # registers "cab"
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2))
    >>> model = hf_icl.enable_cab(model, sparsity=0.9, block_size=16)
    >>> model.config._attn_implementation, model.config.cab_sparsity
    ('cab', 0.9)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..kernels.coarsen import coarsen_max_l2
from ..validation import check_choice, check_float, check_int
from .block_sparse import block_sparse_attention
from .selection import (
    SELECTION_POLICIES,
    block_scores,
    causal_block_mask,
    reference_cab_v3_selection,
    select_blocks,
)

NAME = "cab"
#: "reference" runs the research document's own (non-causal) selection, for honest comparisons
POLICIES = tuple(sorted(p for p in SELECTION_POLICIES if p != "oracle")) + ("reference",)
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

    @classmethod
    def from_config(cls, config) -> CABParams:
        defaults = cls.__dataclass_fields__
        return cls(**{name: getattr(config, config_field(name), defaults[name].default) for name in defaults})

    def to_config_fields(self) -> dict:
        return {config_field(name): value for name, value in asdict(self).items()}


def config_field(name: str) -> str:
    return "cab_lambda" if name == "lam" else f"cab_{name}"


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
    if key.shape[1] != query.shape[1]:  # grouped-query attention: share each K/V head
        repeats = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(repeats, dim=1), value.repeat_interleave(repeats, dim=1)
    n_q, n_k = query.shape[2], key.shape[2]
    q_offset = n_k - n_q
    mask = _bool_mask(attention_mask)
    misaligned = n_q > 1 and q_offset % params.block_size  # chunked prefill not on a block boundary
    dense_decode = n_q < n_k and (params.decode == "dense" or params.policy == "reference")
    if n_k < params.min_seq_len or params.sparsity == 0 or misaligned or dense_decode:
        out = _dense_causal(query, key, value, mask, scaling, q_offset, dropout)
    else:
        keep = select_cab_blocks(query, key, params, scaling, q_offset)
        out = block_sparse_attention(
            query,
            key,
            value,
            keep,
            block_size=params.block_size,
            scaling=scaling,
            q_offset=q_offset,
            attention_mask=mask,
            dropout=dropout,
        )
    return out.transpose(1, 2).contiguous(), None


def select_cab_blocks(query, key, params: CABParams, scaling: float, q_offset: int = 0) -> torch.Tensor:
    """Coarsen, score and select: the ``(B, H, Mq, Mk)`` bool block mask CAB attends over.

    ``policy="reference"`` (prefill only) is the document's ``run_cab_v3_pipeline`` selection: it scores
    future blocks and applies causality only afterwards, so an early query's block choice depends on
    later tokens. We add each row's diagonal block to it (the document does not), so no row is empty.
    """
    if params.policy == "reference":
        keep = reference_cab_v3_selection(query, key, params.sparsity, params.block_size, coarsen_max_l2)
        return keep | torch.eye(keep.shape[-1], dtype=torch.bool, device=keep.device)
    q_coarse, k_coarse = coarsen_max_l2(query, key, params.block_size)
    causal = causal_block_mask(q_coarse.shape[2], k_coarse.shape[2], q_offset // params.block_size, query.device)
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
    ``magnitude_fraction``); they are validated and stored on ``model.config``.
    """
    current = CABParams.from_config(model.config)
    params = CABParams(**{**asdict(current), **hyperparameters})
    for field, value in params.to_config_fields().items():
        setattr(model.config, field, value)
    model.set_attn_implementation(NAME)
    return model
