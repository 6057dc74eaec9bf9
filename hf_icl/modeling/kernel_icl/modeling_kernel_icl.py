"""The kernel-regression document's in-context learner (seed 000, ``PretrainedAttentionICL`` / ``UnifiedICL``).

One attention head is a Nadaraya–Watson smoother with a learned kernel: the prediction for a query ``x`` is
``out(Σ_j w_j(x) V_j)`` with ``V_j = W_V e_y(y_j)`` and weights ``w(x) = softmax_j score(W_Q e_x(x), W_K e_x(x_j))``
over the context pairs, ``e_x`` and ``e_y`` two-layer embedding MLPs. The score is the chosen row kernel of
:mod:`hf_icl.similarity.row_kernels` with learnable temperature / β's; optional GA column attention
(:mod:`hf_icl.similarity.column_attention`) first mixes the raw input features by weights computed from the context.

Two protocols share the weights (see :meth:`KernelICLForInContextRegression.forward`): the package's causal
all-prefix protocol (position ``i`` uses the pairs ``j < i`` and ``x_i``; one pass by masking) and the document's
context/query split.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init

from ...similarity.column_attention import column_mixing_weights, mix_columns, prefix_column_mixing_weights
from ...similarity.row_kernels import row_kernel_scores
from ..heads import ICLOutput, loss_mask_for
from ..initialization import init_linear_uniform
from ..loading import BitExactLoadingMixin
from ..prompts import check_no_backbone_kwargs, check_prompt
from .configuration_kernel_icl import KernelICLConfig

#: the parameters of the model's forward (close matches for a mistyped keyword)
_FORWARD_PARAMETERS = ("xs", "ys", "loss_positions", "n_context", "output_attentions", "check_inputs")


def _embedding(in_features: int, hidden_size: int) -> nn.Sequential:
    """The document's embedding MLP: Linear → ReLU → Linear."""
    return nn.Sequential(nn.Linear(in_features, hidden_size), nn.ReLU(), nn.Linear(hidden_size, hidden_size))


