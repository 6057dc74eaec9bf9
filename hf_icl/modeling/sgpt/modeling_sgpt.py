"""SGPT: the simplified GPT of the context-scaling study, with identity query/key/value weights.

A layer mixes rows with ``g(H) = φ(H Hᵀ) H`` (no trained attention weights; φ is a row-wise l1
normalisation by default), then applies ``σ(g(H) W_proj + H W_MLP) + g(H) W_proj + H`` (eq. 13 of the
document). The read-in ``H₀ = A W₀`` is a fixed random matrix kept as a persistent buffer, so a
reloaded model reads prompts through the very same ``W₀``.

In the document's concatenated format a prompt is a matrix of rows ``[x_i, y_i]``, and the prediction
of ``y_i`` is the output at the last row of the prefix matrix ``A^i`` (rows ``0..i``, the last label
zeroed). One forward pass gives all N of them: the model carries two streams through its layers, the
context rows ``[x_j, y_j]`` under a causal mask, and one query row ``[x_i, 0]`` per position that
attends to the context rows ``j < i`` and to itself while no row attends to it. Because every layer is
causal, the context rows ``j < i`` hold exactly what they hold inside ``A^i``, so query ``i`` ends
where the last row of ``A^i`` ends (tests check this against the per-prefix loop, for every φ).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput

from ..forward_docs import add_forward_docstring, hidden_states_entry, icl_forward_docstring
from ..heads import ICLHead, ICLOutput
from ..initialization import init_linear_normal
from ..loading import BitExactLoadingMixin
from ..prompts import check_model_prompt, check_no_backbone_kwargs, encode_labels, prompt_layout, prompt_tokens
from .configuration_sgpt import SGPTConfig

#: the parameters of the models' forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = ("xs", "ys", "loss_positions", "output_hidden_states", "check_inputs")

#: the docstring of the ICL model's forward: the shared text (forward_docs.py) with this model's own phrases
_FORWARD_DOCSTRING = icl_forward_docstring(
    output_hidden_states=hidden_states_entry("layer"),
    nan_cause="the masked attention matmul multiplies a weight of 0 by it, and 0 times inf is NaN",
)


def attention_weights(scores: torch.Tensor, allowed: torch.Tensor, normalization: str) -> torch.Tensor:
    """φ of the document: turn masked scores into attention weights, row by row.

    ``allowed`` is True where a row may attend. Every row allows at least itself, so a softmax row is
    never empty; an l1 row whose allowed scores are all 0 (a zero hidden state) stays 0 instead of 0/0.
    """
    if normalization == "softmax":
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    scores = scores.masked_fill(~allowed, 0.0)
    if normalization == "relu":
        return scores.relu()
    if normalization == "l1":
        norm = scores.abs().sum(-1, keepdim=True)
        return scores / torch.where(norm > 0, norm, 1.0)
    return scores  # "none"


def _full_precision(method):
    """Run ``method(self, first, ...)`` with autocast off on the device of its first tensor."""

    def wrapped(self, first: torch.Tensor, *args):
        with torch.autocast(device_type=first.device.type, enabled=False):
            return method(self, first, *args)

    wrapped.__doc__ = method.__doc__
    return wrapped


class SGPTBlock(GradientCheckpointingLayer):
    """One SGPT layer applied to the context stream and, if given, to the query stream."""

    def __init__(self, config: SGPTConfig):
        super().__init__()
        self.proj = nn.Linear(config.n_embd, config.n_embd)  # W_proj
        self.mlp = nn.Linear(config.n_embd, config.n_embd)  # W_MLP: the MLP's single matrix
        self.act = ACT2FN[config.activation_function]
        self.normalization = config.normalization
        self.scale = 1 / math.sqrt(config.n_embd) if config.scale_attn_weights else 1.0

    def forward(
        self, context: torch.Tensor, queries: torch.Tensor | None = None, update_context: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on both streams; with ``update_context=False`` (and queries) the context rows come back
        as they went in: the last layer's context outputs feed no prediction, so the model skips them."""
        new_queries = None if queries is None else self._update(queries, self._attend_queries(queries, context))
        if not update_context and queries is not None:
            return context, new_queries
        return self._update(context, self._attend_context(context)), new_queries

    def _update(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Eq. 13: ``σ(g(H) W_proj + H W_MLP) + g(H) W_proj + H``."""
        attended = self.proj(attended)
        return self.act(attended + self.mlp(hidden)) + attended + hidden

    # The scores and their normalisation run in float32 (autocast off, or it would cast the matmuls back
    # down): HHᵀ of un-normalised hidden states overflows float16, and an l1 norm summed in bfloat16
    # loses the small weights.
    @_full_precision
    def _attend_context(self, context: torch.Tensor) -> torch.Tensor:
        """``φ(HHᵀ) H`` under the causal mask: row t mixes rows ``s <= t``."""
        h = _at_least_float32(context)
        length = h.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=h.device).tril()
        weights = attention_weights(h @ h.transpose(1, 2) * self.scale, causal, self.normalization)
        return (weights @ h).to(context.dtype)

    @_full_precision
    def _attend_queries(self, queries: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Query ``i`` mixes the context rows ``j < i`` and itself, normalised together."""
        q, c = _at_least_float32(queries), _at_least_float32(context)
        n_points = q.shape[1]
        earlier = torch.ones(n_points, n_points, dtype=torch.bool, device=q.device).tril(-1)
        allowed = torch.cat((earlier, earlier.new_ones(n_points, 1)), dim=1)
        scores = torch.cat((q @ c.transpose(1, 2), (q * q).sum(-1, keepdim=True)), dim=-1) * self.scale
        weights = attention_weights(scores, allowed, self.normalization)
        return (weights[..., :n_points] @ c + weights[..., n_points:] * q).to(queries.dtype)


def _at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


class SGPTPreTrainedModel(BitExactLoadingMixin, PreTrainedModel):
    """Weight initialisation and loading shared by the SGPT models."""

    config_class = SGPTConfig
    base_model_prefix = "model"
    main_input_name = "xs"
    supports_gradient_checkpointing = True
    _no_split_modules = ["SGPTBlock"]
    #: its attention is fixed (identity Q/K/V, φ from the config), not one of transformers' implementations
    supports_attn_implementation = False

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            init_linear_normal(module, self.config.initializer_range)
        elif isinstance(module, SGPTModel):
            # W₀ ~ N(0, 1/token_width): a row of A with O(1) entries maps to O(1) hidden entries.
            init.normal_(module.read_in, mean=0.0, std=1 / math.sqrt(module.read_in.shape[0]))


class SGPTModel(SGPTPreTrainedModel):
    """Prompt → rows → fixed read-in → SGPT layers; the hidden state of every token ``(B, 2N, n_embd)``.

    Tokens are in the prompt format's order: for ``"concatenated"`` the query row ``[x_i, 0]`` at ``2i``
    and the context row ``[x_i, y_i]`` at ``2i + 1``; for ``"interleaved"`` x at ``2i`` and y at ``2i + 1``.
    """

    def __init__(self, config: SGPTConfig):
        super().__init__(config)
        self.prompt = prompt_layout(config)
        # W₀: fixed and random, but persistent so that a reloaded model is the same function.
        self.register_buffer("read_in", torch.empty(self.prompt.token_width, config.n_embd), persistent=True)
        self.layers = nn.ModuleList(SGPTBlock(config) for _ in range(config.n_layer))
        self.gradient_checkpointing = False
        self.post_init()

    # Copied from SGPTForInContextRegression.forward
    #   (signature: xs, ys, output_hidden_states, check_inputs)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, output_hidden_states: bool | None = None, check_inputs: bool = True,
        queries_only: bool = False, **kwargs) -> BaseModelOutput:  # fmt: skip
        """``check_inputs``: see :meth:`SGPTForInContextRegression.forward`.

        ``queries_only``: return only the states of the tokens that predict, ``(B, N, n_embd)`` (the query rows,
        or the x tokens of the interleaved format). In the concatenated format the last layer then skips the
        context rows, whose outputs nothing reads (unless ``output_hidden_states`` asks for every token).
        """
        tokens = prompt_tokens(self.config, self.prompt, xs, ys, self.read_in, check_inputs) @ self.read_in
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        if self.config.prompt_format == "concatenated":
            queries, context = tokens[:, 0::2], tokens[:, 1::2]
        else:
            queries, context = None, tokens
        hidden_states = (_merge(queries, context),) if output_hidden_states else None
        skip_last_context = queries_only and queries is not None and not output_hidden_states
        for index, layer in enumerate(self.layers):
            last = index == len(self.layers) - 1
            context, queries = layer(context, queries, update_context=not (last and skip_last_context))
            if output_hidden_states:
                hidden_states += (_merge(queries, context),)
        if queries_only:
            last_hidden = context[:, self.prompt.query_positions(xs.shape[1])] if queries is None else queries
        else:
            last_hidden = _merge(queries, context)
        return BaseModelOutput(last_hidden_state=last_hidden, hidden_states=hidden_states)

    def forward_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The document's model on matrices of rows ``(B, n, token_width)``: the output of every row under
        the plain causal mask, ``(B, n, n_embd)``. ``rows`` are taken as given (for the prefix matrix
        ``A^i`` the caller zeroes the last label); :func:`per_prefix_predictions` is built on it."""
        hidden = rows.to(self.read_in.dtype) @ self.read_in
        for layer in self.layers:
            hidden, _ = layer(hidden)
        return hidden


def _merge(queries: torch.Tensor | None, context: torch.Tensor) -> torch.Tensor:
    """The two streams back in token order (q_0, c_0, q_1, c_1, …); the single stream as it is."""
    if queries is None:
        return context
    batch, n_points, width = context.shape
    return torch.stack((queries, context), dim=2).reshape(batch, 2 * n_points, width)


class SGPTForInContextRegression(SGPTPreTrainedModel):
    """SGPT with a linear read-out ``W_O`` predicting ``y_i`` at every position from its query token.

    Example::

        >>> import torch
        >>> from hf_icl import SGPTConfig, SGPTForInContextRegression
        >>> from hf_icl.modeling.sgpt import per_prefix_predictions
        >>> model = SGPTForInContextRegression(SGPTConfig.from_preset("tiny", n_dims=5, n_points=11))
        >>> xs, ys = torch.randn(4, 11, 5), torch.randn(4, 11)
        >>> predictions = model(xs, ys).predictions  # every position in one pass
        >>> predictions.shape, torch.allclose(predictions, per_prefix_predictions(model, xs, ys), atol=1e-5)
        (torch.Size([4, 11]), True)
    """

    def __init__(self, config: SGPTConfig):
        super().__init__(config)
        self.model = SGPTModel(config)
        self.head = ICLHead(config.n_embd, config.target_kind, config.n_classes)
        self.post_init()

    # Copied from GPT2ForInContextRegression.forward
    #   (signature: xs, ys, loss_positions, output_hidden_states; Args: loss_positions)
    @add_forward_docstring(_FORWARD_DOCSTRING)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, loss_positions: torch.Tensor | list[int] | None = None,
        output_hidden_states: bool | None = None, check_inputs: bool = True, **kwargs) -> ICLOutput:  # fmt: skip
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        base = self.model(
            xs, ys, output_hidden_states=output_hidden_states, check_inputs=check_inputs, queries_only=True
        )
        return self.head.predict(base.last_hidden_state, ys, loss_positions, base.hidden_states)


@torch.no_grad()
def per_prefix_predictions(model: SGPTForInContextRegression, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The document's evaluation, one forward per prefix: position ``i`` is the read-out of the last row of
    ``A^i = [[x_0, y_0], …, [x_i, 0]]``. ``(B, N)`` predictions (``(B, N, C)`` logits for a categorical
    head). The one-pass forward equals it; this loop exists as its reference and benchmark baseline."""
    config = model.config
    if config.prompt_format != "concatenated":
        raise ValueError(f"per-prefix matrices exist for prompt_format='concatenated', got {config.prompt_format!r}")
    check_model_prompt(config, xs, ys, dtype=model.model.read_in.dtype)
    rows = torch.cat((xs, encode_labels(ys, config.target_kind, config.n_classes).to(xs.dtype)), dim=-1)
    outputs = []
    for i in range(xs.shape[1]):
        prefix = rows[:, : i + 1].clone()
        prefix[:, i, config.n_dims :] = 0  # the label being predicted is hidden
        outputs.append(model.head.read_out(model.model.forward_rows(prefix)[:, -1]))
    out = torch.stack(outputs, dim=1)
    return out if config.target_kind == "categorical" else out.squeeze(-1)
