"""Configuration of the functional-GD transformer for categorical in-context learning (seed 004)."""

from __future__ import annotations

from transformers import PretrainedConfig

from ...validation import check_choice, check_float, check_int
from ..config_fields import check_config_kwargs, check_prompt_fields, preset_width
from .functional_gd import KERNELS

#: what the context tokens attend to: "full", the document's (every context pair, in both protocols); "causal", the
#: causal variant (token i reads the pairs j < i only: a different algorithm for more than one block)
CONTEXT_ATTENTION = ("full", "causal")

#: name -> embed_dim (d', the width of the class embeddings and of the latent f)
SIZE_PRESETS = {"tiny": 16, "small": 32, "standard": 64}


def check_gd_options(config) -> None:
    """The checks both GD configs (classification and language model) share: softmax-only normalised attention and
    a feed-forward width only with a feed-forward layer."""
    if config.normalize_attention and config.kernel != "softmax":
        raise ValueError(
            f"normalize_attention=True normalises the softmax kernel's weights; it needs kernel='softmax', "
            f"got kernel={config.kernel!r}"
        )
    if config.ff_hidden_size is not None:
        if not config.use_feed_forward:
            raise ValueError(
                f"ff_hidden_size sets the width of the feed-forward layer; it needs use_feed_forward=True, "
                f"got ff_hidden_size={config.ff_hidden_size!r} with use_feed_forward=False"
            )
        check_int("ff_hidden_size", config.ff_hidden_size, low=1)


