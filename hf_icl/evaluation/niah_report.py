"""Tables and plots of needle-in-a-haystack results (the records :func:`~hf_icl.evaluation.niah.run_niah` returns).

:func:`summarize_niah` aggregates per method, context length and needle setting (variant, value kind), with a 95%
Wilson interval on every hit rate; :func:`write_niah_report` writes ``summary.csv``, ``summary.md``, a
gkamradt-style depth × length heatmap per method and accuracy against achieved sparsity per method name.

Two hit rates per row, each with its Wilson score interval (:func:`~hf_icl.evaluation.intervals.wilson_interval`):

* ``accuracy``: exact match over the row's ``n`` prompts (``hits`` of ``n``);
* ``kept_of_dense``: of the prompts dense attention (``sdpa``) answered (``dense_hits``: same context length,
  depth, sample, variant and value kind), the share the method also answered (``kept`` of ``dense_hits``). It
  separates what a sparse method loses from what the model never knew: a method can only lose hits dense has.

Example::

    summary = summarize_niah(load_niah_results("niah/results.jsonl"))
    summary[summary["context_length"] == 4096][["method", "accuracy", "accuracy_low", "accuracy_high"]]
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from .intervals import wilson_interval
from .niah import DENSE, RECORD_FIELDS

#: fields of later formats, and what an older record stands for
_DEFAULTS = {"score": None, "kept_blocks": None, "variant": "single", "value_kind": "number"}
#: fields added after the first results format that summaries never read (older records may lack them)
_UNREAD_LATER_FIELDS = ("achieved_sparsity", "needle_start", "needle_end")
#: the fields every record has had since the first results format (the others are filled in when absent)
_REQUIRED_FIELDS = tuple(name for name in RECORD_FIELDS if name not in (*_DEFAULTS, *_UNREAD_LATER_FIELDS))
#: what makes a prompt: records of two methods with the same values saw the same prompt
_PROMPT = ("context_length", "depth", "sample", "variant", "value_kind")
#: the ``context_length`` of the rows that pool every length of a needle setting
ALL_LENGTHS = "all"
#: the columns of :func:`summarize_niah`'s table, in order
SUMMARY_COLUMNS = (
    "variant",
    "value_kind",
    "context_length",
    "method",
    "name",
    "policy",
    "score",
    "sparsity",
    "kept_blocks",
    "budget",
    "n",
    "hits",
    "accuracy",
    "accuracy_low",
    "accuracy_high",
    "value_recall",
    "dense_hits",
    "kept",
    "kept_of_dense",
    "kept_low",
    "kept_high",
    "pct_of_dense",
    "answer_logprob",
    "preservation",
    "achieved_sparsity",
    "best",
)

__all__ = ["ALL_LENGTHS", "SUMMARY_COLUMNS", "method_name", "summarize_niah", "write_niah_report"]


def method_name(label: str, policy: str | None = None) -> str:
    """The method a label names without its budget: ``"cab-quest@16blocks"`` → ``"quest"``, ``"sdpa"`` → ``"sdpa"``
    (a label of another form: ``policy``, else the label)."""
    if label == DENSE:
        return DENSE
    if label.startswith("cab-") and "@" in label:
        return label[len("cab-") :].rsplit("@", 1)[0]
    return policy or label


def _budget(label: str, sparsity, kept_blocks) -> str:
    """``"dense"``, ``"16 blocks"`` or the sparsity (``"0.90"``, ``"0.975"``)."""
    if label == DENSE:
        return "dense"
    if not _missing(kept_blocks):
        return f"{int(kept_blocks)} blocks"
    if _missing(sparsity):
        return "–"
    sparsity = float(sparsity)
    return f"{sparsity:.2f}" if round(sparsity, 2) == sparsity else f"{sparsity:g}"


def _missing(value) -> bool:
    """None, NaN or pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pd.NA (whose comparison is NA, and bool(NA) raises)
    except TypeError:
        return True


