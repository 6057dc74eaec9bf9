"""The kernel-regression document's in-context learner (seed 000): a learned attention head as a kernel smoother,
with the softmax, cosine, Cayley or GA row kernel and optional GA column attention."""

from .configuration_kernel_icl import DEFAULT_TEMPERATURES, SIZE_PRESETS, KernelICLConfig
from .modeling_kernel_icl import (
    KernelICLColumnAttention,
    KernelICLForInContextRegression,
    KernelICLPreTrainedModel,
)