def _masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax over the allowed keys; a row with no allowed key (position 0) gets all-zero weights."""
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * allowed


class KernelICLColumnAttention(nn.Module):
    """GA column attention with learnable ``beta1``, ``beta2``, ``diag_bias``, ``wedge_mu`` and residual ``gate``
    (the document's ``LearnableColumnAttention``; the formulas are in :mod:`hf_icl.similarity.column_attention`)."""

    def __init__(self, config: KernelICLConfig):
        super().__init__()
        self.eps = config.eps
        self.beta1 = nn.Parameter(torch.tensor(config.init_column_beta1))
        self.beta2 = nn.Parameter(torch.tensor(config.init_column_beta2))
        self.diag_bias = nn.Parameter(torch.tensor(config.init_diag_bias))
        self.wedge_mu = nn.Parameter(torch.tensor(config.init_wedge_mu))
        self.gate = nn.Parameter(torch.tensor(config.init_gate))

    def weights(self, xs: torch.Tensor) -> torch.Tensor:
        """Mixing weights ``(B, D, D)`` of the sample set ``xs (B, N, D)``."""
        return column_mixing_weights(xs, self.beta1, self.beta2, self.diag_bias, self.wedge_mu, self.eps)

    def prefix_weights(self, xs: torch.Tensor) -> torch.Tensor:
        """Mixing weights ``(B, N, D, D)`` of every prefix ``xs[:, :i]``."""
        return prefix_column_mixing_weights(xs, self.beta1, self.beta2, self.diag_bias, self.wedge_mu, self.eps)

    def mix(self, xs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``(1 - σ(gate)) x + σ(gate) α x`` for every sample (:func:`~hf_icl.similarity.mix_columns`)."""
        return mix_columns(xs, weights, self.gate)


class KernelICLPreTrainedModel(BitExactLoadingMixin, PreTrainedModel):
    """Weight initialisation (PyTorch's default ``nn.Linear`` init, the config's initial kernel parameters) and
    loading for the kernel ICL model."""

    config_class = KernelICLConfig
    base_model_prefix = "kernel_icl"
    main_input_name = "xs"
    #: no transformers attention to swap: ``build_model`` and the training arguments refuse an ``attn_implementation``
    supports_attn_implementation = False
    #: the causal protocol with column attention can recompute each chunk of positions in the backward pass
    supports_gradient_checkpointing = True

    def _init_weights(self, module):
        # Through transformers.initialization, so that weights from_pretrained just loaded are left alone.
        config = self.config
        if isinstance(module, nn.Linear):
            init_linear_uniform(module)  # as nn.Linear draws them: the document trains PyTorch modules
        elif isinstance(module, KernelICLColumnAttention):
            init.constant_(module.beta1, config.init_column_beta1)
            init.constant_(module.beta2, config.init_column_beta2)
            init.constant_(module.diag_bias, config.init_diag_bias)
            init.constant_(module.wedge_mu, config.init_wedge_mu)
            init.constant_(module.gate, config.init_gate)
        elif isinstance(module, KernelICLForInContextRegression):
            if config.initial_temperature is not None:
                init.constant_(module.temperature, config.initial_temperature)
            if config.row_kernel == "ga":
                init.constant_(module.ga_beta1, config.init_ga_beta1)
                init.constant_(module.ga_beta2, config.init_ga_beta2)


class KernelICLForInContextRegression(KernelICLPreTrainedModel):
    """A learned kernel smoother: the document's ``UnifiedICL`` (``PretrainedAttentionICL`` with
    ``row_kernel="softmax"`` and no column attention), in both ICL protocols.

    Modules and parameters carry the document's names: ``embed_x``, ``embed_y`` (Linear-ReLU-Linear), the bias-free
    ``W_Q``, ``W_K`` (on x-embeddings) and ``W_V`` (on y-embeddings), the read-out ``out``; the row kernel's
    ``temperature`` (cosine, cayley, ga) and ``ga_beta1``, ``ga_beta2`` (ga); the column attention's ``beta1``,
    ``beta2``, ``diag_bias``, ``wedge_mu`` and ``gate`` in ``column_attention``.

    Example::

        >>> import torch
        >>> from hf_icl.modeling.kernel_icl import KernelICLConfig, KernelICLForInContextRegression
        >>> config = KernelICLConfig.from_preset("tiny", n_dims=3, n_points=20, row_kernel="ga",
        ...                                      use_column_attention=True)
        >>> model = KernelICLForInContextRegression(config)
        >>> xs, ys = torch.randn(4, 20, 3), torch.randn(4, 20)
        >>> model(xs, ys).predictions.shape  # position i from the pairs j < i
        torch.Size([4, 20])
        >>> model(xs, ys, n_context=15).predictions.shape  # 5 queries, each from the 15 context pairs
        torch.Size([4, 5])
    """

    def __init__(self, config: KernelICLConfig):
        super().__init__(config)
        hidden = config.hidden_size
        if config.use_column_attention:
            self.column_attention = KernelICLColumnAttention(config)
        self.embed_x = _embedding(config.n_dims, hidden)
        self.embed_y = _embedding(1, hidden)
        self.W_Q = nn.Linear(hidden, hidden, bias=False)
        self.W_K = nn.Linear(hidden, hidden, bias=False)
        self.W_V = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, 1)
        self.scale = hidden**-0.5
        if config.initial_temperature is not None:
            self.temperature = nn.Parameter(torch.tensor(config.initial_temperature))
        if config.row_kernel == "ga":
            self.ga_beta1 = nn.Parameter(torch.tensor(config.init_ga_beta1))
            self.ga_beta2 = nn.Parameter(torch.tensor(config.init_ga_beta2))
        self.gradient_checkpointing = False
        self.post_init()

    # Copied from GPT2ForInContextRegression.forward
    #   (signature: xs, ys, loss_positions, output_attentions)
    def forward(
        self, xs: torch.Tensor, ys: torch.Tensor, loss_positions: torch.Tensor | list[int] | None = None,
        n_context: int | None = None, output_attentions: bool | None = None, check_inputs: bool = True,
        **kwargs) -> ICLOutput:  # fmt: skip
        """Predict the prompts ``xs (B, N, n_dims)``, ``ys`` in one of two protocols.

        * ``n_context=None`` (default): the package's causal all-prefix protocol, ``N <= config.n_points``.
          ``predictions (B, N)``: position ``i``'s query ``x_i`` attends to the pairs ``j < i`` only (masked
          softmax of the row kernel). With column attention the mixing weights of position ``i`` come from the
          samples ``j < i`` and mix both those context inputs and ``x_i``, so every position has its own keys; they
          are computed batched over chunks of positions (see ``config.max_chunk_elements``). Position 0 has no
          pairs: it predicts ``out(0)``, the read-out's bias. ``ys`` is ``(B, N)``; the loss (MSE) is over
          ``loss_positions`` (a ``(N,)`` bool mask or indices; default all).
        * ``n_context=n`` (``0 <= n < N``): the document's protocol. The first ``n`` pairs are the context,
          positions ``n..N-1`` are queries; every query attends to all ``n`` context pairs and never to another
          query. ``predictions (B, N - n)``. Column attention weights come from the ``n`` context samples and mix
          context and queries alike. (The document applies column attention to the query set separately, i.e.
          transductively, from the queries' own statistics; using the context's makes the two protocols agree,
          position ``i`` of the causal one being this protocol with ``n = i``, and no query depends on another.)
          ``ys`` is ``(B, N)`` (the query labels enter the loss only, MSE over the queries) or ``(B, n)`` (context
          labels only, no loss); ``loss_positions`` is not used.

        Args:
            output_attentions: also return ``attentions = (row weights,)``, plus the column weights with column
                attention: row weights ``(B, N, N)`` over keys ``j`` (zero for ``j >= i``) in the causal protocol,
                ``(B, N - n, n)`` in the context/query one; column weights ``(B, N, D, D)`` (position ``i``'s) or
                ``(B, D, D)``.
            check_inputs: check the prompt's *values* (finite, ``|x|`` and ``|y|`` at most
                :func:`.max_prompt_magnitude` of the model's dtype); one device sync, skipped with ``False``.
                Shapes, dtypes and devices are checked either way. With ``False`` a NaN, inf or out-of-bound entry
                can make *earlier* positions NaN too (the masked softmax weights of 0 multiply it, and 0 times inf
                is NaN), so the predictions are causal only for valid inputs.
        """
        config = self.config
        check_no_backbone_kwargs(type(self).__name__, kwargs, _FORWARD_PARAMETERS)
        if output_attentions is None:
            output_attentions = config.output_attentions
        device = self.out.weight.device
        if n_context is None:
            dtype = self.out.weight.dtype
            degree = 3 if config.use_column_attention and dtype == torch.float16 else 2  # float16 column Gram
            bound = {"dtype": dtype, "degree": degree}  # the magnitude bound (max_prompt_magnitude)
            check_prompt(xs, ys, config.n_dims, config.n_points, check_values=check_inputs, device=device, **bound)
            targets, loss_mask = ys, loss_mask_for(loss_positions, xs.shape[1], xs.device)
            predictions, attentions = self._causal(xs, ys, output_attentions)
        else:
            targets = self._check_context_query(xs, ys, n_context, loss_positions, check_inputs, device)
            predictions, attentions = self._context_query(xs, ys, n_context, output_attentions)
            loss_mask = None
        loss = None if targets is None else _mse(predictions, targets, loss_mask)
        return ICLOutput(loss=loss, predictions=predictions, attentions=attentions if output_attentions else None)

    # -- the two protocols -----------------------------------------------------------------------------------------

    def _causal(self, xs: torch.Tensor, ys: torch.Tensor, output_attentions: bool):
        dtype = self.out.weight.dtype
        xs, ys = xs.to(dtype), ys.to(dtype)
        n_points = xs.shape[1]
        values = self.W_V(self.embed_y(ys.unsqueeze(-1)))  # (B, N, H)
        if not self.config.use_column_attention:
            embedded = self.embed_x(xs)  # keys are shared by every position: one masked attention
            allowed = torch.ones(n_points, n_points, dtype=torch.bool, device=xs.device).tril(-1)  # [i, j]: j < i
            weights = _masked_softmax(self._row_scores(self.W_Q(embedded), self.W_K(embedded)), allowed)
            return self.out(weights @ values).squeeze(-1), (weights,)
        column_weights = self.column_attention.prefix_weights(xs)  # (B, N, D, D)
        chunk = max(1, min(n_points, self.config.max_chunk_elements // (xs.shape[0] * n_points * values.shape[-1])))
        attended, row_weights = [], []
        for start in range(0, n_points, chunk):
            stop = min(start + chunk, n_points)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                part = self._gradient_checkpointing_func(self._causal_chunk, xs, values, column_weights, start, stop)
            else:
                part = self._causal_chunk(xs, values, column_weights, start, stop)
            attended.append(part[0])
            if output_attentions:  # pad the keys j >= stop (weight 0) to N
                row_weights.append(nn.functional.pad(part[1], (0, n_points - stop)))
        predictions = self.out(torch.cat(attended, dim=1)).squeeze(-1)
        return predictions, ((torch.cat(row_weights, dim=1), column_weights) if output_attentions else None)

    def _causal_chunk(
        self, xs: torch.Tensor, values: torch.Tensor, column_weights: torch.Tensor, start: int, stop: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``start..stop-1`` with column attention: ``(B, P, H)`` attended values, ``(B, P, stop)`` weights.

        Position ``i`` mixes the samples ``x_0..x_{stop-1}`` with its own column weights (only ``j < i`` are used as
        keys, and ``j = i`` as its query), so the keys are ``(B, P, stop, H)``.
        """
        positions = torch.arange(start, stop, device=xs.device)
        mixed = self.column_attention.mix(xs[:, None, :stop], column_weights[:, start:stop])  # (B, P, stop, D)
        embedded = self.embed_x(mixed)
        own = embedded[:, torch.arange(stop - start, device=xs.device), positions]  # x_i mixed by position i: (B, P, H)
        scores = self._row_scores(self.W_Q(own).unsqueeze(-2), self.W_K(embedded)).squeeze(-2)  # (B, P, stop)
        allowed = torch.arange(stop, device=xs.device) < positions[:, None]  # (P, stop): j < i
        weights = _masked_softmax(scores, allowed)
        return torch.einsum("bpj,bjh->bph", weights, values[:, :stop]), weights

    def _context_query(self, xs: torch.Tensor, ys: torch.Tensor, n_context: int, output_attentions: bool):
        dtype = self.out.weight.dtype
        xs, context_ys = xs.to(dtype), ys[:, :n_context].to(dtype)
        column_weights = None
        if self.config.use_column_attention:
            column_weights = self.column_attention.weights(xs[:, :n_context])  # from the context samples only
            xs = self.column_attention.mix(xs, column_weights)
        embedded = self.embed_x(xs)
        keys = self.W_K(embedded[:, :n_context])
        queries = self.W_Q(embedded[:, n_context:])
        values = self.W_V(self.embed_y(context_ys.unsqueeze(-1)))
        weights = torch.softmax(self._row_scores(queries, keys), dim=-1)  # (B, N - n, n); n = 0: empty, out(0)
        predictions = self.out(weights @ values).squeeze(-1)
        attentions = (weights,) if column_weights is None else (weights, column_weights)
        return predictions, attentions

    def _row_scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The row kernel's scores ``(..., M, N)`` between queries ``(..., M, H)`` and keys ``(..., N, H)``."""
        kernel, eps = self.config.row_kernel, self.config.eps
        if kernel == "softmax":
            return row_kernel_scores(queries, keys, "softmax", scale=self.scale)
        if kernel == "ga":
            params = {"beta1": self.ga_beta1, "beta2": self.ga_beta2, "wedge_mode": "penalty"}
            return row_kernel_scores(queries, keys, "ga", temperature=self.temperature, eps=eps, **params)
        return row_kernel_scores(queries, keys, kernel, temperature=self.temperature, eps=eps)

    def _check_context_query(self, xs, ys, n_context, loss_positions, check_inputs, device) -> torch.Tensor | None:
        """Check a context/query prompt; return the query targets ``(B, N - n)``, or None without query labels."""
        config = self.config
        if loss_positions is not None:
            raise ValueError(
                "loss_positions applies to the causal protocol (n_context=None); with n_context the loss is over "
                f"the query positions, got loss_positions={loss_positions!r}"
            )
        if isinstance(n_context, bool) or not isinstance(n_context, int):
            raise ValueError(f"n_context must be an integer or None, got {n_context!r} ({type(n_context).__name__})")
        n_points = xs.shape[1] if isinstance(xs, torch.Tensor) and xs.ndim == 3 else None
        if n_points is not None and not 0 <= n_context < n_points:
            raise ValueError(
                f"n_context must be in [0, {n_points - 1}] for prompts of {n_points} points (at least one query), "
                f"got {n_context}"
            )
        context_only = isinstance(ys, torch.Tensor) and n_points is not None and ys.shape == (xs.shape[0], n_context)
        if context_only:  # check the context labels as a full prompt whose query labels are placeholders
            ys = torch.cat([ys, ys.new_zeros(xs.shape[0], n_points - n_context)], dim=1)
        elif isinstance(ys, torch.Tensor) and isinstance(xs, torch.Tensor) and ys.shape != xs.shape[:2]:
            raise ValueError(
                f"ys must have shape {tuple(xs.shape[:2])} (context and query labels: the loss is computed) or "
                f"{(xs.shape[0], n_context)} (context labels only) with n_context={n_context}, got {tuple(ys.shape)}"
            )
        dtype = self.out.weight.dtype
        degree = 3 if config.use_column_attention and dtype == torch.float16 else 2  # float16 column Gram: 1e2
        check_prompt(xs, ys, config.n_dims, None, check_values=check_inputs, device=device, dtype=dtype, degree=degree)
        return None if context_only else ys[:, n_context:]


def _mse(predictions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error, over the masked positions only when ``mask`` is given (as every ICL head computes it)."""
    per_position = (predictions.float() - targets.float()).square()
    if mask is None:
        return per_position.mean()
    weights = mask.to(per_position.dtype).expand_as(per_position)
    return (per_position * weights).sum() / weights.sum().clamp_min(1)
