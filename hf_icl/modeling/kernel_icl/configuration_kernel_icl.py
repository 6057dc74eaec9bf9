"""Configuration of the kernel-regression document's in-context learner (seed 000, ``UnifiedICL``)."""

from __future__ import annotations

from typing import ClassVar

from transformers import PretrainedConfig

from ...similarity.row_kernels import ROW_KERNELS
from ...validation import check_choice, check_float, check_int
from ..config_fields import check_config_kwargs, preset_width

#: name -> hidden_size (the document's d_model is 64)
SIZE_PRESETS = {"tiny": 16, "small": 32, "standard": 64}
#: the document's initial row temperature of each angular kernel (the softmax kernel has none)
DEFAULT_TEMPERATURES = {"cosine": 0.1, "cayley": 0.1, "ga": 1.0}


class KernelICLConfig(PretrainedConfig):
    r"""A single learned attention head as a kernel smoother, with optional GA column attention.

    The document's ``UnifiedICL``: an x-embedding MLP feeds the query and key projections, a y-embedding MLP the
    value projection, the row kernel (``softmax``, ``cosine``, ``cayley`` or ``ga``) turns query-key pairs into
    attention weights over the context, and a linear read-out maps the attended value to a prediction. With
    ``use_column_attention`` the raw inputs are first mixed across features by GA column attention
    (:mod:`hf_icl.similarity.column_attention`) computed from the context samples.

    Args:
        n_dims: input dimension d.
        n_points: the longest prompt the causal all-prefix protocol accepts (the default forward). The model has no
            positional parameters, so it changes no weight; it bounds the prompt length there (whose memory grows
            as ``N²``, times ``hidden_size`` with column attention) and is the prompt length that
            ``hf-icl evaluate`` uses. The context/query protocol (``forward(..., n_context=n)``) takes prompts of
            any length.
        target_kind: ``"regression"`` only (the document's model predicts real values; another value is an error).
        hidden_size: width of the embeddings and of Q, K, V (the document's ``d_model``, 64).
        row_kernel: the attention kernel over samples, one of ``softmax`` (``QKᵀ/√hidden_size``), ``cosine``
            (``cos θ / T``), ``cayley`` (``-θ²/(2T²)``) or ``ga`` (``(β₁ cos θ - β₂ sin θ) / T``), θ the angle
            between query and key.
        use_column_attention: mix the raw input features by GA column attention before embedding them.
        init_temperature: initial learnable temperature T of ``cosine`` / ``cayley`` / ``ga`` (None: the document's
            0.1, 0.1 and 1.0); must stay None for ``softmax``, which has no temperature.
        init_ga_beta1, init_ga_beta2: initial learnable β₁, β₂ of the ``ga`` row kernel (4.0, 1.0; used by ``ga``
            only).
        init_column_beta1, init_column_beta2, init_diag_bias, init_wedge_mu, init_gate: initial learnable
            parameters of the column attention (4.0, 1.0, 2.0, 0.5, 0.0; used with ``use_column_attention`` only):
            scores ``β₁ cos θ - β₂ (sin θ - μ)² + diag_bias · I`` between features, residual gate ``σ(gate)``.
        eps: clamp of norms and cosines in both kernels (the document's 1e-6).
        max_chunk_elements: memory bound of the causal protocol with column attention, whose keys differ for every
            position: positions are processed in chunks of as many as keep one ``(B, chunk, N, hidden_size)``
            activation under this many elements (at least one position per chunk).

    ``KernelICLConfig.from_preset("tiny" | "small" | "standard", ...)`` sets ``hidden_size`` (16 / 32 / 64).

    Example::

        >>> from hf_icl.modeling.kernel_icl import KernelICLConfig
        >>> config = KernelICLConfig.from_preset("tiny", n_dims=10, row_kernel="cayley", use_column_attention=True)
        >>> config.hidden_size, config.initial_temperature
        (16, 0.1)
    """

    model_type = "kernel_icl"
    #: ``from_preset`` sizes: name -> hidden_size
    size_presets: ClassVar[dict[str, int]] = SIZE_PRESETS

    n_dims: int = 10
    n_points: int = 256
    target_kind: str = "regression"
    hidden_size: int = 64
    row_kernel: str = "softmax"
    use_column_attention: bool = False
    init_temperature: float | None = None
    init_ga_beta1: float = 4.0
    init_ga_beta2: float = 1.0
    init_column_beta1: float = 4.0
    init_column_beta2: float = 1.0
    init_diag_bias: float = 2.0
    init_wedge_mu: float = 0.5
    init_gate: float = 0.0
    eps: float = 1e-6
    max_chunk_elements: int = 2**24

    def __post_init__(self, **kwargs):
        # first, so that a categorical task says what is wrong rather than "unknown field 'n_classes'"
        if self.target_kind != "regression":
            raise ValueError(
                f"target_kind must be 'regression' for kernel_icl (the kernel smoother predicts real values; "
                f"binary and categorical targets are not supported), got {self.target_kind!r}"
            )
        kwargs = check_config_kwargs(self, kwargs)  # unknown fields (typos) are errors, not silent defaults
        check_int("n_dims", self.n_dims, low=1)
        check_int("n_points", self.n_points, low=1)
        check_int("hidden_size", self.hidden_size, low=1)
        check_choice("row_kernel", self.row_kernel, ROW_KERNELS)
        if not isinstance(self.use_column_attention, bool):
            raise ValueError(f"use_column_attention must be True or False, got {self.use_column_attention!r}")
        if self.init_temperature is not None:
            if self.row_kernel == "softmax":
                raise ValueError(
                    "init_temperature applies to the cosine, cayley and ga row kernels only (row_kernel='softmax' "
                    "scales by 1/sqrt(hidden_size) and has no temperature), got "
                    f"init_temperature={self.init_temperature!r}"
                )
            check_float("init_temperature", self.init_temperature, low=0, low_inclusive=False)
        for name in (
            "init_ga_beta1",
            "init_ga_beta2",
            "init_column_beta1",
            "init_column_beta2",
            "init_diag_bias",
            "init_wedge_mu",
            "init_gate",
        ):
            check_float(name, getattr(self, name))
        check_float("eps", self.eps, low=0, low_inclusive=False, high=0.5)
        check_int("max_chunk_elements", self.max_chunk_elements, low=1)
        super().__post_init__(**kwargs)

    @classmethod
    def from_preset(cls, size: str, **kwargs) -> KernelICLConfig:
        """A config with the ``hidden_size`` of a named size (tiny 16, small 32, standard 64)."""
        return cls(hidden_size=preset_width(size, cls.size_presets, "hidden_size", kwargs), **kwargs)

    @property
    def initial_temperature(self) -> float | None:
        """The row temperature the model starts from: ``init_temperature``, or the kernel's default (None for
        ``softmax``)."""
        if self.row_kernel == "softmax":
            return None
        return self.init_temperature if self.init_temperature is not None else DEFAULT_TEMPERATURES[self.row_kernel]
