"""The functional-GD transformer for categorical in-context learning (seed 004) as a transformers model.

Layout. Position ``i`` carries a *state* ``z_i = (x_i, f_i, s_i)``: the input (``d``), the latent function
(``d'``) and a scratch slot (``d'``) for the expected embedding, which starts at ``(x_i, 0, 0)``; and a *label
slot* ``ℓ_i = w_{e,y_i} − w̄_e`` (``d'``), the document's centred label embedding, fixed through the blocks.
The document's token ``e_{i,0} = (x_i, w_{e,y_i} − w̄_e, 0_{d'})`` is ``(x_i, ℓ_i, f_i)``; the scratch slot is
what the multi-step blocks add.

What attends to what (``config.context_attention``):

* ``"full"`` (the document's transformer). A prompt is ``m`` context pairs followed by queries
  (``forward(..., n_context=m)``): head 1 of every token reads the ``m`` context tokens ``(z_j, ℓ_j)`` (a
  context token its own pair too), head 2 reads the context's states and the token's own. No token reads a
  query, so each query's logits are K steps of the document's functional GD on the context, whatever the other
  queries are. Without ``n_context`` every position is the query of its own prefix: the prompt is copied once
  per position (copy ``p`` has the pairs before ``p`` as its context and ``p`` as its query) and the copies run as
  one batch, ``N×`` the work of one pass (:func:`.functional_gd.prefix_masks`); it equals a per-prefix loop.
* ``"causal"`` (a variant): head 1 of token ``i`` reads the pairs ``j < i``, head 2 the states ``j <= i``, one
  pass for every position. For K ≥ 2 it computes :func:`.functional_gd.causal_functional_gd_logits`, not the
  document's algorithm.

Either way the label slot is read only by head 1's keys and values, from context tokens, so a prediction never
depends on its own label or a later one, for *any* parameter values.

A block (:class:`GDTransformerBlock`) is

1. self-attention with two heads, both reading the block's input state, their outputs added to it:

   * head 1 (``update``): weights ``κ(q_i, k_j)`` over the context pairs (the config's kernel, bandwidth,
     ``normalize_attention``), divided by their number with ``normalize_by_count``;
   * head 2 (``erase``): softmax of ``−λ‖q_i − k_j‖²`` over the context's states and its own;

2. cross-attention (``expect``): queries from the state, keys and values from the centred class embeddings
   ``w_{e,c} − w̄_e`` (softmax over the C classes);
3. optionally a feed-forward layer (:class:`~.layers.GDFeedForward`: LayerNorm, Linear, GELU, Linear), added to
   the state.

Logits are ``W_eᵀ f_i``: ``W_e`` (``d' × C``) is one parameter, used for the label slots, the cross-attention
and the read-out. Every projection is a bias-free ``nn.Linear``, so the architecture trains from a random
initialisation ("Trained TF" in the document).

The GD construction (:meth:`GDTransformerForInContextClassification.from_gd_construction`) sets, in block k,

* head 1: ``q = x_i``, ``k = x_j``, ``v = ℓ_j − s_j = w_{e,y_j} − E(w_e)|f_{j,k}``, output ``η v`` into f;
* head 2: ``q = x_i``, ``k = x_j``, ``v = s_j``, output ``−v`` into the scratch slot, with a huge λ
  (:data:`CONSTRUCTION_ERASE_TEMPERATURE`): the score ``−λ‖x_i − x_j‖²`` is exactly 0 at ``j = i`` (the same
  numbers are subtracted) and below it everywhere else, so the off-diagonal weights ``exp(−λ‖x_i − x_j‖²)``
  underflow to 0 (below float64's precision once ``‖x_i − x_j‖² > 37 / λ``; only exact duplicates of ``x_i``
  in the context share the weight). Head 2 then returns ``s_i`` itself and erases it;
* cross-attention: ``q = f_{i,k+1}``, ``k = v = w_{e,c} − w̄_e``: the weights are ``softmax(W_eᵀ f_{i,k+1})``
  (centring moves every score by the same ``w̄_eᵀ f``), the output ``E(w_e)|f_{i,k+1} − w̄_e`` goes into the
  scratch slot, ready for head 1 of the next block;

so ``f`` after K blocks is exactly K steps of functional GD (:func:`.functional_gd.functional_gd_logits`, or
:func:`.functional_gd.causal_functional_gd_logits` with ``context_attention="causal"``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer

from ...validation import check_float, check_int
from ..heads import ICLOutput, loss_mask_for
from ..initialization import init_linear_normal
from ..loading import BitExactLoadingMixin
from ..prompts import check_model_prompt, check_no_backbone_kwargs
from .configuration_gd_transformer import GDTransformerConfig
from .functional_gd import (
    causal_context_mask,
    check_finite_tensor,
    context_query_masks,
    kernel_scores,
    kernel_weights,
    overflow_message,
    pair_counts,
    prefix_masks,
    squared_distances,
)
from .layers import GDFeedForward

#: λ of head 2 in the GD construction: off-diagonal weights exp(−λ‖x_i − x_j‖²) underflow for ‖x_i − x_j‖² > ~1e-10
CONSTRUCTION_ERASE_TEMPERATURE = 1e12

#: the parameters of the model's forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = (
    "xs",
    "ys",
    "loss_positions",
    "n_context",
    "output_hidden_states",
    "output_attentions",
    "check_inputs",
)


# ------------------------------------------------------------------------------------------------------------
# Layout of the state and the context token
# ------------------------------------------------------------------------------------------------------------


def input_slot(config: GDTransformerConfig) -> slice:
    """Where ``x_i`` sits in the state (and in the context token)."""
    return slice(0, config.n_dims)


def latent_slot(config: GDTransformerConfig) -> slice:
    """Where the latent function ``f_i`` sits in the state (and in the context token)."""
    return slice(config.n_dims, config.n_dims + config.embed_dim)


def scratch_slot(config: GDTransformerConfig) -> slice:
    """Where the expected embedding (``E(w_e)|f_i − w̄_e`` in the construction) sits; the simplified block has none."""
    if config.simplified:
        raise ValueError("the simplified block (simplified=True) has no scratch slot")
    start = config.n_dims + config.embed_dim
    return slice(start, start + config.embed_dim)


def label_slot(config: GDTransformerConfig) -> slice:
    """Where ``w_{e,y_j} − w̄_e`` sits in the context token (after the state)."""
    return slice(config.state_width, config.token_width)


# ------------------------------------------------------------------------------------------------------------
# Layers
# ------------------------------------------------------------------------------------------------------------


class GDClassEmbedding(nn.Module):
    """The class embeddings ``W_e`` (``d' × C``; column ``c`` embeds class ``c``), shared by the label slots, the
    cross-attention and the read-out ``W_eᵀ f``."""

    def __init__(self, config: GDTransformerConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.embed_dim, config.n_classes))

    def centred(self) -> torch.Tensor:
        """``W_e − w̄_e 1ᵀ``: every column minus the mean column, ``(d', C)``."""
        return self.weight - self.weight.mean(dim=1, keepdim=True)


class GDSelfAttention(nn.Module):
    """The block's self-attention: head 1 (``update_*``) and, unless the block is simplified, head 2 (``erase_*``).

    Head 1's queries read the state ``z_i``, its keys and values the context token ``(z_j, ℓ_j)``; head 2 reads
    states only. The masks say which tokens each head attends to. Query/key width is ``n_dims``, value width
    ``embed_dim``; both heads write into the whole state.
    """

    def __init__(self, config: GDTransformerConfig):
        super().__init__()
        self.config = config
        state, token, qk, v = config.state_width, config.token_width, config.n_dims, config.embed_dim
        self.update_query = nn.Linear(state, qk, bias=False)
        self.update_key = nn.Linear(token, qk, bias=False)
        self.update_value = nn.Linear(token, v, bias=False)
        self.update_output = nn.Linear(v, state, bias=False)
        self.has_erase_head = not config.simplified
        if self.has_erase_head:
            self.erase_query = nn.Linear(state, qk, bias=False)
            self.erase_key = nn.Linear(state, qk, bias=False)
            self.erase_value = nn.Linear(state, v, bias=False)
            self.erase_output = nn.Linear(v, state, bias=False)

    def forward(
        self, states: torch.Tensor, tokens: torch.Tensor, update_mask: torch.Tensor, erase_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``states (..., N, state_width)``, ``tokens (..., N, token_width)``, bool masks ``(..., N, N)`` (True at
        ``[i, j]`` where token ``i`` may read token ``j``; head 1's, head 2's) → (the sum of both heads' outputs,
        ``(..., heads, N, N)`` attention weights)."""
        config = self.config
        update_weights = kernel_weights(
            self.update_query(states),
            self.update_key(tokens),
            config.kernel,
            config.bandwidth,
            update_mask,
            config.normalize_attention,
        )
        update = update_weights @ self.update_value(tokens)
        if config.normalize_by_count:
            update = update / pair_counts(update_mask, update.dtype)
        out, weights = self.update_output(update), [update_weights]
        if self.has_erase_head:
            # −λ‖q_i − k_j‖² from the differences: exactly 0 at j = i when the query and key maps agree
            scores = squared_distances(self.erase_query(states), self.erase_key(states)) * -config.erase_temperature
            erase_weights = scores.masked_fill(~erase_mask, float("-inf")).softmax(dim=-1)
            out = out + self.erase_output(erase_weights @ self.erase_value(states))
            weights.append(erase_weights.expand_as(update_weights))
        return out, torch.stack(weights, dim=-3)


class GDCrossAttention(nn.Module):
    """Cross-attention from each state to the C centred class embeddings ``w_{e,c} − w̄_e`` (one softmax head)."""

    def __init__(self, config: GDTransformerConfig):
        super().__init__()
        state, width = config.state_width, config.embed_dim
        self.query = nn.Linear(state, width, bias=False)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width, bias=False)
        self.output = nn.Linear(width, state, bias=False)

    def forward(self, states: torch.Tensor, class_embeddings: torch.Tensor) -> torch.Tensor:
        """``states (B, N, state_width)``, ``class_embeddings (d', C)`` → the output added to the states."""
        columns = class_embeddings.T  # (C, d'): one key/value per class
        weights = (self.query(states) @ self.key(columns).T).softmax(dim=-1)
        return self.output(weights @ self.value(columns))


class GDTransformerBlock(GradientCheckpointingLayer):
    """Self-attention (two heads), cross-attention to the class embeddings, optional feed-forward; each added to
    the state. The simplified block (``config.simplified``) is head 1 alone."""

    def __init__(self, config: GDTransformerConfig):
        super().__init__()
        self.self_attention = GDSelfAttention(config)
        self.cross_attention = None if config.simplified else GDCrossAttention(config)
        self.feed_forward = (
            GDFeedForward(config.state_width, config.feed_forward_width) if config.use_feed_forward else None
        )

    def forward(
        self,
        states: torch.Tensor,
        label_slots: torch.Tensor,
        class_embeddings: torch.Tensor,
        update_mask: torch.Tensor,
        erase_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``states (..., N, state_width)``, ``label_slots (..., N, d')``, centred ``class_embeddings (d', C)``, the
        heads' masks (:class:`GDSelfAttention`) → (new states, self-attention weights ``(..., heads, N, N)``)."""
        tokens = torch.cat((states, label_slots), dim=-1)
        update, weights = self.self_attention(states, tokens, update_mask, erase_mask)
        states = states + update
        if self.cross_attention is not None:
            states = states + self.cross_attention(states, class_embeddings)
        if self.feed_forward is not None:
            states = states + self.feed_forward(states)
        return states, weights


# ------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------


class GDTransformerPreTrainedModel(BitExactLoadingMixin, PreTrainedModel):
    """Random initialisation (projections ``N(0, initializer_range)``, class embeddings ``N(0, 1/d')``) and loading."""

    config_class = GDTransformerConfig
    base_model_prefix = "gd_transformer"
    main_input_name = "xs"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GDTransformerBlock"]
    #: its attention is the GD blocks' own (kernels, erase head, cross-attention), not one of transformers'
    supports_attn_implementation = False

    def _init_weights(self, module):
        # through transformers.initialization, so weights that from_pretrained just loaded are left alone
        if isinstance(module, nn.Linear):
            init_linear_normal(module, self.config.initializer_range)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, GDClassEmbedding):
            init.normal_(module.weight, mean=0.0, std=1 / math.sqrt(self.config.embed_dim))


class GDTransformerForInContextClassification(GDTransformerPreTrainedModel):
    """Class logits ``W_eᵀ f`` for the queries of a categorical prompt.

    See the module docstring for the layout, the two kinds of context attention and the blocks. A fresh model is
    randomly initialised (trainable from scratch); :meth:`from_gd_construction` sets the document's construction,
    which computes ``n_blocks`` steps of functional GD exactly.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.gd_transformer import GDTransformerConfig, GDTransformerForInContextClassification
        >>> model = GDTransformerForInContextClassification(GDTransformerConfig(n_dims=4, n_points=11, n_classes=3,
        ...                                                                     embed_dim=8, n_blocks=2))
        >>> xs, ys = torch.randn(2, 11, 4), torch.randint(3, (2, 11))
        >>> out = model(xs, ys, n_context=10)  # the document's prompt: 10 context pairs, one query
        >>> out.logits.shape, out.loss.shape
        (torch.Size([2, 1, 3]), torch.Size([]))
        >>> model(xs, ys).logits.shape  # every position as the query of its own prefix
        torch.Size([2, 11, 3])
    """

    def __init__(self, config: GDTransformerConfig):
        super().__init__(config)
        self.class_embedding = GDClassEmbedding(config)
        self.blocks = nn.ModuleList(GDTransformerBlock(config) for _ in range(config.n_blocks))
        self.post_init()

    # Copied from GPT2ForInContextRegression.forward
    #   (signature: xs, ys, loss_positions, output_hidden_states, output_attentions)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, loss_positions: torch.Tensor | list[int] | None = None,
        n_context: int | None = None, output_hidden_states: bool | None = None, output_attentions: bool | None = None,
        check_inputs: bool = True, **kwargs) -> ICLOutput:  # fmt: skip
        """Class logits for the prompts ``xs (B, N, n_dims)``, ``ys`` (class ids), in one of two protocols.

        * ``n_context=None`` (default): every position ``i`` is predicted from the pairs ``j < i`` (the package's
          all-prefix protocol), ``logits (B, N, n_classes)``; ``ys`` is ``(B, N)`` and the cross-entropy is over
          ``loss_positions`` (a ``(N,)`` bool mask or indices; default all). With ``context_attention="full"`` the
          prompt runs once per prefix in one batch (``N×`` the work of one pass; see the module docstring).
        * ``n_context=m`` (``0 <= m < N``; ``context_attention="full"`` only): the document's prompt, ``m`` context
          pairs then the queries ``m..N-1``, each read from the whole context and never from another query;
          ``logits (B, N - m, n_classes)``. ``ys`` is ``(B, N)`` (the query labels enter the loss only) or
          ``(B, m)`` (context labels only, no loss); ``loss_positions`` is not used.

        Args:
            output_hidden_states: also return the states before the first block and after each block: ``(B, N,
                state_width)``, or ``(B, N, N, state_width)`` (copy ``p``, token ``t``) for the all-prefix protocol
                with full context attention.
            output_attentions: also return each block's self-attention weights (head 1's kernel weights, then head
                2's), ``(B, heads, N, N)`` or, for the copies of the all-prefix protocol, ``(B, N, heads, N, N)``.
            check_inputs: check the prompt's values (finite ``xs`` within
                :func:`~hf_icl.modeling.prompts.max_prompt_magnitude` of the model's dtype, class ids in
                ``[0, n_classes)``) at the cost of one device sync, and that the logits came out finite (a second
                sync: the unnormalised softmax kernel's ``exp`` overflows for scores above ``log(finfo.max)``, which
                no bound on the inputs alone prevents; the error names the block and its largest kernel score).
                Shapes, dtypes and devices are checked either way. With ``False`` a NaN, inf or out-of-bound entry,
                or an overflowed kernel, can make *earlier* positions NaN too (a masked weight of 0 times an
                infinite value is NaN in the matmuls), so the predictions are causal only for valid inputs.
        """
        config = self.config
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        W_e = self.class_embedding.weight
        if n_context is None:
            check_model_prompt(config, xs, ys, check_values=check_inputs, device=W_e.device, dtype=W_e.dtype)
            targets, loss_mask = ys, loss_mask_for(loss_positions, xs.shape[1], xs.device)
        else:
            ys, targets = self._check_context_query(xs, ys, n_context, loss_positions, check_inputs)
            loss_mask = None
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = config.output_attentions if output_attentions is None else output_attentions

        n_points = xs.shape[1]
        centred = self.class_embedding.centred()
        label_slots = centred.T[ys.long()]  # (B, N, d'): w_{e,y_j} − w̄_e
        states = self.initial_states(xs)
        copies = n_context is None and config.context_attention == "full"
        if copies:  # copy p: the pairs before p are its context, p its query
            update_mask, erase_mask = prefix_masks(n_points, xs.device)
            states = states.unsqueeze(1).expand(-1, n_points, -1, -1)
            label_slots = label_slots.unsqueeze(1).expand(-1, n_points, -1, -1)
        elif n_context is None:
            update_mask = causal_context_mask(n_points, xs.device)  # j < i
            erase_mask = update_mask | torch.eye(n_points, dtype=torch.bool, device=xs.device)  # j <= i
        else:
            update_mask, erase_mask = context_query_masks(n_points, n_context, xs.device)
        all_states, all_weights = [states], []
        for block in self.blocks:
            states, weights = block(states, label_slots, centred, update_mask, erase_mask)
            all_states.append(states)
            all_weights.append(weights)
        latents = states[..., latent_slot(config)]
        if copies:
            latents = latents.diagonal(dim1=1, dim2=2).transpose(1, 2)  # copy p's token p: (B, N, d')
        elif n_context is not None:
            latents = latents[:, n_context:]
        logits = latents @ W_e
        if check_inputs and not bool(torch.isfinite(logits).all()):  # the second device sync
            with torch.no_grad():
                self._explain_overflow(logits, all_states, label_slots, update_mask)
        loss = None if targets is None else categorical_loss(logits, targets, loss_mask)
        return ICLOutput(
            loss=loss,
            logits=logits,
            hidden_states=tuple(all_states) if output_hidden_states else None,
            attentions=tuple(all_weights) if output_attentions else None,
        )

    def _explain_overflow(self, logits, all_states, label_slots, update_mask) -> None:
        """Raise a ``ValueError`` saying why ``logits`` are not finite: a non-finite parameter (named), else the
        first block whose output left the dtype's range, with its largest head-1 kernel score (the unnormalised
        softmax kernel's ``exp`` overflows once a score passes ``log(finfo.max)``: see
        :mod:`~hf_icl.modeling.gd_transformer.functional_gd`)."""
        for name, parameter in self.named_parameters():
            check_finite_tensor(name, parameter.detach())
        config, owner = self.config, type(self).__name__
        index = tuple((~torch.isfinite(logits)).nonzero()[0].tolist())
        where = f"logits[{index[0]}, {index[1]}] (prompt {index[0]}, query {index[1]}) is {logits[index].item()}"
        for k, block in enumerate(self.blocks):
            if bool(torch.isfinite(all_states[k + 1]).all()):
                continue
            attention, states = block.self_attention, all_states[k]
            tokens = torch.cat((states, label_slots), dim=-1)
            queries, keys = attention.update_query(states), attention.update_key(tokens)
            scores = kernel_scores(queries, keys, config.kernel, config.bandwidth).masked_fill(~update_mask, -math.inf)
            score = float(scores.nan_to_num(nan=math.inf, posinf=math.inf).max())
            kernel, normalize = config.kernel, config.normalize_attention
            raise ValueError(overflow_message(owner, logits.dtype, kernel, normalize, score, f"block {k}; {where}"))
        raise ValueError(f"{owner}: the logits are not finite, {where}; the blocks' states are finite (check W_e)")

    def _check_context_query(self, xs, ys, n_context, loss_positions, check_inputs) -> tuple:
        """Check a context/query prompt; return ``(ys (B, N) with placeholders for absent query labels, the query
        targets (B, N - m) or None)``."""
        config = self.config
        if config.context_attention != "full":
            raise ValueError(
                "n_context (context pairs read by every token, queries by none) is the document's protocol; it needs "
                f"context_attention='full', got context_attention={config.context_attention!r} with n_context="
                f"{n_context!r}"
            )
        if loss_positions is not None:
            raise ValueError(
                "loss_positions applies to the all-prefix protocol (n_context=None); with n_context the loss is over "
                f"the query positions, got loss_positions={loss_positions!r}"
            )
        n_points = xs.shape[1] if isinstance(xs, torch.Tensor) and xs.ndim == 3 else None
        if isinstance(n_context, bool) or not isinstance(n_context, int):
            raise ValueError(f"n_context must be an integer or None, got {n_context!r} ({type(n_context).__name__})")
        if n_points is not None and not 0 <= n_context < n_points:
            raise ValueError(
                f"n_context must be in [0, {n_points - 1}] for prompts of {n_points} points (at least one query), "
                f"got {n_context}"
            )
        context_only = isinstance(ys, torch.Tensor) and n_points is not None and ys.shape == (xs.shape[0], n_context)
        if context_only:  # the query labels are placeholders, read by nothing
            ys = torch.cat([ys, ys.new_zeros(xs.shape[0], n_points - n_context)], dim=1)
        elif isinstance(ys, torch.Tensor) and isinstance(xs, torch.Tensor) and ys.shape != xs.shape[:2]:
            raise ValueError(
                f"ys must have shape {tuple(xs.shape[:2])} (context and query labels: the loss is computed) or "
                f"{(xs.shape[0], n_context)} (context labels only) with n_context={n_context}, got {tuple(ys.shape)}"
            )
        weight = self.class_embedding.weight
        check_model_prompt(config, xs, ys, check_values=check_inputs, device=weight.device, dtype=weight.dtype)
        return ys, (None if context_only else ys[:, n_context:])

    def initial_states(self, xs: torch.Tensor) -> torch.Tensor:
        """The states before the first block, ``(x_i, f = 0, scratch = 0)``, in the model's dtype."""
        W_e = self.class_embedding.weight
        rest = xs.new_zeros(*xs.shape[:2], self.config.state_width - self.config.n_dims, dtype=W_e.dtype)
        return torch.cat((xs.to(W_e.dtype), rest), dim=-1)

    @classmethod
    def from_gd_construction(
        cls, n_steps: int, learning_rate: float, kernel: str, W_e: torch.Tensor, **config_fields
    ) -> GDTransformerForInContextClassification:
        """The document's stationary point: a model whose logits are ``n_steps`` steps of functional GD.

        Args:
            n_steps: K, the number of blocks.
            learning_rate: η of every step.
            kernel: κ, one of ``"softmax"``, ``"rbf"``, ``"linear"``.
            W_e: ``(d', C)`` class embeddings; they fix ``embed_dim`` and ``n_classes``, and the model's dtype and
                device.
            config_fields: any other :class:`GDTransformerConfig` field (``n_dims``, ``n_points``, ``bandwidth``,
                ``normalize_by_count``, ``normalize_attention``, ``simplified``, ``use_feed_forward``, …);
                ``erase_temperature`` defaults to :data:`CONSTRUCTION_ERASE_TEMPERATURE`.

        The logits equal :func:`~hf_icl.modeling.gd_transformer.functional_gd_logits` with the same arguments and
        protocol (``n_context``), or :func:`~hf_icl.modeling.gd_transformer.causal_functional_gd_logits` with
        ``context_attention="causal"`` (to rounding). The feed-forward layers, if any, get a zero output layer.

        Example::

            >>> import torch
            >>> from hf_icl.modeling.gd_transformer import GDTransformerForInContextClassification, functional_gd_logits
            >>> W_e = torch.randn(6, 3, dtype=torch.float64)
            >>> model = GDTransformerForInContextClassification.from_gd_construction(2, 0.5, "softmax", W_e, n_dims=4)
            >>> xs, ys = torch.randn(2, 9, 4, dtype=torch.float64), torch.randint(3, (2, 9))
            >>> reference = functional_gd_logits(xs, ys, W_e, n_steps=2, learning_rate=0.5, n_context=6)
            >>> torch.allclose(model(xs, ys, n_context=6).logits, reference)
            True
        """
        check_int("n_steps", n_steps, low=1)
        check_float("learning_rate", learning_rate)
        if not (isinstance(W_e, torch.Tensor) and W_e.ndim == 2 and W_e.is_floating_point()):
            shape = tuple(W_e.shape) if isinstance(W_e, torch.Tensor) else type(W_e).__name__
            raise ValueError(f"W_e must be a floating-point (embed_dim, n_classes) tensor, got {shape}")
        check_finite_tensor("W_e", W_e)
        derived = {"n_blocks": n_steps, "kernel": kernel, "embed_dim": W_e.shape[0], "n_classes": W_e.shape[1]}
        for name, value in derived.items():
            if name in config_fields and config_fields[name] != value:
                raise ValueError(
                    f"from_gd_construction sets {name}={value!r} from its arguments; got {name}={config_fields[name]!r}"
                )
        config_fields = {"erase_temperature": CONSTRUCTION_ERASE_TEMPERATURE, **config_fields, **derived}
        model = cls(GDTransformerConfig(**config_fields)).to(device=W_e.device, dtype=W_e.dtype)
        with torch.no_grad():
            for name, value in construction_parameters(model.config, learning_rate, W_e).items():
                model.get_parameter(name).copy_(value)
        return model.eval()


def categorical_loss(logits: torch.Tensor, ys: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy over the positions in ``loss_mask`` (all when None), in at least float32."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    per_position = F.cross_entropy(logits.transpose(1, 2), ys.long(), reduction="none")
    if loss_mask is None:
        return per_position.mean()
    weights = loss_mask.to(per_position.dtype).expand_as(per_position)
    return (per_position * weights).sum() / weights.sum().clamp_min(1)


# ------------------------------------------------------------------------------------------------------------
# The construction and the distance to it
# ------------------------------------------------------------------------------------------------------------


def construction_parameters(
    config: GDTransformerConfig, learning_rate: float, W_e: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``{parameter name: value}`` of the GD construction for ``config`` (see the module docstring).

    Projections the construction does not use are zero; the feed-forward layers keep their input side and get a
    zero output layer (so they add nothing). ``W_e`` fixes ``class_embedding.weight`` and the dtype and device.
    """

    def zeros(rows: int, cols: int) -> torch.Tensor:
        return torch.zeros(rows, cols, dtype=W_e.dtype, device=W_e.device)

    def identity(rows: int, cols: int, row_slot: slice, col_slot: slice, scale: float = 1.0) -> torch.Tensor:
        out = zeros(rows, cols)
        size = row_slot.stop - row_slot.start
        out[row_slot, col_slot] = scale * torch.eye(size, dtype=W_e.dtype, device=W_e.device)
        return out

    d, width = config.n_dims, config.embed_dim
    state, token = config.state_width, config.token_width
    x, f, label = input_slot(config), latent_slot(config), label_slot(config)
    own = slice(0, d)  # a query/key head's output coordinates are x's
    head = slice(0, width)  # a value head's output coordinates
    values = {"class_embedding.weight": W_e}
    for b in range(config.n_blocks):
        attention = f"blocks.{b}.self_attention."
        update_value = identity(width, token, head, label)
        if not config.simplified:
            update_value[:, scratch_slot(config)] = -torch.eye(width, dtype=W_e.dtype, device=W_e.device)
        values |= {
            attention + "update_query.weight": identity(d, state, own, x),
            attention + "update_key.weight": identity(d, token, own, x),
            attention + "update_value.weight": update_value,  # ℓ_j − s_j = w_{e,y_j} − E(w_e)|f_{j,k}
            attention + "update_output.weight": identity(state, width, f, head, learning_rate),
        }
        if not config.simplified:
            scratch = scratch_slot(config)
            cross = f"blocks.{b}.cross_attention."
            values |= {
                attention + "erase_query.weight": identity(d, state, own, x),
                attention + "erase_key.weight": identity(d, state, own, x),
                attention + "erase_value.weight": identity(width, state, head, scratch),
                attention + "erase_output.weight": identity(state, width, scratch, head, -1.0),
                cross + "query.weight": identity(width, state, head, f),
                cross + "key.weight": identity(width, width, head, head),
                cross + "value.weight": identity(width, width, head, head),
                cross + "output.weight": identity(state, width, scratch, head),
            }
        if config.use_feed_forward:
            values[f"blocks.{b}.feed_forward.fc_out.weight"] = zeros(state, config.feed_forward_width)
            values[f"blocks.{b}.feed_forward.fc_out.bias"] = torch.zeros(state, dtype=W_e.dtype, device=W_e.device)
    return values


def _dot_score_matrix(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``W_Qᵀ W_K``: the bilinear form of a dot-product score ``q_iᵀ k_j``."""
    return query.T @ key


def _distance_score_matrix(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``[W_Q, −W_K]ᵀ [W_Q, −W_K]``: the quadratic form of a distance score ``‖q_i − k_j‖²``."""
    stacked = torch.cat((query, -key), dim=1)
    return stacked.T @ stacked


def _head_products(config: GDTransformerConfig, parameters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The products that determine each head's function: score forms and value-output maps ``W_O W_V``."""

    def weight(name: str) -> torch.Tensor:
        return parameters[name].detach().double()

    products = {}
    for b in range(config.n_blocks):
        attention, cross = f"blocks.{b}.self_attention.", f"blocks.{b}.cross_attention."
        update_score = _distance_score_matrix if config.kernel == "rbf" else _dot_score_matrix
        products[f"blocks.{b}.update.qk"] = update_score(
            weight(attention + "update_query.weight"), weight(attention + "update_key.weight")
        )
        products[f"blocks.{b}.update.ov"] = weight(attention + "update_output.weight") @ weight(
            attention + "update_value.weight"
        )
        if not config.simplified:
            products[f"blocks.{b}.erase.qk"] = _distance_score_matrix(
                weight(attention + "erase_query.weight"), weight(attention + "erase_key.weight")
            )
            products[f"blocks.{b}.erase.ov"] = weight(attention + "erase_output.weight") @ weight(
                attention + "erase_value.weight"
            )
            products[f"blocks.{b}.expect.qk"] = _dot_score_matrix(
                weight(cross + "query.weight"), weight(cross + "key.weight")
            )
            products[f"blocks.{b}.expect.ov"] = weight(cross + "output.weight") @ weight(cross + "value.weight")
    return products


def distance_to_construction(model: GDTransformerForInContextClassification) -> dict[str, float]:
    """How far each head of a (trained) model is from the GD construction, after the symmetries below.

    For every block ``b`` and head (``update`` = head 1, ``erase`` = head 2, ``expect`` = the cross-attention),
    two groups: ``qk``, the form of the score (``W_Qᵀ W_K`` for dot-product scores; for distance scores, the RBF
    kernel and head 2, the Gram matrix ``[W_Q, −W_K]ᵀ[W_Q, −W_K]`` of ``‖q_i − k_j‖²``), and ``ov``, the map
    ``W_O W_V`` from what the head reads to what it writes. Products remove the reparametrisations of a head's
    query/key and value spaces that leave the model's function unchanged (any invertible map for dot products and
    values, any rotation for distances). One positive scale per group is free (it is a step size, an inverse
    bandwidth or λ: the construction is a family), so it is fitted: for a trained product ``G`` and the
    construction's ``P``,

        scale = max(0, ⟨G, P⟩ / ‖P‖²),   distance = ‖G − scale · P‖ / ‖G‖,

    the fraction of ``G`` (Frobenius norm) the construction's pattern does not explain: 0 for a positive multiple
    of the construction, 1 for a product orthogonal to it (or pointing away, or zero). The result holds
    ``"blocks.{b}.{head}.{qk|ov}"`` (distances) and the same keys with ``".scale"`` (the fitted scales: for the
    construction itself, η for ``update.ov`` and 1 elsewhere).

    Not removed: the basis in which a model stores the expectation (the construction's scratch slot; a model may
    use another basis of it, or other coordinates, and then looks farther than it is). The feed-forward layers
    have no counterpart in the construction and are not compared.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.gd_transformer import GDTransformerForInContextClassification
        >>> model = GDTransformerForInContextClassification.from_gd_construction(2, 0.3, "rbf", torch.randn(5, 3),
        ...                                                                      n_dims=4)
        >>> result = distance_to_construction(model)
        >>> max(v for k, v in result.items() if not k.endswith(".scale")) < 1e-6
        True
        >>> round(result["blocks.1.update.ov.scale"], 4)  # the step size η
        0.3
    """
    config = model.config
    trained = _head_products(config, dict(model.named_parameters()))
    W_e = model.class_embedding.weight.detach()
    reference = _head_products(config, construction_parameters(config, 1.0, W_e))
    result = {}
    for name, product in trained.items():
        pattern = reference[name]
        scale = max(0.0, float((product * pattern).sum() / pattern.square().sum()))
        norm = float(product.norm())
        result[name] = float((product - scale * pattern).norm()) / norm if norm > 0 else 1.0
        result[name + ".scale"] = scale
    return result
