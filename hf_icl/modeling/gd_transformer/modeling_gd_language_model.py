"""The functional-GD language model (seed 004's TinyStories model) as a transformers causal LM.

A sequence of tokens ``y_0 … y_{T−1}`` is read as in-context pairs ``(x_j, y_j)`` with ``x_j = P_j``, the LayerNormed
learned embedding of position j, and ``e_j = LN(wte)[y_j]``, the LayerNormed embedding of the token. Write
``W = LN(wte)`` (``V × d'``, every row normalised) and ``E|f = softmax(W f)ᵀ W``, the expected embedding under the
softmax model ``p(y | f) = softmax(W f)``. Row ``r`` is the query ``x_r = P_r`` with the context pairs ``j < r``:

    f_{r,0} = 0,
    f_{r,k+1} = f_{r,k} + W_o^k [ s_r Σ_{j<r} κ_h(P_r, P_j) (e_j − E|f_{j,k}) ]_{h = 1..H},

heads ``h`` side by side (each with its own query/key maps, all reading the same values), ``s_r = 1/r`` with
``normalize_by_count``, ``W_o^k`` one output projection per step (``H d' → d'``: a learned step size; ``η I`` per
head makes it functional GD with the kernel ``η Σ_h κ_h``). ``e_j − E|f_{j,k}`` is the negative gradient of pair
j's cross-entropy with respect to f, evaluated at row j's own f (its prediction from the pairs before it): the
update is exactly K steps of the causal variant of functional GD (:func:`.functional_gd.causal_functional_gd_logits`:
a language model's row sees the tokens before it only, so pair j's state is its own prefix's). The token
after ``t`` is predicted by row ``t + 1`` (query ``P_{t+1}``, pairs ``j <= t``): logits ``W (f + FF(f))`` with the
optional feed-forward layer, tied to the token embedding.

The document's co-author's code (williamconvertino/gdgpt, ``src/models/gd.py``) has the same layout (keys
``P_0 … P_{T−1}``, queries ``P_1 … P_T``) but evaluates pair j's expectation at row ``j + 1``'s f (which already
used pair j) and with the raw ``wte`` instead of ``LN(wte)``; here both follow the GD formula, so the residual is the
gradient of the loss the read-out defines.

Generation. Row r's f, and with it pair r's value ``e_r − E|f_{r,k}``, depend on the tokens before r only, and the
keys on positions only, so appending a token changes nothing already computed: :class:`GDLanguageModelCache` keeps
every step's values and the keys, and a forward over new tokens computes their rows only (plus the first new token's
own row, one query over the cached pairs).

Padding. ``attention_mask`` (1 = real token) removes padded tokens from every context and positions count real
tokens only, so a padded row gives, on its real tokens, what it gives alone.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..causal_lm import CheckedGenerationMixin, ModelOwnCache, ModelOwnCacheLayer
from ..initialization import init_linear_normal
from ..lm_inputs import check_input_ids, check_labels, real_token_mask
from ..loading import BitExactLoadingMixin
from ..prompts import check_no_backbone_kwargs
from .configuration_gd_language_model import GDLanguageModelConfig
from .functional_gd import expected_embedding, kernel_weights
from .layers import GDFeedForward

#: the parameters of the model's forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = (
    "input_ids",
    "attention_mask",
    "labels",
    "past_key_values",
    "use_cache",
    "output_hidden_states",
    "logits_to_keep",
)


# ------------------------------------------------------------------------------------------------------------
# Cache: every step's values and the (positional) keys of the tokens so far
# ------------------------------------------------------------------------------------------------------------


class GDLanguageModelCacheLayer(ModelOwnCacheLayer):
    """One GD step's cached values ``e_j − E|f_{j,k}`` of the tokens so far, ``(B, T, d')``, or None before any."""

    row_tensors = ("values",)
    is_croppable = True
    is_sliding = False

    def __init__(self):
        self.values: torch.Tensor | None = None

    def append(self, values: torch.Tensor) -> None:
        self.values = values if self.values is None else torch.cat((self.values, values), dim=1)

    def get_seq_length(self) -> int:
        return 0 if self.values is None else self.values.shape[1]

    def crop(self, tokens_to_remove: int) -> None:
        if self.values is not None:
            self.values = self.values[:, : self.values.shape[1] - _tokens_to_remove(tokens_to_remove)]


def _tokens_to_remove(tokens_to_remove: int) -> int:
    # transformers 5.x passes a negative count (a positive value was the legacy "final length")
    if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int) or tokens_to_remove > 0:
        raise ValueError(
            f"tokens_to_remove must be 0 or a negative integer (-n removes the last n tokens), got {tokens_to_remove!r}"
        )
    return -tokens_to_remove


class GDLanguageModelCache(ModelOwnCache):
    """Generation cache of :class:`GDTransformerForCausalLM`: exact, since nothing cached changes when tokens are
    appended.

    ``layers[k].values`` ``(B, T, d')``: step k's values ``e_j − E|f_{j,k}``; ``keys`` ``(B, H, T, d')``: every head's
    key of each token's position (the same for all steps: the kernel is fixed, the steps differ in ``W_o`` only);
    ``real`` ``(B, T)`` bool: which cached tokens are real (padding is never attended to). ``crop`` is exact too
    (a token's values depend on earlier tokens only), so assisted generation and beam search work.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.gd_transformer import GDLanguageModelConfig, GDTransformerForCausalLM
        >>> config = GDLanguageModelConfig(vocab_size=20, n_positions=32, embed_dim=8, n_heads=2, n_blocks=3)
        >>> model = GDTransformerForCausalLM(config).eval()
        >>> cache = model(torch.randint(20, (1, 10)), use_cache=True).past_key_values
        >>> cache.get_seq_length(), cache.keys.shape, cache.layers[2].values.shape
        (10, torch.Size([1, 2, 10, 8]), torch.Size([1, 10, 8]))
    """

    row_tensors = ("real", "keys")

    def __init__(self, num_steps: int):
        super().__init__(layers=[GDLanguageModelCacheLayer() for _ in range(num_steps)])
        self.keys: torch.Tensor | None = None
        self.real: torch.Tensor | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.real is None else self.real.shape[1]

    def real_tokens(self) -> torch.Tensor | None:
        """``(B,)``: real (unpadded) tokens cached per row, i.e. the next token's position; None when empty."""
        return None if self.real is None else self.real.sum(dim=1)

    def append_tokens(self, keys: torch.Tensor, real: torch.Tensor) -> None:
        """Add the new tokens' keys ``(B, H, L, d')`` and real-token mask ``(B, L)`` (the values go to the layers)."""
        self.keys = keys if self.keys is None else torch.cat((self.keys, keys), dim=2)
        self.real = real if self.real is None else torch.cat((self.real, real), dim=1)

    def crop(self, tokens_to_remove: int) -> None:
        keep = self.get_seq_length() - _tokens_to_remove(tokens_to_remove)
        super().crop(tokens_to_remove)
        if self.real is not None:
            self.keys, self.real = self.keys[:, :, :keep], self.real[:, :keep]


# ------------------------------------------------------------------------------------------------------------
# Layers
# ------------------------------------------------------------------------------------------------------------


class GDPositionKernel(nn.Module):
    """The kernel heads ``κ_h(P_r, P_j)``: per head a query map and a key map of the positional embeddings.

    ``qk_form`` ``"diag"``: ``q = w_q ⊙ P`` and ``k = w_k ⊙ P`` (``query_weight``, ``key_weight`` ``(H, d')``);
    ``"full"``: ``q = W_q P``, ``k = W_k P`` (``(H, d', d')``); the ``*_shared`` forms use ``query_weight`` for
    both (no ``key_weight``). The weights are the config's kernel of the projections (``kernel_weights``).
    """

    def __init__(self, config: GDLanguageModelConfig):
        super().__init__()
        self.config = config
        width = config.embed_dim
        shape = (config.n_heads, width) if config.qk_form.startswith("diag") else (config.n_heads, width, width)
        self.query_weight = nn.Parameter(torch.empty(shape))
        self.key_weight = None if config.shares_query_key else nn.Parameter(torch.empty(shape))

    @staticmethod
    def _project(positions: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``positions (B, T, d')`` → ``(B, H, T, d')``, every head's map applied."""
        positions = positions.unsqueeze(1)
        if weight.dim() == 2:
            return positions * weight.unsqueeze(1)
        return positions @ weight.transpose(-1, -2)

    def queries(self, positions: torch.Tensor) -> torch.Tensor:
        return self._project(positions, self.query_weight)

    def keys(self, positions: torch.Tensor) -> torch.Tensor:
        return self._project(positions, self.query_weight if self.key_weight is None else self.key_weight)

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, H, Q, d')`` queries and ``(B, H, K, d')`` keys, ``mask`` broadcastable to ``(B, H, Q, K)`` (True =
        in the context) → kernel weights ``(B, H, Q, K)``, zero outside the context."""
        config = self.config
        return kernel_weights(queries, keys, config.kernel, config.bandwidth, mask, config.normalize_attention)


class GDStep(nn.Module):
    """One GD step's update ``W_o^k [s_r Σ_j κ_h(P_r, P_j) v_j]_h`` from the (count-scaled) kernel weights."""

    def __init__(self, config: GDLanguageModelConfig):
        super().__init__()
        self.output = nn.Linear(config.n_heads * config.embed_dim, config.embed_dim, bias=False)
        self.output.writes_latent = True  # initialised smaller (see _latent_writer_std)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``weights (B, H, Q, K)``, ``values (B, K, d')`` → the update ``(B, Q, d')``."""
        per_head = weights @ values.unsqueeze(1)  # (B, H, Q, d')
        return self.dropout(self.output(per_head.transpose(1, 2).flatten(2)))


# ------------------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------------------


def _latent_writer_std(config: GDLanguageModelConfig, fan_in: int) -> float:
    """Init std of a layer that writes into f (a step projection, the feed-forward output): ``σ / √(2 K fan_in)``.

    What such a layer reads has entries of size ≲ 1 (values ``e_j − E|f`` of LayerNormed embeddings, GELU units), so
    it moves each entry of f by ≲ σ, and the logits ``LN(wte) f`` (rows of norm √d') start at ≲ σ√d': near uniform,
    loss ≈ log V. GPT-2's ``σ / √(2K)`` (the document's code) starts them far larger (loss ≈ 25 rather than
    log V ≈ 10.8 at the document's d' = 512, 8 heads), since nothing LayerNorms f before the read-out.
    """
    return config.initializer_range / (2 * config.n_blocks * fan_in) ** 0.5


class GDLanguageModelPreTrainedModel(BitExactLoadingMixin, PreTrainedModel):
    """Initialisation (embeddings, query/key maps, feed-forward input ``N(0, initializer_range)``; the layers that
    write into f ``N(0, initializer_range / √(2 n_blocks fan_in))``, so the logits start near uniform) and loading."""

    config_class = GDLanguageModelConfig
    base_model_prefix = "gd_language_model"
    main_input_name = "input_ids"
    #: its attention is its own kernel over positions, not one of transformers' implementations
    supports_attn_implementation = False

    def _init_weights(self, module):
        # through transformers.initialization, so weights that from_pretrained just loaded are left alone
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            if getattr(module, "writes_latent", False):
                std = _latent_writer_std(self.config, module.in_features)
            init_linear_normal(module, std)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, GDPositionKernel):
            for weight in (module.query_weight, module.key_weight):
                if weight is not None:
                    init.normal_(weight, mean=0.0, std=std)


class GDTransformerForCausalLM(GDLanguageModelPreTrainedModel, CheckedGenerationMixin):
    """Next-token logits by K steps of functional GD over the positions (see the module docstring).

    Keys and queries come from the positional embeddings only, values from the token embeddings, the read-out is
    the token embedding. Parameters: ``wte`` (token embedding), ``wpe`` (``n_positions + 1`` positions), the two
    bias-free LayerNorms ``ln_token``, ``ln_position``, the kernel heads' query/key maps (``kernel``), one output
    projection per step (``steps[k].output``) and the optional ``feed_forward``.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.gd_transformer import GDLanguageModelConfig, GDTransformerForCausalLM
        >>> config = GDLanguageModelConfig(vocab_size=20, n_positions=32, embed_dim=8, n_heads=2, n_blocks=2)
        >>> model = GDTransformerForCausalLM(config).eval()
        >>> ids = torch.randint(20, (2, 10))
        >>> model(ids, labels=ids).loss.shape
        torch.Size([])
        >>> model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0).shape
        torch.Size([2, 15])
    """

    def __init__(self, config: GDLanguageModelConfig):
        super().__init__(config)
        width = config.embed_dim
        self.wte = nn.Embedding(config.vocab_size, width)
        self.wpe = nn.Embedding(config.n_positions + 1, width)
        self.ln_token = nn.LayerNorm(width, eps=config.layer_norm_epsilon, bias=False)
        self.ln_position = nn.LayerNorm(width, eps=config.layer_norm_epsilon, bias=False)
        self.embedding_dropout = nn.Dropout(config.embd_pdrop)
        self.kernel = GDPositionKernel(config)
        self.kernel_dropout = nn.Dropout(config.attn_pdrop)
        self.steps = nn.ModuleList(GDStep(config) for _ in range(config.n_blocks))
        self.feed_forward = (
            GDFeedForward(width, config.feed_forward_width, config.layer_norm_epsilon)
            if config.use_feed_forward
            else None
        )
        if self.feed_forward is not None:
            self.feed_forward.fc_out.writes_latent = True
        self.feed_forward_dropout = nn.Dropout(config.resid_pdrop)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.wte = value

    def get_output_embeddings(self) -> None:
        return None  # the read-out is LN(wte) itself: nothing separate to tie

    def token_embeddings(self) -> torch.Tensor:
        """``W = LN(wte)`` ``(V, d')``: the values' embeddings, the expectation's and the read-out's."""
        return self.ln_token(self.wte.weight)

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        past_key_values: GDLanguageModelCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Next-token logits ``(B, L, vocab_size)`` of ``input_ids`` ``(B, L)`` (continuing ``past_key_values``).

        Args:
            attention_mask: ``(B, L)``, or ``(B, past + L)`` as ``generate`` passes it; 1 = real token, 0 = padding.
                Padded tokens are in no context, and positions count real tokens only.
            labels: ``(B, L)``; the loss is the mean cross-entropy of predicting ``labels[:, t + 1]`` at ``t``
                (transformers' shift; ``-100`` = ignored).
            past_key_values: a :class:`GDLanguageModelCache` to continue from (updated in place).
            use_cache: return a cache (a new one if none was given); default ``config.use_cache`` outside training.
            output_hidden_states: also return ``f`` at the output rows before the first step and after each step
                (``n_blocks + 1`` tensors ``(B, L, d')``; the feed-forward layer is part of the read-out, not in them).
            logits_to_keep: an int keeps the last that many positions (0: all), a tensor the positions it lists.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)  # Trainer's token count for the loss
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        config = self.config
        batch, length = check_input_ids(input_ids, config.vocab_size)
        if labels is not None:
            check_labels(labels, config.vocab_size, (batch, length))
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        if use_cache is None:
            use_cache = config.use_cache and not self.training
        cache = past_key_values
        if cache is not None and not isinstance(cache, GDLanguageModelCache):
            raise ValueError(
                f"past_key_values must be a GDLanguageModelCache (the model makes one with use_cache=True), "
                f"got {type(cache).__name__}"
            )
        if cache is None and use_cache:
            cache = GDLanguageModelCache(config.n_blocks)
        past = 0 if cache is None else cache.get_seq_length()
        real = real_token_mask(attention_mask, batch, length, past, input_ids.device)
        prior = None if cache is None else cache.real_tokens()

        # Rows: row 0 is the first new token's own row (query P at its position, the cached pairs); row m >= 1 is
        # the row after new token m - 1 (query P at the next position, the pairs up to token m - 1).
        query_index, key_index = self._position_indices(real, prior, batch, length)
        positions = self.embedding_dropout(self.ln_position(self.wpe.weight))
        queries = self.kernel.queries(positions[query_index])  # (B or 1, H, L + 1, d')
        keys = self.kernel.keys(positions[key_index])  # (B or 1, H, L, d')
        if cache is not None:  # the cache holds every row's keys (B, ...), so the queries must match them
            keys, queries = keys.expand(batch, -1, -1, -1), queries.expand(batch, -1, -1, -1)
            new_keys = keys
            new_real = torch.ones(batch, length, dtype=torch.bool, device=input_ids.device) if real is None else real
            if past:
                keys = torch.cat((cache.keys, new_keys), dim=2)
                real = torch.cat((cache.real, new_real), dim=1)
        mask = _context_mask(real, past, length, input_ids.device)
        weights = self.kernel_dropout(self.kernel(queries, keys, mask))
        if config.normalize_by_count:  # the number of real pairs in row r's context is its query index
            weights = weights / query_index.clamp_min(1)[:, None, :, None].to(weights.dtype)

        embeddings = self.token_embeddings()
        token_values = self.embedding_dropout(embeddings[input_ids])  # e_j, (B, L, d')
        f = token_values.new_zeros(batch, length + 1, config.embed_dim)
        all_latents, new_values = [f[:, 1:]], []
        for k, step in enumerate(self.steps):
            values = token_values - expected_embedding(f[:, :length], embeddings.T)  # e_j − E|f_{j,k}
            new_values.append(values)
            if past:
                values = torch.cat((cache.layers[k].values, values), dim=1)
            f = f + step(weights, values)
            all_latents.append(f[:, 1:])
        if cache is not None:  # only now: a failed forward leaves the cache as it was
            cache.append_tokens(new_keys, new_real)
            for layer, values in zip(cache.layers, new_values, strict=True):
                layer.append(values)

        out = self.kept_positions(f[:, 1:], logits_to_keep)
        if self.feed_forward is not None:
            out = out + self.feed_forward_dropout(self.feed_forward(out))
        logits = out @ embeddings.T
        return CausalLMOutputWithPast(
            loss=self.next_token_loss(logits, labels, num_items_in_batch),
            logits=logits,
            past_key_values=cache,
            hidden_states=tuple(all_latents) if output_hidden_states else None,
        )

    def _position_indices(
        self, real: torch.Tensor | None, prior: torch.Tensor | None, batch: int, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(query_index (B', L + 1), key_index (B', L))``: each row's query position and each new token's position,
        counting real tokens only (``B' = 1`` when every row has the same positions)."""
        device = self.wpe.weight.device
        if real is None and prior is None:  # no padding, no cache: the same positions in every row
            steps = torch.arange(length + 1, device=device)[None]
            query_index, key_index = steps, steps[:, :length]
        else:
            counts = torch.ones(batch, length, dtype=torch.long, device=device) if real is None else real.long()
            start = torch.zeros(batch, dtype=torch.long, device=device) if prior is None else prior
            before = torch.cat((start[:, None], start[:, None] + counts.cumsum(dim=1)), dim=1)  # real tokens before
            query_index, key_index = before, before[:, :length]
        longest = (0 if prior is None else int(prior.max())) + length  # a bound; exact check only when it is too big
        if longest > self.config.n_positions and int(query_index.max()) > self.config.n_positions:
            raise ValueError(
                f"sequences reach {int(query_index.max())} tokens but the model has n_positions="
                f"{self.config.n_positions} (its longest context)"
            )
        return query_index, key_index


def _context_mask(real: torch.Tensor | None, past: int, length: int, device) -> torch.Tensor:
    """``(B or 1, 1, L + 1, past + L)`` bool: row m sees pair j iff ``j < past + m`` and token j is real."""
    causal = torch.ones(length + 1, past + length, dtype=torch.bool, device=device).tril(past - 1)
    mask = causal[None, None]
    return mask if real is None else mask & real[:, None, None, :]


# ------------------------------------------------------------------------------------------------------------
# Parameter counts: the document's "8K attention parameters vs 6M"
# ------------------------------------------------------------------------------------------------------------


def attention_parameter_counts(model: nn.Module) -> dict[str, int]:
    """Attention parameters of a :class:`GDTransformerForCausalLM` or a transformers ``GPT2LMHeadModel`` /
    ``GPT2Model``, token embeddings excluded (the document does not count them).

    Returns ``{"query_key", "value", "output", "attention", "non_embedding"}``:

    * ``query_key``: the maps that form attention scores (GD: the kernel heads' query/key maps; GPT-2: the query
      and key two thirds of every ``c_attn``, weights and biases);
    * ``value``: the maps that form values (GD: none, its values are ``e_j − E|f``; GPT-2: the value third of
      ``c_attn``);
    * ``output``: the output projections (GD: ``W_o`` of every step, its learned step sizes; GPT-2: ``c_proj``);
    * ``attention`` = ``query_key + value``: the count the document compares ("8K attention parameters" for the
      GD model, d' = 512, 8 heads, ``qk_form="diag"``: 2 · 8 · 512 = 8192). Its "6M" for a one-layer transformer
      with d' = 512 and 8 heads matches 8 heads with full-width query, key and value maps (8 · 3 · 512² ≈ 6.3M);
      GPT-2 splits the width across heads, so its ``c_attn`` holds 3 · 512² + 3 · 512 ≈ 0.79M;
    * ``non_embedding``: every parameter but the token embedding (positions, LayerNorms, feed-forward included).

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from hf_icl.modeling.gd_transformer import GDLanguageModelConfig, GDTransformerForCausalLM
    >>> gd = GDTransformerForCausalLM(GDLanguageModelConfig(vocab_size=10, n_positions=8, embed_dim=512, n_heads=8))
    >>> attention_parameter_counts(gd)["attention"]
    8192
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=10, n_positions=8, n_embd=512, n_head=8, n_layer=1))
    >>> attention_parameter_counts(gpt2)["attention"]
    787968
    """
    from transformers import GPT2LMHeadModel, GPT2Model

    if isinstance(model, GDTransformerForCausalLM):
        query_key = sum(p.numel() for p in model.kernel.parameters())
        value = 0
        output = sum(p.numel() for step in model.steps for p in step.parameters())
        token_embedding = model.wte.weight
    elif isinstance(model, (GPT2LMHeadModel, GPT2Model)):
        gpt2 = model.transformer if isinstance(model, GPT2LMHeadModel) else model
        query_key = value = output = 0
        for block in gpt2.h:
            attention = block.attn
            if getattr(attention, "is_cross_attention", False) or hasattr(block, "crossattention"):
                raise ValueError("attention_parameter_counts counts decoder-only GPT-2 models (no cross-attention)")
            qkv = attention.c_attn.weight.numel() + attention.c_attn.bias.numel()  # [q | k | v] columns
            query_key += 2 * qkv // 3
            value += qkv // 3
            output += sum(p.numel() for p in attention.c_proj.parameters())
        token_embedding = gpt2.wte.weight
    else:
        raise ValueError(
            f"model must be a GDTransformerForCausalLM or a GPT2LMHeadModel / GPT2Model, got {type(model).__name__}"
        )
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied lm_head once
    return {
        "query_key": query_key,
        "value": value,
        "output": output,
        "attention": query_key + value,
        "non_embedding": total - token_embedding.numel(),
    }
