"""The kernel-ICL document's figures from a finished run: predictions against the truth, kernel weights for one
query, training curves, box plots of the per-task errors and the paired row / column+row bars."""

from __future__ import annotations

from pathlib import Path

import torch

from ...evaluation.plotting import new_panels, save_figure
from ...similarity.row_kernels import row_kernel_scores
from ..report import seed_interval
from .document import KERNEL_NAMES, TABLE1, grid_label, grid_name

#: the document's query for the weight profiles (x ≈ 0.94, on the right slope)
PROFILE_QUERY = 65


def plot_predictions(path: Path, predictions: dict, data: dict, labels: dict) -> Path:
    """One panel per Table-1 method: context points, the true sine and the method's prediction."""
    fig, axes = new_panels(4, (18.0, 7.5), rows=2, sharex=True, sharey=True)
    cx, cy = data["context_x"][0, :, 0], data["context_y"][0]
    qx, qy = data["query_x"][0, :, 0], data["query_y"][0]
    for ax, (name, label) in zip(axes, labels.items(), strict=True):
        prediction = predictions[name]
        mse = float((prediction - qy).square().mean())
        ax.scatter(cx.tolist(), cy.tolist(), s=5, alpha=0.3, color="gray", label="context")
        ax.plot(qx.tolist(), qy.tolist(), "k--", lw=1, label="sin(x)")
        ax.plot(qx.tolist(), prediction.tolist(), "r-", lw=2, label="prediction")
        ax.set_title(f"{label}\nMSE = {mse:.4f}", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)


def weight_profiles(data: dict, features, head) -> dict[str, torch.Tensor]:
    """Each kernel's attention weights over the context for the query :data:`PROFILE_QUERY`."""
    cx, qx = data["context_x"][0], data["query_x"][0, PROFILE_QUERY : PROFILE_QUERY + 1]
    zc, zq = features(cx), features(qx)
    scores = {
        "RBF (σ = 0.5)": row_kernel_scores(qx, cx, "rbf", bandwidth=0.5),
        "raw softmax": row_kernel_scores(qx, cx, "softmax"),
        "cosine (T = 0.1)": row_kernel_scores(zq, zc, "cosine", temperature=0.1),
        "Cayley (T = 0.1)": row_kernel_scores(zq, zc, "cayley", temperature=0.1),
        "GA penalty": row_kernel_scores(zq, zc, "ga", beta1=4.0, beta2=1.0, temperature=1.0),
    }
    weights = {name: s.softmax(-1)[0] for name, s in scores.items()}
    with torch.no_grad():
        xs = torch.cat([cx, qx]).float()[None]
        ys = torch.cat([data["context_y"][0], torch.zeros(1, dtype=cx.dtype)]).float()[None]
        out = head(xs, ys, n_context=cx.shape[0], output_attentions=True)
    if out.attentions:
        weights["pre-trained head"] = out.attentions[-1].reshape(-1, cx.shape[0])[-1].double()
    return weights


def plot_weights(path: Path, weights: dict[str, torch.Tensor], data: dict) -> Path:
    fig, axes = new_panels(len(weights), (3.6 * len(weights), 3.4), sharex=True)
    cx = data["context_x"][0, :, 0].tolist()
    query = float(data["query_x"][0, PROFILE_QUERY, 0])
    for ax, (name, w) in zip(axes, weights.items(), strict=True):
        ax.bar(cx, w.tolist(), width=0.04, color="steelblue", alpha=0.7)
        ax.axvline(query, color="red", ls="--", lw=2, label=f"query = {query:.2f}")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("context x")
    axes[0].set_ylabel("weight")
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def plot_training_curves(path: Path, grid: dict, curve_every: int, labels) -> Path:
    """Training loss (mean over seeds) of the row-only and column+row model of each row kernel."""
    kernels = [k for k in KERNEL_NAMES if any(k == kernel for kernel, _ in grid)]
    fig, axes = new_panels(len(kernels), (4.5 * len(kernels), 3.6), sharey=True)
    for ax, kernel in zip(axes, kernels, strict=True):
        for column, color in ((False, "coral"), (True, "steelblue")):
            losses = grid[kernel, column][1].mean(1)
            steps = [curve_every * (i + 1) for i in range(losses.shape[0])]
            ax.plot(steps, losses.tolist(), color=color, lw=1.5, label=labels(kernel, column))
        ax.set_title(KERNEL_NAMES[kernel])
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"training MSE (mean of {curve_every} steps)")
    return save_figure(fig, path)


