"""Figures for evaluation results, drawn with matplotlib's Agg canvas.

matplotlib is imported only when a plot is made, and figures are built on an explicit
``FigureCanvasAgg`` instead of through ``pyplot``: writing a PNG then neither needs a display
nor switches the backend of a notebook or script that imports this package.

Example::

    >>> import tempfile, pathlib, torch
    >>> fig, ax = new_axes("demo")
    >>> line = draw_band_curve(ax, torch.arange(3.0), torch.ones(3), torch.zeros(3), 2 * torch.ones(3), label="one")
    >>> path = save_figure(fig, pathlib.Path(tempfile.mkdtemp()) / "demo.png")
    >>> path.stat().st_size > 0
    True
"""

from __future__ import annotations

from pathlib import Path

import torch

#: Line styles that tell baselines apart (the first, dashed, is the trivial predictor's).
BASELINE_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1)))


def new_axes(title: str | None = None, size: tuple[float, float] = (6.4, 4.4)):
    """A fresh ``(figure, axes)`` pair on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def draw_band_curve(ax, x: torch.Tensor, value: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, **line_kw):
    """A line with its band shaded in the line's colour; returns the line."""
    (line,) = ax.plot(x.tolist(), value.tolist(), **line_kw)
    ax.fill_between(x.tolist(), lower.tolist(), upper.tolist(), color=line.get_color(), alpha=0.2, linewidth=0)
    return line


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
