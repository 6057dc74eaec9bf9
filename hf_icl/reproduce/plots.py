"""Plots the reproductions draw beyond the evaluation's own: error against a swept quantity (T, N, λ)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..evaluation.plotting import BASELINE_STYLES, new_axes, save_figure


def plot_sweep(
    path: Path,
    x: Sequence[float],
    curves: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = False,
    log_y: bool = True,
    references: Mapping[str, float] | None = None,
) -> Path:
    """One line per curve over ``x``; ``references`` are horizontal lines (baselines), each named in the legend."""
    fig, ax = new_axes(title)
    for name, values in curves.items():
        ax.plot(list(x), list(values), marker="o", label=name)
    # a colour after the curves' and a dash pattern each: the legend, not a grey line's position, names them
    for j, (name, value) in enumerate((references or {}).items()):
        style = BASELINE_STYLES[j % len(BASELINE_STYLES)]
        ax.axhline(value, linestyle=style, color=f"C{(len(curves) + j) % 10}", linewidth=1.2, label=name)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
