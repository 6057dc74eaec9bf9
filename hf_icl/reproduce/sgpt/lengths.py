"""GPT-2 vs SGPT on prompts longer than they were trained on (seed ``001``, Appendix A, item 4).

The document, on its 2-layer ReLU-network task: "We observed that unlike our model, GPT-2 does not generalize well
for context lengths that it has not been trained on." Here both models are trained on prompts of ``L`` points only
and evaluated on prompts of ``2L``.

GPT-2 cannot run past its position table (``n_positions = 2 · n_points`` tokens). So both models are *built* for
``2L`` points and *trained* on ``L``: a fixed curriculum (start ``L``, increment 0; :meth:`ExperimentState.train`'s
``train_points``) keeps every training prompt at ``L`` points. GPT-2's position embeddings for tokens ``2L … 4L − 1``
therefore exist but never receive a gradient: they stay at their N(0, 0.02) initialisation, which is what a
longer prompt meets. SGPT has no position embeddings (its ``n_points`` is only the longest prompt it accepts).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...estimators import get_estimator
from ...evaluation.plotting import draw_band_curve, new_axes, save_figure
from .common import at, subject, table

if TYPE_CHECKING:
    from .common import ExperimentState

#: task -> (parameters, (d on the CPU, d at full size), reference estimators)
LENGTH_TASKS = {
    "relu_2nn_regression": ({"hidden_size": 100}, (8, 20), ("knn",)),  # the document's task for this remark
    "linear_regression": ({"weight_prior": "scaled"}, (5, 20), ("least_squares",)),
}
#: the last trained lengths a model's error beyond L is compared with
WINDOW = 5
#: GPT-2 "does not generalise" when its mean error beyond L exceeds this multiple of its error at the last lengths
#: it trained on; SGPT "generalises" when its ratio stays at or below ``HOLDS_UP``
DEGRADES, HOLDS_UP = 1.25, 1.1


def lengths(ctx: ExperimentState) -> None:
    s = ctx.scale
    trained = s.dims(20, 50)
    longest = 2 * trained
    ctx.report.add(
        f"Both models are built for prompts of {longest} points and trained on prompts of {trained} only (a fixed "
        f"curriculum); GPT-2's position embeddings past token {2 * trained - 1} are never trained. Errors are "
        f"squared error / E[y²] (the zero predictor scores 1); N is the number of examples before the query, so "
        f"N = 0 … {trained - 1} were trained and N = {trained} … {longest - 1} were not."
    )
    for task, (params, (cpu_dims, full_dims), references) in LENGTH_TASKS.items():
        d = s.dims(cpu_dims, full_dims)
        models = {
            label: ctx.train(
                f"lengths_{task}_{model_type}",
                model_type,
                fields,
                task,
                params,
                n_dims=d,
                n_points=longest,
                train_points=trained,
            )
            for label, (model_type, fields) in {"SGPT": ctx.sgpt(), "GPT-2": ctx.gpt2()}.items()
        }
        result = ctx.evaluate(
            {**models, **{name: get_estimator(name) for name in references}},
            task,
            params,
            n_dims=d,
            n_points=longest,
            normalize_by_trivial=True,
        )
        path = plot_beyond(ctx.report.plot_path(task), result, list(models), references, trained, f"{task} (d={d})")
        ctx.report.add_plot(path, f"{task} (d={d}): trained on N < {trained}, evaluated to N = {longest - 1}")
        shown = sorted({1, *range(5, longest, 5), trained - 1, longest - 1})
        rows = {name: at(result, name, shown) for name in (*models, *references)}
        ctx.report.add(f"{task}: squared error / E[y²]\n\n" + table(rows, shown, "N →"))
        ratios = {}
        for label in models:
            window = sum(at(result, label, range(trained - WINDOW, trained))) / WINDOW
            beyond_curve = at(result, label, range(trained, longest))
            beyond = sum(beyond_curve) / len(beyond_curve)
            worst = max(range(len(beyond_curve)), key=beyond_curve.__getitem__)
            ratios[label] = beyond / window
            ctx.report.numbers[f"{task}: {label}"] = {
                "trained_window": window,
                "beyond": beyond,
                "ratio": ratios[label],
                "curve": at(result, label, range(longest)),
            }
            ctx.report.numbers[f"{task}: {label}"]["summary"] = (
                f"{label}: {window:.3g} at N = {trained - WINDOW}…{trained - 1} (trained) → {beyond:.3g} at N = "
                f"{trained}…{longest - 1} ({ratios[label]:.2f}×; worst {beyond_curve[worst]:.3g} at N = "
                f"{trained + worst})"
            )
        trained_positions = range(1, trained)
        ctx.report.claim(
            f"GPT-2 does not generalise beyond its trained length on {task}",
            "App. A (4): GPT-2 does not generalize well to context lengths it was not trained on",
            ctx.report.numbers[f"{task}: GPT-2"]["summary"],
            ratios["GPT-2"] > DEGRADES,
            [subject(result, "GPT-2", trained_positions)],
        )
        ctx.report.claim(
            f"SGPT generalises beyond its trained length on {task}",
            'App. A (4): "unlike our model": SGPT does',
            ctx.report.numbers[f"{task}: SGPT"]["summary"],
            ratios["SGPT"] <= HOLDS_UP,
            [subject(result, "SGPT", trained_positions)],
        )
    ctx.report.add(
        f"Criteria: a model does not generalise when its mean error over the untrained lengths is above {DEGRADES}× "
        f"its mean over the last {WINDOW} trained lengths; it generalises when that ratio is at most {HOLDS_UP}."
    )


def plot_beyond(path: Path, result, models, references, trained: int, title: str) -> Path:
    """The models' curves over all positions with their bands, the reference estimators and the zero predictor
    dashed, a vertical line after the longest trained prompt. The y axis stops a decade below the models' lowest
    error (least squares' exact fits at ~1e-15 would flatten every other curve)."""
    fig, ax = new_axes(f"{title}: beyond the trained length")
    x = list(range(result.n_points))
    positions = torch.tensor(x)
    for name in models:
        draw_band_curve(
            ax, positions, result.values[name], result.lower[name], result.upper[name], label=name, marker="."
        )
    for name in references:
        ax.plot(x, result.values[name].tolist(), linestyle=":", label=name)
    ax.plot(x, result.values["trivial"].tolist(), linestyle="--", color="0.4", label="trivial (zero)")
    ax.axvline(trained - 0.5, color="black", linewidth=1)
    ax.annotate(" trained | untrained →", (trained - 0.5, 1.0), fontsize=8, va="top")
    ax.set_xlabel("in-context examples N")
    ax.set_ylabel("squared error / E[y²]")
    ax.set_yscale("log")
    lowest = min(float(result.lower[name].clamp_min(1e-12).min()) for name in models)
    ax.set_ylim(bottom=lowest / 10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
