"""Garg et al.'s prompt strategies: queries that differ from their context on purpose.

Each strategy turns inputs ``xs (B, N, d)`` into ``(context_xs, query_xs)``, both ``(B, N, d)``.
Position ``i`` is then scored on its own prompt: the context pairs ``(context_x_j, f(context_x_j))``
for ``j < i`` followed by the query ``query_x_i``, labelled ``f(query_x_i)`` with the prompt's task ``f``.
Because the query at ``i`` is not the context input at ``i``, one all-positions pass cannot score these
prompts: :func:`score_by_position` runs each predictor once per position (on every prompt at once) and keeps
the prediction at ``i``.

* ``random_quadrants`` (:func:`random_quadrants_prompts`): a random sign pattern ``s`` per prompt; context
  inputs ``|x|·s`` all lie in the orthant ``s``, the query is the untouched ``x`` (a random orthant), as in
  Garg et al.'s ``build_evals``; ``query_orthant="opposite"`` puts it at ``|x|·(−s)`` instead (their
  ``opposite_quadrants``).
* ``orthogonal_train_test`` (:func:`orthogonal_prompts`): the query at ``i`` is ``x_i`` minus its
  projection on ``span(x_0, …, x_{i−1})``, rescaled to ``‖x_i‖``. Only ``i < d`` is scored: beyond ``d``
  the context spans everything (Garg et al. cap the prompt at ``min(N, d)`` points).
* ``overlapping_train_test`` (:func:`overlapping_prompts`): the query at ``i ≥ 1`` is one of the earlier
  context inputs ``x_j``, ``j < i``, drawn uniformly; position 0 has no earlier input and keeps ``x_0``.

:func:`evaluate_prompt_strategy` draws prompts of a task family, builds the strategy's queries and returns
the same :class:`~hf_icl.evaluation.ContextScalingResult` (metric, bootstrap bands, trivial curve) as
:func:`~hf_icl.evaluation.evaluate_context_scaling`.

Example::

    >>> import torch
    >>> from hf_icl.data.tasks import get_task
    >>> from hf_icl.estimators import get_estimator
    >>> result = evaluate_prompt_strategy(
    ...     {"least_squares": get_estimator("least_squares")},
    ...     get_task("linear_regression", n_dims=3),
    ...     "orthogonal_train_test",
    ...     n_prompts=64,
    ...     n_points=6,
    ... )
    >>> result.n_points  # positions 0, 1, 2 = min(n_points, d)
    3
    >>> bool(torch.allclose(result.curves["least_squares"], result.trivial))  # nothing known about the query
    True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..data.tasks import TaskFamily
from ..validation import check_choice, check_int
from .context_scaling import ContextScalingResult, checked_evaluation, result_from_scores
from .metrics import PositionMetric
from .ood import check_inputs_shiftable
from .predictors import Predictor, score_predictor

#: Where the quadrant strategy puts the query: Garg et al.'s ``random_quadrants`` (the untouched input, in a
#: random orthant; the default) or their ``opposite_quadrants`` (``−s``).
QUERY_ORTHANTS = ("random", "opposite")


def _check_inputs(xs: Any) -> None:
    if not isinstance(xs, torch.Tensor) or not xs.is_floating_point() or xs.ndim != 3 or min(xs.shape) < 1:
        got = f"shape {tuple(xs.shape)}, {xs.dtype}" if isinstance(xs, torch.Tensor) else type(xs).__name__
        raise ValueError(f"xs must be a float tensor of shape (B, N, d) with B, N, d >= 1, got {got}")


def _check_generator(generator: Any) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")


def _draw_device(xs: torch.Tensor, generator: torch.Generator | None) -> torch.device:
    """torch draws on the generator's device; the draws then move to ``xs``'s device."""
    return xs.device if generator is None else generator.device


def random_quadrants_prompts(
    xs: torch.Tensor, generator: torch.Generator | None = None, *, query_orthant: str = "random"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context in one random orthant per prompt; queries left where they were drawn (or in the opposite orthant).

    Each prompt draws signs ``s ∈ {−1, +1}^d`` (uniform, independent); context inputs are ``|x|·s``. The query
    at position ``i`` is the original ``x_i`` (``query_orthant="random"``, what Garg et al.'s code runs under
    the name ``random_quadrants``), or ``|x_i|·(−s)`` (``"opposite"``: their ``opposite_quadrants``).

    >>> xs = torch.tensor([[[1.0, -2.0], [-3.0, 4.0]]])
    >>> context, query = random_quadrants_prompts(xs, torch.Generator().manual_seed(0))
    >>> bool((context.abs() == xs.abs()).all() and (query == xs).all())
    True
    >>> context, query = random_quadrants_prompts(xs, torch.Generator().manual_seed(0), query_orthant="opposite")
    >>> bool((query == -context).all())
    True
    """
    _check_inputs(xs)
    _check_generator(generator)
    check_choice("query_orthant", query_orthant, QUERY_ORTHANTS)
    batch, _, n_dims = xs.shape
    bits = torch.randint(2, (batch, 1, n_dims), generator=generator, device=_draw_device(xs, generator))
    signs = (2 * bits - 1).to(device=xs.device, dtype=xs.dtype)
    context = xs.abs() * signs
    return context, (-context if query_orthant == "opposite" else xs.clone())


