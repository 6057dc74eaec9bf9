"""Functional gradient descent for categorical in-context learning (seed 004), and the kernels it uses.

The softmax classification model ``p(y = c | x) = softmax(W_eᵀ f(x))_c`` shares the embedding matrix
``W_e`` (``d' × C``, column ``c`` embeds class ``c``) with the transformer. The document's functional GD on the
cross-entropy of the ``m`` context pairs updates the latent at every context point from *all* context pairs, and
reads a query ``x_q`` from the same pairs:

    f_{i,0} = 0,
    f_{i,k+1} = f_{i,k} + η s Σ_{j=1..m} κ(x_i, x_j) (w_{e,y_j} − E(w_e)|f_{j,k})    (i a context point or a query),
    E(w_e)|f = W_e softmax(W_eᵀ f),

with ``s = 1`` or ``1 / m`` and logits ``W_eᵀ f_{q,K}``; a context point's own pair is in its sum (``j = i``).
:func:`functional_gd_logits` computes it for the queries after a context (``n_context=m``) or, with
``n_context=None``, at every prompt position ``i`` from the pairs ``j < i`` (each position is the query of its own
prefix: K steps on that prefix, a per-prefix loop).

For ``K = 1`` every position's prediction uses the pairs before it once, and one causal pass computes all of them.
For ``K ≥ 2`` the context latents ``f_{j,k}`` depend on the whole context, so a token ``j`` that sees only the pairs
before it computes something else: :func:`causal_functional_gd_logits`, the *causal variant*

    f_{i,k+1} = f_{i,k} + η s_i Σ_{j<i} κ(x_i, x_j) (w_{e,y_j} − E(w_e)|f_{j,k}),    s_i = 1 or 1 / i,

in which position ``j``'s state ``f_{j,k}`` used the pairs before ``j`` only. It is not the document's algorithm
(the logits differ for K ≥ 2); the transformer computes it with ``context_attention="causal"``.

Numerics. ``"rbf"`` weights are at most 1 and the normalised softmax kernel (``normalize=True``) is computed with
a max shift (``softmax``), so both stay finite and exact for inputs of any magnitude the prompt check accepts
(off-diagonal rbf weights of far-apart inputs underflow to exactly 0, as they should). The *unnormalised* softmax
kernel is different: ``f = η Σ_j exp(x_iᵀx_j / h) r_j`` is itself of size ``exp(max score)``, and a max shift or
the log domain cannot help, because it is the logits (``W_eᵀ f``), not an intermediate, that leave float64's range
once a score passes ``log(finfo.max)`` (709.8; 88.7 in float32): inputs × 100 of a normal prompt have scores of
order 10⁴. So a result that does not fit is refused, never returned as NaN: both references raise a ``ValueError``
naming the largest kernel score, the limit and the dtype, and the transformer checks its logits (one device sync
with ``check_inputs``) and says the same. :func:`kernel_weights` itself returns ``inf`` weights there (it is used
inside the model, where a check would cost a sync per block).

The pieces here are small and shared: :func:`kernel_weights` (the kernels as masked attention weights),
:func:`expected_embedding`, :func:`functional_gd_step`, the attention masks of both protocols and the two
references.
"""

from __future__ import annotations

import math

import torch

from ...validation import check_choice, check_float, check_int
from ..prompts import check_prompt

#: the kernels κ (``bandwidth`` h rescales each; all are unnormalised sums unless ``normalize`` is asked for):
#: ``"softmax"`` ``exp(qᵀk / h)``, ``"rbf"`` ``exp(−‖q − k‖² / (2h²))``, ``"linear"`` ``qᵀk / h``
KERNELS = ("softmax", "rbf", "linear")


