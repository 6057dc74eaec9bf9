"""The SGPT document's MLP in-context learners (seed 001, section 5, Appendix A) as transformers models.

Every position of every prompt is one row of one batched MLP: ``B * N`` rows, no loop over prefixes. The
vectorised input of position ``i`` (the zero-padded prompt, see :class:`MLPICLConfig`) is never materialised: the
first layer applied to it is a sum over slots, ``Σ_{j<=i} W[x-slot j] x_j + Σ_{j<i} W[y-slot j] y_j + b``, i.e. a
cumulative sum over positions of per-slot products, which costs ``(d + c)`` instead of ``n_points * (d + c)``
multiply-adds per position and hidden unit.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN

from ...estimators._prefix import exclusive_cumsum
from ..forward_docs import PROMPT_VALUES, add_forward_docstring, icl_forward_docstring
from ..heads import ICLHead, ICLOutput
from ..initialization import init_linear_uniform
from ..loading import BitExactLoadingMixin
from ..prompts import check_model_prompt, check_no_backbone_kwargs, encode_labels
from .configuration_mlp import MLPICLConfig, OneLayerFeatureMapConfig
from .feature_maps import feature_map, prompt_matrix

#: the parameters of the models' forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = ("xs", "ys", "loss_positions", "output_hidden_states", "check_inputs")

#: the docstring of the ICL model's forward: the shared text (forward_docs.py) with this model's own phrases
_FORWARD_DOCSTRING = icl_forward_docstring(
    output_hidden_states="also return the activations of every hidden layer, ``(B, N, hidden_size)`` each.",
    values=f'{PROMPT_VALUES}, degree 3 for the cubic feature map ``"linear"``',
    nan_cause="the feature maps' masked matmuls multiply a weight of 0 by it, and 0 times inf is NaN",
)


class MLPICLPreTrainedModel(BitExactLoadingMixin, PreTrainedModel):
    """Weight initialisation (PyTorch's default ``nn.Linear`` init) and loading for the MLP ICL models."""

    config_class = MLPICLConfig
    base_model_prefix = "mlp"
    main_input_name = "xs"
    #: no attention to swap: ``build_model`` and the training arguments refuse an ``attn_implementation``
    supports_attn_implementation = False

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            init_linear_uniform(module)  # as nn.Linear draws them: the document trains PyTorch MLPs


class MLPForInContextRegression(MLPICLPreTrainedModel):
    """An MLP that predicts ``y_i`` at every position from the prompt's first ``i`` pairs and ``x_i``.

    ``config.mlp_input`` picks its input (vectorised prompt, features ψ(A), both, or the smoothed estimate);
    ``config.n_hidden_layers`` activated linear layers of ``config.hidden_size`` units are followed by the
    :class:`~hf_icl.modeling.heads.ICLHead` read-out (the only layer when ``n_hidden_layers=0``).

    Example::

        >>> import torch
        >>> from hf_icl.modeling.sgpt import MLPForInContextRegression, MLPICLConfig
        >>> config = MLPICLConfig.from_preset("tiny", n_dims=4, n_points=10, mlp_input="both")
        >>> model = MLPForInContextRegression(config)
        >>> xs, ys = torch.randn(3, 10, 4), torch.randn(3, 10)
        >>> model(xs, ys).predictions.shape
        torch.Size([3, 10])
        >>> model(xs[:, :6], ys[:, :6]).predictions.shape  # shorter prompts are zero-padded to n_points
        torch.Size([3, 6])
    """

    def __init__(self, config: MLPICLConfig):
        super().__init__(config)
        fan_ins = [config.input_width] + [config.hidden_size] * (config.n_hidden_layers - 1)
        self.layers = nn.ModuleList(
            nn.Linear(fan_in, config.hidden_size) for fan_in in fan_ins[: config.n_hidden_layers]
        )
        self.act = ACT2FN[config.activation_function]
        head_width = config.hidden_size if config.n_hidden_layers else config.input_width
        self.head = ICLHead(head_width, config.target_kind, config.n_classes)
        self.post_init()

    # Copied from GPT2ForInContextRegression.forward
    #   (signature: xs, ys, loss_positions, output_hidden_states; Args: loss_positions)
    @add_forward_docstring(_FORWARD_DOCSTRING)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, loss_positions: torch.Tensor | list[int] | None = None,
        output_hidden_states: bool | None = None, check_inputs: bool = True, **kwargs) -> ICLOutput:  # fmt: skip
        config = self.config
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        weight = self.head.read_out.weight
        degree = 3 if config.mlp_input != "vectorized" and config.feature_map == "linear" else 2  # ψ_L is cubic
        check_model_prompt(
            config, xs, ys, check_values=check_inputs, device=weight.device, dtype=weight.dtype, degree=degree
        )
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        labels = encode_labels(ys, config.target_kind, config.n_classes)
        features = self.input_features(xs, labels)
        xs, labels = xs.to(weight.dtype), labels.to(weight.dtype)
        states = []
        if self.layers:
            hidden = self.act(self._first_layer(xs, labels, features))
            states.append(hidden)
            for layer in self.layers[1:]:
                hidden = self.act(layer(hidden))
                states.append(hidden)
        else:  # a linear model: the read-out reads the input itself
            hidden = self._materialised_inputs(xs, labels, features)
        return self.head.predict(hidden, ys, loss_positions, tuple(states) if output_hidden_states else None)

    def input_features(self, xs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """The feature part of every position's input, ``(B, N, features_width)`` in the model's dtype (None for
        ``mlp_input="vectorized"``): ``feature_map(A)`` or, for ``"estimate"``, its label column(s).

        ``labels`` are the encoded labels ``(B, N, label_width)`` (:func:`~hf_icl.modeling.prompts.encode_labels`).
        """
        config = self.config
        if config.mlp_input == "vectorized":
            return None
        # ψ runs in at least float32 (the Hilbert kernel's powers overflow half precision), then meets the weights.
        psi = feature_map(
            prompt_matrix(xs, labels), config.feature_map, config.kernel_bandwidth, label_width=config.label_width
        )
        if config.mlp_input == "estimate":
            psi = psi[..., config.n_dims :]
        return psi.to(self.head.read_out.weight.dtype)

    def model_inputs(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Every position's input, materialised: ``(B, N, config.input_width)`` (layout in :class:`MLPICLConfig`).

        The forward pass does not build it (its first layer sums per-slot products instead); it is here to inspect
        what the MLP reads, and for the linear model (``n_hidden_layers=0``).
        """
        config = self.config
        dtype = self.head.read_out.weight.dtype
        degree = 3 if config.mlp_input != "vectorized" and config.feature_map == "linear" else 2  # ψ_L is cubic
        check_model_prompt(config, xs, ys, device=self.head.read_out.weight.device, dtype=dtype, degree=degree)
        labels = encode_labels(ys, config.target_kind, config.n_classes)
        features = self.input_features(xs, labels)
        return self._materialised_inputs(xs.to(dtype), labels.to(dtype), features)

    def _materialised_inputs(
        self, xs: torch.Tensor, labels: torch.Tensor, features: torch.Tensor | None
    ) -> torch.Tensor:
        parts = [] if features is None else [features]
        if self.config.vectorized_width:
            n_points, pad = xs.shape[1], self.config.n_points - xs.shape[1]
            seen = torch.ones(n_points, n_points, dtype=torch.bool, device=xs.device).tril()  # [i, j]: j <= i
            # (B, N, N, width): row i holds x_j (j <= i) / y_j (j < i) in slot j; slots past N are zero padding.
            x_block = torch.where(seen[..., None], xs.unsqueeze(1), 0.0)
            y_block = torch.where(seen.tril(-1)[..., None], labels.unsqueeze(1), 0.0)
            x_block = nn.functional.pad(x_block, (0, 0, 0, pad)).flatten(2)
            y_block = nn.functional.pad(y_block, (0, 0, 0, pad)).flatten(2)
            parts = [x_block, y_block, *parts]
        return torch.cat(parts, dim=-1)

    def _first_layer(self, xs: torch.Tensor, labels: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        """``self.layers[0]`` applied to every position's input, without materialising the vectorised part."""
        config, layer = self.config, self.layers[0]
        width = config.vectorized_width
        out = layer.bias
        if width:
            n_points, dims, slots = xs.shape[1], config.n_dims, config.n_points
            x_weight = layer.weight[:, : slots * dims].unflatten(1, (slots, dims))[:, :n_points]
            y_weight = layer.weight[:, slots * dims : width].unflatten(1, (slots, config.label_width))[:, :n_points]
            # Position j's own slot contributions (B, N, H); position i sums x-slots j <= i and y-slots j < i.
            x_terms = torch.einsum("bnd,hnd->bnh", xs, x_weight)
            y_terms = torch.einsum("bnc,hnc->bnh", labels, y_weight)
            out = out + x_terms.cumsum(1) + exclusive_cumsum(y_terms, 1)
        if features is not None:
            out = out + features @ layer.weight[:, width:].T
        return out


class OneLayerFeatureMapModel(MLPForInContextRegression):
    """The document's one-layer model (eq. 9): ``σ(ψ(A)_{N,:} W1) W2`` at every position (with biases).

    ψ is ``config.feature_map``; row ``i`` of ψ(A) uses ``x_0..x_i`` and ``y_0..y_{i-1}`` only.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.sgpt import OneLayerFeatureMapConfig, OneLayerFeatureMapModel
        >>> model = OneLayerFeatureMapModel(OneLayerFeatureMapConfig.from_preset("tiny", n_dims=8, n_points=20))
        >>> model.layers[0]  # W1: the d + 1 = 9 features of ψ(A)'s row to k = 64 hidden units
        Linear(in_features=9, out_features=64, bias=True)
        >>> xs, ys = torch.randn(2, 20, 8), torch.randn(2, 20)
        >>> model(xs, ys).predictions.shape
        torch.Size([2, 20])
    """

    config_class = OneLayerFeatureMapConfig