class GDTransformerConfig(PretrainedConfig):
    r"""An attention model whose blocks can compute functional gradient descent on categorical labels.

    Every position carries a state ``(x_i, f_i, s_i)`` (``n_dims + 2 * embed_dim`` numbers: the input, the latent
    function and a scratch slot for the expected embedding) and a label slot ``w_{e,y_i} − w̄_e`` that only the
    tokens reading it as a context pair see. A block is a self-attention layer with two heads (head 1 updates f
    with kernel attention over the context pairs; head 2, with scores ``−λ‖q_i − k_j‖²`` over the context and the
    token itself, can erase the scratch slot), then a cross-attention layer from the state to the class embeddings
    (it can write ``E(w_e)|f`` into the scratch slot), then an optional feed-forward layer. Logits are ``W_eᵀ f``.
    See :class:`~hf_icl.modeling.gd_transformer.GDTransformerForInContextClassification`.

    Args:
        n_dims: input dimension d.
        n_points: the longest prompt.
        target_kind: ``"categorical"`` only (the model predicts ``n_classes`` logits).
        n_classes: C.
        embed_dim: d', the width of the class embeddings ``W_e (d', C)`` and of f.
        n_blocks: blocks, i.e. GD steps K of the construction.
        context_attention: ``"full"`` (default), the document's transformer: the context tokens attend to every
            context pair (themselves included) and each query to the context only, so K blocks compute K steps of
            the document's functional GD; ``"causal"``, the causal variant: token ``i`` attends to the pairs
            ``j < i`` only (one pass predicts every prefix, but for K ≥ 2 it is a different algorithm,
            :func:`~hf_icl.modeling.gd_transformer.causal_functional_gd_logits`).
        kernel: head 1's kernel κ: ``"softmax"`` ``exp(qᵀk / h)``, ``"rbf"`` ``exp(−‖q − k‖² / (2h²))`` or
            ``"linear"`` ``qᵀk / h``, an unnormalised sum over the context pairs.
        bandwidth: h > 0, a fixed scale of head 1's scores.
        normalize_by_count: multiply head 1's sum by one over the number of context pairs the token reads.
        normalize_attention: divide the softmax kernel's weights by their sum over the context pairs (softmax
            attention); ``kernel="softmax"`` only.
        erase_temperature: λ > 0 of head 2's scores ``−λ‖q_i − k_j‖²``. The GD construction uses a large λ
            (:data:`~hf_icl.modeling.gd_transformer.modeling_gd_transformer.CONSTRUCTION_ERASE_TEMPERATURE`) so the
            head attends to its own position only; a model trained from scratch keeps the default 1 (the scale of
            its projections is learned, and a huge λ would saturate head 2's softmax at initialisation).
        use_feed_forward: a feed-forward layer (LayerNorm, two linear layers, GELU) after each block, added to the
            state; the construction sets its output layer to zero.
        ff_hidden_size: its width (None: 4 × the state width).
        simplified: the document's one-step block: head 1 alone (no head 2, no cross-attention, no scratch slot);
            only with ``n_blocks=1``.
        initializer_range: std of the random projections of a fresh model (the class embeddings get ``1/√d'``).

    ``GDTransformerConfig.from_preset("tiny" | "small" | "standard", ...)`` sets ``embed_dim`` (16 / 32 / 64).

    Example::

        >>> from hf_icl.modeling.gd_transformer import GDTransformerConfig
        >>> config = GDTransformerConfig.from_preset("tiny", n_dims=4, n_points=20, n_classes=3, n_blocks=2)
        >>> config.embed_dim, config.state_width, config.token_width
        (16, 36, 52)
    """

    model_type = "gd_transformer"

    n_dims: int = 20
    n_points: int = 41
    target_kind: str = "categorical"
    n_classes: int = 5
    embed_dim: int = 32
    n_blocks: int = 1
    context_attention: str = "full"
    kernel: str = "softmax"
    bandwidth: float = 1.0
    normalize_by_count: bool = False
    normalize_attention: bool = False
    erase_temperature: float = 1.0
    use_feed_forward: bool = False
    ff_hidden_size: int | None = None
    simplified: bool = False
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)  # unknown fields (typos) are errors, not silent defaults
        check_prompt_fields(self)
        if self.target_kind != "categorical":
            raise ValueError(
                f"target_kind must be 'categorical' for the GD transformer (it predicts class logits W_eᵀ f), "
                f"got target_kind={self.target_kind!r}"
            )
        check_int("embed_dim", self.embed_dim, low=1)
        check_int("n_blocks", self.n_blocks, low=1)
        check_choice("kernel", self.kernel, KERNELS)
        check_choice("context_attention", self.context_attention, CONTEXT_ATTENTION)
        check_float("bandwidth", self.bandwidth, low=0, low_inclusive=False)
        check_float("erase_temperature", self.erase_temperature, low=0, low_inclusive=False)
        check_float("initializer_range", self.initializer_range, low=0)
        for name in ("normalize_by_count", "normalize_attention", "use_feed_forward", "simplified"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_gd_options(self)
        if self.simplified and self.n_blocks != 1:
            raise ValueError(
                f"simplified=True is the document's one-step block (no expectation to update); it needs n_blocks=1, "
                f"got n_blocks={self.n_blocks}"
            )
        super().__post_init__(**kwargs)

    @classmethod
    def from_preset(cls, size: str, **kwargs) -> GDTransformerConfig:
        """A config with the ``embed_dim`` of a named size (tiny 16, small 32, standard 64)."""
        return cls(embed_dim=preset_width(size, SIZE_PRESETS, "embed_dim", kwargs), **kwargs)

    @property
    def state_width(self) -> int:
        """Numbers in a position's state ``(x, f, scratch)`` (no scratch slot for the simplified block)."""
        return self.n_dims + (1 if self.simplified else 2) * self.embed_dim

    @property
    def token_width(self) -> int:
        """Numbers in a context token: the state followed by the label slot ``w_{e,y} − w̄_e``."""
        return self.state_width + self.embed_dim

    @property
    def feed_forward_width(self) -> int:
        """Hidden units of each feed-forward layer (``ff_hidden_size``, or 4 × the state width)."""
        return self.ff_hidden_size if self.ff_hidden_size is not None else 4 * self.state_width
