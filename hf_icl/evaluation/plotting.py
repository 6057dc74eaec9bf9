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


def band_label(confidence: tuple[float, float]) -> str:
    """How a legend names the shaded bands, e.g. ``"5–95% bootstrap band"``.

    >>> band_label((0.05, 0.95))
    '5–95% bootstrap band'
    """
    low, high = (100 * q for q in confidence)
    return f"{low:g}–{high:g}% bootstrap band"


def finish_axes(ax, metric, *, log_y: bool | None, confidence: tuple[float, float], **legend_kw) -> None:
    """Label the y axis with ``metric``, pick its scale and add a legend that names the bands.

    ``log_y=None`` chooses by metric: a log axis for errors (least squares' interpolation peak at
    n = d would flatten every other curve), a linear one for accuracy.
    """
    from matplotlib.patches import Patch

    ax.set_ylabel(metric.axis_label)
    if metric.target_kind == "regression" if log_y is None else log_y:
        ax.set_yscale("log")
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="0.5", alpha=0.2, linewidth=0))
    labels.append(band_label(confidence))
    ax.legend(handles, labels, **legend_kw)


def new_panels(columns: int, size: tuple[float, float], rows: int = 1, **subplots):
    """A fresh figure on an Agg canvas and its ``rows × columns`` axes, flattened to one sequence."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, columns, squeeze=False, **subplots).ravel()


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (parent folders created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
