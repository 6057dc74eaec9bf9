"""Markdown and pandas views of evaluation results (pandas is imported only when asked for).

Example::

    >>> print(markdown_grid("examples", ["a", "b"], [0, 1], lambda row, col: f"{row}{col}"))
    | examples | a | b |
    |---:|---:|---:|
    | 0 | 0a | 0b |
    | 1 | 1a | 1b |
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any


def markdown_grid(corner: str, columns: Sequence[str], rows: Iterable[Any], cell: Callable[[Any, str], str]) -> str:
    """A right-aligned markdown table: one line per row key, ``cell(row, column)`` in each cell."""
    lines = [f"| {corner} | " + " | ".join(columns) + " |", "|---:|" + "---:|" * len(columns)]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(cell(row, column) for column in columns) + " |")
    return "\n".join(lines)


def format_band(value: float, lower: float, upper: float) -> str:
    """A value with its band, compactly: ``0.123 [0.1, 0.15]``.

    >>> format_band(0.12345, 0.1, 0.15)
    '0.123 [0.1, 0.15]'
    """
    return f"{value:.3g} [{lower:.3g}, {upper:.3g}]"


def rows_to_dataframe(rows: list[dict[str, Any]]):
    """A ``pandas.DataFrame`` with one row per dict."""
    import pandas as pd  # pandas is optional for everything but this view

    return pd.DataFrame.from_records(rows)