def _frame(records):
    """The records as a DataFrame, checked, with the later formats' fields filled in."""
    import pandas as pd

    frame = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(list(records))
    if frame.empty:
        raise ValueError("records must not be empty")
    missing = [name for name in _REQUIRED_FIELDS if name not in frame.columns]
    if missing:
        raise ValueError(f"records lack the fields {missing}; expected those of RECORD_FIELDS")
    for name, default in _DEFAULTS.items():
        if name not in frame.columns:
            frame[name] = default
        elif default is not None:
            frame[name] = frame[name].where(frame[name].notna(), default)
    frame["exact_match"] = frame["exact_match"].astype(bool)
    if "achieved_sparsity" not in frame.columns:
        frame["achieved_sparsity"] = math.nan
    frame["achieved_sparsity"] = frame["achieved_sparsity"].astype(float)
    frame = frame.reset_index(drop=True)
    dense = frame[frame["method"] == DENSE].groupby(list(_PROMPT), sort=False)["exact_match"].any()
    keys = list(zip(*(frame[name] for name in _PROMPT), strict=True))
    answered = {key for key, hit in dense.items() if hit}
    frame["_dense_hit"] = [key in answered for key in keys]
    return frame


def _value_recall(answer: str, generated: str) -> float:
    """The share of the answer's values found in the generation (RULER's score of the multi-value needle: naming 3
    of 4 values scores 0.75 where exact match scores 0); a single value: 1 or 0."""
    from ..data.niah import ANSWER_SEPARATOR  # here: data.niah imports datasets, which the report's readers need not

    values = str(answer).split(ANSWER_SEPARATOR)
    return sum(value in str(generated) for value in values) / len(values)


def _row(group, section: dict, confidence: float) -> dict:
    """One summary row: a method's records in one section (a context length, or all of them)."""
    first = group.iloc[0]
    n, hits = len(group), int(group["exact_match"].sum())
    accuracy_low, accuracy_high = wilson_interval(hits, n, confidence)
    label = first["method"]
    answered = group[group["_dense_hit"]]
    dense_hits, kept = len(answered), int(answered["exact_match"].sum())
    kept_of_dense = kept_low = kept_high = math.nan
    if dense_hits and label != DENSE:
        kept_of_dense = kept / dense_hits
        kept_low, kept_high = wilson_interval(kept, dense_hits, confidence)
    kept_blocks = None if _missing(first["kept_blocks"]) else int(first["kept_blocks"])
    sparsity = math.nan if _missing(first["sparsity"]) else float(first["sparsity"])
    return {
        **section,
        "method": label,
        "name": method_name(label, first["policy"]),
        "policy": first["policy"],
        "score": None if _missing(first["score"]) else first["score"],
        "sparsity": sparsity,
        "kept_blocks": kept_blocks,
        "budget": _budget(label, sparsity, kept_blocks),
        "n": n,
        "hits": hits,
        "accuracy": hits / n,
        "accuracy_low": accuracy_low,
        "accuracy_high": accuracy_high,
        "value_recall": float(sum(map(_value_recall, group["answer"], group["generated"])) / n),
        "dense_hits": dense_hits,
        "kept": kept,
        "kept_of_dense": kept_of_dense,
        "kept_low": kept_low,
        "kept_high": kept_high,
        "answer_logprob": float(group["answer_logprob"].mean()),
        "preservation": float(group["preservation"].mean()),
        "achieved_sparsity": float(group["achieved_sparsity"].mean()),
    }


