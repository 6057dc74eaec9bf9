"""Figures for evaluation results, drawn with matplotlib's Agg canvas.

matplotlib is imported only when a plot is made, and figures are built on an explicit
``FigureCanvasAgg`` instead of through ``pyplot``: writing a PNG then neither needs a display
nor switches the backend of a notebook or script that imports this package. :func:`save_figure` fits every
title into the width it sits over first (:func:`fit_titles`): constrained layout makes room for a title's height,
never its width, so a long title would otherwise run off the figure or into the next panel.

Example::

    >>> import tempfile, pathlib, torch
    >>> fig, ax = new_axes("demo")
    >>> line = draw_band_curve(ax, torch.arange(3.0), torch.ones(3), torch.zeros(3), 2 * torch.ones(3), label="one")
    >>> path = save_figure(fig, pathlib.Path(tempfile.mkdtemp()) / "demo.png")
    >>> path.stat().st_size > 0
    True
"""

from __future__ import annotations

import textwrap
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


#: Share of its room a title may fill: text measured at the figure's dpi is saved at another (hinting differs).
TITLE_ROOM = 0.98
#: Layout passes :func:`fit_titles` makes at most: a wrapped title is taller, which can move the axes it sits over.
_FIT_PASSES = 3


def _titles(fig) -> list:
    """``(title, container)`` for every shown, non-empty title of ``fig``: its suptitle (and its subfigures'),
    each visible axes' centre, left and right titles; the container is what the title is placed over."""
    found = []
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_visible() and suptitle.get_text():
        found.append((suptitle, fig))
    for ax in fig.axes if fig is fig.figure else ():  # a subfigure's axes are listed by the root figure
        if ax.get_visible():
            for name in ("title", "_left_title", "_right_title"):
                title = getattr(ax, name, None)
                if title is not None and title.get_visible() and title.get_text():
                    found.append((title, ax))
    for sub in getattr(fig, "subfigs", ()):
        found += _titles(sub)
    return found


def _room(title, container) -> float:
    """The widest ``title`` can be and stay over ``container``, given where it is anchored and how it is aligned."""
    left, right = container.bbox.x0, container.bbox.x1
    x = title.get_transform().transform(title.get_unitless_position())[0]
    align = title.get_horizontalalignment()
    if align == "left":
        room = right - x
    elif align == "right":
        room = x - left
    else:
        room = 2 * min(x - left, right - x)
    return TITLE_ROOM * (room if room > 0 else container.bbox.width)


def _wrap(title, room: float, renderer) -> None:
    """Wrap ``title``'s lines (its own line breaks kept) at the most characters that keep it within ``room``
    pixels, measured with ``renderer``; a title that already fits is left as it is."""
    if title.get_window_extent(renderer).width <= room:
        return
    shown = title.get_text()
    lines = shown.split("\n")
    for chars in range(max(map(len, lines)) - 1, 0, -1):
        text = "\n".join(textwrap.fill(line, chars) if len(line) > chars else line for line in lines)
        if text == shown:  # the wrap changes only at word boundaries: measure only a new one
            continue
        title.set_text(text)
        shown = text
        if title.get_window_extent(renderer).width <= room:
            return


def fit_titles(fig) -> None:
    """Wrap every title of ``fig`` (axes titles and the suptitle) to the width it is placed over: its axes, else
    the figure. The figure is laid out first and each title measured with the canvas's renderer; a title that
    fits is not touched, and a wrapped one keeps every word (a word wider than the room is split across lines).

    >>> fig, ax = new_axes("a title " * 20)
    >>> fit_titles(fig)
    >>> ax.get_title().count("\\n") > 0, " ".join(ax.get_title().split()) == ("a title " * 20).strip()
    (True, True)
    """
    titles = _titles(fig)
    if not titles:
        return
    original = {id(title): title.get_text() for title, _ in titles}
    for _ in range(_FIT_PASSES):
        fig.draw_without_rendering()  # places the axes, whose widths are the room
        renderer = fig.canvas.get_renderer()
        before = [title.get_text() for title, _ in titles]
        for title, container in titles:
            title.set_text(original[id(title)])  # refit from the words given: the room may have grown
            _wrap(title, _room(title, container), renderer)
        if [title.get_text() for title, _ in titles] == before:
            return


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Fit ``fig``'s titles into the figure (:func:`fit_titles`), write it to ``path`` (parent folders created)
    and return the path."""
    fit_titles(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