def squared_distances(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``‖q_i − k_j‖²`` for every pair, ``(..., Nq, Nk)``, from the differences themselves (not the expansion
    ``‖q‖² + ‖k‖² − 2qᵀk``), so a query equal to a key is at distance exactly 0.

    >>> import torch
    >>> squared_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0]]), torch.tensor([[3.0, 4.0]]))
    tensor([[25.],
            [ 0.]])
    """
    return torch.cdist(queries, keys, compute_mode="donot_use_mm_for_euclid_dist").square()


def kernel_scores(queries: torch.Tensor, keys: torch.Tensor, kernel: str, bandwidth: float = 1.0) -> torch.Tensor:
    """The kernel's argument for every (query, key) pair, ``(..., Nq, Nk)``: ``qᵀk / h`` for ``"softmax"`` and
    ``"linear"``, ``−‖q − k‖² / (2h²)`` for ``"rbf"``. κ is ``exp`` of it (softmax, rbf) or it itself (linear)."""
    if kernel == "rbf":
        return squared_distances(queries, keys) / (-2.0 * bandwidth**2)
    return queries @ keys.transpose(-1, -2) / bandwidth


def kernel_weights(
    queries: torch.Tensor,
    keys: torch.Tensor,
    kernel: str,
    bandwidth: float = 1.0,
    mask: torch.Tensor | None = None,
    normalize: bool = False,
) -> torch.Tensor:
    """Kernel values ``κ(q_i, k_j)`` as attention weights, ``(..., Nq, Nk)``, zero where ``mask`` is False.

    Args:
        queries, keys: ``(..., Nq, D)`` and ``(..., Nk, D)``.
        kernel: one of :data:`KERNELS`.
        bandwidth: h > 0.
        mask: bool, broadcastable to ``(..., Nq, Nk)``; True where key ``j`` may be used by query ``i``.
        normalize: divide the softmax kernel's weights by their sum over the allowed keys (softmax attention as
            trained transformers compute it); a query with no allowed key gets all-zero weights. Softmax only.

    Masked entries are removed *before* ``exp``, so no overflowed ``inf`` (and no ``0 · inf`` gradient) appears.

    >>> import torch
    >>> q = torch.tensor([[1.0], [2.0]])
    >>> causal = torch.tensor([[False, False], [True, False]])  # query i sees keys j < i
    >>> kernel_weights(q, q, "linear", mask=causal)
    tensor([[0., 0.],
            [2., 0.]])
    """
    check_choice("kernel", kernel, KERNELS)
    if normalize and kernel != "softmax":
        raise ValueError(f"normalize=True applies to kernel='softmax' only, got kernel={kernel!r}")
    scores = kernel_scores(queries, keys, kernel, bandwidth)
    if kernel == "linear":
        return scores if mask is None else torch.where(mask, scores, 0.0)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if not normalize:
        return scores.exp()
    weights = scores.softmax(dim=-1)
    # a row with no allowed key is all -inf: softmax gives NaN there, the empty sum is 0
    return weights if mask is None else torch.where(mask.any(dim=-1, keepdim=True), weights, 0.0)


def expected_embedding(f: torch.Tensor, class_embeddings: torch.Tensor) -> torch.Tensor:
    """``E(w_e)|f = W_e softmax(W_eᵀ f)`` for every latent ``f (..., d')``; ``class_embeddings`` is ``W_e (d', C)``.

    >>> import torch
    >>> W_e = torch.eye(2)
    >>> expected_embedding(torch.zeros(1, 2), W_e)  # f = 0: the mean embedding
    tensor([[0.5000, 0.5000]])
    """
    return (f @ class_embeddings).softmax(dim=-1) @ class_embeddings.T


def causal_context_mask(n_points: int, device=None) -> torch.Tensor:
    """``(N, N)`` bool, True at ``[i, j]`` for ``j < i``: the context pairs position ``i`` may use."""
    return torch.ones(n_points, n_points, dtype=torch.bool, device=device).tril(-1)


def context_query_masks(n_points: int, n_context: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The document's masks for a prompt of ``n_context`` context pairs followed by queries, ``(N, N)`` bool each.

    ``update[i, j]``: token ``i`` reads pair ``j`` (``j < n_context``, for context tokens and queries alike: the
    context attends to the whole context, itself included; no token reads a query). ``erase[i, j]``: the states
    token ``i`` may read (the context and itself).

    >>> update, erase = context_query_masks(3, 2)
    >>> update.int().tolist(), erase.int().tolist()
    ([[1, 1, 0], [1, 1, 0], [1, 1, 0]], [[1, 1, 0], [1, 1, 0], [1, 1, 1]])
    """
    positions = torch.arange(n_points, device=device)
    update = (positions < n_context).expand(n_points, n_points)
    return update, update | torch.eye(n_points, dtype=torch.bool, device=device)


