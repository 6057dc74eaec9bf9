"""What the package's causal language models (the GD language model, the linear-attention GPT) share around
``generate``: both make their own cache in ``forward`` (never transformers' ``DynamicCache``), check the prompt before
generating, keep the logits of ``logits_to_keep`` positions and take the next-token loss of every position."""

from __future__ import annotations

import torch
from transformers import GenerationMixin
from transformers.cache_utils import Cache

from .lm_inputs import check_generate_inputs


class ModelOwnCache(Cache):
    """A generation cache the model builds and updates itself: beam search reorders it through
    ``batch_select_indices``, and it is not compileable (which also keeps ``generate`` from building 4-D attention
    masks for it)."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    @property
    def is_compileable(self) -> bool:
        return False


class CheckedGenerationMixin(GenerationMixin):
    """transformers' ``GenerationMixin`` for a model whose ``forward`` makes its own cache (a :class:`ModelOwnCache`)
    and whose config has ``vocab_size`` and ``n_positions``; ``generate`` checks the prompt first."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate must not make a DynamicCache: forward makes the model's own cache
        return False

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """transformers' ``generate``, with the prompt's ids, its ``attention_mask`` and ``max_new_tokens`` checked
        first (:func:`~hf_icl.modeling.lm_inputs.check_generate_inputs`)."""
        check_generate_inputs(inputs, kwargs, self.config.vocab_size, self.config.n_positions)
        return super().generate(inputs, generation_config, **kwargs)

    @staticmethod
    def kept_positions(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
        """``hidden (B, T, ...)`` at the positions whose logits are kept: an int keeps the last that many (0: all), a
        tensor the positions it lists."""
        if isinstance(logits_to_keep, int):
            return hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return hidden[:, logits_to_keep]

    def next_token_loss(
        self, logits: torch.Tensor, labels: torch.LongTensor | None, num_items_in_batch=None
    ) -> torch.Tensor | None:
        """The mean cross-entropy of predicting ``labels[:, t + 1]`` at ``t`` (None without labels); the logits must
        cover every position."""
        if labels is None:
            return None
        if logits.shape[1] != labels.shape[1]:
            raise ValueError(f"labels {tuple(labels.shape)} need the logits of every position (logits_to_keep=0)")
        return self.loss_function(logits, labels, self.config.vocab_size, num_items_in_batch=num_items_in_batch)
