"""Linear-attention GPT: GPT-2's blocks with causal linear attention, as an ICL regressor and a causal LM.

Attention is :func:`~hf_icl.kernels.linear_attention.causal_linear_attention`, so its memory is a state
``(S, z)`` of fixed size per layer instead of a key/value list that grows with the sequence.
:class:`LinearAttentionCache` keeps exactly that during generation: a prompt is prefilled in one pass
(``linear_attention_state`` seeds the state), then each new token costs one
``linear_attention_step`` per layer, whatever the length so far.

Padding: ``attention_mask`` (1 = real token) removes padded tokens from ``S`` and ``z`` and positions count
real tokens only, so a left- or right-padded row gives, on its real tokens, what it gives alone.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from ...kernels.linear_attention import causal_linear_attention, linear_attention_state, linear_attention_step
from ..causal_lm import CheckedGenerationMixin, ModelOwnCache, ModelOwnCacheLayer
from ..forward_docs import add_forward_docstring, hidden_states_entry, icl_forward_docstring
from ..heads import ICLHead, ICLOutput
from ..initialization import icl_io_layer, init_icl_io_layer
from ..lm_inputs import (
    check_input_ids,
    check_labels,
    check_position_ids,
    real_token_mask,
)
from ..loading import BitExactLoadingMixin
from ..prompts import check_no_backbone_kwargs, prompt_layout, prompt_tokens
from .configuration_linear_gpt import LinearGPTConfig

#: the parameters of the ICL model's forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = ("xs", "ys", "loss_positions", "output_hidden_states", "check_inputs")

#: the docstring of the ICL model's forward: the shared text (forward_docs.py) with this model's own phrases
_FORWARD_DOCSTRING = icl_forward_docstring(
    output_hidden_states=hidden_states_entry("block"),
    nan_cause="the masked linear-attention matmuls multiply a weight of 0 by it, and 0 times inf is NaN",
)

State = tuple[torch.Tensor, torch.Tensor]


# ------------------------------------------------------------------------------------------------------------
# Cache: one (S, z) per layer and a token count, nothing that grows with the sequence
# ------------------------------------------------------------------------------------------------------------


class LinearAttentionCacheLayer(ModelOwnCacheLayer):
    """One layer's state ``(S, z)``: S ``(B, H, F, Dv)`` and z ``(B, H, F)`` in float32 (float64 for a float64
    model), or ``None`` before the prefill."""

    row_tensors = ("state",)
    is_croppable = False

    def __init__(self):
        self.state: State | None = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a linear-attention state cannot forget tokens: it keeps their sum, not the tokens")


class LinearAttentionCache(ModelOwnCache):
    """Constant-memory generation cache of :class:`LinearGPTForCausalLM`.

    Per layer the state ``(S, z)`` of :func:`~hf_icl.kernels.linear_attention.linear_attention_state`
    (``layers[i].state``); for the whole batch the number of columns read so far (``get_seq_length()``,
    padding included: ``generate`` slices its inputs by it) and ``positions`` ``(B,)``, each row's real
    tokens so far (its next learned position). None of it grows with the sequence.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.linear_gpt import LinearGPTConfig, LinearGPTForCausalLM
        >>> model = LinearGPTForCausalLM(LinearGPTConfig(vocab_size=20, n_embd=16, n_layer=2, n_head=2)).eval()
        >>> cache = model(torch.randint(20, (1, 30)), use_cache=True).past_key_values
        >>> cache.get_seq_length(), cache.layers[0].state[0].shape
        (30, torch.Size([1, 2, 8, 8]))
        >>> _ = model(torch.randint(20, (1, 5)), past_key_values=cache)  # five more tokens: the state keeps its size
        >>> cache.get_seq_length(), cache.layers[0].state[0].shape
        (35, torch.Size([1, 2, 8, 8]))
    """

    row_tensors = ("positions",)

    def __init__(self, num_layers: int):
        super().__init__(layers=[LinearAttentionCacheLayer() for _ in range(num_layers)])
        self.seen_tokens = 0
        self.positions: torch.Tensor | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def advance(self, num_columns: int, real: torch.Tensor) -> None:
        """Account for ``num_columns`` more columns, of which ``real`` ``(B,)`` are real tokens per row."""
        self.seen_tokens += num_columns
        self.positions = real if self.positions is None else self.positions + real

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0


# ------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------


class LinearGPTAttention(nn.Module):
    """Multi-head causal linear attention: GPT-2's fused q/k/v projection and output projection around it."""

    def __init__(self, config: LinearGPTConfig, layer_idx: int):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.layer_idx = layer_idx
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.c_proj.is_residual_projection = True
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        self.feature_map = config.linear_attention_feature_map
        self.eps = config.linear_attention_eps
        self.normalize = config.linear_attention_normalize
        self.mode = config.linear_attention_mode
        self.backend = config.linear_attention_backend
        self.chunk_size = config.linear_attention_chunk_size

    def forward(
        self, hidden_states: torch.Tensor, key_mask: torch.Tensor | None, cache: LinearAttentionCache | None
    ) -> torch.Tensor:
        batch, length, width = hidden_states.shape
        q, k, v = (
            x.view(batch, length, self.n_head, self.head_dim).transpose(1, 2)
            for x in self.c_attn(hidden_states).split(width, dim=2)
        )
        layer = None if cache is None else cache.layers[self.layer_idx]
        if layer is None or layer.state is None:
            out = causal_linear_attention(
                q,
                k,
                v,
                feature_map=self.feature_map,
                eps=self.eps,
                normalize=self.normalize,
                mode=self.mode,
                backend=self.backend,
                chunk_size=self.chunk_size,
                key_mask=key_mask,
            )
            if layer is not None:  # prefill: the state after the prompt, padding left out
                layer.state = linear_attention_state(k, v, feature_map=self.feature_map, key_mask=key_mask)
        else:
            out, layer.state = self._recur(q, k, v, layer.state, key_mask)
        out = out.transpose(1, 2).reshape(batch, length, width)
        return self.resid_dropout(self.c_proj(out))

    def _recur(self, q, k, v, state: State, key_mask: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """Continue from ``state`` one token at a time (a decode step is the one-token case)."""
        outputs = []
        for t in range(q.shape[2]):
            token = slice(t, t + 1)
            out, new_state = linear_attention_step(
                q[:, :, token],
                k[:, :, token],
                v[:, :, token],
                state,
                feature_map=self.feature_map,
                eps=self.eps,
                normalize=self.normalize,
            )
            if key_mask is not None:  # a padded token leaves the state as it was and outputs 0, as in the prefill
                real = key_mask[:, t, None, None]  # (B, 1, 1)
                new_state = (
                    torch.where(real[..., None], new_state[0], state[0]),
                    torch.where(real, new_state[1], state[1]),
                )
                out = out.masked_fill(~real[..., None], 0.0)
            outputs.append(out)
            state = new_state
        return torch.cat(outputs, dim=2), state


class LinearGPTMLP(nn.Module):
    """GPT-2's MLP: ``n_inner`` (default ``4 * n_embd``) wide, ``activation_function`` in between."""

    def __init__(self, config: LinearGPTConfig):
        super().__init__()
        inner = config.n_inner or 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, inner)
        self.c_proj = nn.Linear(inner, config.n_embd)
        self.c_proj.is_residual_projection = True
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class LinearGPTBlock(GradientCheckpointingLayer):
    """Pre-LN block: ``h + attn(ln_1(h))``, then ``h + mlp(ln_2(h))``."""

    def __init__(self, config: LinearGPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = LinearGPTAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = LinearGPTMLP(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        past_key_values: LinearAttentionCache | None = None,
    ) -> torch.Tensor:
        # the keyword is past_key_values: gradient checkpointing drops it by that name (it would write the state twice)
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), key_mask, past_key_values)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


