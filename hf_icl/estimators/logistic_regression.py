"""L2-regularised logistic regression refitted on every prefix (binary ±1 labels or class ids), by a batched
Newton method: every prefix of every prompt is its own problem, all solved together."""

from __future__ import annotations

import warnings

import torch

from ..validation import check_float, check_int
from ._prefix import earlier_mask, to_working
from .base import InContextEstimator


class LogisticRegressionConvergenceWarning(RuntimeWarning):
    """Some logistic-regression fits reached ``max_iter`` Newton steps without meeting the stopping rule."""


class LogisticRegression(InContextEstimator):
    """L2-regularised logistic regression fitted to the pairs ``j < i`` and evaluated at ``x_i``, no intercept.

    Position ``i``'s weights minimise scikit-learn's objective on the prefix,

        ``C · Σ_{j<i} -log softmax(W x_j)[y_j] + ½ ‖W‖²``,

    over one weight vector per class for ``K >= 3`` classes (the multinomial model, as sklearn's), and over a
    single vector ``w`` (the logit of the second class against the first, ``log p₁/p₀ = wᵀx``) for two classes.
    The model always covers the whole label set (``n_classes``), so the objective is strongly convex and every
    prefix has one finite solution: position 0 (no pairs) gets ``W = 0``, the uniform prediction; a prefix that
    has seen one class only, or not every class, is an ordinary fit whose unseen classes keep a small but
    non-zero probability. When a prefix contains every class this is exactly
    ``sklearn.linear_model.LogisticRegression(C=C, l1_ratio=0, fit_intercept=False)`` fitted on it (sklearn
    itself fits only the classes present, and refuses a single class). For an intercept, append a constant input
    coordinate (then penalised like the other weights).

    All ``B · N`` problems are solved together in float64 (float32 on MPS) by Newton's method from ``W = 0``
    with an Armijo backtracking line search; the Hessian ``C Σ_j (diag p_j - p_j p_jᵀ) ⊗ x_j x_jᵀ + I`` is
    formed with the pairs ``j >= i`` masked out. Each problem stops on its own, when its gradient's largest
    entry is at most ``tol`` (or when no step can lower the objective in floating point), so a prediction does
    not depend on the rest of the batch. A Newton step costs ``O(N² K² d² + N (K d)³)`` per prompt, and memory
    grows with ``N · (K d)²`` per prompt, so prompts are processed in chunks of at most
    :attr:`max_chunk_elements` entries; a GPU pays off for large ``d`` and ``K``.

    Outputs, in the formats the package scores:

    * ``n_classes=None`` (binary tasks, labels ``-1.0`` / ``+1.0``): ``(B, N)`` logits ``log p(+1) / p(-1)``,
      like the binary models' predictions (the sign is the label; position 0 predicts exactly 0, which
      accuracy counts as wrong);
    * ``n_classes=C`` (categorical tasks, labels ``0.0 … C-1`` as floats): ``(B, N, C)`` log-probabilities,
      logits whose softmax is the predicted distribution (position 0: ``-log C`` everywhere).

    :meth:`predict_queries` fits once on each prompt's whole context and returns ``(B, Q)`` or ``(B, Q, C)``.

    Args:
        n_classes: ``None`` for ±1 labels, or the number of classes ``C >= 2`` of class-id labels.
        C: inverse regularisation strength > 0 (scikit-learn's ``C``; default 1.0, sklearn's default).
        tol: a fit stops when ``max |∇ objective| <= tol`` (> 0).
        max_iter: most Newton steps per fit (>= 1); fits still unconverged then keep their last iterate and are
            reported with a :class:`LogisticRegressionConvergenceWarning`.

    >>> import torch
    >>> from hf_icl.estimators import LogisticRegression
    >>> xs = torch.tensor([[[1.0], [-1.0], [2.0], [0.5]]], dtype=torch.float64)
    >>> ys = torch.tensor([[1.0, -1.0, 1.0, 1.0]], dtype=torch.float64)
    >>> logits = LogisticRegression(C=1.0)(xs, ys)
    >>> logits[0, 0].item(), torch.equal(logits[0, 1:].sign(), ys[0, 1:])  # nothing seen yet: 0; then sign(x)
    (0.0, True)
    >>> log_probs = LogisticRegression(n_classes=3)(xs, (ys + 1))  # class ids 0 and 2
    >>> log_probs.shape, torch.allclose(log_probs[0, 0].exp(), torch.full((3,), 1 / 3, dtype=torch.float64))
    (torch.Size([1, 4, 3]), True)
    """

    #: most entries of the Newton systems (and of the products they are summed from) built at once: prompts go
    #: through the solver in chunks of about ``max_chunk_elements / (N (K d)² + N² K² d)``
    max_chunk_elements: int = 2**23

    def __init__(self, n_classes: int | None = None, C: float = 1.0, tol: float = 1e-8, max_iter: int = 100):
        if n_classes is not None:
            check_int("n_classes", n_classes, low=2)
        self.n_classes = n_classes
        self.C = check_float("C", C, low=0.0, low_inclusive=False)
        self.tol = check_float("tol", tol, low=0.0, low_inclusive=False)
        self.max_iter = check_int("max_iter", max_iter, low=1)
        classes = "" if n_classes is None else f", {n_classes} classes"
        self.name = f"logistic_regression(C={self.C:g}{classes})"

    @property
    def _n_labels(self) -> int:
        """Number of classes of the model: 2 for ±1 labels."""
        return 2 if self.n_classes is None else self.n_classes

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        labels = self._class_ids("ys", ys)
        (xs,) = to_working(xs)
        batch, n_points, n_dims = xs.shape
        usable = earlier_mask(n_points, xs.device).to(xs.dtype).expand(batch, n_points, n_points)
        weights = self._fit_in_chunks(xs, labels, usable)
        return self._output(torch.einsum("bid,bikd->bik", xs, weights))

    def _predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        labels = self._class_ids("context_ys", context_ys)
        context_xs, query_xs = to_working(context_xs, query_xs)
        usable = context_xs.new_ones(context_xs.shape[0], 1, context_xs.shape[1])
        weights = self._fit_in_chunks(context_xs, labels, usable)[:, 0]  # one fit per prompt: (B, K, d)
        return self._output(torch.einsum("bqd,bkd->bqk", query_xs, weights))

    def _fit_in_chunks(self, xs: torch.Tensor, labels: torch.Tensor, usable: torch.Tensor) -> torch.Tensor:
        """Weights ``(B, P, K, d)`` of the ``P`` problems of every prompt (problem ``p`` uses the pairs where
        ``usable[b, p] == 1``), a chunk of prompts at a time."""
        n_problems, n_pairs = usable.shape[1:]
        n_free, n_dims = _n_free(self._n_labels), xs.shape[-1]
        # the Hessians, plus the (K, d, K, n) products they are summed from
        per_prompt = n_problems * ((n_free * n_dims) ** 2 + n_free**2 * n_dims * n_pairs)
        chunk = max(1, self.max_chunk_elements // per_prompt)
        fits, unconverged = [], 0
        for start in range(0, xs.shape[0], chunk):
            rows = slice(start, start + chunk)
            weights, failed = _newton(
                xs[rows], labels[rows], usable[rows], self._n_labels, self.C, self.tol, self.max_iter
            )
            fits.append(weights)
            unconverged += failed
        if unconverged:
            warnings.warn(
                f"logistic_regression: {unconverged} of {xs.shape[0] * n_problems} fits did not converge within "
                f"max_iter={self.max_iter} Newton steps; their predictions are the last iterate (raise max_iter "
                "or tol)",
                LogisticRegressionConvergenceWarning,
                stacklevel=4,
            )
        return torch.cat(fits)

    def _output(self, free_logits: torch.Tensor) -> torch.Tensor:
        """Binary: the logit ``(…)``; categorical: log-probabilities ``(…, C)``."""
        if self.n_classes is None:
            return free_logits[..., 0]
        return torch.log_softmax(_full_logits(free_logits, self._n_labels), dim=-1)

    def _class_ids(self, arg: str, ys: torch.Tensor) -> torch.Tensor:
        """Labels as int64 class indices (±1 → 0 / 1), or a ``ValueError`` naming ``arg``."""
        if self.n_classes is None:
            bad = (ys != 1) & (ys != -1)
            if bool(bad.any()):
                raise ValueError(
                    f"{arg} must hold binary labels -1.0 or +1.0 (logistic_regression with n_classes=None; pass "
                    f"n_classes=C for class ids), got {ys[bad][0].item()}"
                )
            return ((ys + 1) / 2).long()
        bad = (ys != ys.round()) | (ys < 0) | (ys >= self.n_classes)
        if bool(bad.any()):
            raise ValueError(
                f"{arg} must hold class ids 0, 1, ..., {self.n_classes - 1} (n_classes={self.n_classes}) as "
                f"whole numbers, got {ys[bad][0].item()}"
            )
        return ys.long()


def _n_free(n_labels: int) -> int:
    """Weight vectors of the model: one per class, except one in all for two classes."""
    return 1 if n_labels == 2 else n_labels


def _full_logits(free_logits: torch.Tensor, n_labels: int) -> torch.Tensor:
    """The ``n_labels`` class logits from the free ones: for two classes, class 0's logit is fixed at 0."""
    if n_labels == 2:
        return torch.cat([torch.zeros_like(free_logits), free_logits], dim=-1)
    return free_logits


def _newton(
    xs: torch.Tensor,
    labels: torch.Tensor,
    usable: torch.Tensor,
    n_labels: int,
    C: float,
    tol: float,
    max_iter: int,
) -> tuple[torch.Tensor, int]:
    """Solve ``min_W C Σ_j usable[b, p, j] · CE(W x_j, y_j) + ½ ‖W‖²`` for every prompt ``b`` and problem ``p``.

    Args:
        xs: ``(B, n, d)`` inputs; labels: ``(B, n)`` class indices; usable: ``(B, P, n)`` 0/1 pair weights.

    Returns:
        The weights ``(B, P, K, d)`` and how many problems stopped at ``max_iter`` unconverged.
    """
    batch, n_problems = usable.shape[:2]
    n_free, n_dims = _n_free(n_labels), xs.shape[-1]
    offset = n_labels - n_free  # the first class has no weights of its own when there are two classes
    targets = torch.nn.functional.one_hot(labels, n_labels).to(xs.dtype)  # (B, n, classes)

    def objective(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The objective ``(B, P)`` and the class log-probabilities ``(B, P, n, classes)``."""
        log_probs = torch.log_softmax(_full_logits(torch.einsum("bnd,bpkd->bpnk", xs, weights), n_labels), -1)
        data_term = -(log_probs * targets.unsqueeze(1)).sum(-1)
        return C * (usable * data_term).sum(-1) + 0.5 * weights.square().sum((-1, -2)), log_probs

    def gradient_of(weights: torch.Tensor, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient ``(B, P, K, d)`` and the free classes' probabilities ``(B, P, n, K)``."""
        probs = log_probs.exp()[..., offset:]
        residual = usable.unsqueeze(-1) * (probs - targets[..., offset:].unsqueeze(1))
        return C * torch.einsum("bpnk,bnd->bpkd", residual, xs) + weights, probs

    eps = torch.finfo(xs.dtype).eps
    weights = xs.new_zeros(batch, n_problems, n_free, n_dims)
    value, log_probs = objective(weights)
    done = torch.zeros(batch, n_problems, dtype=torch.bool, device=xs.device)
    for iteration in range(max_iter + 1):
        gradient, probs = gradient_of(weights, log_probs)
        done |= gradient.abs().amax((-1, -2)) <= tol
        if bool(done.all()) or iteration == max_iter:
            break
        # H[(k, d), (l, e)] = C Σ_j usable_j (diag p_j - p_j p_jᵀ)[k, l] x_j[d] x_j[e] + δ: one matmul over j that
        # writes H in its final layout.
        curvature = (C * usable)[..., None, None] * (
            torch.diag_embed(probs) - probs.unsqueeze(-1) * probs.unsqueeze(-2)
        )
        scaled = torch.einsum("bpnkl,bnd->bpkdln", curvature, xs).reshape(batch, n_problems, -1, xs.shape[1])
        hessian = (scaled @ xs.unsqueeze(1)).reshape(batch, n_problems, n_free * n_dims, n_free * n_dims)
        hessian.diagonal(dim1=-2, dim2=-1).add_(1.0)  # + I, the penalty's curvature
        factor, info = torch.linalg.cholesky_ex(hessian)
        if bool((info != 0).any()):
            raise ValueError(
                f"logistic_regression: the Newton system is not positive definite in floating point (C={C:g}); "
                "use a smaller C"
            )
        # Two triangular solves (much faster than cholesky_solve on small batched CPU systems).
        half = torch.linalg.solve_triangular(factor, gradient.reshape(batch, n_problems, -1, 1), upper=False)
        step = torch.linalg.solve_triangular(factor.mH, half, upper=True).reshape(weights.shape)
        # A Newton step too small to change the weights in floating point: the problem is solved to precision.
        done |= step.abs().amax((-1, -2)) <= 4 * eps * weights.abs().amax((-1, -2)).clamp_min(1.0)
        decrease = (gradient * step).sum((-1, -2))  # the Newton decrement gᵀH⁻¹g >= 0
        # Near the optimum the objective's change drops below its rounding error and the Armijo test turns into
        # a coin toss; a slack of a few hundred ulps lets the (then exact) full Newton step through.
        slack = 256 * eps * value.abs().clamp_min(1.0)
        # Armijo backtracking, problem by problem; finished problems never move again.
        step_size = torch.ones_like(value)
        accepted = done.clone()
        for _ in range(60):
            trial = weights - step_size[..., None, None] * step
            trial_value, trial_log_probs = objective(trial)
            ok = ~accepted & (trial_value <= value - 1e-4 * step_size * decrease + slack)
            weights = torch.where(ok[..., None, None], trial, weights)
            value = torch.where(ok, trial_value, value)
            log_probs = torch.where(ok[..., None, None], trial_log_probs, log_probs)
            accepted |= ok
            if bool(accepted.all()):
                break
            step_size = torch.where(accepted, step_size, step_size / 2)
        done |= ~accepted  # no step lowers the objective in floating point: at its optimum to precision
    return weights, int((~done).sum())
