"""The gd-icl experiments (:data:`EXPERIMENTS`) and :func:`run`, what ``hf-icl reproduce gd-icl`` calls."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from ..report import Experiment, Paper, Report, RunOptions
from .document import PAPER
from .features import features
from .specs import CPU, FULL, ExperimentState, Scale
from .stories import TITLE as stories_title
from .stories import stories
from .synthetic import synthetic


def _stories(ctx: ExperimentState) -> None:
    """The document's language generation (:mod:`.stories`, with sizes of its own)."""
    stories(ctx.report, ctx.runs_dir, full=ctx.full, retrain=ctx.retrain, steps=ctx.steps, seed=ctx.seed)


EXPERIMENTS = {
    "synthetic": Experiment(
        "synthetic C = 25, N = 10: GD vs trained from scratch against the number of training tasks L", synthetic
    ),
    "features": Experiment("digits features, held-out classes: GD with 1-3 blocks vs linear probing", features),
    "stories": Experiment(stories_title, _stories),
}


def shifted(scale: Scale, seed: int) -> Scale:
    """``scale`` with every seed shifted by ``seed``."""
    return replace(scale, seeds=tuple(s + seed for s in scale.seeds)) if seed else scale


def describe(scale: Scale, experiment: str, options: RunOptions) -> str:
    steps = options.steps
    return shifted(scale, options.seed).describe(experiment) + (f"; every model trained {steps} steps" if steps else "")


def start(scale: Scale, output_dir: Path, runs_dir: Path, report: Report, options: RunOptions) -> ExperimentState:
    scale = shifted(scale, options.seed)
    report.numbers["scale"] = asdict(scale)
    return ExperimentState.begin(scale, output_dir, runs_dir, report, options)


PAPER_SPEC = Paper(PAPER, EXPERIMENTS, CPU, FULL, describe, start)
