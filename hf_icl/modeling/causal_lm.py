"""What the package's causal language models (the GD language model, the linear-attention GPT) share around
``generate``: both make their own cache in ``forward`` (never transformers' ``DynamicCache``), check the prompt before
generating, keep the logits of ``logits_to_keep`` positions and take the next-token loss of every position."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import GenerationMixin
from transformers.cache_utils import Cache

from .lm_inputs import check_generate_inputs


def _map_rows(owner, rows: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Apply ``rows`` to every tensor of ``owner.row_tensors`` (each attribute None, a tensor or a tuple of them)."""
    for name in owner.row_tensors:
        value = getattr(owner, name)
        if isinstance(value, tuple):
            setattr(owner, name, tuple(rows(x) for x in value))
        elif value is not None:
            setattr(owner, name, rows(value))


def _select(indices: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.index_select(0, indices.to(x.device))


def _repeat(repeats: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.repeat_interleave(repeats, dim=0)


class ModelOwnCacheLayer:
    """One layer of a :class:`ModelOwnCache`. ``row_tensors`` names the attributes that hold its tensors, batch
    first (None while empty, a tensor, or a tuple of tensors): beam search selects and expands their rows, ``reset``
    empties them."""

    row_tensors: tuple[str, ...] = ()
    is_compileable = False
    supports_early_init = False  # transformers' early init allocates key/value tensors, which these layers have none of

    def reset(self) -> None:
        for name in self.row_tensors:
            setattr(self, name, None)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        _map_rows(self, _select(indices))

    def batch_repeat_interleave(self, repeats: int) -> None:
        _map_rows(self, _repeat(repeats))

    def get_max_length(self) -> int:
        return -1

    def offload(self) -> None: ...

    def prefetch(self) -> None: ...


class ModelOwnCache(Cache):
    """A generation cache the model builds and updates itself: beam search reorders it through
    ``batch_select_indices``, and it is not compileable (which also keeps ``generate`` from building 4-D attention
    masks for it). ``generate`` needs no argument: the model creates its cache on its first forward with
    ``use_cache``.

    Besides its layers (:class:`ModelOwnCacheLayer`), ``row_tensors`` names the attributes that hold per-row tensors
    of the whole cache, batch first (None while empty): selected and expanded with the layers, emptied by ``reset``;
    the first one gives ``batch_size``."""

    row_tensors: tuple[str, ...] = ()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        _map_rows(self, _select(indices))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        _map_rows(self, _repeat(repeats))

    def reset(self) -> None:
        super().reset()
        for name in self.row_tensors:
            setattr(self, name, None)

    @property
    def batch_size(self) -> int:
        rows = getattr(self, self.row_tensors[0])
        return -1 if rows is None else rows.shape[0]

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
