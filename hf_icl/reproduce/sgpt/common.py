"""What the SGPT reproductions (seed ``001``) share: the run sizes, an experiment's state (where it writes, how it
trains and evaluates), and the helpers that turn evaluation curves into tables and into the
:class:`~hf_icl.reproduce.report.Subject` s a claim is judged on (:mod:`~hf_icl.reproduce.sgpt.figures` has the
figures, :mod:`~hf_icl.reproduce.sgpt.hilbert` the consistency of the Hilbert estimate,
:mod:`~hf_icl.reproduce.sgpt.lengths` the prompts longer than the trained ones).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...data.tasks import make_task
from ...evaluation import evaluate_context_scaling
from ...evaluation.context_scaling import TRIVIAL
from ...evaluation.tables import markdown_grid
from ..plots import plot_sweep
from ..report import Report, RunOptions, Subject, model_fields, train_or_reuse

PAPER = "sgpt"


@dataclass(frozen=True)
class Scale:
    """The size of a reproduction: training budget and model shapes.

    ``hilbert_prompts`` and ``hilbert_max_log2`` size the consistency measurement of the Hilbert estimate
    (prompts per setting, and the longest context ``2**hilbert_max_log2``); it trains nothing.
    """

    label: str
    steps: int
    batch_size: int
    eval_prompts: int
    n_embd: int
    n_layer: int
    n_head: int
    mlp_width: int
    learning_rate: float
    full: bool
    hilbert_prompts: int = 2000
    hilbert_max_log2: int = 16

    def dims(self, cpu: int, full: int) -> int:
        return full if self.full else cpu


CPU = Scale("CPU default", 1500, 64, 512, 64, 3, 2, 256, 1e-3, full=False)
FULL = Scale(
    "full (the document's sizes)",
    50_000,
    64,
    1280,
    256,
    8,
    8,
    1024,
    1e-4,
    full=True,
    hilbert_prompts=10_000,
    hilbert_max_log2=18,
)


@dataclass
class ExperimentState(RunOptions):
    """Where an experiment writes, at which scale, its report and the run options (``steps`` overrides the scale's
    steps, ``mlp_steps`` those of the MLP runs only: they learn slowly and cost little). SGPT's runs live in each
    figure's own folder, so it has no ``runs_dir``."""

    scale: Scale
    output_dir: Path
    report: Report

    def train(
        self,
        name: str,
        model_type: str,
        fields: dict,
        task: str,
        task_params: dict,
        *,
        n_dims: int,
        n_points: int,
        n_tasks: int | None = None,
        train_points: int | None = None,
    ) -> torch.nn.Module:
        """Train (or reuse) one run. The model holds prompts of up to ``n_points`` examples; ``train_points``
        (default ``n_points``) is the prompt length it trains on: a fixed curriculum (start ``train_points``,
        increment 0), so a model built for ``n_points`` never sees a prompt longer than ``train_points``."""
        scale = self.scale
        steps = self.steps or scale.steps
        if model_type == "mlp_icl" and self.mlp_steps:
            steps = self.mlp_steps
        curriculum = {}
        if train_points is not None and train_points != n_points:
            if not 1 <= train_points < n_points:
                raise ValueError(f"train_points must be in [1, n_points={n_points}), got {train_points!r}")
            curriculum = {"curriculum_points_start": train_points, "curriculum_points_inc": 0}
        return train_or_reuse(
            self.output_dir / "runs" / name,
            retrain=self.retrain,
            task=task,
            task_params=json.dumps(task_params, sort_keys=True),
            n_dims=n_dims,
            n_points=n_points,
            n_tasks=n_tasks,
            model_type=model_type,
            model_size=None,
            model_overrides=model_fields(**fields),
            max_steps=steps,
            per_device_train_batch_size=scale.batch_size,
            learning_rate=scale.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=min(500, steps // 10),
            seed=self.seed,
            eval_prompts=min(256, scale.eval_prompts),
            **curriculum,
        )

    def evaluate(
        self,
        predictors: dict,
        task: str,
        task_params: dict,
        *,
        n_dims: int,
        n_points: int,
        plot: str | None = None,
        title: str = "",
        normalize_by_trivial: bool = False,
    ):
        family = make_task({"name": task, "n_dims": n_dims, **task_params})
        normalizer = trivial_error(family) if normalize_by_trivial else None
        result = evaluate_context_scaling(
            predictors,
            family,
            n_prompts=self.scale.eval_prompts,
            seed=self.seed + 1,
            n_points=n_points,
            normalizer=normalizer,
            n_bootstrap=200,
        )
        if plot:
            path = self.report.plot_path(plot)
            result.plot(path, title=title)
            self.report.add_plot(path, title)
        return result

    def sweep(
        self, name: str, x: Sequence, curves: dict, *, caption: str, corner: str, table_rows=None, **plot
    ) -> None:
        """Plot ``curves`` over ``x`` (:func:`plot_sweep` keywords), add the plot with ``caption`` and the table
        (``table_rows``, default the curves) to the report."""
        self.report.add_plot(plot_sweep(self.report.plot_path(name), x, curves, **plot), caption)
        self.report.add(table(table_rows or curves, x, corner))

    # -- the models the document compares --------------------------------------------------------
    def gpt2(self, **extra) -> tuple[str, dict]:
        """GPT-2 reading the document's concatenated ``[x, y]`` rows (read-in/out initialised like GPT-2)."""
        s = self.scale
        fields = dict(n_embd=s.n_embd, n_layer=s.n_layer, n_head=s.n_head, prompt_format="concatenated", io_init="gpt2")
        return "gpt2_icl", {**fields, **extra}

    def sgpt(self, **extra) -> tuple[str, dict]:
        return "sgpt", {"n_embd": self.scale.n_embd, "n_layer": self.scale.n_layer, **extra}

    def mlp(self, mlp_input: str, feature_map: str = "hilbert", **extra) -> tuple[str, dict]:
        fields = {"hidden_size": self.scale.mlp_width, "mlp_input": mlp_input}
        if mlp_input != "vectorized":
            fields["feature_map"] = feature_map
        return "mlp_icl", {**fields, **extra}


def trivial_error(family, n: int = 20_000) -> float:
    """E[y²] of a family: the error of the zero predictor, the document's normaliser in Fig. 4."""
    _, ys = family.sample(n // 10, 10, seed=12345)
    return float(ys.float().square().mean())


def at(result, name: str, positions: Sequence[int]) -> list[float]:
    return [float(result.values[name][i]) for i in positions]


def table(rows: dict[str, list[float]], columns: Sequence, corner: str) -> str:
    """One line per curve, one column per swept value."""
    index = {str(column): i for i, column in enumerate(columns)}
    return markdown_grid(corner, list(index), rows, lambda name, column: f"{rows[name][index[column]]:.4g}")


def fmt(values: Sequence[float]) -> str:
    return " → ".join(f"{v:.3g}" for v in values)


def subject(result, name: str, positions: Sequence[int], *, kind: str = "model", label: str | None = None) -> Subject:
    """The :class:`Subject` for curve ``name`` of an evaluation ``result``, read at ``positions``: its error where it
    did best against the trivial predictor (the lowest ratio of the two on the same prompts), beside the trivial
    predictor's error there.

    A model is judged by the best it did on the curve a claim reads (it learned something if it beat 0.9 × the
    trivial error anywhere on it); a baseline by the same rule against the trivial error itself.
    """
    return best_of(label or name, [(result.values[name][i], result.values[TRIVIAL][i]) for i in positions], kind=kind)


def in_context_subject(result, name: str, positions: Sequence[int]) -> Subject:
    """:func:`subject` for a claim about learning *in context*: the trivial error at each position is the smaller of
    the zero predictor's and the model's own with no examples (position 0), so a model that only learned the labels'
    marginal (below the zero predictor, flat in N) counts as having learned nothing in context."""
    context_free = float(result.values[name][0])
    pairs = [(result.values[name][i], min(float(result.values[TRIVIAL][i]), context_free)) for i in positions]
    return best_of(f"{name} (in context)", pairs)


def best_of(name: str, pairs, *, kind: str = "model") -> Subject:
    """A :class:`Subject` from ``(error, trivial error)`` pairs (several runs of one model, several lengths): the
    pair with the lowest ratio error / trivial (NaN errors last)."""
    pairs = [(float(error), float(trivial)) for error, trivial in pairs]
    if not pairs:
        raise ValueError(f"{name}: no (error, trivial) pair to judge it on")

    def ratio(pair: tuple[float, float]) -> tuple[bool, float]:
        error, trivial = pair
        return (not error == error, error / trivial if trivial > 0 else float("inf"))

    error, trivial = min(pairs, key=ratio)
    return Subject(name, error, trivial, kind)
