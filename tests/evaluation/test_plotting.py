"""Titles of figures made with ``hf_icl.evaluation.plotting`` are fitted into the figure before it is saved."""

from __future__ import annotations

import pytest
import torch

from hf_icl.evaluation.plotting import draw_band_curve, fit_titles, new_axes, new_panels, save_figure

LONG = (
    "Needle in a haystack: cab-hybrid_with_a_rather_long_policy_name_from_a_sweep@0.975 against dense attention "
    "on every context length and needle depth of the sweep, with 95% Wilson intervals"
)
PANEL = "context length 4096 tokens, multikey needle, word values, policy cab-quest_with_a_long_suffix@16blocks"


def _words(text: str) -> str:
    return "".join(text.split())


def _inside(fig, text) -> bool:
    box, frame = text.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def _draw(ax) -> None:
    x = torch.arange(4.0)
    draw_band_curve(ax, x, x, x - 1, x + 1, label="curve")


def test_long_suptitle_and_panel_titles_fit_inside_the_figure_and_keep_every_word(tmp_path):
    fig, axes = new_panels(2, size=(8.0, 3.5))
    fig.suptitle(LONG)
    for ax in axes:
        ax.set_title(PANEL)
        _draw(ax)
    path = save_figure(fig, tmp_path / "panels.png")
    assert path.stat().st_size > 0
    fig.canvas.draw()
    titles = [fig._suptitle, *(ax.title for ax in axes)]
    for title, original in zip(titles, (LONG, PANEL, PANEL), strict=True):
        assert "\n" in title.get_text()  # wrapped ...
        assert _inside(fig, title), title.get_text()  # ... into the figure ...
        assert _words(title.get_text()) == _words(original)  # ... with nothing dropped
    renderer = fig.canvas.get_renderer()
    left, right = (ax.title.get_window_extent(renderer) for ax in axes)
    assert left.x1 < right.x0  # each panel's title over its own panel, not into its neighbour's
    for ax in axes:
        assert ax.title.get_window_extent(renderer).width <= ax.bbox.width


def test_a_long_axes_title_of_new_axes_fits_and_a_word_wider_than_the_axes_is_split_not_dropped(tmp_path):
    word = "x" * 150  # no space to break at
    fig, ax = new_axes(f"{LONG} {word}")
    _draw(ax)
    save_figure(fig, tmp_path / "axes.png")
    fig.canvas.draw()
    assert _inside(fig, ax.title)
    assert _words(ax.get_title()) == _words(f"{LONG} {word}")


@pytest.mark.parametrize("title", ["linear regression, d=3", "two\nlines"])
def test_short_titles_are_left_as_they_are(tmp_path, title):
    fig, axes = new_panels(1, size=(6.4, 4.4))
    fig.suptitle("a short suptitle")
    axes[0].set_title(title)
    _draw(axes[0])
    save_figure(fig, tmp_path / "short.png")
    assert fig.get_suptitle() == "a short suptitle" and axes[0].get_title() == title


def test_fit_titles_is_idempotent_and_handles_figures_without_titles():
    fig, ax = new_axes()
    fit_titles(fig)  # nothing to fit
    assert ax.get_title() == ""
    fig, ax = new_axes(LONG)
    fit_titles(fig)
    once = ax.get_title()
    fit_titles(fig)
    assert ax.get_title() == once and once != LONG


def test_left_and_right_titles_fit_too(tmp_path):
    fig, ax = new_axes(size=(5.0, 4.0))
    ax.set_title(PANEL, loc="left")
    ax.set_title(PANEL, loc="right")
    _draw(ax)
    save_figure(fig, tmp_path / "sides.png")
    fig.canvas.draw()
    for title in (ax._left_title, ax._right_title):
        assert "\n" in title.get_text() and _inside(fig, title) and _words(title.get_text()) == _words(PANEL)
