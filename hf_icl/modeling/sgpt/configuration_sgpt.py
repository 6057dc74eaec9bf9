"""Configuration of SGPT, the simplified GPT of the context-scaling study (identity Q/K/V)."""

from __future__ import annotations

from transformers.activations import ACT2FN

from ...validation import check_choice, check_float, check_int
from ..config_fields import ICLPromptConfig, check_config_kwargs, check_prompt_fields
from ..prompts import PROMPT_FORMATS

#: how a row of attention scores HHᵀ becomes weights (the document's φ)
NORMALIZATIONS = ("l1", "softmax", "none", "relu")
#: name -> (n_embd, n_layer): the widths and depths of GPT2ICLConfig's presets, so that a size names
#: the same shape for both models; the document's best SGPT is n_embd=256, n_layer=8
SIZE_PRESETS = {"tiny": (64, 3), "small": (128, 6), "standard": (256, 12)}


class SGPTConfig(ICLPromptConfig):
    r"""SGPT: GPT-2 with the query, key and value weights fixed to the identity.

    Layer ``i`` maps ``H`` to ``σ(g(H) W_proj + H W_MLP) + g(H) W_proj + H`` (the document's eq. 13)
    with ``g(H) = φ(H Hᵀ) H`` under the causal mask: no layer norm, no Q/K/V weights, one MLP matrix.
    The read-in ``H₀ = A W₀`` is a fixed random matrix (saved with the model, never trained); the
    read-out is linear.

    Args:
        n_dims: input dimension d.
        n_points: longest prompt.
        target_kind / n_classes: as for :class:`~hf_icl.GPT2ICLConfig` (regression, binary, categorical).
        prompt_format: ``"concatenated"`` (the document's rows ``[x_i, y_i]``; each position's prediction
            comes from a query row ``[x_i, 0]`` that sees the earlier rows and itself) or ``"interleaved"``
            (Garg et al.'s x, y, x, y, … tokens).
        n_embd: width k.
        n_layer: number of layers.
        activation_function: σ, any name in ``transformers.activations.ACT2FN`` (the document: GELU).
        normalization (alias ``attn_normalization``): φ, applied to each row of the causally masked scores:
            ``"l1"`` (divide by the row's l1 norm; a row whose norm is 0 stays 0), ``"softmax"``, ``"relu"``
            (entry-wise, no normalisation) or ``"none"`` (the raw scores).
        scale_attn_weights: multiply the scores by ``1/√n_embd`` (eq. 3) before φ; eq. 6, the
            document's SGPT, does not (it makes no difference to ``"l1"``).
        initializer_range: standard deviation of the trained weights' normal init (GPT-2's 0.02).

    ``SGPTConfig.from_preset("tiny" | "small" | "standard", ...)`` sets ``n_embd`` and ``n_layer``.
    """

    model_type = "sgpt"
    attribute_map = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "attn_normalization": "normalization"}

    prompt_format: str = "concatenated"
    n_embd: int = 256
    n_layer: int = 8
    activation_function: str = "gelu"
    normalization: str = "l1"
    scale_attn_weights: bool = False
    initializer_range: float = 0.02
    use_cache: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)
        check_prompt_fields(self)
        check_choice("prompt_format", self.prompt_format, sorted(PROMPT_FORMATS))
        check_int("n_embd", self.n_embd, low=1)
        check_int("n_layer", self.n_layer, low=1)
        check_choice("activation_function", self.activation_function, sorted(ACT2FN))
        check_choice("normalization", self.normalization, NORMALIZATIONS)
        if not isinstance(self.scale_attn_weights, bool):
            raise ValueError(f"scale_attn_weights must be True or False, got {self.scale_attn_weights!r}")
        check_float("initializer_range", self.initializer_range, low=0)
        if self.use_cache:
            raise ValueError("use_cache must be False: SGPT predicts whole prompts and keeps no key/value cache")
        super().__post_init__(**kwargs)

    @classmethod
    def from_preset(cls, size: str, **kwargs) -> SGPTConfig:
        """A config with the width and depth of a named size (tiny, small, standard)."""
        check_choice("size", size, sorted(SIZE_PRESETS))
        kwargs = {cls.attribute_map.get(key, key): value for key, value in kwargs.items()}
        clash = sorted({"n_embd", "n_layer"} & set(kwargs))
        if clash:
            raise ValueError(f"size={size!r} sets n_embd and n_layer; do not also pass {clash}")
        n_embd, n_layer = SIZE_PRESETS[size]
        return cls(n_embd=n_embd, n_layer=n_layer, **kwargs)
