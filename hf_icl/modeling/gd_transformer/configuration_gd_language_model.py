"""Configuration of the functional-GD language model (seed 004's TinyStories model)."""

from __future__ import annotations

import math

from transformers import PretrainedConfig

from ...validation import check_choice, check_float, check_int
from ..config_fields import check_config_kwargs
from .configuration_gd_transformer import check_gd_options
from .functional_gd import KERNELS

#: how each head maps positional embeddings to queries and keys: a diagonal or a full d' × d' matrix per head, with
#: separate query and key matrices or one matrix for both (``*_shared``)
QK_FORMS = ("diag", "full", "diag_shared", "full_shared")


class GDLanguageModelConfig(PretrainedConfig):
    r"""A language model whose layers are steps of functional gradient descent on the next-token cross-entropy.

    Token ``t`` of a sequence is the in-context pair ``(x_t, y_t)`` with ``x_t = P_t`` (the LayerNormed learned
    embedding of position t) and ``y_t`` the token, whose embedding is ``e_t = LN(wte)[y_t]``. The token after
    ``t`` is predicted at the query ``x_{t+1} = P_{t+1}`` from the pairs ``j <= t``, by K steps of functional GD
    (one per ``n_blocks``) on their cross-entropy under ``p(y | f) = softmax(LN(wte) f)``; the logits are
    ``LN(wte) f``, tied to the token embedding. See
    :class:`~hf_icl.modeling.gd_transformer.GDTransformerForCausalLM` for the update.

    Args:
        vocab_size: tokens in the vocabulary.
        n_positions: the context length: sequences of up to that many tokens (``n_positions + 1`` learned positions,
            one more than tokens: the last token's prediction queries the position after it).
        embed_dim: d', the width of the token and position embeddings and of the latent f.
        n_heads: kernel heads; each has its own query/key maps (``qk_form``) and all read the same values.
        n_blocks: GD steps K, each with its own output projection ``W_o`` (``n_heads * d' → d'``, a learned step).
        kernel: κ over the projected positions: ``"softmax"`` ``exp(qᵀk / h)``, ``"rbf"``
            ``exp(−‖q − k‖² / (2h²))`` or ``"linear"`` ``qᵀk / h`` (:data:`~.functional_gd.KERNELS`).
        qk_form: one of :data:`QK_FORMS`: per head a diagonal (d' numbers) or full (d'²) query map and key map,
            or one map for both (``"diag_shared"``, ``"full_shared"``). The document's LM uses diagonal maps: with
            d' = 512 and 8 heads ``"diag"`` has 2 · 8 · 512 = 8192 query/key parameters, its "8K attention
            parameters".
        bandwidth: h > 0; default ``√embed_dim`` (the usual attention scale: ``qᵀk / √d'``).
        normalize_by_count: divide position t's kernel sum by its number of context pairs (GD on the *mean*
            cross-entropy of the context; the document's code does).
        normalize_attention: divide the softmax kernel's weights by their sum over the context (softmax attention;
            the document's code does, on top of ``normalize_by_count``); ``kernel="softmax"`` only.
        use_feed_forward: a residual feed-forward layer (LayerNorm, Linear, GELU, Linear) on ``f_K`` before the
            read-out ("Softmax GD + FF" in the document).
        ff_hidden_size: its width (None: ``4 * embed_dim``).
        embd_pdrop: dropout on the LayerNormed token and position embeddings.
        attn_pdrop: dropout on the kernel weights.
        resid_pdrop: dropout on each step's update and on the feed-forward output.
        layer_norm_epsilon: of the embeddings' LayerNorms (no bias, as in the document's code) and of the
            feed-forward layer.
        initializer_range: std σ of the embeddings, the query/key maps and the feed-forward input layer; the layers
            that write into f (the step projections, the feed-forward output layer) get ``σ / √(2 n_blocks fan_in)``,
            so the logits start near uniform (the document's code gives the step projections GPT-2's
            ``σ / √(2 n_blocks)``, which starts the loss far above log V).
        use_cache: return a :class:`~hf_icl.modeling.gd_transformer.GDLanguageModelCache` by default (eval mode).
        tie_word_embeddings: True (the read-out is the token embedding by construction; False is an error).

    Example::

        >>> from hf_icl.modeling.gd_transformer import GDLanguageModelConfig
        >>> config = GDLanguageModelConfig(vocab_size=100, n_positions=32, embed_dim=16, n_heads=2)
        >>> config.bandwidth, config.hidden_size
        (4.0, 16)
    """

    model_type = "gd_transformer_lm"
    attribute_map = {
        "hidden_size": "embed_dim",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_heads",
        "num_hidden_layers": "n_blocks",
    }

    vocab_size: int = 50257
    n_positions: int = 256
    embed_dim: int = 512
    n_heads: int = 8
    n_blocks: int = 1
    kernel: str = "softmax"
    qk_form: str = "diag"
    bandwidth: float | None = None
    normalize_by_count: bool = True
    normalize_attention: bool = False
    use_feed_forward: bool = False
    ff_hidden_size: int | None = None
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    resid_pdrop: float = 0.0
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)  # unknown fields (typos) are errors, not silent defaults
        for name in ("vocab_size", "n_positions", "embed_dim", "n_heads", "n_blocks"):
            check_int(name, getattr(self, name), low=1)
        check_choice("kernel", self.kernel, KERNELS)
        check_choice("qk_form", self.qk_form, QK_FORMS)
        if self.bandwidth is None:
            self.bandwidth = math.sqrt(self.embed_dim)
        check_float("bandwidth", self.bandwidth, low=0, low_inclusive=False)
        for name in ("normalize_by_count", "normalize_attention", "use_feed_forward", "use_cache"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.tie_word_embeddings is not True:
            raise ValueError(
                "tie_word_embeddings must be True: the functional-GD model reads out with its token embedding "
                f"(logits = LN(wte) f), got tie_word_embeddings={self.tie_word_embeddings!r}"
            )
        check_gd_options(self)
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            check_float(name, getattr(self, name), low=0, high=1)
        check_float("layer_norm_epsilon", self.layer_norm_epsilon, low=0, low_inclusive=False)
        check_float("initializer_range", self.initializer_range, low=0)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            for token in value if isinstance(value, (list, tuple)) else [] if value is None else [value]:
                check_int(name, token, low=0, high=self.vocab_size - 1)
        super().__post_init__(**kwargs)

    @property
    def feed_forward_width(self) -> int:
        """Hidden units of the feed-forward layer (``ff_hidden_size``, or ``4 * embed_dim``)."""
        return self.ff_hidden_size if self.ff_hidden_size is not None else 4 * self.embed_dim

    @property
    def shares_query_key(self) -> bool:
        """One map for queries and keys (``qk_form`` ends in ``_shared``)."""
        return self.qk_form.endswith("_shared")
