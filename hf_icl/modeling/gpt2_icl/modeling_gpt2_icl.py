"""GPT-2 in-context learner: Garg et al.'s read-in → GPT-2 → read-out, around transformers' GPT2Model.

The backbone is transformers' own :class:`~transformers.GPT2Model` built from the same config,
so any attention implementation registered with transformers (sdpa, eager, CAB, …) runs
inside it unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import GPT2Model
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel

from ..heads import ICLHead, ICLOutput, loss_mask_for
from ..loading import BitExactLoadingMixin
from ..prompts import PROMPT_FORMATS, check_forward_kwargs, check_model_prompt, encode_labels
from .configuration_gpt2_icl import GPT2ICLConfig

#: the parameters of the models' forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = ("xs", "ys", "loss_positions", "output_hidden_states", "output_attentions", "check_inputs")


class GPT2ICLPreTrainedModel(BitExactLoadingMixin, GPT2PreTrainedModel):
    """Weight initialisation (GPT-2's) and loading for the GPT-2 ICL models."""

    config_class = GPT2ICLConfig
    base_model_prefix = "model"
    main_input_name = "xs"

    def _init_weights(self, module):
        super()._init_weights(module)
        if self.config.io_init == "garg" and getattr(module, "is_icl_io_layer", False):
            # PyTorch's own nn.Linear init (kaiming-uniform with a=√5 is U(±1/√fan_in)), as Garg et al.'s
            # read-in/read-out get it; the GPT-2 scheme above gives them N(0, 0.02).
            bound = 1 / math.sqrt(module.in_features)
            init.uniform_(module.weight, -bound, bound)
            init.uniform_(module.bias, -bound, bound)


class GPT2ICLModel(GPT2ICLPreTrainedModel):
    """Prompt → tokens → read-in → GPT-2; returns the hidden state of every token ``(B, 2N, H)``."""

    def __init__(self, config: GPT2ICLConfig):
        super().__init__(config)
        self.prompt = PROMPT_FORMATS[config.prompt_format](config.n_dims, config.label_width)
        self.read_in = nn.Linear(self.prompt.token_width, config.n_embd)
        self.read_in.is_icl_io_layer = True
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
        config = self.config
        read_in = self.read_in.weight
        check_model_prompt(config, xs, ys, check_values=check_inputs, device=read_in.device, dtype=read_in.dtype)
        check_forward_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        labels = encode_labels(ys, self.config.target_kind, self.config.n_classes)
        embeds = self.read_in(self.prompt.tokens(xs.to(self.read_in.weight.dtype), labels))
        out = self.backbone(
            inputs_embeds=embeds,
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
        self.head = ICLHead(config.n_embd, config.target_kind, config.n_classes)
        self.head.read_out.is_icl_io_layer = True
        self.post_init()

    def forward(
        self,
        xs: torch.Tensor,
        ys: torch.Tensor,
        loss_positions: torch.Tensor | list[int] | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        check_inputs: bool = True,
        **kwargs,
    ) -> ICLOutput:
        """Predict every position of the prompts ``xs (B, N, n_dims)``, ``ys (B, N)``.

        Args:
            loss_positions: a ``(N,)`` bool mask or integer indices of the positions in the loss (default all).
            check_inputs: check the prompt's *values* (finite ``xs``; ``ys`` finite, ±1 or class ids in
                ``[0, n_classes)`` by ``config.target_kind``; ``|x|`` and real ``|y|`` at most
                :func:`.max_prompt_magnitude` of the model's dtype) and raise a ``ValueError`` naming the first bad
                entry. This costs one device sync; pass ``False`` for prompts you built yourself (the trainer
                does, for the tasks it samples). Shapes, dtypes and devices are checked either way. With ``False``
                a NaN, inf or out-of-bound entry can make *earlier* positions NaN too (SDPA turns a whole attention
                row NaN for one NaN score, and a masked weight of 0 times an infinite value is NaN), so the
                predictions are causal only for valid inputs.
        """
        check_forward_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        base = self.model(
            xs,
            ys,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            check_inputs=check_inputs,
            **kwargs,
        )
        n_points = xs.shape[1]
        hidden = base.last_hidden_state[:, self.model.prompt.query_positions(n_points)]
        out = self.head(hidden, ys, loss_mask_for(loss_positions, n_points, xs.device))
        out.hidden_states, out.attentions = base.hidden_states, base.attentions
        return out
