"""Configuration of the linear-attention GPT (the causal linear attention study, seed 002)."""

from __future__ import annotations

from transformers import GPT2Config
from transformers.activations import ACT2FN

from ...kernels.linear_attention import BACKENDS, FEATURE_MAPS, MODES, feature_dim
from ...validation import check_choice, check_float, check_int
from ..config_fields import check_config_kwargs
from ..gpt2_icl.configuration_gpt2_icl import GPT2ICLConfig, GPT2ShapedICLConfig, check_gpt2_shape_fields

#: saved beside ``linear_attention_feature_map="quadratic"``: the map is the document's ``[1, x, x_i x_j (i ≤ j)]``.
#: Before it (2026-11-26) "quadratic" meant the full outer product, now ``"quadratic_full"``; a saved config with
#: "quadratic" and without this marker is refused rather than loaded with a changed meaning.
QUADRATIC_MARKER = "quadratic_map"
QUADRATIC_MAP = "upper_triangle"


class LinearGPTConfig(GPT2ShapedICLConfig):
    r"""A GPT-2-shaped decoder whose attention is causal linear attention.

    Each block is GPT-2's (pre-LN, GELU MLP of width ``4 * n_embd``, residuals; learned positions and a
    final LN), with softmax attention replaced by
    ``o_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps)``, ``S_t = Σ_{j≤t} φ(k_j) v_jᵀ``, ``z_t = Σ_{j≤t} φ(k_j)``
    (:func:`hf_icl.kernels.linear_attention.causal_linear_attention`, q and k scaled by ``1/√d_head``).

    The field names are GPT-2's (``vocab_size``, ``n_embd``, ``n_layer``, ``n_head``, ``n_positions``,
    ``resid_pdrop``, ``embd_pdrop``, ``layer_norm_epsilon``, ``initializer_range``, with the aliases
    ``hidden_size``, ``num_hidden_layers``, …) plus :class:`~hf_icl.GPT2ICLConfig`'s ICL fields
    (``n_dims``, ``n_points``, ``target_kind``, ``n_classes``, ``prompt_format``, ``io_init``), so one
    config serves :class:`LinearGPTForInContextRegression` and :class:`LinearGPTForCausalLM`.

    Args:
        n_positions: learned positions; ``None`` (the default) gives ``2 * n_points``, the tokens of the
            longest prompt. A language model sets it to its context length.
        linear_attention_feature_map: φ, one of ``FEATURE_MAPS``: ``"squared_relu"`` (the default, the study's
            ``ReLU(x)²``), ``"relu"``, ``"elu_plus_one"``, ``"identity"``, ``"quadratic"`` (the study's appendix
            map ``[1, x_i, x_i x_j for i ≤ j]``, width ``1 + D + D(D+1)/2``) or ``"quadratic_full"``
            (``[1, x, vec(x ⊗ x)]``, width ``1 + D + D²``, kernel ``1 + q·k + (q·k)²``); the two quadratic maps
            need ``n_embd / n_head <= 32``.
        linear_attention_eps: > 0, added to the denominator.
        linear_attention_normalize: divide by ``φ(q_t)ᵀ z_t + eps`` (the study does).
        linear_attention_mode: ``"parallel"``, ``"recurrent"`` or ``"chunked"`` (default): the same function,
            computed three ways.
        linear_attention_backend: ``"auto"``/``"torch"``, ``"triton"`` or ``"fla"`` (the last two chunked only).
        linear_attention_chunk_size: tokens per chunk of the chunked mode.

    Dropout defaults to 0, the vocabulary to one unused row (set ``vocab_size`` for a language model).
    ``LinearGPTConfig.from_preset("tiny" | "small" | "standard", ...)`` sets width, depth and heads, the
    same shapes as ``GPT2ICLConfig``'s presets.

    Example::

        >>> from hf_icl.modeling.linear_gpt import LinearGPTConfig
        >>> config = LinearGPTConfig.from_preset("tiny", n_dims=5, n_points=11, linear_attention_mode="parallel")
        >>> config.n_embd, config.n_head, config.n_positions
        (64, 2, 22)
    """

    model_type = "linear_gpt"
    attribute_map = dict(GPT2Config.attribute_map)  # GPT-2's aliases: hidden_size, num_hidden_layers, …

    vocab_size: int = 1
    n_positions: int | None = None
    n_embd: int = 256
    n_layer: int = 12
    n_head: int = 8
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    linear_attention_feature_map: str = "squared_relu"
    linear_attention_eps: float = 1e-6
    linear_attention_normalize: bool = True
    linear_attention_mode: str = "chunked"
    linear_attention_backend: str = "auto"
    linear_attention_chunk_size: int = 64
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)  # unknown fields (typos) are errors, not silent defaults
        check_gpt2_shape_fields(self, ("vocab_size", "n_embd", "n_layer", "n_head"))
        if self.n_positions is None:
            self.n_positions = 2 * self.n_points
        check_int("n_positions", self.n_positions, low=1)
        if self.n_inner is not None:
            check_int("n_inner", self.n_inner, low=1)
        check_choice("activation_function", self.activation_function, sorted(ACT2FN))
        for name in ("resid_pdrop", "embd_pdrop"):
            check_float(name, getattr(self, name), low=0, high=1)
        check_float("layer_norm_epsilon", self.layer_norm_epsilon, low=0, low_inclusive=False)
        check_float("initializer_range", self.initializer_range, low=0)
        self._check_linear_attention()
        for name in ("use_cache", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        super().__post_init__(**kwargs)

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.linear_attention_feature_map == "quadratic":
            out[QUADRATIC_MARKER] = QUADRATIC_MAP
        return out

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        config_dict = dict(config_dict)
        marker = config_dict.pop(QUADRATIC_MARKER, None)
        if config_dict.get("linear_attention_feature_map") == "quadratic" and marker != QUADRATIC_MAP:
            raise ValueError(
                "linear_attention_feature_map='quadratic' in a config saved without "
                f"{QUADRATIC_MARKER}={QUADRATIC_MAP!r}: it was saved when 'quadratic' meant the full outer product "
                "[1, x, x xᵀ], now 'quadratic_full'; 'quadratic' is the document's [1, x, x_i x_j (i ≤ j)]. Set "
                "linear_attention_feature_map to 'quadratic_full' in its config.json to load it as it was trained"
            )
        return super().from_dict(config_dict, **kwargs)

    def _check_linear_attention(self) -> None:
        check_choice("linear_attention_feature_map", self.linear_attention_feature_map, FEATURE_MAPS)
        check_float("linear_attention_eps", self.linear_attention_eps, low=0, low_inclusive=False)
        if not isinstance(self.linear_attention_normalize, bool):
            raise ValueError(
                f"linear_attention_normalize must be True or False, got {self.linear_attention_normalize!r}"
            )
        check_choice("linear_attention_mode", self.linear_attention_mode, MODES)
        check_choice("linear_attention_backend", self.linear_attention_backend, BACKENDS)
        check_int("linear_attention_chunk_size", self.linear_attention_chunk_size, low=1)
        if self.linear_attention_backend in ("triton", "fla") and self.linear_attention_mode != "chunked":
            raise ValueError(
                f"linear_attention_backend={self.linear_attention_backend!r} runs linear_attention_mode='chunked' "
                f"only, got linear_attention_mode={self.linear_attention_mode!r}"
            )
        try:  # the quadratic maps are O(D²) wide: feature_dim refuses heads wider than 32
            feature_dim(self.linear_attention_feature_map, self.n_embd // self.n_head)
        except ValueError as err:
            raise ValueError(
                f"linear_attention_feature_map={self.linear_attention_feature_map!r} with n_embd={self.n_embd}, "
                f"n_head={self.n_head} (head_dim {self.n_embd // self.n_head}): {err}"
            ) from None

    # the same presets as the softmax baseline, so the two compare at equal sizes
    from_preset = classmethod(GPT2ICLConfig.from_preset.__func__)
