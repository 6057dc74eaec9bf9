"""GPT-2 in-context learner: Garg et al.'s read-in → GPT-2 → read-out, around transformers' GPT2Model.

The backbone is transformers' own :class:`~transformers.GPT2Model` built from the same config,
so any attention implementation registered with transformers (sdpa, eager, CAB, …) runs
inside it unchanged.
"""

from __future__ import annotations

import torch
from transformers import GPT2Model
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel

from ..forward_docs import add_forward_docstring, icl_forward_docstring
from ..heads import ICLHead, ICLOutput
from ..initialization import icl_io_layer, init_icl_io_layer
from ..loading import BitExactLoadingMixin
from ..prompts import check_forward_kwargs, prompt_layout, prompt_tokens
from .configuration_gpt2_icl import GPT2ICLConfig

#: the parameters of the models' forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = ("xs", "ys", "loss_positions", "output_hidden_states", "output_attentions", "check_inputs")

#: the docstring of the ICL model's forward: the shared text (forward_docs.py) with this model's own phrases
_FORWARD_DOCSTRING = icl_forward_docstring(
    nan_cause="SDPA turns a whole attention row NaN for one NaN score, and a masked weight of 0 times an infinite "
    "value is NaN"
)


class GPT2ICLPreTrainedModel(BitExactLoadingMixin, GPT2PreTrainedModel):
    """Weight initialisation (GPT-2's) and loading for the GPT-2 ICL models."""

    config_class = GPT2ICLConfig
    base_model_prefix = "model"
    main_input_name = "xs"

    def _init_weights(self, module):
        super()._init_weights(module)
        init_icl_io_layer(module, self.config.io_init)


class GPT2ICLModel(GPT2ICLPreTrainedModel):
    """Prompt → tokens → read-in → GPT-2; returns the hidden state of every token ``(B, 2N, H)``."""

    def __init__(self, config: GPT2ICLConfig):
        super().__init__(config)
        self.prompt = prompt_layout(config)
        self.read_in = icl_io_layer(self.prompt.token_width, config.n_embd)
        self.backbone = GPT2Model(config)
        # Prompts enter through read_in; the token table is never used, and a trainable unused
        # parameter would stall DistributedDataParallel's gradient reduction.
        self.backbone.wte.weight.requires_grad_(False)
        self.post_init()

    def forward(
        self,
        xs: torch.Tensor,
        ys: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        check_inputs: bool = True,
        **kwargs,
    ) -> BaseModelOutput:
        """``check_inputs``: see :meth:`GPT2ForInContextRegression.forward`."""
        tokens = prompt_tokens(self.config, self.prompt, xs, ys, self.read_in.weight, check_inputs)
        check_forward_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        out = self.backbone(
            inputs_embeds=self.read_in(tokens),
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            use_cache=False,
            **kwargs,
        )
        return BaseModelOutput(
            last_hidden_state=out.last_hidden_state, hidden_states=out.hidden_states, attentions=out.attentions
        )


class GPT2ForInContextRegression(GPT2ICLPreTrainedModel):
    """Predicts ``y_i`` at every position from the hidden state of the token holding ``x_i``.

    ``config.target_kind`` picks the head: regression values with MSE, ±1 labels with BCE on
    one logit, or ``n_classes`` logits with cross-entropy.

    Example::

        >>> import torch
        >>> from hf_icl import GPT2ICLConfig, GPT2ForInContextRegression
        >>> model = GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=5, n_points=11))
        >>> xs, ys = torch.randn(4, 11, 5), torch.randn(4, 11)
        >>> model(xs, ys).predictions.shape
        torch.Size([4, 11])
    """

    def __init__(self, config: GPT2ICLConfig):
        super().__init__(config)
        self.model = GPT2ICLModel(config)
        self.head = ICLHead(config.n_embd, config.target_kind, config.n_classes, io_layer=True)
        self.post_init()

    @add_forward_docstring(_FORWARD_DOCSTRING)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, loss_positions: torch.Tensor | list[int] | None = None,
        output_hidden_states: bool | None = None, output_attentions: bool | None = None, check_inputs: bool = True,
        **kwargs) -> ICLOutput:  # fmt: skip
        check_forward_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        base = self.model(
            xs,
            ys,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            check_inputs=check_inputs,
            **kwargs,
        )
        hidden = base.last_hidden_state[:, self.model.prompt.query_positions(xs.shape[1])]
        return self.head.predict(hidden, ys, loss_positions, base.hidden_states, base.attentions)
