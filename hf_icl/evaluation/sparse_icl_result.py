"""What :func:`hf_icl.evaluation.sparse_icl.sparse_icl_curves` returns: the curves, each method's late error and
ratio to dense, where each method departs from dense (:func:`find_departure`), a table, a JSON document and a figure.
See :mod:`hf_icl.evaluation.sparse_icl` for the definitions (achieved sparsity, late window, departure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..validation import check_float, check_int
from .context_scaling import TRIVIAL, ContextScalingResult
from .plotting import BASELINE_STYLES, band_label, draw_band_curve, new_panels, save_figure
from .sparse_icl_methods import DENSE, LEAST_SQUARES, SparseICLMethod

__all__ = ["Departure", "SparseICLResult", "find_departure"]

# -- departure from dense ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Departure:
    """Where one method's error leaves dense: ``departs`` is the least sparse budget whose late error differs from
    dense's by more than ``threshold`` (relative), ``within`` the sparsest budget before it (every less sparse one
    within the threshold too); either is None when there is none."""

    departs: str | None
    within: str | None
    threshold: float

    def to_dict(self) -> dict:
        return {"departs": self.departs, "within": self.within, "threshold": self.threshold}


#: slack for a ratio that is ``1 + threshold`` up to float rounding
_ROUNDING = 1e-12


def find_departure(entries: Sequence[tuple[str, float, float]], threshold: float = 0.10) -> Departure:
    """The :class:`Departure` of one method's budgets ``entries = [(label, achieved_sparsity, ratio_to_dense)]``:
    walking from the least to the most sparse (ties keep their order), the first entry with ``|ratio - 1| >
    threshold`` departs; the entry before it is the sparsest within.

        >>> find_departure([("k8", 0.5, 1.02), ("k4", 0.75, 1.08), ("k2", 0.87, 1.6)])
        Departure(departs='k2', within='k4', threshold=0.1)
    """
    threshold = check_float("threshold", threshold, low=0.0, low_inclusive=False)
    checked = []
    for i, entry in enumerate(entries):
        try:
            label, achieved, ratio = entry
        except (TypeError, ValueError):
            raise ValueError(
                f"entries[{i}] must be (label, achieved_sparsity, ratio_to_dense), got {entry!r}"
            ) from None
        check_float(f"entries[{i}] achieved_sparsity", achieved, low=0.0, high=1.0)
        check_float(f"entries[{i}] ratio_to_dense", ratio, low=0.0)
        checked.append((str(label), float(achieved), float(ratio)))
    within = None
    for label, _, ratio in sorted(checked, key=lambda entry: entry[1]):
        if abs(ratio - 1.0) > threshold + _ROUNDING:  # a ratio of exactly 1 + threshold is within
            return Departure(label, within, threshold)
        within = label
    return Departure(None, within, threshold)


# -- the result --------------------------------------------------------------------------------------------------


@dataclass
class SparseICLResult:
    """The curves of :func:`sparse_icl_curves` and what they say.

    Attributes:
        curves: the :class:`ContextScalingResult` (dense, every CAB method, least squares, extras, trivial).
        methods: dense and the CAB methods, in evaluation order.
        achieved_sparsity: ``{label: share of causal (query token, key) pairs skipped}`` (dense: 0).
        late_start: first position of the late window (the departure is judged on positions ``late_start..N-1``).
        settings: the run's settings (block size, score, sinks, local window, tokens, prompts, seed, task).
    """

    curves: ContextScalingResult
    methods: list[SparseICLMethod]
    achieved_sparsity: dict[str, float]
    late_start: int
    settings: dict[str, Any]

    @property
    def n_points(self) -> int:
        return self.curves.n_points

    @property
    def tokens_per_example(self) -> float | None:
        return self.settings.get("tokens_per_example")

    def late_error(self, name: str) -> float:
        """Mean error of curve ``name`` over the late window."""
        return float(self.curves.values[name][self.late_start :].mean())

    def ratio_to_dense(self, name: str) -> float:
        """:meth:`late_error` of ``name`` over dense's."""
        dense = self.late_error(DENSE)
        if not dense > 0:
            raise ValueError(f"dense's late error is {dense}: a ratio to it is undefined")
        return self.late_error(name) / dense

    def method_names(self) -> list[str]:
        """The CAB method names, in order (one figure panel each)."""
        return list(dict.fromkeys(m.name for m in self.methods if not m.is_dense))

    def departures(self, threshold: float = 0.10) -> dict[str, Departure]:
        """``{method name: Departure}`` (see the module docstring)."""
        return {
            name: find_departure(
                [
                    (m.label, self.achieved_sparsity[m.label], self.ratio_to_dense(m.label))
                    for m in self.methods
                    if m.name == name
                ],
                threshold,
            )
            for name in self.method_names()
        }

    @property
    def baselines(self) -> list[str]:
        """The non-model curves and extras: least squares, the extra predictors, trivial."""
        labels = {m.label for m in self.methods}
        return [name for name in self.curves.predictors if name not in labels]

    def default_examples(self) -> list[int]:
        n = self.n_points
        return sorted({e for e in (8, 16, 32, 64, n - 1) if 0 <= e < n})

    def to_markdown(self, examples: Sequence[int] | None = None, threshold: float = 0.10) -> str:
        """One row per curve: method, budget, achieved sparsity, error at ``examples`` in-context examples, late
        error and its ratio to dense; then one line per method saying where it departs."""
        examples = self.default_examples() if examples is None else list(examples)
        for i, e in enumerate(examples):
            check_int(f"examples[{i}]", e, low=0, high=self.n_points - 1)
        late = f"mean {self.late_start}–{self.n_points - 1}"
        head = [
            "curve",
            "method",
            "budget",
            "achieved sparsity",
            *(f"{e} ex." for e in examples),
            late,
            "ratio to dense",
        ]
        lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
        by_label = {m.label: m for m in self.methods}
        for name in self.curves.predictors:
            method = by_label.get(name)
            if method is None:
                kind, budget, achieved = name, "—", "—"
            else:
                kind = "dense" if method.is_dense else method.name
                budget = method.budget_text(self.settings["block_size"], self.tokens_per_example)
                achieved = f"{100 * self.achieved_sparsity[name]:.1f}%"
            cells = [f"{float(self.curves.values[name][e]):.3g}" for e in examples]
            ratio = self.ratio_to_dense(name)
            lines.append(
                f"| {name} | {kind} | {budget} | {achieved} | "
                + " | ".join(cells)
                + f" | {self.late_error(name):.3g} | {ratio:.3g} |"
            )
        lines.append("")
        for name, departure in self.departures(threshold).items():
            lines.append(f"- {name}: " + _departure_sentence(departure, self.achieved_sparsity))
        return "\n".join(lines)

    def to_dict(self, threshold: float = 0.10) -> dict[str, Any]:
        """Everything, JSON-ready: settings, curves with bands, per-method numbers, departures."""
        c = self.curves
        return {
            "settings": dict(self.settings),
            "metric": c.metric.name,
            "n_prompts": c.n_prompts,
            "confidence": list(c.confidence),
            "late_positions": [self.late_start, self.n_points - 1],
            "curves": {
                name: {
                    "value": c.values[name].tolist(),
                    "lower": c.lower[name].tolist(),
                    "upper": c.upper[name].tolist(),
                }
                for name in c.predictors
            },
            "methods": [
                {
                    "label": m.label,
                    "name": m.name,
                    "policy": m.policy,
                    "score": None if m.is_dense else m.score(self.settings["score"]),
                    "budget": m.budget,
                    "kept_blocks": m.kept_blocks,
                    "sparsity": m.sparsity,
                    "achieved_sparsity": self.achieved_sparsity[m.label],
                    "late_error": self.late_error(m.label),
                    "ratio_to_dense": self.ratio_to_dense(m.label),
                }
                for m in self.methods
            ],
            "baselines": {
                name: {"late_error": self.late_error(name), "ratio_to_dense": self.ratio_to_dense(name)}
                for name in self.baselines
            },
            "departures": {name: d.to_dict() for name, d in self.departures(threshold).items()},
        }

    def plot(self, path: str | Path, *, title: str | None = None, columns: int = 3, dpi: int = 120) -> Path:
        """Error against the number of in-context examples, one panel per CAB method: dense, least squares, the
        extra predictors, the trivial predictor and every budget of that method (labelled with its achieved
        sparsity), the late window shaded. A log error axis; least squares (≈ 0 past d examples on noiseless
        tasks) may leave it at the bottom."""
        columns = check_int("columns", columns, low=1)
        dpi = check_int("dpi", dpi, low=10)
        names = self.method_names()
        columns = min(columns, len(names))
        rows = -(-len(names) // columns)
        fig, axes = new_panels(columns, (6.5 * columns, 7.0 * rows), rows=rows, sharey=True)
        c = self.curves
        x = torch.arange(self.n_points)
        model_curves = [c.values[m.label] for m in self.methods]
        shown = [*model_curves, *(c.values[b] for b in self.baselines if b != LEAST_SQUARES)]
        floor = min(float(v[v > 0].min()) for v in shown if bool((v > 0).any()))
        ceiling = max(float(v.max()) for v in (*model_curves, c.values[TRIVIAL]))
        import matplotlib

        colormap = matplotlib.colormaps["viridis"]
        settings = self.settings
        for ax, name in zip(axes, names, strict=False):
            ax.grid(True, alpha=0.3)
            ax.axvspan(
                self.late_start,
                self.n_points - 1,
                color="tab:blue",
                alpha=0.07,
                linewidth=0,
                label=f"late window ({self.late_start}–{self.n_points - 1} examples)",
            )
            for i, base in enumerate(self.baselines):
                style = BASELINE_STYLES[0] if base == TRIVIAL else BASELINE_STYLES[1 + i % (len(BASELINE_STYLES) - 1)]
                color = "0.5" if base == TRIVIAL else ("0.2" if base == LEAST_SQUARES else f"C{i + 3}")
                text = {TRIVIAL: "trivial (predict 0)", LEAST_SQUARES: "least squares"}.get(base, base)
                ax.plot(x.tolist(), c.values[base].tolist(), linestyle=style, color=color, label=text)
            draw_band_curve(
                ax,
                x,
                c.values[DENSE],
                c.lower[DENSE],
                c.upper[DENSE],
                color="black",
                linewidth=2.0,
                label="dense attention",
            )
            mine = sorted((m for m in self.methods if m.name == name), key=lambda m: self.achieved_sparsity[m.label])
            for j, m in enumerate(mine):
                share = self.achieved_sparsity[m.label]
                label = (
                    f"{m.budget_text(settings['block_size'], self.tokens_per_example)}, {100 * share:.1f}% sparse, "
                    f"×{self.ratio_to_dense(m.label):.2f} dense"
                )
                color = colormap(0.15 + 0.75 * j / max(1, len(mine) - 1))
                draw_band_curve(
                    ax,
                    x,
                    c.values[m.label],
                    c.lower[m.label],
                    c.upper[m.label],
                    color=color,
                    marker=".",
                    markersize=3,
                    label=label,
                )
            score = mine[0].score(settings["score"]) if mine else None
            ax.set_title(f"CAB policy {name!r}" + (f" (block score {score!r})" if score else ""))
            ax.set_xlabel("number of in-context examples")
            ax.set_ylabel(c.metric.axis_label)
            ax.set_yscale("log")
            ax.set_ylim(floor / 3, ceiling * 2)
            ax.xaxis.get_major_locator().set_params(integer=True)
            handles, labels = ax.get_legend_handles_labels()
            from matplotlib.patches import Patch

            handles.append(Patch(facecolor="0.5", alpha=0.2, linewidth=0))
            labels.append(band_label(c.confidence))
            ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1)
        for ax in axes[len(names) :]:
            ax.set_visible(False)
        examples = (
            f" = {settings['block_size'] / self.tokens_per_example:g} examples" if self.tokens_per_example else ""
        )
        fig.suptitle(
            title
            or (
                f"{settings.get('model', 'ICL model')} on {c.task_name}, {c.n_prompts} prompts: error vs in-context "
                f"examples under CAB (blocks of {settings['block_size']} tokens{examples}, "
                f"sink {settings['sink_blocks']}, local {settings['local_blocks']})"
            )
        )
        return save_figure(fig, path, dpi=dpi)


def _departure_sentence(departure: Departure, achieved: Mapping[str, float]) -> str:
    pct = f"{100 * departure.threshold:g}%"
    within = (
        f"within {pct} of dense down to {departure.within} ({100 * achieved[departure.within]:.1f}% sparse)"
        if departure.within
        else f"no budget within {pct} of dense"
    )
    if departure.departs is None:
        return within + "; no budget departs"
    return within + f"; departs at {departure.departs} ({100 * achieved[departure.departs]:.1f}% sparse)"
