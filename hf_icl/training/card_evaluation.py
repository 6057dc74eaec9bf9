"""What a model card says about the model's scores: the ``eval_results`` of its ``model-index`` (checked rows, from a
context-scaling evaluation) and the bands over evaluation seeds behind them. :mod:`hf_icl.training.model_card` writes
the card (and re-exports every name here).

A band in the card says where a user's own number should land. A bootstrap over the prompts of one draw does
not: it leaves out how far a fresh draw of tasks moves the mean (heavy-tailed squared errors make it worse), so a
user's fresh prompts can fall outside it far more often than its level says. :func:`evaluate_over_seeds` therefore
scores the model on several evaluation seeds (independent draws of tasks and inputs, the same number of prompts
each) and states, at every position, the mean over the seeds and the **prediction interval** for the value of one
more seed (:func:`prediction_interval`)::

    mean ± t_{(1 + level)/2, n - 1} · s · sqrt(1 + 1/n)      (n seeds, s the standard deviation of their values)

With ``level = 0.95`` a fresh seed's value (same number of prompts) falls inside it 19 times in 20 when the
per-seed means are normal (4096 prompts each make them close to it). The model-index of such a card records, for
every result, the band's rule (``band``), the seeds (``seeds``) and the prompts per seed (``n_prompts``);
:func:`~hf_icl.training.model_card.read_card_results` returns them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..validation import check_float, check_int

__all__ = [
    "BAND_KEYS",
    "DEFAULT_EVAL_SEEDS",
    "RESULT_KEYS",
    "SEED_BAND_LEVEL",
    "SeedEvaluation",
    "card_seeds",
    "check_eval_results",
    "eval_results_from_context_scaling",
    "evaluate_over_seeds",
    "metric_bounds",
    "prediction_interval",
    "seed_evaluation_from_curves",
    "t_quantile",
]

#: keys of one evaluation result (what ``eval_results`` takes and :func:`read_card_results` returns); the first
#: three are required. ``lower`` / ``upper``: the band; ``n_prompts``: the prompts behind one evaluation (one seed);
#: ``seeds``: the evaluation seeds the value and band come from; ``band``: the band's rule in words
RESULT_KEYS = ("metric", "value", "n_examples", "lower", "upper", "n_prompts", "seeds", "band")
#: the result keys written into a model-index entry's ``args`` (besides ``n_examples``)
BAND_KEYS = ("lower", "upper", "n_prompts", "seeds", "band")
#: the level of a card's prediction interval over evaluation seeds
SEED_BAND_LEVEL = 0.95
#: how many evaluation seeds a card's band is drawn from by default
DEFAULT_EVAL_SEEDS = 10


def eval_results_from_context_scaling(
    result,
    predictor: str,
    positions: Sequence[int] | None = None,
    *,
    seeds: Sequence[int] | None = None,
    band: str | None = None,
) -> list[dict[str, Any]]:
    """``eval_results`` for :func:`write_model_card` from a context-scaling evaluation: ``predictor``'s mean
    score and band at a few numbers of in-context examples (default: about 1, N/4, N/2 and the last).

    ``result`` is a :class:`~hf_icl.evaluation.ContextScalingResult`; each row also records its prompt count
    (``n_prompts``), the evaluation ``seeds`` when given, and ``band``, the band's rule (default: the result's
    bootstrap quantiles over the prompts of one draw, e.g. ``"5-95 % bootstrap band over the prompts of one
    draw"``). :meth:`SeedEvaluation.eval_results` passes its seeds and its prediction-interval rule.
    """
    if predictor not in result.values:
        raise ValueError(f"predictor must be one of the evaluated curves {list(result.values)}, got {predictor!r}")
    if band is None:
        low, high = (100 * q for q in result.confidence)
        band = f"{low:g}-{high:g} % bootstrap band over the prompts of one draw"
    last = result.n_points - 1
    if positions is None:  # position 0 has no examples: every predictor predicts the prior there
        positions = sorted({1, last // 4, last // 2, last} - {0}) if last else [0]
    rows = []
    for position in positions:
        check_int("positions", position, low=0, high=last)
        rows.append(
            {
                "metric": result.metric.name,
                "value": float(result.values[predictor][position]),
                "n_examples": position,
                "lower": float(result.lower[predictor][position]),
                "upper": float(result.upper[predictor][position]),
                "n_prompts": int(result.n_prompts),
                "seeds": None if seeds is None else [int(seed) for seed in seeds],
                "band": band,
            }
        )
    return check_eval_results(rows)


# -- bands over evaluation seeds ---------------------------------------------------------------------------------
def card_seeds(first_seed: int, n_seeds: int = DEFAULT_EVAL_SEEDS) -> list[int]:
    """The evaluation seeds of a card: ``first_seed, first_seed + 1, ..., first_seed + n_seeds - 1``.

    Each seed draws its own tasks and inputs (``TaskFamily.sample(..., seed=seed)``), so the draws are independent.

    >>> card_seeds(7919, 3)
    [7919, 7920, 7921]
    """
    check_int("first_seed", first_seed, low=0)
    check_int("n_seeds", n_seeds, low=2)
    return list(range(first_seed, first_seed + n_seeds))


def t_quantile(level: float, n_values: int) -> float:
    """``t_{(1 + level)/2, n_values - 1}``: the Student-t quantile of a two-sided ``level`` interval from
    ``n_values`` values (scipy's ``t.ppf``)."""
    from scipy.stats import t  # scipy comes with scikit-learn

    return float(t.ppf((1.0 + _check_level(level)) / 2.0, check_int("n_values", n_values, low=2) - 1))


def prediction_interval(
    values: Sequence[float], level: float = SEED_BAND_LEVEL, bounds: tuple[float, float] | None = None
) -> tuple[float, float, float]:
    """``(mean, lower, upper)`` of ``n >= 2`` independent values: their mean, and the interval that one more
    independent value of the same kind falls into with probability ``level``::

        mean ± t_{(1 + level)/2, n - 1} · s · sqrt(1 + 1/n)

    where ``s`` is the values' standard deviation (``n - 1`` in its denominator). This is the textbook prediction
    interval of a normal sample: exact when the values are independent and normal, whatever the unknown mean and
    variance. It is wider than the mean's confidence interval (``± t · s / sqrt(n)``) because a new value carries
    its own scatter as well as the mean's uncertainty. ``bounds`` clips the interval to a metric's range
    (``(0, inf)`` for squared errors, ``(0, 1)`` for accuracy).

    >>> mean, lower, upper = prediction_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> mean, round(lower, 3), round(upper, 3)
    (3.0, -1.809, 7.809)
    >>> prediction_interval([1.0, 2.0, 3.0, 4.0, 5.0], bounds=(0.0, 6.0))[1:]
    (0.0, 6.0)
    """
    import torch

    tensor = torch.as_tensor([float(check_float("values", v)) for v in values], dtype=torch.float64)
    mean, lower, upper = _prediction_band(tensor[:, None], level, bounds)
    return float(mean[0]), float(lower[0]), float(upper[0])


def metric_bounds(metric) -> tuple[float, float]:
    """The range a metric's value can take: ``(0, inf)`` for squared errors, ``(0, 1)`` for accuracy."""
    return (0.0, math.inf) if metric.target_kind == "regression" else (0.0, 1.0)


@dataclass
class SeedEvaluation:
    """A context-scaling evaluation repeated on several evaluation seeds, summarised for a model card.

    Attributes:
        result: a :class:`~hf_icl.evaluation.ContextScalingResult` whose ``values`` are the mean over the seeds
            (of each seed's mean over its prompts) and whose ``lower`` / ``upper`` are the prediction interval
            for one more seed's value (:func:`prediction_interval`, clipped to the metric's range), per predictor
            and position; ``confidence`` is ``((1 - level)/2, (1 + level)/2)`` and ``n_prompts`` the prompts of
            one seed.
        seeds: the evaluation seeds, one draw of ``n_prompts`` prompts (fresh tasks) each.
        per_seed: ``{predictor: (n_seeds, N) float64}``, each seed's mean score at every position.
        level: the prediction interval's level (0.95: a fresh seed lands inside 19 times in 20).
    """

    result: Any
    seeds: list[int]
    per_seed: dict[str, Any]
    level: float = SEED_BAND_LEVEL

    @property
    def n_prompts(self) -> int:
        """Prompts behind one seed's evaluation (the size a user's own evaluation must have for the band)."""
        return self.result.n_prompts

    @property
    def band(self) -> str:
        """The band's rule in one line (the model-index's ``band``)."""
        n = len(self.seeds)
        return (
            f"{100 * self.level:g} % prediction interval for one more evaluation seed of {self.n_prompts} prompts: "
            f"mean over {n} seeds ± t({(1 + self.level) / 2:g}, {n - 1}) · s · sqrt(1 + 1/{n}), s the standard "
            "deviation over the seeds"
        )

    def describe(self) -> str:
        """A markdown paragraph for the card: what the numbers and the band are, and which seeds were used."""
        n = len(self.seeds)
        t = t_quantile(self.level, n)
        return (
            f"Every number below is the **mean over {n} evaluation seeds** ({_seed_list(self.seeds)}), each a "
            f"fresh draw of {self.n_prompts} prompts with their own tasks; its band is the "
            f"**{100 * self.level:g} % prediction interval for one more seed**, mean ± t · s · √(1 + 1/{n}) with "
            f"t = t({(1 + self.level) / 2:g}, {n - 1}) = {t:.3f} and s the standard deviation of the "
            f"{n} per-seed values (clipped to the metric's range). Scoring the model on {self.n_prompts} fresh "
            f"prompts of your own (any other seed) should land inside the band {self._odds()}. A bootstrap over "
            "the prompts of one draw would be narrower and would understate this: it leaves out how far a fresh "
            "draw of tasks moves the mean."
        )

    def _odds(self) -> str:
        return "19 times in 20" if math.isclose(self.level, 0.95) else f"with probability {self.level:g}"

    def eval_results(self, predictor: str, positions: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """``eval_results`` for :func:`write_model_card`: ``predictor``'s mean over the seeds and its prediction
        interval at a few positions (those of :func:`eval_results_from_context_scaling`), each recording
        ``n_prompts``, ``seeds`` and the band's rule."""
        return eval_results_from_context_scaling(self.result, predictor, positions, seeds=self.seeds, band=self.band)

    def entry(self, **extra: Any) -> dict[str, Any]:
        """The ``metrics.json`` evaluation entry (:func:`~hf_icl.evaluation.runs.evaluation_entry`): the curves
        (mean over seeds, prediction band), ``seed`` (the first seed), ``seeds``, ``level``, ``band`` and
        ``seed_curves``, each seed's curve per predictor (enough to recompute the band by any other rule)."""
        from ..evaluation.runs import evaluation_entry

        curves = {name: values.tolist() for name, values in self.per_seed.items()}
        return evaluation_entry(
            self.result,
            seed=self.seeds[0],
            seeds=list(self.seeds),
            level=self.level,
            band=self.band,
            **extra,
            seed_curves=curves,
        )

    def plot(self, path: str | Path, *, title: str | None = None) -> Path:
        """The curves with their prediction bands shaded (the trivial predictor dashed), written to a PNG."""
        import torch

        from ..evaluation.plotting import BASELINE_STYLES, draw_band_curve, new_axes, save_figure

        result = self.result
        fig, ax = new_axes(title or f"{result.task_name} ({len(self.seeds)} seeds × {self.n_prompts} prompts)")
        x = torch.arange(result.n_points)
        for name in result.predictors:
            style = {"linestyle": BASELINE_STYLES[0], "color": "0.4"} if name == "trivial" else {"marker": "."}
            draw_band_curve(ax, x, result.values[name], result.lower[name], result.upper[name], label=name, **style)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("number of in-context examples")
        ax.set_ylabel(result.metric.axis_label)
        if result.metric.target_kind == "regression":
            ax.set_yscale("log")
        from matplotlib.patches import Patch

        handles, labels = ax.get_legend_handles_labels()
        handles.append(Patch(facecolor="0.5", alpha=0.2, linewidth=0))
        labels.append(f"{100 * self.level:g} % prediction band for one more seed")
        ax.legend(handles, labels)
        return save_figure(fig, path)


def seed_evaluation_from_curves(
    per_seed: dict[str, Any],
    metric,
    seeds: Sequence[int],
    n_prompts: int,
    *,
    task_name: str = "",
    level: float = SEED_BAND_LEVEL,
) -> SeedEvaluation:
    """A :class:`SeedEvaluation` from each seed's curves ``{predictor: (n_seeds, N)}`` (``"trivial"`` among
    them): mean over seeds and :func:`prediction_interval` at every position, clipped to ``metric``'s range."""
    import torch

    from ..evaluation import ContextScalingResult

    seeds = _check_seeds("seeds", seeds, 2)
    level = _check_level(level)
    check_int("n_prompts", n_prompts, low=1)
    if "trivial" not in per_seed:
        raise ValueError(f"per_seed must hold the 'trivial' curve besides the predictors, got {sorted(per_seed)}")
    curves = {name: torch.as_tensor(c, dtype=torch.float64) for name, c in per_seed.items()}
    shapes = {tuple(c.shape) for c in curves.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != len(seeds):
        raise ValueError(f"per_seed curves must all be (n_seeds={len(seeds)}, N), got shapes {sorted(shapes)}")
    bands = {name: _prediction_band(c, level, metric_bounds(metric)) for name, c in curves.items()}
    result = ContextScalingResult(
        metric=metric,
        values={name: band[0] for name, band in bands.items()},
        lower={name: band[1] for name, band in bands.items()},
        upper={name: band[2] for name, band in bands.items()},
        n_prompts=n_prompts,
        task_name=task_name,
        confidence=((1 - level) / 2, (1 + level) / 2),
    )
    return SeedEvaluation(result=result, seeds=seeds, per_seed=curves, level=level)


def evaluate_over_seeds(
    models_and_estimators: dict[str, Any],
    task,
    seeds: Sequence[int],
    n_prompts: int,
    *,
    n_points: int | None = None,
    batch_size: int | None = None,
    device=None,
    level: float = SEED_BAND_LEVEL,
) -> SeedEvaluation:
    """Score every predictor on ``n_prompts`` fresh prompts of ``task`` for each of ``seeds`` (at least two;
    one :func:`~hf_icl.evaluation.evaluate_context_scaling` per seed, the predictors sharing each seed's prompts)
    and summarise the seeds: mean over seeds and the ``level`` prediction interval for one more seed's value.

    Each seed is an independent draw of tasks and inputs of the same size, so the spread over seeds is the spread
    a user's own evaluation of ``n_prompts`` prompts will show, task draw included; see the module docstring for
    the rule. The per-seed bootstrap is skipped (its bands are not used).

    Example::

        >>> from hf_icl.data.tasks import get_task
        >>> from hf_icl.estimators import get_estimator
        >>> seeds = evaluate_over_seeds({"averaging": get_estimator("averaging")},
        ...                             get_task("linear_regression", n_dims=2), seeds=[0, 1, 2], n_prompts=32,
        ...                             n_points=4)
        >>> seeds.seeds, seeds.n_prompts, tuple(seeds.per_seed["averaging"].shape)
        ([0, 1, 2], 32, (3, 4))
    """
    import torch

    from ..evaluation import evaluate_context_scaling

    seeds = _check_seeds("seeds", seeds, 2)
    per_seed: dict[str, list] = {}
    for seed in seeds:
        result = evaluate_context_scaling(
            models_and_estimators,
            task,
            n_prompts=n_prompts,
            seed=seed,
            n_points=n_points,
            batch_size=batch_size,
            device=device,
            n_bootstrap=1,
        )
        for name, values in result.values.items():
            per_seed.setdefault(name, []).append(values)
    curves = {name: torch.stack(values) for name, values in per_seed.items()}
    return seed_evaluation_from_curves(curves, result.metric, seeds, n_prompts, task_name=result.task_name, level=level)


def check_eval_results(eval_results: Any) -> list[dict[str, Any]]:
    """Check ``eval_results`` (a list of dicts with :data:`RESULT_KEYS`) and return them with plain numbers."""
    if not isinstance(eval_results, (list, tuple)):
        raise ValueError(f"eval_results must be a list of dicts, got {type(eval_results).__name__}")
    checked = []
    for i, item in enumerate(eval_results):
        where = f"eval_results[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a dict with keys {list(RESULT_KEYS)}, got {item!r}")
        missing = [key for key in RESULT_KEYS[:3] if key not in item]
        unknown = sorted(set(item) - set(RESULT_KEYS))
        if missing or unknown:
            problem = f"lacks {missing}" if missing else f"has unknown keys {unknown}"
            raise ValueError(
                f"{where} {problem}; its keys must be {list(RESULT_KEYS)} (all but the first three optional)"
            )
        if not isinstance(item["metric"], str) or not item["metric"]:
            raise ValueError(
                f"{where}['metric'] must be a metric name such as 'squared_error/d', got {item['metric']!r}"
            )
        row = {
            "metric": item["metric"],
            "value": check_float(f"{where}['value']", item["value"]),
            "n_examples": check_int(f"{where}['n_examples']", item["n_examples"], low=0),
        }
        for key in ("lower", "upper"):
            value = item.get(key)
            row[key] = None if value is None else check_float(f"{where}[{key!r}]", value)
        if row["lower"] is not None and row["upper"] is not None and row["lower"] > row["upper"]:
            raise ValueError(
                f"{where} has lower {row['lower']} above upper {row['upper']}; a band needs lower <= upper"
            )
        n_prompts = item.get("n_prompts")
        row["n_prompts"] = None if n_prompts is None else check_int(f"{where}['n_prompts']", n_prompts, low=1)
        row["seeds"] = None if item.get("seeds") is None else _check_seeds(f"{where}['seeds']", item["seeds"], 1)
        band = item.get("band")
        if band is not None and not (isinstance(band, str) and band.strip()):
            raise ValueError(f"{where}['band'] must be a non-empty string saying how the band was made, got {band!r}")
        row["band"] = band
        checked.append(row)
    return checked


def _check_level(level: Any) -> float:
    level = check_float("level", level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {level}")
    return level


def _check_seeds(name: str, seeds: Any, at_least: int) -> list[int]:
    """Distinct non-negative integer seeds, at least ``at_least`` of them, as a list."""
    if not isinstance(seeds, (list, tuple)) or len(seeds) < at_least:
        raise ValueError(f"{name} must be a list of at least {at_least} evaluation seeds, got {seeds!r}")
    checked = [check_int(f"{name}[{i}]", seed, low=0) for i, seed in enumerate(seeds)]
    if len(set(checked)) != len(checked):
        raise ValueError(f"{name} must be distinct (each seed one independent draw), got {checked}")
    return checked


def _prediction_band(values, level: float, bounds: tuple[float, float] | None = None):
    """Mean, lower and upper along dim 0 of ``values`` ``(n, ...)``: see :func:`prediction_interval`."""
    import torch

    n = values.shape[0]
    if n < 2:
        raise ValueError(f"a prediction interval needs at least 2 values (seeds), got {n}")
    mean = values.mean(dim=0)
    half = t_quantile(level, n) * values.std(dim=0, correction=1) * math.sqrt(1.0 + 1.0 / n)
    lower, upper = mean - half, mean + half
    if bounds is not None:
        lower, upper = lower.clamp(min=bounds[0], max=bounds[1]), upper.clamp(min=bounds[0], max=bounds[1])
    return mean, torch.minimum(lower, mean), torch.maximum(upper, mean)


def _seed_list(seeds: Sequence[int]) -> str:
    """``7919–7928`` for consecutive seeds, else the seeds joined by commas."""
    consecutive = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"seeds {seeds[0]}–{seeds[-1]}" if consecutive and len(seeds) > 2 else "seeds " + ", ".join(map(str, seeds))
