"""The functional-GD transformer for categorical in-context learning (seed 004): blocks of two-head
self-attention and cross-attention to the class embeddings that compute functional gradient descent exactly
(:meth:`GDTransformerForInContextClassification.from_gd_construction`) or train from scratch, the
functional-GD references (:func:`functional_gd_logits`, the document's on the whole context, and
:func:`causal_functional_gd_logits`, the causal variant), and the functional-GD language model
(:class:`GDTransformerForCausalLM`, the document's TinyStories model) with its generation cache."""

from .configuration_gd_language_model import QK_FORMS, GDLanguageModelConfig
from .configuration_gd_transformer import CONTEXT_ATTENTION, SIZE_PRESETS, GDTransformerConfig
from .functional_gd import (
    KERNELS,
    causal_functional_gd_logits,
    context_query_masks,
    expected_embedding,
    functional_gd_logits,
    functional_gd_step,
    kernel_scores,
    kernel_weights,
    prefix_masks,
    squared_distances,
)
from .layers import GDFeedForward
from .modeling_gd_language_model import (
    GDLanguageModelCache,
    GDLanguageModelCacheLayer,
    GDLanguageModelPreTrainedModel,
    GDPositionKernel,
    GDStep,
    GDTransformerForCausalLM,
    attention_parameter_counts,
)
from .modeling_gd_transformer import (
    CONSTRUCTION_ERASE_TEMPERATURE,
    GDClassEmbedding,
    GDCrossAttention,
    GDSelfAttention,
    GDTransformerBlock,
    GDTransformerForInContextClassification,
    GDTransformerPreTrainedModel,
    construction_parameters,
    distance_to_construction,
)
