"""The functional-GD transformer for categorical in-context learning (seed 004): blocks of two-head
self-attention and cross-attention to the class embeddings that compute functional gradient descent exactly
(:meth:`GDTransformerForInContextClassification.from_gd_construction`) or train from scratch, and the
functional-GD reference itself (:func:`functional_gd_logits`)."""

from .configuration_gd_transformer import SIZE_PRESETS, GDTransformerConfig
from .functional_gd import (
    KERNELS,
    expected_embedding,
    functional_gd_logits,
    functional_gd_step,
    kernel_scores,
    kernel_weights,
    squared_distances,
)
from .modeling_gd_transformer import (
    CONSTRUCTION_ERASE_TEMPERATURE,
    GDClassEmbedding,
    GDCrossAttention,
    GDFeedForward,
    GDSelfAttention,
    GDTransformerBlock,
    GDTransformerForInContextClassification,
    GDTransformerPreTrainedModel,
    construction_parameters,
    distance_to_construction,
)