def plot_box_and_bars(path: Path, errors: dict[str, torch.Tensor], labels: dict[str, str]) -> Path:
    """Left: per-task MSE of every method (all seeds pooled); right: row vs column+row per kernel with the seeds'
    95 % intervals, KRR dashed."""
    fig, (box, bars) = new_panels(2, (15.0, 5.0))
    names = list(labels)
    box.boxplot([errors[n].flatten().tolist() for n in names], showfliers=False)
    box.set_xticks(range(1, len(names) + 1), [labels[n] for n in names], rotation=45, ha="right")
    means = [float(errors[n].mean()) for n in names]
    box.scatter(range(1, len(names) + 1), means, color="red", marker="D", zorder=5, s=30, label="mean")
    box.set_ylabel("MSE per task")
    box.legend(fontsize=8)
    kernels = [n.removeprefix("row_") for n in names if n.startswith("row_")]
    for offset, (prefix, color, label) in enumerate((("row", "coral", "row only"), ("col", "steelblue", "col+row"))):
        stats = [seed_interval(errors[f"{prefix}_{k}"].mean(1)) for k in kernels]
        xs = [i + (offset - 0.5) * 0.35 for i in range(len(kernels))]
        bars.bar(
            xs,
            [float(m) for m, _ in stats],
            0.35,
            yerr=[float(torch.nan_to_num(h)) for _, h in stats],
            color=color,
            alpha=0.85,
            label=label,
            capsize=3,
        )
    krr = float(errors["krr"].mean())
    bars.axhline(krr, color="gray", ls="--", lw=1.5, label=f"KRR (RBF) = {krr:.3f}")
    bars.set_xticks(range(len(kernels)), [KERNEL_NAMES[k] for k in kernels])
    bars.set_ylabel("mean MSE")
    bars.legend(fontsize=8)
    return save_figure(fig, path)


def add_figures(ctx) -> None:
    """Draw every figure of a context whose tables have run, and add them to its report."""
    from ...estimators import RandomFourierFeatures

    report, scale = ctx.report, ctx.scale
    predictions, data, head = ctx.example
    seed = scale.seeds[0]
    labels = {name: label for name, (label, _, _) in TABLE1.items()}
    report.add_plot(
        plot_predictions(report.plot_path("predictions"), predictions, data, labels),
        f"Table 1's methods on the sin(x) prompt of seed {seed}",
    )
    features = RandomFourierFeatures(n_dims=1, n_frequencies=scale.rff_frequencies, scale=scale.rff_scale, seed=seed)
    report.add_plot(
        plot_weights(report.plot_path("weights"), weight_profiles(data, features, head), data),
        f"attention / kernel weights over the context for query {PROFILE_QUERY} (seed {seed})",
    )
    report.add_plot(
        plot_training_curves(report.plot_path("curves"), ctx.grid, scale.curve_every, grid_label),
        "Table 2's training curves, row only vs column + row, mean over seeds",
    )
    grid_labels = {"krr": "KRR"} | {grid_name(k, c): grid_label(k, c) for (k, c) in ctx.grid}
    report.add_plot(
        plot_box_and_bars(report.plot_path("box_bars"), ctx.table2, grid_labels),
        "Table 2: per-task MSE of every method (left) and row vs column + row per kernel (right)",
    )
