"""Configurations of the SGPT document's MLPs (seed 001, section 5 and Appendix A): on the vectorised prompt, on
the one-layer features ψ(A), on both, or on the smoothed estimate alone."""

from __future__ import annotations

from typing import ClassVar

from transformers.activations import ACT2FN

from ...validation import check_choice, check_float, check_int
from ..config_fields import ICLPromptConfig, check_config_kwargs, check_prompt_fields, preset_width
from .feature_maps import FEATURE_MAPS

#: what the MLP reads at each position (see :class:`MLPICLConfig`)
MLP_INPUTS = ("vectorized", "features", "both", "estimate")
#: name -> hidden_size of the MLPs (the document's width is 1024)
SIZE_PRESETS = {"tiny": 256, "small": 512, "standard": 1024}
#: name -> hidden_size of the one-layer feature-map model (k of eq. 9)
ONE_LAYER_SIZE_PRESETS = {"tiny": 64, "small": 128, "standard": 256}


class MLPICLConfig(ICLPromptConfig):
    r"""An MLP in-context learner: ``n_hidden_layers`` activated linear layers and a linear read-out, at every position.

    The document's MLP (its eq. 14) is ``f(x) = σ(x W0) W1``: one hidden layer of width 1024 with ReLU, trained once
    for every context length by zero-padding to the longest one.

    Args:
        n_dims: input dimension d.
        n_points: the longest prompt; the vectorised input is zero-padded to it.
        target_kind: ``"regression"`` (MSE), ``"binary"`` (±1 labels, BCE) or ``"categorical"`` (cross-entropy).
        n_classes: classes of a categorical task (labels enter the input one-hot, ``label_width`` wide).
        mlp_input: what the MLP reads at position ``i`` (``c = label_width``):

            * ``"vectorized"``: the document's vectorised prompt zero-padded to ``n_points``, ``n_points * (d + c)``
              numbers: first an x-block of ``n_points`` slots of ``d`` (``x_0..x_i`` in slots ``0..i``, zeros after),
              then a y-block of ``n_points`` slots of ``c`` (``y_0..y_{i-1}`` in slots ``0..i-1``, zeros from slot
              ``i`` on);
            * ``"features"``: ``feature_map(A)[:, i]``, the ``d + c`` numbers ``ψ(A^i)_{i,:}`` (smoothed x, then the
              smoothed label(s));
            * ``"both"``: the vectorised input followed by the features;
            * ``"estimate"``: the label column(s) of the features only, the smoothed estimate ``ψ_K(A)_{N,d+1}``.
        feature_map: the map ψ of :mod:`hf_icl.modeling.sgpt.feature_maps`: ``"linear"`` (one-step GD),
            ``"exponential"`` (softmax attention), ``"hilbert"`` (the Hilbert estimate) or ``"l1"``. Unused with
            ``mlp_input="vectorized"``.
        kernel_bandwidth: temperature of the ``"exponential"`` map (None: 1); an error with any other map.
        hidden_size: width of every hidden layer.
        n_hidden_layers: hidden layers; 0 gives a linear model on the input (with ``mlp_input="estimate"`` the
            document's linear fit on the scalar ``ψ_K(A)_{N,d+1}``, Figure 6).
        activation_function: any name in ``transformers.activations.ACT2FN`` (the document: ``"relu"``).

    ``MLPICLConfig.from_preset("tiny" | "small" | "standard", ...)`` sets ``hidden_size`` (256 / 512 / 1024).

    Example::

        >>> from hf_icl.modeling.sgpt import MLPICLConfig
        >>> config = MLPICLConfig.from_preset("tiny", n_dims=4, n_points=10, mlp_input="both")
        >>> config.hidden_size, config.input_width  # 10 * (4 + 1) vectorised + 4 + 1 features
        (256, 55)
    """

    model_type = "mlp_icl"
    #: the values ``mlp_input`` may take (a subclass narrows them)
    mlp_inputs: ClassVar[tuple[str, ...]] = MLP_INPUTS
    #: ``from_preset`` sizes: name -> hidden_size
    size_presets: ClassVar[dict[str, int]] = SIZE_PRESETS

    mlp_input: str = "vectorized"
    feature_map: str = "hilbert"
    kernel_bandwidth: float | None = None
    hidden_size: int = 1024
    n_hidden_layers: int = 1
    activation_function: str = "relu"

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)  # unknown fields (typos) are errors, not silent defaults
        check_prompt_fields(self)
        check_choice("mlp_input", self.mlp_input, type(self).mlp_inputs)
        check_choice("feature_map", self.feature_map, FEATURE_MAPS)
        if self.kernel_bandwidth is not None:
            if self.feature_map != "exponential":
                raise ValueError(
                    f"kernel_bandwidth applies to feature_map='exponential' only (feature_map={self.feature_map!r} "
                    f"has none), got kernel_bandwidth={self.kernel_bandwidth!r}"
                )
            check_float("kernel_bandwidth", self.kernel_bandwidth, low=0, low_inclusive=False)
        check_int("hidden_size", self.hidden_size, low=1)
        check_int("n_hidden_layers", self.n_hidden_layers, low=0)
        check_choice("activation_function", self.activation_function, sorted(ACT2FN))
        super().__post_init__(**kwargs)

    @classmethod
    def from_preset(cls, size: str, **kwargs) -> MLPICLConfig:
        """A config with the ``hidden_size`` of a named size (``cls.size_presets``: tiny, small, standard)."""
        return cls(hidden_size=preset_width(size, cls.size_presets, "hidden_size", kwargs), **kwargs)

    @property
    def vectorized_width(self) -> int:
        """Width of the zero-padded vectorised prompt (0 when ``mlp_input`` does not use it)."""
        if self.mlp_input not in ("vectorized", "both"):
            return 0
        return self.n_points * (self.n_dims + self.label_width)

    @property
    def features_width(self) -> int:
        """Width of the feature part of the input (0 for ``mlp_input="vectorized"``)."""
        return {"vectorized": 0, "estimate": self.label_width}.get(self.mlp_input, self.n_dims + self.label_width)

    @property
    def input_width(self) -> int:
        """Numbers the first layer reads at each position: the vectorised part, then the features."""
        return self.vectorized_width + self.features_width


class OneLayerFeatureMapConfig(MLPICLConfig):
    r"""The document's one-layer model (eq. 9): ``f(A) = σ(ψ(A)_{N,:} W1) W2``, an MLP on the features only.

    Like :class:`MLPICLConfig` with ``mlp_input`` fixed to ``"features"`` (another value is an error) and a
    ``hidden_size`` (k) of 256 by default; presets tiny / small / standard give 64 / 128 / 256.

    Example::

        >>> from hf_icl.modeling.sgpt import OneLayerFeatureMapConfig
        >>> config = OneLayerFeatureMapConfig.from_preset("tiny", n_dims=8, n_points=50, feature_map="hilbert")
        >>> config.hidden_size, config.input_width
        (64, 9)
    """

    model_type = "one_layer_feature_map"
    mlp_inputs: ClassVar[tuple[str, ...]] = ("features",)
    size_presets: ClassVar[dict[str, int]] = ONE_LAYER_SIZE_PRESETS

    mlp_input: str = "features"
    hidden_size: int = 256