def summarize_niah(records, *, confidence: float = 0.95):
    """Per needle setting, context length and method: accuracy and the share of dense's hits kept, with Wilson
    intervals; % of dense accuracy; mean answer log-prob, preservation and achieved sparsity.

    ``records``: the list :func:`run_niah` returns (or a ``pandas.DataFrame`` of it); records of older files
    without ``score``, ``kept_blocks``, ``variant``, ``value_kind`` or ``achieved_sparsity`` count as None, None,
    ``"single"``, ``"number"`` and NaN. ``confidence``: the intervals' level.

    Returns a ``pandas.DataFrame`` with the columns :data:`SUMMARY_COLUMNS`, one row per method in each section:
    a section is a needle setting (``variant``, ``value_kind``) and a ``context_length``, then, when the setting
    has several lengths, :data:`ALL_LENGTHS` (``"all"``) pooling them. Sections come in the records' order of
    settings and by length; in each, dense first, then sparsity budgets from the lowest, then block budgets from
    the most blocks, each budget's methods in the records' order.

    * ``name``: the method without its budget (``frc``, ``quest``, ...); ``budget``: ``"dense"``, the sparsity
      (``"0.90"``) or ``"16 blocks"``; ``sparsity`` is NaN and ``kept_blocks`` set under a block budget;
    * ``n, hits, accuracy, accuracy_low, accuracy_high``: exact match over the prompts, with its interval;
    * ``value_recall``: the mean share of the answer's values the generation names (RULER's multi-value score;
      equals ``accuracy`` for one value);
    * ``dense_hits, kept, kept_of_dense, kept_low, kept_high``: of the ``dense_hits`` prompts dense answered, the
      ``kept`` the method answered too, their share and its interval (NaN for dense itself and without dense
      hits);
    * ``pct_of_dense``: 100 × accuracy / dense's in the section (NaN without dense or when dense's is 0);
    * ``achieved_sparsity``: the share of causal query-token × key-block pairs CAB dropped (NaN for records
      without it);
    * ``best``: the best CAB method at each budget of a section (accuracy, then answer log-prob).
    """
    import pandas as pd

    frame = _frame(records)
    settings = list(dict.fromkeys(zip(frame["variant"], frame["value_kind"], strict=True)))
    rows = []
    for variant, value_kind in settings:
        chosen = frame[(frame["variant"] == variant) & (frame["value_kind"] == value_kind)]
        lengths = sorted(int(length) for length in dict.fromkeys(chosen["context_length"]))
        sections = [(length, chosen[chosen["context_length"] == length]) for length in lengths]
        if len(lengths) > 1:
            sections.append((ALL_LENGTHS, chosen))
        for length, part in sections:
            section = {"variant": variant, "value_kind": value_kind, "context_length": length}
            section_rows = [_row(group, section, confidence) for _, group in part.groupby("method", sort=False)]
            rows.extend(_ordered(section_rows, list(dict.fromkeys(frame["method"]))))
    summary = pd.DataFrame.from_records(rows)
    summary["kept_blocks"] = summary["kept_blocks"].astype("Int64")
    summary["context_length"] = summary["context_length"].astype(object)
    return summary[list(SUMMARY_COLUMNS)]


def _ordered(rows: list[dict], methods: list[str]) -> list[dict]:
    """A section's rows in order, with ``pct_of_dense`` and ``best`` filled in."""
    by_method = sorted(rows, key=lambda row: methods.index(row["method"]))
    names = list(dict.fromkeys(row["name"] for row in by_method))

    def key(row):
        blocks = row["kept_blocks"] is not None
        budget = -row["kept_blocks"] if blocks else (row["sparsity"] if not math.isnan(row["sparsity"]) else math.inf)
        return (row["method"] != DENSE, blocks, budget, names.index(row["name"]), methods.index(row["method"]))

    rows = sorted(rows, key=key)
    dense = next((row["accuracy"] for row in rows if row["method"] == DENSE), math.nan)
    best: dict[str, dict] = {}
    for row in rows:
        row["pct_of_dense"] = 100.0 * row["accuracy"] / dense if dense > 0 else math.nan
        row["best"] = False
        if row["method"] != DENSE:
            held = best.get(row["budget"])
            if held is None or (row["accuracy"], row["answer_logprob"]) > (held["accuracy"], held["answer_logprob"]):
                best[row["budget"]] = row
    for row in best.values():
        row["best"] = True
    return rows


# -- markdown ----------------------------------------------------------------------------------


def _number(value, spec: str) -> str:
    return "–" if _missing(value) else format(value, spec)


def _interval(value, low, high, spec: str = ".3f") -> str:
    return "–" if _missing(value) else f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"


def _section_title(row, several_settings: bool) -> str:
    length = "all lengths" if row.context_length == ALL_LENGTHS else f"context length {row.context_length}"
    return f"{length}, {row.variant} needle, {row.value_kind} values" if several_settings else length


