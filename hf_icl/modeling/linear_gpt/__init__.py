from .configuration_linear_gpt import LinearGPTConfig
from .modeling_linear_gpt import (
    LinearAttentionCache,
    LinearGPTForCausalLM,
    LinearGPTForInContextRegression,
    LinearGPTModel,
    LinearGPTPreTrainedModel,
)
