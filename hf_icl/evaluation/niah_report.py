"""Tables and plots of needle-in-a-haystack results (the records :func:`~hf_icl.evaluation.niah.run_niah` returns).

:func:`summarize_niah` aggregates per method; :func:`write_niah_report` writes ``summary.csv``, ``summary.md``,
a gkamradt-style depth × length heatmap per method and accuracy against sparsity per policy.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .niah import DENSE, RECORD_FIELDS

#: the fields every record has had since the first results format (later ones are filled in when absent)
_REQUIRED_FIELDS = tuple(name for name in RECORD_FIELDS[:13] if name not in ("score", "kept_blocks"))

__all__ = ["summarize_niah", "write_niah_report"]


def summarize_niah(records):
    """Per method: accuracy, % of dense accuracy, mean answer log-prob, preservation and achieved sparsity.

    ``records``: the list :func:`run_niah` returns (or a ``pandas.DataFrame`` of it). Returns a
    ``pandas.DataFrame`` with columns ``method, policy, sparsity, n, accuracy, pct_of_dense, answer_logprob,
    preservation, achieved_sparsity, best``: dense first, then by sparsity and policy; ``best`` marks the best
    CAB policy at each sparsity (accuracy, then log-prob). ``pct_of_dense`` is NaN without a dense record or
    when dense accuracy is 0; ``achieved_sparsity`` (the share of causal query-token × key-block pairs CAB
    dropped, which can differ from the requested ``sparsity``) is NaN for records that lack it.
    """
    import pandas as pd

    frame = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(list(records))
    if frame.empty:
        raise ValueError("records must not be empty")
    missing = [name for name in _REQUIRED_FIELDS if name not in frame.columns]
    if missing:
        raise ValueError(f"records lack the fields {missing}; expected those of RECORD_FIELDS")
    frame["exact_match"] = frame["exact_match"].astype(float)
    if "achieved_sparsity" not in frame.columns:
        frame["achieved_sparsity"] = math.nan
    frame["achieved_sparsity"] = frame["achieved_sparsity"].astype(float)
    order = {label: i for i, label in enumerate(dict.fromkeys(frame["method"]))}
    summary = (
        frame.groupby(["method", "policy", "sparsity"], sort=False)
        .agg(
            n=("exact_match", "size"),
            accuracy=("exact_match", "mean"),
            answer_logprob=("answer_logprob", "mean"),
            preservation=("preservation", "mean"),
            achieved_sparsity=("achieved_sparsity", "mean"),
        )
        .reset_index()
    )
    dense = summary.loc[summary["method"] == DENSE, "accuracy"]
    dense_accuracy = float(dense.iloc[0]) if len(dense) else math.nan
    summary["pct_of_dense"] = (
        100.0 * summary["accuracy"] / dense_accuracy if dense_accuracy and dense_accuracy > 0 else math.nan
    )
    policy_order = {p: i for i, p in enumerate(dict.fromkeys(summary["policy"]))}
    summary["_cab"] = summary["method"] != DENSE
    summary["_policy"] = summary["policy"].map(policy_order)
    summary["_first"] = summary["method"].map(order)
    summary = summary.sort_values(["_cab", "sparsity", "_policy", "_first"], kind="stable").reset_index(drop=True)
    summary["best"] = False
    cab = summary[summary["method"] != DENSE]
    for _, group in cab.groupby("sparsity", sort=False):
        best = group.sort_values(["accuracy", "answer_logprob"], ascending=False, kind="stable").index[0]
        summary.loc[best, "best"] = True
    columns = ["method", "policy", "sparsity", "n", "accuracy", "pct_of_dense", "answer_logprob", "preservation"]
    columns.append("achieved_sparsity")
    return summary[[*columns, "best"]]


def _summary_markdown(summary) -> str:
    def number(value: float, spec: str) -> str:
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)

    lines = [
        "| method | policy | sparsity | n | accuracy | % of dense | answer log-prob | preservation "
        "| achieved sparsity |",
        "|:---|:---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary.itertuples(index=False):
        method = f"**{row.method}** ★" if row.best else row.method
        lines.append(
            f"| {method} | {row.policy} | {row.sparsity:.2f} | {row.n} | {row.accuracy:.3f} | "
            f"{number(row.pct_of_dense, '.1f')} | {row.answer_logprob:.3f} | {row.preservation:.3f} | "
            f"{number(row.achieved_sparsity, '.3f')} |"
        )
    note = (
        "★ best CAB policy at its sparsity (accuracy, then answer log-prob). Achieved sparsity: the share of causal "
        "(query token, key block) pairs CAB dropped, over every layer and head."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


def _heatmap(frame, label: str, path: Path) -> Path:
    from matplotlib.colors import LinearSegmentedColormap

    from .plotting import new_axes, save_figure

    grid = frame.pivot_table(index="depth", columns="context_length", values="exact_match", aggfunc="mean")
    grid = grid.sort_index().sort_index(axis=1)
    fig, ax = new_axes(f"Needle in a haystack: {label}", size=(1.6 + 0.9 * grid.shape[1], 1.4 + 0.5 * grid.shape[0]))
    ax.grid(False)
    cmap = LinearSegmentedColormap.from_list("niah", ["#F0496E", "#EBB839", "#0CD79F"])  # gkamradt's colours
    image = ax.imshow(grid.to_numpy(dtype=float), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            value = grid.iat[i, j]
            if not math.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [f"{100 * d:g}%" for d in grid.index])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    fig.colorbar(image, ax=ax, label="accuracy")
    return save_figure(fig, path)


def _accuracy_plot(summary, path: Path) -> Path:
    from .plotting import new_axes, save_figure

    fig, ax = new_axes("Passkey accuracy against CAB sparsity")
    for policy, group in summary[summary["method"] != DENSE].groupby("policy", sort=False):
        group = group.sort_values("sparsity")
        ax.plot(group["sparsity"].tolist(), group["accuracy"].tolist(), marker="o", label=policy)
    dense = summary[summary["method"] == DENSE]
    if len(dense):
        ax.axhline(float(dense["accuracy"].iloc[0]), color="0.3", linestyle="--", label="dense (sdpa)")
    ax.set_xlabel("sparsity (fraction of causal blocks dropped)")
    ax.set_ylabel("exact-match accuracy")
    ax.set_ylim(-0.03, 1.03)
    ax.legend()
    return save_figure(fig, path)


def write_niah_report(records, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``summary.csv``, ``summary.md``, ``heatmap_<label>.png`` per method and ``accuracy_vs_sparsity.png``.

    Returns ``{file name: path}``.
    """
    import pandas as pd

    frame = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(list(records))
    summary = summarize_niah(frame)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    summary.to_csv(out / "summary.csv", index=False)
    written["summary.csv"] = out / "summary.csv"
    (out / "summary.md").write_text(_summary_markdown(summary), encoding="utf-8")
    written["summary.md"] = out / "summary.md"
    frame["exact_match"] = frame["exact_match"].astype(float)
    for label in summary["method"]:
        name = f"heatmap_{label}.png"
        written[name] = _heatmap(frame[frame["method"] == label], label, out / name)
    written["accuracy_vs_sparsity.png"] = _accuracy_plot(summary, out / "accuracy_vs_sparsity.png")
    return written
