"""The SGPT study's experiments (seed ``001``): the figures, the Hilbert estimate's consistency and the prompts longer
than the trained ones, by name, and :func:`run`, which runs one of them at a scale and writes its report."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ..report import Experiment, Paper, Report, RunOptions
from . import hilbert, lengths
from .common import CPU, FULL, PAPER, ExperimentState, Scale
from .figures import fig1, fig2, fig3, fig4, fig5, fig6, fig7

EXPERIMENTS = {
    "fig1": Experiment("GPT-2 vs the vectorised MLP: task-scaling and context-scaling", fig1),
    "fig2": Experiment("linear regression σ=0.5: SGPT vs GPT-2 vs optimally tuned ridge", fig2),
    "fig3": Experiment("linear regression with noise levels {0.1, 0.5}: algorithm selection", fig3),
    "fig4": Experiment("sparse linear, 2-layer ReLU NN, decision tree: SGPT vs GPT-2 vs baselines", fig4),
    "fig5": Experiment("one-layer SGPT context-scales (d=8, N=10..50)", fig5),
    "fig6": Experiment("MLP on ψ_K(A)_N,: vs a linear fit on the scalar ψ_K(A)_N,d+1", fig6),
    "fig7": Experiment("MLP inputs: vectorised, ψ features, both — task- and context-scaling", fig7),
    "hilbert": Experiment(
        "the Hilbert estimate ψ_H(A)_N,d+1 is consistent: its error against E[y|x] as the context grows",
        hilbert.hilbert,
    ),
    "lengths": Experiment("GPT-2 vs SGPT on prompts longer than the ones they were trained on", lengths.lengths),
}


def describe(scale: Scale, experiment: str, options: RunOptions) -> str:
    """The run's size as the report states it."""
    if experiment == "hilbert":  # a measurement of an estimator: nothing is trained
        return (
            f"{scale.label}: no training; {scale.hilbert_prompts} prompts per setting, contexts N = 4 … "
            f"2^{scale.hilbert_max_log2}"
        )
    return (
        f"{scale.label}: transformers n_embd={scale.n_embd}, n_layer={scale.n_layer}; MLP width {scale.mlp_width}; "
        f"{options.steps or scale.steps} steps × {scale.batch_size} prompts"
        + (f" ({options.mlp_steps} for the MLPs)" if options.mlp_steps else "")
        + f"; {scale.eval_prompts} evaluation prompts"
    )


def start(scale: Scale, output_dir: Path, runs_dir: Path, report: Report, options: RunOptions) -> ExperimentState:
    """The state every figure runs on (SGPT's runs live in each figure's own folder: ``runs_dir`` is unused)."""
    return ExperimentState(scale, output_dir, report, **asdict(options))


def cpu_note(scale: Scale) -> str | None:
    if scale.full:
        return None
    return "CPU-sized run (smaller d, widths, steps and pools than the document); --full runs the document's sizes"


PAPER_SPEC = Paper(PAPER, EXPERIMENTS, CPU, FULL, describe, start, cpu_note, trains_mlps=True)
