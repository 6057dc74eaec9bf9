"""ICL architectures as transformers configs + PreTrainedModels, registered with the Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .config_fields import check_config_kwargs
from .gd_transformer import (
    GDLanguageModelConfig,
    GDTransformerConfig,
    GDTransformerForCausalLM,
    GDTransformerForInContextClassification,
    attention_parameter_counts,
    causal_functional_gd_logits,
    functional_gd_logits,
)
from .gpt2_icl import SIZE_PRESETS, GPT2ForInContextRegression, GPT2ICLConfig, GPT2ICLModel
from .heads import ICLHead, ICLOutput
from .kernel_icl import KernelICLConfig, KernelICLForInContextRegression
from .linear_gpt import (
    LinearAttentionCache,
    LinearGPTConfig,
    LinearGPTForCausalLM,
    LinearGPTForInContextRegression,
    LinearGPTModel,
)
from .prompts import check_forward_kwargs, check_prompt
from .sgpt import (
    MLPForInContextRegression,
    MLPICLConfig,
    OneLayerFeatureMapConfig,
    OneLayerFeatureMapModel,
    SGPTConfig,
    SGPTForInContextRegression,
    SGPTModel,
)

#: what ``from hf_icl.modeling import *`` gives, and ``hf_icl`` re-exports: the configs and models, their output, and
#: the model builder and functional-GD references (the rest stays importable from here by name)
__all__ = [
    "GDLanguageModelConfig",
    "GDTransformerConfig",
    "GDTransformerForCausalLM",
    "GDTransformerForInContextClassification",
    "GPT2ForInContextRegression",
    "GPT2ICLConfig",
    "GPT2ICLModel",
    "ICLOutput",
    "KernelICLConfig",
    "KernelICLForInContextRegression",
    "LinearGPTConfig",
    "LinearGPTForCausalLM",
    "LinearGPTForInContextRegression",
    "LinearGPTModel",
    "MLPForInContextRegression",
    "MLPICLConfig",
    "OneLayerFeatureMapConfig",
    "OneLayerFeatureMapModel",
    "SGPTConfig",
    "SGPTForInContextRegression",
    "SGPTModel",
    "attention_parameter_counts",
    "build_model",
    "causal_functional_gd_logits",
    "functional_gd_logits",
]

#: model_type -> (config class, predicting model class)
MODEL_CLASSES = {
    GPT2ICLConfig.model_type: (GPT2ICLConfig, GPT2ForInContextRegression),
    SGPTConfig.model_type: (SGPTConfig, SGPTForInContextRegression),
    MLPICLConfig.model_type: (MLPICLConfig, MLPForInContextRegression),
    OneLayerFeatureMapConfig.model_type: (OneLayerFeatureMapConfig, OneLayerFeatureMapModel),
    LinearGPTConfig.model_type: (LinearGPTConfig, LinearGPTForInContextRegression),
    KernelICLConfig.model_type: (KernelICLConfig, KernelICLForInContextRegression),
    GDTransformerConfig.model_type: (GDTransformerConfig, GDTransformerForInContextClassification),
}

# AutoModel maps to the predicting model: reloading a checkpoint with AutoModel gives the
# same predictions (transformers has no Auto class for in-context regression heads).
for _config_class, _model_class in MODEL_CLASSES.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModel.register(_config_class, _model_class, exist_ok=True)
# the linear-attention GPT is also a language model (constant-memory generation)
AutoModelForCausalLM.register(LinearGPTConfig, LinearGPTForCausalLM, exist_ok=True)
# the functional-GD language model (a causal LM only: it is not an ICL prompt model, so not in MODEL_CLASSES)
AutoConfig.register(GDLanguageModelConfig.model_type, GDLanguageModelConfig, exist_ok=True)
AutoModelForCausalLM.register(GDLanguageModelConfig, GDTransformerForCausalLM, exist_ok=True)


def build_config(model_type: str, size: str | None = None, **config_fields):
    """The config of a registered ICL model type: a size preset (tiny, small, standard) with
    ``config_fields`` on top, or with ``size=None`` the config's own defaults and ``config_fields``."""
    if model_type not in MODEL_CLASSES:
        raise ValueError(f"model_type must be one of {sorted(MODEL_CLASSES)}, got {model_type!r}")
    config_class = MODEL_CLASSES[model_type][0]
    return config_class(**config_fields) if size is None else config_class.from_preset(size, **config_fields)


def check_attn_implementation(model_type: str, attn_implementation: str | None) -> None:
    """Raise ``ValueError`` for an ``attn_implementation`` given to a model type whose attention is not
    transformers' (SGPT's fixed identity attention) or that has none (the MLPs): it would be ignored."""
    model_class = MODEL_CLASSES[model_type][1]
    if attn_implementation is not None and not getattr(model_class, "supports_attn_implementation", True):
        raise ValueError(
            f"attn_implementation selects one of transformers' attention implementations; model_type={model_type!r} "
            f"has none to select, got attn_implementation={attn_implementation!r} (leave it unset)"
        )


def build_model(model_type: str, size: str | None, attn_implementation: str | None = None, **config_fields):
    """A freshly initialised ICL model of a registered type and size preset (``None``: no preset)."""
    config = build_config(model_type, size, **config_fields)
    check_attn_implementation(model_type, attn_implementation)
    model_class = MODEL_CLASSES[model_type][1]
    if attn_implementation is None:
        return model_class(config)
    return model_class._from_config(config, attn_implementation=attn_implementation)
