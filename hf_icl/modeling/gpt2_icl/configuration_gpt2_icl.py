"""Configuration of the GPT-2 in-context learner (Garg et al.'s baseline)."""

from __future__ import annotations

from transformers import GPT2Config
from transformers.activations import ACT2FN

from ...validation import check_choice, check_float, check_int
from ..config_fields import ICLPromptConfig, check_config_kwargs, check_prompt_fields
from ..prompts import PROMPT_FORMATS

#: initialisations of the read-in and read-out layers (see ``GPT2ICLConfig.io_init``)
IO_INITS = ("gpt2", "garg")


def check_gpt2_shape_fields(config, sizes: tuple[str, ...]) -> None:
    """The checks the GPT-2-shaped ICL configs (:class:`GPT2ICLConfig`, ``LinearGPTConfig``) share, in this order:
    the prompt fields, ``prompt_format``, ``io_init``, the positive integer fields ``sizes``, and ``n_embd``
    divisible by ``n_head``."""
    check_prompt_fields(config)
    check_choice("prompt_format", config.prompt_format, sorted(PROMPT_FORMATS))
    check_choice("io_init", config.io_init, IO_INITS)
    for name in sizes:
        check_int(name, getattr(config, name), low=1)
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head ({config.n_head})")


class GPT2ShapedICLConfig(ICLPromptConfig):
    """The ICL fields of the GPT-2-shaped configs (:class:`GPT2ICLConfig`, ``LinearGPTConfig``): the prompt fields,
    ``prompt_format`` and ``io_init`` (documented in :class:`GPT2ICLConfig`). A base class only, like
    :class:`~hf_icl.modeling.config_fields.ICLPromptConfig`."""

    prompt_format: str = "interleaved"
    io_init: str = "garg"


#: name -> (n_embd, n_layer, n_head)
SIZE_PRESETS = {"tiny": (64, 3, 2), "small": (128, 6, 4), "standard": (256, 12, 8)}
#: GPT2Config's default n_positions: a config that does not set it (GPT2ICLConfig derives it from n_points)
_GPT2_N_POSITIONS = GPT2Config.__dataclass_fields__["n_positions"].default


class GPT2ICLConfig(GPT2ShapedICLConfig, GPT2Config):
    r"""A GPT-2 backbone reading prompts of ``n_points`` (x, y) pairs of dimension ``n_dims``.

    It *is* a :class:`~transformers.GPT2Config` (so transformers' own ``GPT2Model`` and every
    registered ``attn_implementation`` run on it) with ICL fields on top:

    Args:
        n_dims: input dimension d.
        n_points: longest prompt; the backbone gets ``n_positions = 2 * n_points`` tokens.
        target_kind: ``"regression"`` (MSE), ``"binary"`` (±1 labels, BCE) or ``"categorical"``
            (``n_classes`` ids, cross-entropy).
        n_classes: classes of a categorical task.
        prompt_format: ``"interleaved"`` (x and y tokens, Garg et al.) or ``"concatenated"``
            (``[x, y]`` tokens each preceded by its ``[x, 0]`` query).
        io_init: initialisation of ``read_in`` and the head's ``read_out``: ``"garg"`` (the default:
            PyTorch's default ``nn.Linear`` init, U(±1/√fan_in) for weight and bias, as in Garg et al.'s
            code) or ``"gpt2"`` (N(0, 0.02), zero bias, like every GPT-2 linear layer). With ``"gpt2"``
            the interleaved layout stays on its initial plateau on a CPU budget
            (docs/results/reliability.md).

    Dropout defaults to 0 and the unused token vocabulary to a single row.
    ``GPT2ICLConfig.from_preset("tiny" | "small" | "standard", ...)`` sets width, depth and heads.
    A keyword that is no field (``n_layers=2``) raises ``ValueError`` naming close matches; the
    ``cab_*`` fields of CAB attention are accepted (and validated), as are transformers' own keys
    and GPT-2's aliases (``hidden_size``, ``num_hidden_layers``, …).
    """

    model_type = "gpt2_icl"

    # GPT-2 defaults changed for ICL: Garg et al.'s standard size, no dropout, no vocabulary.
    vocab_size: int = 1
    n_embd: int = 256
    n_layer: int = 12
    n_head: int = 8
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    attn_pdrop: float = 0.0
    use_cache: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)  # unknown fields (typos) are errors, not silent defaults
        check_gpt2_shape_fields(self, ("n_embd", "n_layer", "n_head"))
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"):
            check_float(name, getattr(self, name), low=0, high=1)
        if self.n_inner is not None:
            check_int("n_inner", self.n_inner, low=1)
        check_choice("activation_function", self.activation_function, sorted(ACT2FN))
        check_float("layer_norm_epsilon", self.layer_norm_epsilon, low=0, low_inclusive=False)
        check_float("initializer_range", self.initializer_range, low=0)
        derived = 2 * self.n_points
        if self.n_positions not in (derived, _GPT2_N_POSITIONS):
            raise ValueError(
                f"n_positions is set from n_points (2 * n_points = {derived} tokens); set n_points instead, "
                f"got n_positions={self.n_positions!r}"
            )
        self.n_positions = derived
        super().__post_init__(**kwargs)

    @classmethod
    def from_preset(cls, size: str, **kwargs) -> GPT2ICLConfig:
        """A config with the width / depth / heads of a named size (tiny, small, standard)."""
        check_choice("size", size, sorted(SIZE_PRESETS))
        n_embd, n_layer, n_head = SIZE_PRESETS[size]
        kwargs = {cls.attribute_map.get(key, key): value for key, value in kwargs.items()}  # hidden_size → n_embd
        clash = sorted({"n_embd", "n_layer", "n_head"} & set(kwargs))
        if clash:
            raise ValueError(f"size={size!r} sets n_embd/n_layer/n_head; do not also pass {clash}")
        return cls(n_embd=n_embd, n_layer=n_layer, n_head=n_head, **kwargs)
