"""The linear-attention figures: Figs. 1–2 (loss curves by depth), Fig. 3 (the anisotropic shift) and the
feature-map ablation's curves."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ...evaluation.plotting import new_panels, save_figure
from ..report import seed_interval
from .document import ABLATION_DEPTH, DEPTHS, FEATURE_MAP_FORMULAS
from .specs import RECIPES, depth_label
from .training import GroupResult


def _samples_axis(ax) -> None:
    """Samples seen in thousands (full numbers overlap on a panel a third of a page wide)."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1000:g}k" if value else "0"))
    ax.set_xlabel("samples seen (steps × batch)")


def plot_curves(path: Path, results: dict) -> Path:
    """Figs. 1–2 side by side: test (solid, 95 % t band over seeds) and train (dashed) loss against samples seen,
    one panel per depth, both architectures in each."""
    fig, axes = new_panels(len(DEPTHS), (5.0 * len(DEPTHS), 4.0))
    for ax, depth in zip(axes, DEPTHS, strict=True):
        shown = []
        for i, (key, recipe) in enumerate(RECIPES.items()):
            r, color = results[key, depth], f"C{i}"
            mean, half = seed_interval(r.test_curve)
            half = torch.nan_to_num(half)
            train = r.train_curve.mean(0)
            ax.plot(r.samples(), mean.tolist(), color=color, label=f"{recipe.label}, test")
            ax.fill_between(r.samples(), (mean - half).tolist(), (mean + half).tolist(), color=color, alpha=0.2)
            ax.plot(r.samples(), train.tolist(), "--", color=color, label=f"{recipe.label}, train")
            shown += [mean, train]
        # the axis follows the curves: a wide band (few seeds) may leave it, and a log axis cannot show its negative end
        values = torch.cat(shown)
        ax.set_yscale("log")
        ax.set_ylim(0.5 * float(values.min().clamp_min(1e-8)), 2 * float(values.max()))
        ax.set_title(depth_label(depth))
        _samples_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("query squared error / d")
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def plot_shift(path: Path, results: dict) -> Path:
    """Fig. 3: isotropic vs anisotropic test loss by depth, both architectures (bars: seed means, whiskers: 95 % t)."""
    fig, (ax,) = new_panels(1, (7.0, 4.2))
    bars = [(key, name) for key in RECIPES for name in ("test", "anisotropic")]
    width, heights = 0.8 / len(bars), []
    for i, (key, name) in enumerate(bars):
        stats = [results[key, d].interval(name) for d in DEPTHS]
        x = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(DEPTHS))]
        label = f"{RECIPES[key].label}, {'isotropic' if name == 'test' else 'anisotropic'}"
        errors = [0 if math.isnan(h) else h for _, h in stats]
        style = {"color": f"C{list(RECIPES).index(key)}", "hatch": "//" if name != "test" else ""}
        ax.bar(x, [m for m, _ in stats], width, yerr=errors, capsize=3, label=label, **style)
        heights += [m for m, _ in stats]
    ax.set_xticks(range(len(DEPTHS)), [depth_label(d) for d in DEPTHS])
    ax.set_yscale("log")
    ax.set_ylim(0.5 * max(min(heights), 1e-8), 2 * max(heights))
    ax.set_ylabel("query squared error / d")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_ablation(path: Path, ablation: dict[str, GroupResult]) -> Path:
    """The feature-map ablation: each map's test loss (95 % t band over seeds) against samples seen, with the trivial
    predictor's loss as a dotted line."""
    fig, (ax,) = new_panels(1, (7.0, 4.2))
    shown = []
    for i, (name, r) in enumerate(ablation.items()):
        mean, half = seed_interval(r.test_curve)
        half = torch.nan_to_num(half)
        label = f"{name}: φ(x) = {FEATURE_MAP_FORMULAS[name]}"
        ax.plot(r.samples(), mean.tolist(), color=f"C{i}", label=label)
        ax.fill_between(r.samples(), (mean - half).tolist(), (mean + half).tolist(), color=f"C{i}", alpha=0.2)
        shown.append(mean[torch.isfinite(mean)])
    trivial = next(iter(ablation.values())).trivial("test")
    ax.axhline(trivial, color="gray", linestyle=":", label=f"trivial predictor (ŷ = 0): {trivial:.3f}")
    values = torch.cat([*shown, torch.tensor([trivial], dtype=torch.float64)])
    ax.set_yscale("log")
    ax.set_ylim(0.5 * float(values.min().clamp_min(1e-8)), 2 * float(values.max()))
    ax.set_title(f"feature maps, linear attention, {depth_label(ABLATION_DEPTH)}")
    _samples_axis(ax)
    ax.set_ylabel("query squared error / d")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