def orthogonal_prompts(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries orthogonal to every earlier context input, with the norm of the input they replace.

    With the reduced QR factorisation ``[x_0 … x_{m−1}] = Q R`` (``m = min(N, d)``), the part of ``x_i``
    orthogonal to ``x_0 … x_{i−1}`` is ``R_ii q_i`` (Gram–Schmidt), so the query is ``‖x_i‖·sign(R_ii)·q_i``
    (position 0: ``x_0`` itself). If ``x_i`` lies in the earlier span (``R_ii = 0``), ``q_i`` is still a unit
    vector orthogonal to it, so no query is ever 0/0. Positions ``i >= d`` have no orthogonal direction
    left; their queries are 0 (as in Garg et al.'s code) and evaluations score only ``i < d``.

    >>> xs = torch.tensor([[[2.0, 0.0], [1.0, 1.0], [3.0, 4.0]]], dtype=torch.float64)
    >>> _, query = orthogonal_prompts(xs)
    >>> query[0].abs().round(decimals=4).tolist()  # x_1 = (1, 1) loses its x_0 part, keeps its norm √2
    [[2.0, 0.0], [0.0, 1.4142], [0.0, 0.0]]
    """
    _check_inputs(xs)
    n_positions = min(xs.shape[1], xs.shape[2])
    inputs = xs[:, :n_positions].double()  # float64: queries orthogonal to well below float32 rounding
    q, r = torch.linalg.qr(inputs.transpose(1, 2))  # q: (B, d, m), columns span growing prefixes
    sign = torch.where(r.diagonal(dim1=1, dim2=2) < 0, -1.0, 1.0).to(inputs.dtype)  # (B, m)
    directions = q.transpose(1, 2) * sign.unsqueeze(-1)  # (B, m, d) unit vectors
    query = torch.zeros_like(xs)
    query[:, :n_positions] = (directions * inputs.norm(dim=-1, keepdim=True)).to(xs.dtype)
    query[:, 0] = xs[:, 0]  # nothing to be orthogonal to: exactly x_0, not its QR round trip
    return xs.clone(), query


def overlapping_prompts(
    xs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries that repeat a context input: the query at ``i >= 1`` is ``x_j`` with ``j`` uniform on ``0 … i−1``
    (independently per prompt and position); position 0 keeps ``x_0``.

    >>> xs = torch.arange(6.0).reshape(1, 3, 2)
    >>> _, query = overlapping_prompts(xs, torch.Generator().manual_seed(0))
    >>> query[0, 1].tolist()  # only x_0 comes before position 1
    [0.0, 1.0]
    """
    _check_inputs(xs)
    _check_generator(generator)
    batch, n_points, n_dims = xs.shape
    uniform = torch.rand(batch, n_points, generator=generator, device=_draw_device(xs, generator), dtype=torch.float64)
    earlier = torch.arange(n_points, dtype=torch.float64, device=uniform.device)  # how many inputs precede i
    # floor(u · i) is uniform on 0 … i−1; the clamp guards u·i rounding up to i, and position 0 picks 0
    picks = torch.minimum((uniform * earlier).floor().long(), (earlier.long() - 1).clamp(min=0))
    query = xs.gather(1, picks.to(xs.device).unsqueeze(-1).expand(batch, n_points, n_dims))
    return xs.clone(), query


#: Strategy name (as Garg et al.'s evaluations call it) → prompt builder ``(xs, generator, **options)``.
PROMPT_STRATEGIES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "random_quadrants": random_quadrants_prompts,
    "orthogonal_train_test": lambda xs, generator=None: orthogonal_prompts(xs),  # deterministic
    "overlapping_train_test": overlapping_prompts,
}


def check_strategy(strategy: str) -> str:
    """``strategy`` if it names one of :data:`PROMPT_STRATEGIES`; a ``ValueError`` listing them otherwise."""
    return check_choice("strategy", strategy, list(PROMPT_STRATEGIES))


def scored_positions(strategy: str, n_points: int, n_dims: int) -> int:
    """How many positions a strategy scores: ``min(n_points, d)`` for orthogonal queries, else ``n_points``."""
    check_strategy(strategy)
    return min(n_points, n_dims) if strategy == "orthogonal_train_test" else n_points


def position_prompt(
    context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor, query_ys: torch.Tensor, i: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt that scores position ``i``: context pairs ``0 … i−1``, then the query ``i`` (length ``i + 1``)."""
    xs = torch.cat([context_xs[:, :i], query_xs[:, i : i + 1]], dim=1)
    ys = torch.cat([context_ys[:, :i], query_ys[:, i : i + 1]], dim=1)
    return xs, ys


def score_by_position(
    predictor: Predictor,
    context_xs: torch.Tensor,
    context_ys: torch.Tensor,
    query_xs: torch.Tensor,
    query_ys: torch.Tensor,
    metric: PositionMetric,
    *,
    name: str,
    n_positions: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Scores ``(P, n_positions)`` float64 of one predictor: column ``i`` scores its prediction at the last
    position of :func:`position_prompt` ``i`` (one call per position, on every prompt; models run as in
    :func:`~hf_icl.evaluation.predictors.score_predictor`, under ``no_grad`` on their own device)."""
    n_positions = context_xs.shape[1] if n_positions is None else n_positions
    check_int("n_positions", n_positions, low=1, high=context_xs.shape[1])
    columns = []
    for i in range(n_positions):
        xs, ys = position_prompt(context_xs, context_ys, query_xs, query_ys, i)
        scores = score_predictor(predictor, xs, ys, metric, name=name, batch_size=batch_size, device=device)
        columns.append(scores[:, i])
    return torch.stack(columns, dim=1)


def strategy_prompts(
    family: TaskFamily, strategy: str, n_prompts: int, n_points: int, seed: int, **options: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(context_xs, context_ys, query_xs, query_ys)`` on the CPU, all from one generator seeded ``seed``.

    The inputs are ``family.sample(n_prompts, n_points, seed=seed)``'s; the strategy reshapes them, and every
    label (context and query) is the prompt's own task evaluated at the input it labels.
    """
    check_strategy(strategy)
    check_inputs_shiftable(family)  # labels must follow the inputs we build
    build = PROMPT_STRATEGIES[strategy]
    try:
        inspect.signature(build).bind(None, None, **options)
    except TypeError as err:
        raise ValueError(f"bad strategy_options {options!r} for strategy {strategy!r}: {err}") from None
    generator = torch.Generator().manual_seed(check_int("seed", seed, low=0))
    xs, _, params = family.sample(n_prompts, n_points, generator=generator, return_params=True)
    context_xs, query_xs = build(xs, generator, **options)

    def labels(inputs: torch.Tensor) -> torch.Tensor:
        return family.observe(family.signal(inputs, params), params, generator)

    return context_xs, labels(context_xs), query_xs, labels(query_xs)


def evaluate_prompt_strategy(
    models_and_estimators: Mapping[str, Predictor],
    task: TaskFamily | str | dict[str, Any],
    strategy: str,
    n_prompts: int = 1280,
    seed: int = 0,
    *,
    n_points: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device | None = None,
    n_bootstrap: int = 1000,
    confidence: tuple[float, float] = (0.05, 0.95),
    plot_path: str | Path | None = None,
    title: str | None = None,
    normalizer: float | None = None,
    strategy_options: Mapping[str, Any] | None = None,
) -> ContextScalingResult:
    """Score every predictor position by position on ``n_prompts`` prompts built with ``strategy``.

    The arguments mean what they mean for :func:`~hf_icl.evaluation.evaluate_context_scaling` (same metric,
    bootstrap band and trivial predictor, the latter scored on the query labels); ``strategy`` is one of
    :data:`PROMPT_STRATEGIES` and ``strategy_options`` go to its prompt builder (e.g.
    ``{"query_orthant": "random"}``). The curves have :func:`scored_positions` points.
    """
    check_strategy(strategy)
    predictors, family, metric, n_points, device, confidence = checked_evaluation(
        models_and_estimators, task, n_prompts, n_points, device, confidence, normalizer
    )

    prompts = strategy_prompts(family, strategy, n_prompts, n_points, seed, **dict(strategy_options or {}))
    n_positions = scored_positions(strategy, n_points, family.n_dims)
    scores = {
        name: score_by_position(
            predictor, *prompts, metric, name=name, n_positions=n_positions, batch_size=batch_size, device=device
        )
        for name, predictor in predictors.items()
    }
    trivial = metric.trivial_per_prompt(prompts[3][:, :n_positions])
    result = result_from_scores(
        scores, trivial, metric, task_name=family.name, seed=seed, n_bootstrap=n_bootstrap, confidence=confidence
    )
    if plot_path is not None:
        result.plot(plot_path, title=title or f"{family.name}, {strategy} ({n_prompts} prompts)")
    return result
