"""The linear-attention experiments (``hf-icl reproduce linear-attention EXPERIMENT``): each one trains (or reuses)
the groups it needs, writes its report's sections and figures, and :func:`run` is the paper's entry point."""

from __future__ import annotations

from ..report import Experiment, Paper, RunOptions
from .claims import (
    ablation_section,
    convergence_section,
    isotropic_claims,
    loss_tables,
    parameter_section,
    shift_section,
)
from .document import ABLATION_DEPTH, N_HEAD, PAPER
from .plots import plot_ablation, plot_curves, plot_shift
from .specs import CPU, FULL, RECIPES, Scale, depth_label, group_specs
from .timing import engines
from .training import ExperimentState


def _curves_plot(ctx: ExperimentState, results: dict) -> None:
    path = plot_curves(ctx.report.plot_path("curves"), results)
    ctx.report.add_plot(path, "Figs. 1–2: test (solid, 95 % band over seeds) and train (dashed) loss by depth")


def _shift_plot(ctx: ExperimentState, results: dict) -> None:
    path = plot_shift(ctx.report.plot_path("anisotropic"), results)
    ctx.report.add_plot(path, "Fig. 3: isotropic vs anisotropic test loss by depth")


def table1(ctx: ExperimentState) -> None:
    results = ctx.results()
    isotropic_claims(ctx, results)
    parameter_section(ctx)
    loss_tables(ctx, results)
    _curves_plot(ctx, results)
    ctx.add_runs_note()


def table2(ctx: ExperimentState) -> None:
    results = ctx.results()
    shift_section(ctx, results)
    _shift_plot(ctx, results)
    ctx.add_runs_note()


def table3(ctx: ExperimentState) -> None:
    results = ctx.results()
    convergence_section(ctx, results)
    _curves_plot(ctx, results)
    ctx.add_runs_note()


def all_tables(ctx: ExperimentState) -> None:
    results = ctx.results()
    isotropic_claims(ctx, results)
    parameter_section(ctx)
    loss_tables(ctx, results)
    shift_section(ctx, results)
    convergence_section(ctx, results)
    _curves_plot(ctx, results)
    _shift_plot(ctx, results)
    ctx.add_runs_note()


def ablation(ctx: ExperimentState) -> None:
    results = ctx.ablation()
    ablation_section(ctx, results)
    path = plot_ablation(ctx.report.plot_path("feature_maps"), results)
    ctx.report.add_plot(
        path, f"Feature-map ablation: test loss by map, {depth_label(ABLATION_DEPTH)} (95 % band over seeds)"
    )
    ctx.add_runs_note(list(results.values()))


EXPERIMENTS = {
    "table1": Experiment("test (and train) loss by depth, softmax GPT-2 vs linear attention; parameters", table1),
    "table2": Experiment("the anisotropic input shift x ~ N(0, diag(0.5, 1, 1.5, 1, 1.75)) (Fig. 3)", table2),
    "table3": Experiment("convergence: samples seen to close 90 % of the test-loss gap", table3),
    "all": Experiment("Tables 1–3 and Figs. 1–3 from one set of runs", all_tables),
    "ablation": Experiment(
        "the appendix's feature-map ablation: identity, ReLU, quadratic [1, x_i, x_i x_j (i ≤ j)] and ReLU², "
        f"{depth_label(ABLATION_DEPTH)}",
        ablation,
    ),
    "engines": Experiment("timing: ways to train the seeds on this machine's cores", engines),
}


def describe(scale: Scale, experiment: str = "", options: RunOptions | None = None) -> str:
    """The size line of a report."""
    specs = group_specs(scale, 0, options.steps if options else None)
    by_recipe = {
        key: "/".join(str(s.steps) for s in specs if s.recipe == key) + f" steps × {RECIPES[key].batch_size}"
        for key in RECIPES
    }
    pool = f"a fixed training set of {scale.train_pool:,} prompts" if scale.train_pool else "fresh training prompts"
    return (
        f"{scale.label}: d_model {scale.n_embd}, {N_HEAD} heads, depths 1/3/6; {len(scale.seeds)} seeds "
        f"{scale.seeds}; softmax {by_recipe['softmax']}, linear {by_recipe['linear']} (depths 1/3/6); {pool}; "
        f"{scale.test_prompts:,} prompts per evaluation set; test loss every {specs[0].eval_steps} steps"
    )


def cpu_note(scale: Scale) -> str | None:
    if scale.full:
        return None
    return (
        f"CPU-sized run (width {scale.n_embd}, {len(scale.seeds)} seeds, 1/{scale.step_divisor} of the steps); "
        "--full runs the document's sizes"
    )


PAPER_SPEC = Paper(PAPER, EXPERIMENTS, CPU, FULL, describe, ExperimentState.begin, cpu_note)