def prefix_masks(n_points: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`context_query_masks` for every prefix at once, ``(N, N, N)`` each: copy ``p`` of the prompt has the
    ``p`` pairs before position ``p`` as its context and position ``p`` as its query (the tokens after ``p`` are
    computed and ignored). One batched pass over the ``N`` copies equals a per-prefix loop.
    """
    positions = torch.arange(n_points, device=device)
    update = (positions < positions[:, None]).unsqueeze(1).expand(n_points, n_points, n_points)  # [p, i, j]: j < p
    return update, update | torch.eye(n_points, dtype=torch.bool, device=device)


def pair_counts(update_mask: torch.Tensor, dtype=None) -> torch.Tensor:
    """``(..., N, 1)``: the pairs each token reads under ``update_mask``, at least 1 (an empty sum stays 0)."""
    return update_mask.sum(dim=-1, keepdim=True).clamp_min(1).to(dtype)


def functional_gd_step(
    f: torch.Tensor,
    weights: torch.Tensor,
    label_embeddings: torch.Tensor,
    class_embeddings: torch.Tensor,
    learning_rate: float,
    normalize_by_count: bool = False,
) -> torch.Tensor:
    """One step ``f_{k+1} = f_k + η s_i Σ_j weights[i, j] (w_{e,y_j} − E(w_e)|f_{j,k})`` at every position.

    Args:
        f: ``(B, N, d')`` the latents ``f_{j,k}`` of every position.
        weights: ``(B, N, N)`` kernel weights, already zero for ``j >= i`` (:func:`kernel_weights`).
        label_embeddings: ``(B, N, d')`` the embeddings ``w_{e,y_j}`` of the labels.
        class_embeddings: ``W_e (d', C)``.
        learning_rate: η.
        normalize_by_count: ``s_i = 1 / i`` instead of 1.
    """
    residuals = label_embeddings - expected_embedding(f, class_embeddings)
    update = weights @ residuals
    if normalize_by_count:
        update = update / pair_counts(causal_context_mask(f.shape[-2], f.device), f.dtype)
    return f + learning_rate * update


def functional_gd_logits(
    xs: torch.Tensor,
    ys: torch.Tensor,
    W_e: torch.Tensor,
    n_steps: int,
    learning_rate: float,
    kernel: str = "softmax",
    bandwidth: float = 1.0,
    normalize_by_count: bool = False,
    normalize_attention: bool = False,
    n_context: int | None = None,
) -> torch.Tensor:
    """The document's ``n_steps`` of functional GD on the whole context, read at the queries.

    * ``n_context=m``: the first ``m`` pairs are the context, positions ``m..N-1`` the queries; returns the queries'
      logits ``W_eᵀ f_{q,K}``, ``(B, N - m, C)`` (``ys`` may be ``(B, m)``, the context labels only).
    * ``n_context=None``: every position ``i`` is the query of its own prefix (the pairs ``j < i``), ``(B, N, C)``;
      position 0 has no pairs: ``f = 0``, uniform logits. A loop over the prefixes (this is the reference).

    Args:
        xs: ``(B, N, d)`` inputs.
        ys: ``(B, N)`` integer class ids in ``[0, C)``.
        W_e: ``(d', C)`` class embeddings (column ``c`` embeds class ``c``).
        n_steps: K >= 0.
        learning_rate: η.
        kernel, bandwidth: κ (:data:`KERNELS`) and its h > 0.
        normalize_by_count: ``s = 1 / m`` instead of 1.
        normalize_attention: the softmax kernel's weights divided by their sum over the context.

    >>> import torch
    >>> xs, ys, W_e = torch.randn(2, 6, 3), torch.randint(4, (2, 6)), torch.randn(5, 4)
    >>> functional_gd_logits(xs, ys, W_e, n_steps=2, learning_rate=0.5, n_context=4).shape  # two queries
    torch.Size([2, 2, 4])
    >>> logits = functional_gd_logits(xs, ys, W_e, n_steps=2, learning_rate=0.5)
    >>> logits.shape, bool((logits[:, 0] == 0).all())  # position 0: f = 0
    (torch.Size([2, 6, 4]), True)
    """
    xs, ys = _check_reference_inputs(xs, ys, W_e, n_steps, learning_rate, bandwidth, n_context)
    options = (W_e, n_steps, learning_rate, kernel, bandwidth, normalize_by_count, normalize_attention)
    if n_context is not None:
        logits = _full_context_gd(xs[:, :n_context], ys[:, :n_context], xs[:, n_context:], *options)
    else:
        prefixes = [_full_context_gd(xs[:, :i], ys[:, :i], xs[:, i : i + 1], *options) for i in range(xs.shape[1])]
        logits = torch.cat(prefixes, dim=1)
    _check_finite_logits("functional_gd_logits", logits, xs, kernel, bandwidth, normalize_attention, n_steps)
    return logits


def _full_context_gd(
    context_xs, context_ys, query_xs, W_e, n_steps, learning_rate, kernel, bandwidth, by_count, normalize
) -> torch.Tensor:
    """K steps on the context (every context point from every context pair), the queries read alongside."""
    n_context = context_xs.shape[1]
    context_weights = kernel_weights(context_xs, context_xs, kernel, bandwidth, normalize=normalize)
    query_weights = kernel_weights(query_xs, context_xs, kernel, bandwidth, normalize=normalize)
    scale = learning_rate / max(n_context, 1) if by_count else learning_rate
    label_embeddings = W_e.T[context_ys.long()]
    f_context = W_e.new_zeros(*context_xs.shape[:2], W_e.shape[0])
    f_query = W_e.new_zeros(*query_xs.shape[:2], W_e.shape[0])
    for _ in range(n_steps):
        residuals = label_embeddings - expected_embedding(f_context, W_e)  # both updates use the step-k residuals
        f_query = f_query + scale * query_weights @ residuals
        f_context = f_context + scale * context_weights @ residuals
    return f_query @ W_e


# Copied from functional_gd_logits
#   (signature: xs, ys, W_e, n_steps, learning_rate, kernel, bandwidth, normalize_by_count, normalize_attention)
def causal_functional_gd_logits(
    xs: torch.Tensor, ys: torch.Tensor, W_e: torch.Tensor, n_steps: int, learning_rate: float, kernel: str = "softmax",
    bandwidth: float = 1.0, normalize_by_count: bool = False, normalize_attention: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Logits ``W_eᵀ f_{i,K}`` of the *causal variant* of functional GD at every position, ``(B, N, C)``.

    Position ``i``'s state is updated from the pairs ``j < i`` with the residuals of *their* states, which used the
    pairs before them only (see the module docstring); equal to :func:`functional_gd_logits` for ``n_steps <= 1``,
    a different algorithm for more. Vectorised over prompts and positions; the loop runs over the K steps only. It
    is what :meth:`GDTransformerForInContextClassification.from_gd_construction` computes with
    ``context_attention="causal"``. Arguments as :func:`functional_gd_logits` (``s_i = 1 / i``, softmax normalised
    over ``j < i``).

    >>> import torch
    >>> xs, ys, W_e = torch.randn(2, 6, 3), torch.randint(4, (2, 6)), torch.randn(5, 4)
    >>> one = causal_functional_gd_logits(xs, ys, W_e, n_steps=1, learning_rate=0.5)
    >>> torch.allclose(one, functional_gd_logits(xs, ys, W_e, n_steps=1, learning_rate=0.5), atol=1e-6)
    True
    """
    xs, ys = _check_reference_inputs(xs, ys, W_e, n_steps, learning_rate, bandwidth, None)
    mask = causal_context_mask(xs.shape[1], xs.device)
    weights = kernel_weights(xs, xs, kernel, bandwidth, mask, normalize_attention)
    label_embeddings = W_e.T[ys.long()]
    f = torch.zeros(*xs.shape[:2], W_e.shape[0], dtype=W_e.dtype, device=xs.device)
    for _ in range(n_steps):
        f = functional_gd_step(f, weights, label_embeddings, W_e, learning_rate, normalize_by_count)
    logits = f @ W_e
    _check_finite_logits("causal_functional_gd_logits", logits, xs, kernel, bandwidth, normalize_attention, n_steps)
    return logits


def _check_reference_inputs(xs, ys, W_e, n_steps, learning_rate, bandwidth, n_context) -> tuple:
    """The references check their inputs as the model does (:func:`~hf_icl.modeling.prompts.check_prompt`: finite
    ``xs`` within the magnitude bound of ``W_e``'s dtype, class ids), plus a finite ``W_e``."""
    check_int("n_steps", n_steps, low=0)
    check_float("learning_rate", learning_rate)
    check_float("bandwidth", bandwidth, low=0, low_inclusive=False)
    if not (isinstance(W_e, torch.Tensor) and W_e.ndim == 2 and W_e.is_floating_point()):
        raise ValueError(f"W_e must be a floating-point (d', C) tensor, got {_describe(W_e)}")
    if not (isinstance(xs, torch.Tensor) and xs.ndim == 3 and xs.is_floating_point()):
        raise ValueError(f"xs must be a floating-point (B, N, d) tensor, got {_describe(xs)}")
    if n_context is not None:
        check_int("n_context", n_context, low=0, high=xs.shape[1] - 1)
    allowed = [tuple(xs.shape[:2])] + ([(xs.shape[0], n_context)] if n_context is not None else [])
    if not isinstance(ys, torch.Tensor) or tuple(ys.shape) not in allowed:
        shapes = " or ".join(map(str, allowed))
        raise ValueError(f"ys must be a tensor of class ids of shape {shapes}, got {_describe(ys)}")
    check_finite_tensor("W_e", W_e)
    n_classes = W_e.shape[1]
    if ys.numel() and not ys.is_complex() and ys.dtype != torch.bool:
        outside = (ys < 0) | (ys >= n_classes)
        if bool(outside.any()):
            index = tuple(outside.nonzero()[0].tolist())
            raise ValueError(
                f"ys must be class ids in [0, {n_classes}) (W_e has {n_classes} columns), got "
                f"{ys[index].item():.6g} at ys[{index[0]}, {index[1]}]"
            )
    placeholders = ys.new_zeros(xs.shape[0], xs.shape[1] - ys.shape[1])  # absent query labels, read by nothing
    full_ys = torch.cat([ys, placeholders], dim=1)
    check_prompt(xs, full_ys, xs.shape[-1], target_kind="categorical", n_classes=n_classes, dtype=W_e.dtype)
    return xs.to(W_e.dtype), ys


def check_finite_tensor(name: str, value: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``name``, the first non-finite entry and its index, unless ``value`` is finite
    (one device sync)."""
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name} must hold finite values only, got {value[index].item()} at {name}[{', '.join(map(str, index))}]"
        )


def largest_kernel_score(xs: torch.Tensor, kernel: str, bandwidth: float) -> tuple[float, tuple[int, int, int]]:
    """The largest score ``x_iᵀx_j / h`` (softmax, linear) or ``−‖x_i − x_j‖² / (2h²)`` (rbf) over every pair of a
    prompt batch ``xs (B, N, d)``, and where it is: ``(prompt, i, j)``."""
    scores = kernel_scores(xs, xs, kernel, bandwidth)
    flat = int(scores.flatten().nan_to_num(nan=math.inf, posinf=math.inf).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), scores.shape))
    return float(scores[index]), index


def overflow_message(owner: str, dtype: torch.dtype, kernel: str, normalize: bool, score: float, where: str) -> str:
    """Why a functional-GD computation left ``dtype``'s range (shared by the references and the transformer)."""
    limit = math.log(torch.finfo(dtype).max)
    name = str(dtype).removeprefix("torch.")
    if kernel == "softmax" and not normalize and score > limit:
        return (
            f"{owner}: the unnormalised softmax kernel exp(q_i·k_j / h) overflows {name}: the largest kernel score is "
            f"{score:.6g} ({where}) and exp of a score above {limit:.4g} exceeds {name}'s largest number "
            f"{torch.finfo(dtype).max:.3g}; the sum it weights (and so the logits) cannot be represented. Use "
            "normalize_attention=True (softmax attention, exact with a max shift), a larger bandwidth, or inputs of "
            "smaller magnitude"
        )
    return (
        f"{owner}: the logits overflowed {name} (largest kernel score {score:.6g}, {where}); the kernel={kernel!r} "
        "update grows with the inputs' (and weights') magnitude at every step. Use inputs of smaller magnitude, a "
        "larger bandwidth, or fewer steps"
    )


def _check_finite_logits(owner, logits, xs, kernel, bandwidth, normalize, n_steps) -> None:
    if n_steps == 0 or bool(torch.isfinite(logits).all()):
        return
    score, (b, i, j) = largest_kernel_score(xs, kernel, bandwidth)
    raise ValueError(overflow_message(owner, logits.dtype, kernel, normalize, score, f"prompt {b}, x_{i}·x_{j}"))


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{value!r} ({type(value).__name__})"
