"""The gd-icl study's figures: accuracy and NLL against the number of training tasks L (one line per model, the
seeds' 95 % intervals as error bars), and the feature study's accuracies against linear probing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ...evaluation.plotting import new_axes, new_panels, save_figure
from ..report import seed_interval


def _interval(values) -> tuple[float, float]:
    mean, half = seed_interval(torch.as_tensor(values, dtype=torch.float64))
    return float(mean), float(torch.nan_to_num(half))


def plot_versus_tasks(
    path: Path,
    task_counts: Sequence[int],
    curves: Mapping[str, Sequence[Sequence[float]]],
    *,
    ylabel: str,
    title: str,
    references: Mapping[str, float] | None = None,
) -> Path:
    """One line per model over L (log x): ``curves[label][L index]`` holds the per-seed values; dashed
    ``references`` (oracle, chance) as horizontal lines."""
    fig, ax = new_axes(title, size=(7.2, 4.8))
    colors: dict[str, str] = {}
    for label, per_l in curves.items():
        stats = [_interval(values) for values in per_l]
        # a GD model and its trained twin share a colour (what follows "GD"/"trained" in the label)
        twin = label.split(" ", 1)[1]
        color = colors.setdefault(twin, f"C{len(colors)}")
        style, marker = ("-", "o") if label.startswith("GD") else ("--", "s")
        ax.errorbar(
            list(task_counts), [m for m, _ in stats], yerr=[h for _, h in stats], marker=marker, ls=style, capsize=3,
            color=color, label=label,
        )  # fmt: skip
    for label, value in (references or {}).items():
        ax.axhline(value, color="0.4", ls=":", lw=1)
        ax.annotate(label, (task_counts[0], value), fontsize=7, color="0.3", va="bottom")
    ax.set_xscale("log")
    ax.set_xlabel("training tasks L")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def add_synthetic_figures(report, task_counts, specs, metrics, references) -> None:
    """Accuracy and NLL against L for every model of the synthetic study, added to ``report``."""
    for metric, ylabel, reference, chance in (
        ("accuracy", "top-1 accuracy at the query", "oracle accuracy", "chance accuracy"),
        ("nll", "NLL at the query", "oracle NLL", "chance NLL"),
    ):
        curves = {spec.label: metrics[spec.name][metric] for spec in specs}
        path = plot_versus_tasks(report.plot_path(metric), task_counts, curves, ylabel=ylabel, title=f"{ylabel} vs L")
        oracle, level = references[reference], references[chance]
        report.add_plot(
            path,
            f"{ylabel} against the number of training tasks L (mean over seeds, 95 % t interval; GD solid, trained "
            f"dashed in the same colour); the task's own logits reach {oracle:.3f}, chance is {level:.3f}",
        )


def plot_feature_accuracy(path: Path, accuracy: Mapping[str, Sequence[float]], labels: Mapping[str, str]) -> Path:
    """One bar per method (mean over seeds with its 95 % interval), the seeds as dots."""
    fig, (ax,) = new_panels(1, (6.4, 4.2))
    names = list(accuracy)
    stats = [_interval(accuracy[n]) for n in names]
    colors = ["0.55" if n == "linear_probe" else "steelblue" for n in names]
    ax.bar(range(len(names)), [m for m, _ in stats], yerr=[h for _, h in stats], color=colors, capsize=4, alpha=0.85)
    for i, name in enumerate(names):
        ax.scatter([i] * len(accuracy[name]), accuracy[name], color="k", s=10, zorder=3)
    ax.set_xticks(range(len(names)), [labels[n] for n in names], rotation=20, ha="right", fontsize=8)
    low = min(min(v) for v in accuracy.values())
    ax.set_ylim(max(0.0, low - 0.1), 1.0)
    ax.set_ylabel("top-1 accuracy on held-out classes")
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, path)


def add_feature_figure(report, accuracy, labels) -> None:
    path = plot_feature_accuracy(report.plot_path("accuracy"), accuracy, labels)
    report.add_plot(path, "held-out-class accuracy: GD with 1-3 blocks vs linear probing (mean over seeds, 95 % t)")