def _summary_markdown(summary, confidence: float = 0.95) -> str:
    level = f"{100 * confidence:g}%"
    several = summary[["variant", "value_kind"]].drop_duplicates().shape[0] > 1 or (
        summary["variant"].iloc[0] != "single" or summary["value_kind"].iloc[0] != "number"
    )
    header = [
        f"| method | policy | budget | n | accuracy [{level}] | kept of dense's hits [{level}] | % of dense "
        "| answer log-prob | preservation | achieved sparsity |",
        "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    recall_header = [header[0] + " values recalled |", header[1] + "---:|"]  # several values per answer
    lines: list[str] = []
    current = None
    for row in summary.itertuples(index=False):
        section = (row.variant, row.value_kind, row.context_length)
        if section != current:
            shown = recall_header if row.variant == "multivalue" else header
            lines += ([""] if lines else []) + [f"### {_section_title(row, several)}", "", *shown]
            current = section
        method = f"**{row.method}** ★" if row.best else row.method
        policy = row.policy if _missing(row.score) else f"{row.policy} ({row.score} score)"
        accuracy = _interval(row.accuracy, row.accuracy_low, row.accuracy_high)
        kept = "–"
        if not _missing(row.kept_of_dense):
            kept = f"{row.kept}/{row.dense_hits} [{row.kept_low:.3f}, {row.kept_high:.3f}]"
        lines.append(
            f"| {method} | {policy} | {row.budget} | {row.n} | {accuracy} | {kept} | "
            f"{_number(row.pct_of_dense, '.1f')} | {row.answer_logprob:.3f} | {row.preservation:.3f} | "
            f"{_number(row.achieved_sparsity, '.3f')} |"
            + (f" {row.value_recall:.3f} |" if row.variant == "multivalue" else "")
        )
    note = (
        f"Intervals: {level} Wilson score intervals. Kept of dense's hits: of the prompts dense attention (sdpa) "
        "answered, how many the method answered too. Budget: the fraction of each token's causal key blocks "
        "dropped, or the key blocks each token keeps. ★ best CAB method at its budget (accuracy, then answer "
        "log-prob). Achieved sparsity: the share of causal (query token, key block) pairs CAB dropped, over every "
        "layer and head."
        + (
            " Values recalled (several values of one key): the mean share of the values the answer names, RULER's "
            "score (exact match needs all of them in order)."
            if (summary["variant"] == "multivalue").any()
            else ""
        )
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


# -- figures -----------------------------------------------------------------------------------

#: markers and line styles of the accuracy plot's methods (cycled)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def _heatmap(frame, label: str, path: Path) -> Path:
    from matplotlib.colors import LinearSegmentedColormap

    from .plotting import new_panels, save_figure

    settings = list(dict.fromkeys(zip(frame["variant"], frame["value_kind"], strict=True)))
    grids = []
    for variant, value_kind in settings:
        part = frame[(frame["variant"] == variant) & (frame["value_kind"] == value_kind)]
        grid = part.pivot_table(index="depth", columns="context_length", values="exact_match", aggfunc="mean")
        grids.append(grid.sort_index().sort_index(axis=1))
    width = max(grid.shape[1] for grid in grids)
    height = max(grid.shape[0] for grid in grids)
    fig, axes = new_panels(len(grids), size=(max(4.2, 1.6 + 0.9 * width) * len(grids), 1.8 + 0.5 * height))
    # the label once across the figure, the needle setting over its own panel (save_figure fits both in)
    fig.suptitle(f"Needle in a haystack: {label}")
    cmap = LinearSegmentedColormap.from_list("niah", ["#F0496E", "#EBB839", "#0CD79F"])  # gkamradt's colours
    for ax, grid, (variant, value_kind) in zip(axes, grids, settings, strict=True):
        if len(grids) > 1:
            ax.set_title(f"{variant} needle, {value_kind} values")
        ax.grid(False)
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
    fig.colorbar(image, ax=list(axes), label="exact-match accuracy")
    return save_figure(fig, path)


def _x(row) -> float:
    """Where a row sits on the sparsity axis: its achieved sparsity, else its requested sparsity (else NaN)."""
    return row["achieved_sparsity"] if not math.isnan(row["achieved_sparsity"]) else row["sparsity"]


def _same_points(a: tuple[list, list], b: tuple[list, list]) -> bool:
    """Whether two series ``(x values, y values)`` are the same points (up to the rounding of their means)."""
    return all(
        len(u) == len(v) and all(math.isclose(p, q, rel_tol=1e-9, abs_tol=1e-12) for p, q in zip(u, v, strict=True))
        for u, v in zip(a, b, strict=True)
    )


def _accuracy_plot(summary, path: Path, confidence: float = 0.95) -> Path:
    from .plotting import new_panels, save_figure

    per_length = summary[summary["context_length"] != ALL_LENGTHS]
    settings = list(dict.fromkeys(zip(per_length["variant"], per_length["value_kind"], strict=True)))
    columns = max(per_length.groupby(["variant", "value_kind"])["context_length"].nunique())
    fig, axes = new_panels(columns, size=(6.0 * columns, 0.6 + 4.4 * len(settings)), rows=len(settings), sharey=True)
    level = f"{100 * confidence:g}%"
    suptitle = (
        f"Retrieval exact match against achieved CAB sparsity\n(error bars and dense band: {level} Wilson intervals)"
    )
    fig.suptitle(suptitle)
    names = list(dict.fromkeys(per_length.loc[per_length["method"] != DENSE, "name"]))
    # Methods can give identical points (magnitude exactly under frc): each gets its own marker and line style,
    # markers shrink in drawing order so a later one shows inside an earlier one, and the legend says which coincide.
    styles = {
        name: {
            "color": f"C{i % 10}",
            "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINESTYLES[i % len(_LINESTYLES)],
            "markersize": 9 - 4 * i / max(1, len(names) - 1),
        }
        for i, name in enumerate(names)
    }
    used = 0
    for r, (variant, value_kind) in enumerate(settings):
        setting = per_length[(per_length["variant"] == variant) & (per_length["value_kind"] == value_kind)]
        for c, length in enumerate(dict.fromkeys(setting["context_length"])):
            ax = axes[r * columns + c]
            used += 1
            part = setting[setting["context_length"] == length]
            drawn = {}  # name → its (x, y) in this panel
            for name in names:
                points = part[(part["name"] == name) & (part["method"] != DENSE)].copy()
                points["_x"] = [_x(row) for _, row in points.iterrows()]
                points = points[points["_x"].notna()].sort_values("_x")
                if points.empty:
                    continue
                xy = (points["_x"].tolist(), points["accuracy"].tolist())
                under = [other for other, earlier in drawn.items() if _same_points(xy, earlier)]
                drawn[name] = xy
                below = (points["accuracy"] - points["accuracy_low"]).tolist()
                above = (points["accuracy_high"] - points["accuracy"]).tolist()
                ax.errorbar(
                    *xy,
                    yerr=[below, above],
                    capsize=3,
                    label=f"{name} (same points as {', '.join(under)})" if under else name,
                    **styles[name],
                )
            dense = part[part["method"] == DENSE]
            if len(dense):
                row = dense.iloc[0]
                ax.axhspan(row["accuracy_low"], row["accuracy_high"], color="0.3", alpha=0.12, linewidth=0)
                ax.axhline(row["accuracy"], color="0.3", linestyle="--", label=f"dense (sdpa), {level} band")
            title = f"context length {length} tokens"
            many = len(settings) > 1 or (variant, value_kind) != ("single", "number")
            ax.set_title(f"{title}\n{variant} needle, {value_kind} values" if many else title)
            ax.set_xlabel("achieved sparsity (share of causal token × key-block pairs dropped)")
            ax.set_ylabel("exact-match accuracy")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    for ax in axes:
        if not ax.has_data():
            ax.set_visible(False)
    return save_figure(fig, path)


def write_niah_report(records, out_dir: str | os.PathLike, *, confidence: float = 0.95) -> dict[str, Path]:
    """Write ``summary.csv`` and ``summary.md`` (:func:`summarize_niah`), ``heatmap_<label>.png`` per method and
    ``accuracy_vs_sparsity.png`` (accuracy against achieved sparsity, one line per method name with Wilson error
    bars, dense as a dashed line with its band, one panel per context length; methods whose points coincide keep
    their own marker and line style and are named as coinciding in the legend).

    Returns ``{file name: path}``.
    """
    frame = _frame(records)
    summary = summarize_niah(frame, confidence=confidence)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    summary.to_csv(out / "summary.csv", index=False)
    written["summary.csv"] = out / "summary.csv"
    (out / "summary.md").write_text(_summary_markdown(summary, confidence), encoding="utf-8")
    written["summary.md"] = out / "summary.md"
    frame["exact_match"] = frame["exact_match"].astype(float)
    for label in dict.fromkeys(summary["method"]):
        name = f"heatmap_{label}.png"
        written[name] = _heatmap(frame[frame["method"] == label], label, out / name)
    written["accuracy_vs_sparsity.png"] = _accuracy_plot(summary, out / "accuracy_vs_sparsity.png", confidence)
    return written