# ------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------


class LinearGPTPreTrainedModel(BitExactLoadingMixin, PreTrainedModel):
    """GPT-2's initialisation (and Garg et al.'s read-in/read-out init with ``io_init="garg"``) and loading."""

    config_class = LinearGPTConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LinearGPTBlock"]
    #: its attention is the linear-attention op configured by ``linear_attention_*``, not one of transformers'
    supports_attn_implementation = False

    def _init_weights(self, module):
        super()._init_weights(module)  # N(0, initializer_range) linears and embeddings, unit LayerNorms
        # Flags on the linear layers themselves: transformers skips the init of a custom-code module that owns no
        # parameters directly (an attention or MLP block), so a rule keyed on the block would never run.
        if getattr(module, "is_residual_projection", False):
            # GPT-2: the projections onto the residual stream shrink by 1/√(2 · n_layer), two per block
            std = self.config.initializer_range / math.sqrt(2 * self.config.n_layer)
            init.normal_(module.weight, mean=0.0, std=std)
        init_icl_io_layer(module, self.config.io_init)


class LinearGPTModel(LinearGPTPreTrainedModel):
    """Token (or given) embeddings + learned positions → linear-attention blocks → final LayerNorm.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.linear_gpt import LinearGPTConfig, LinearGPTModel
        >>> model = LinearGPTModel(LinearGPTConfig(vocab_size=20, n_embd=16, n_layer=2, n_head=2, n_positions=32))
        >>> ids = torch.randint(20, (2, 10))
        >>> model(ids, attention_mask=torch.ones(2, 10)).last_hidden_state.shape
        torch.Size([2, 10, 16])
    """

    def __init__(self, config: LinearGPTConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(LinearGPTBlock(config, layer_idx=i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.wte = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: LinearAttentionCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Hidden states ``(B, T, n_embd)`` of ``input_ids`` ``(B, T)`` or ``inputs_embeds`` ``(B, T, n_embd)``.

        Args:
            attention_mask: ``(B, T)``, or ``(B, past + T)`` as ``generate`` passes it; 1 = real token, 0 = padding.
                Padded tokens never enter the state, and positions count real tokens only.
            position_ids: ``(B, T)`` or ``(T,)``; default: each row's real tokens so far (0, 1, … from its first
                real token, continuing from the cache).
            past_key_values: a :class:`LinearAttentionCache` to continue from (it is updated in place).
            use_cache: return a cache (a new one if none was given); default ``config.use_cache`` outside training.
        """
        check_no_backbone_kwargs(type(self).__name__, kwargs, ("input_ids", "attention_mask", "position_ids"))
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("LinearGPTModel.forward takes exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            check_input_ids(input_ids, self.config.vocab_size)
            inputs_embeds = self.wte(input_ids)
        batch, length = inputs_embeds.shape[:2]
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        if self.gradient_checkpointing and self.training and (use_cache or past_key_values is not None):
            raise ValueError(
                "gradient checkpointing recomputes each block, which would add its tokens to the cache twice; "
                "pass use_cache=False and no past_key_values in training"
            )
        if past_key_values is None and use_cache:
            past_key_values = LinearAttentionCache(self.config.n_layer)
        if past_key_values is not None and not isinstance(past_key_values, LinearAttentionCache):
            raise ValueError(
                f"past_key_values must be a LinearAttentionCache (the model makes one with use_cache=True), "
                f"got {type(past_key_values).__name__}"
            )
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        key_mask = real_token_mask(attention_mask, batch, length, past, inputs_embeds.device)
        if position_ids is None:
            position_ids = self._default_positions(key_mask, batch, length, past_key_values, inputs_embeds.device)
        else:  # generate passes its own (from the mask): past n_positions they would index wpe out of range
            check_position_ids(position_ids, batch, length, self.config.n_positions)

        hidden_states = self.drop(inputs_embeds + self.wpe(position_ids))
        all_hidden_states = () if output_hidden_states else None
        for block in self.h:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states = block(hidden_states, key_mask, past_key_values=past_key_values)
        hidden_states = self.ln_f(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)

        if past_key_values is not None:
            real = torch.full((batch,), length, device=inputs_embeds.device) if key_mask is None else key_mask.sum(1)
            past_key_values.advance(length, real)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states, past_key_values=past_key_values, hidden_states=all_hidden_states
        )

    def _default_positions(self, key_mask, batch, length, cache, device) -> torch.Tensor:
        """Each token's index among its row's real tokens, counted on from the cache."""
        start = cache.positions if cache is not None and cache.positions is not None else None
        if key_mask is None:
            offsets = torch.arange(length, device=device).expand(batch, length)
        else:  # padding before the first real token sits at 0, after it at the last real position
            offsets = (key_mask.long().cumsum(1) - 1).clamp_min(0)
        positions = offsets if start is None else offsets + start[:, None]
        # the largest position is at most (columns so far + length - 1): check exactly only if that bound is too big
        if (0 if cache is None else cache.seen_tokens) + length > self.config.n_positions:
            longest = int(positions.max()) + 1
            if longest > self.config.n_positions:
                raise ValueError(
                    f"sequences reach {longest} tokens but the model has n_positions={self.config.n_positions} "
                    "learned positions"
                )
        return positions


class LinearGPTForInContextRegression(LinearGPTPreTrainedModel):
    """Predicts ``y_i`` at every position of a prompt, like :class:`~hf_icl.GPT2ForInContextRegression`.

    The prompt ``(xs, ys)`` becomes tokens (``config.prompt_format``), a linear read-in maps them to
    ``n_embd``, the linear-attention GPT runs over them, and the ICL head reads the token of each ``x_i``
    (regression with MSE, ±1 labels with BCE, or ``n_classes`` logits with cross-entropy).

    Example::

        >>> import torch
        >>> from hf_icl.modeling.linear_gpt import LinearGPTConfig, LinearGPTForInContextRegression
        >>> model = LinearGPTForInContextRegression(LinearGPTConfig.from_preset("tiny", n_dims=5, n_points=11))
        >>> xs, ys = torch.randn(4, 11, 5), torch.randn(4, 11)
        >>> model(xs, ys).predictions.shape
        torch.Size([4, 11])
    """

    main_input_name = "xs"

    def __init__(self, config: LinearGPTConfig):
        super().__init__(config)
        if config.n_positions < 2 * config.n_points:
            raise ValueError(
                f"n_positions ({config.n_positions}) must be at least 2 * n_points = {2 * config.n_points}, the tokens "
                "of the longest prompt (leave n_positions unset to get exactly that)"
            )
        self.prompt = prompt_layout(config)
        self.read_in = icl_io_layer(self.prompt.token_width, config.n_embd)
        self.transformer = LinearGPTModel(config)
        # Prompts enter through read_in; a trainable unused token table would stall DDP's gradient reduction.
        self.transformer.wte.weight.requires_grad_(False)
        self.head = ICLHead(config.n_embd, config.target_kind, config.n_classes, io_layer=True)
        self.post_init()

    # Copied from GPT2ForInContextRegression.forward
    #   (signature: xs, ys, loss_positions, output_hidden_states; Args: loss_positions)
    @add_forward_docstring(_FORWARD_DOCSTRING)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, loss_positions: torch.Tensor | list[int] | None = None,
        output_hidden_states: bool | None = None, check_inputs: bool = True, **kwargs) -> ICLOutput:  # fmt: skip
        tokens = prompt_tokens(self.config, self.prompt, xs, ys, self.read_in.weight, check_inputs)
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        base = self.transformer(
            inputs_embeds=self.read_in(tokens), use_cache=False, output_hidden_states=output_hidden_states
        )
        hidden = base.last_hidden_state[:, self.prompt.query_positions(xs.shape[1])]
        return self.head.predict(hidden, ys, loss_positions, base.hidden_states)


class LinearGPTForCausalLM(LinearGPTPreTrainedModel, CheckedGenerationMixin):
    """The linear-attention GPT with a token LM head; ``generate`` runs in constant memory per layer.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.linear_gpt import LinearGPTConfig, LinearGPTForCausalLM
        >>> model = LinearGPTForCausalLM(LinearGPTConfig(vocab_size=20, n_embd=16, n_layer=2, n_head=2, n_positions=64))
        >>> ids = torch.randint(20, (2, 10))
        >>> model(ids, labels=ids).loss.shape
        torch.Size([])
        >>> model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0).shape
        torch.Size([2, 15])
    """

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    #: the state cannot be rolled back, so assisted generation (which needs that) refuses this model
    _is_stateful = True

    def __init__(self, config: LinearGPTConfig):
        super().__init__(config)
        self.transformer = LinearGPTModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    # Copied from LinearGPTModel.forward
    #   (signature: input_ids, attention_mask, position_ids, inputs_embeds, past_key_values, use_cache,
    #   output_hidden_states)
    def forward(
        self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None, inputs_embeds: torch.Tensor | None = None,
        past_key_values: LinearAttentionCache | None = None, labels: torch.LongTensor | None = None,
        use_cache: bool | None = None, output_hidden_states: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
        **kwargs) -> CausalLMOutputWithPast:  # fmt: skip
        """Next-token logits ``(B, T, vocab_size)``; with ``labels`` ``(B, T)`` the mean cross-entropy of predicting
        ``labels[:, t + 1]`` at ``t`` (``-100`` = ignored). ``logits_to_keep``: an int keeps the last that many
        positions (0: all), a tensor the positions it lists. Other arguments as :meth:`LinearGPTModel.forward`."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)  # Trainer's token count for the loss
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        hidden_states = out.last_hidden_state
        if labels is not None:
            check_labels(labels, self.config.vocab_size, tuple(hidden_states.shape[:2]))
        logits = self.lm_head(self.kept_positions(hidden_states, logits_to_keep))
        return CausalLMOutputWithPast(
            loss=self.next_token_loss(logits, labels, num_items_in_batch),
            logits=logits,
            past_key_values=out.past_key_values,
            hidden_states=out.hidden_states,
        )
