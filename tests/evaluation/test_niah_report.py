"""The needle-in-a-haystack summary and report on hand-made records: every hit rate and interval recounted by a loop
and Wilson's closed form, block budgets (sparsity None), needle settings, records of older files, the figure."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from hf_icl.evaluation import plotting
from hf_icl.evaluation.niah_report import ALL_LENGTHS, SUMMARY_COLUMNS, method_name, summarize_niah, write_niah_report

Z95 = 1.959963984540054
#: label, policy, score, sparsity, kept_blocks, achieved sparsity, chance of a hit where dense hits
METHODS = [
    ("sdpa", "sdpa", None, 0.0, None, 0.0, 1.0),
    ("cab-frc@0.50", "frc", None, 0.5, None, 0.42, 0.8),
    ("cab-streaming@0.50", "streaming", None, 0.5, None, 0.42, 0.6),
    ("cab-frc@0.90", "frc", None, 0.9, None, 0.81, 0.4),
    ("cab-quest@4blocks", "magnitude", "bound", None, 4, 0.7, 0.7),
    ("cab-max_l2@4blocks", "magnitude", "max_l2", None, 4, 0.7, 0.5),
    ("cab-quest@8blocks", "magnitude", "bound", None, 8, 0.45, 0.9),
]


def _wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _records(seed: int = 0, lengths=(64, 128), samples: int = 6, variant: str = "single", value_kind: str = "number"):
    rng = random.Random(seed)
    records = []
    for length in lengths:
        for depth in (0.0, 0.5, 1.0):
            for sample in range(samples):
                dense_hit = rng.random() < 0.75
                for label, policy, score, sparsity, kept_blocks, achieved, keep in METHODS:
                    hit = dense_hit if label == "sdpa" else (rng.random() < (keep if dense_hit else 0.15))
                    records.append(
                        {
                            "method": label,
                            "policy": policy,
                            "score": score,
                            "sparsity": sparsity,
                            "kept_blocks": kept_blocks,
                            "context_length": length,
                            "depth": depth,
                            "sample": sample,
                            "answer": "4821",
                            "generated": "4821" if hit else "1111",
                            "exact_match": hit,
                            "answer_logprob": -rng.random() * 3,
                            "preservation": 1.0 if label == "sdpa" else rng.random(),
                            "achieved_sparsity": achieved + 0.01 * rng.random(),
                            "needle_start": 10,
                            "needle_end": 20,
                            "variant": variant,
                            "value_kind": value_kind,
                        }
                    )
    return records


def _row(summary, method, length, variant="single", value_kind="number"):
    chosen = summary[
        (summary["method"] == method)
        & (summary["context_length"] == length)
        & (summary["variant"] == variant)
        & (summary["value_kind"] == value_kind)
    ]
    assert len(chosen) == 1, (method, length)
    return chosen.iloc[0]


def _prompt(record):
    return (record["context_length"], record["depth"], record["sample"], record["variant"], record["value_kind"])


def test_accuracy_and_its_interval_per_cell_follow_the_formula():
    records = _records()
    summary = summarize_niah(records)
    assert tuple(summary.columns) == SUMMARY_COLUMNS
    assert len(summary) == 3 * len(METHODS)  # 64, 128 and all lengths
    for label, *_ in METHODS:
        for length in (64, 128, ALL_LENGTHS):
            cell = [r for r in records if r["method"] == label and length in (ALL_LENGTHS, r["context_length"])]
            n, hits = len(cell), sum(r["exact_match"] for r in cell)
            row = _row(summary, label, length)
            assert (row["n"], row["hits"]) == (n, hits) and n == (18 if length != ALL_LENGTHS else 36)
            assert row["accuracy"] == pytest.approx(hits / n)
            assert (row["accuracy_low"], row["accuracy_high"]) == pytest.approx(_wilson(hits, n), abs=1e-12)
            assert row["answer_logprob"] == pytest.approx(sum(r["answer_logprob"] for r in cell) / n)
            assert row["preservation"] == pytest.approx(sum(r["preservation"] for r in cell) / n)
            assert row["achieved_sparsity"] == pytest.approx(sum(r["achieved_sparsity"] for r in cell) / n)
            dense = _row(summary, "sdpa", length)["accuracy"]
            assert row["pct_of_dense"] == pytest.approx(100 * row["accuracy"] / dense)
    wide = summarize_niah(records, confidence=0.99)
    row, wider = _row(summary, "cab-frc@0.50", 64), _row(wide, "cab-frc@0.50", 64)
    assert wider["accuracy_low"] < row["accuracy_low"] and row["accuracy_high"] < wider["accuracy_high"]


def test_kept_of_dense_counted_by_a_loop():
    records = _records(seed=1)
    answered = {_prompt(r) for r in records if r["method"] == "sdpa" and r["exact_match"]}
    dropped = next(r for r in records if r["method"] == "cab-frc@0.90" and _prompt(r) in answered)
    records.remove(dropped)  # an unfinished run: the method lacks one prompt dense answered
    summary = summarize_niah(records)
    for label, *_ in METHODS[1:]:
        for length in (64, 128, ALL_LENGTHS):
            dense_hits = kept = 0
            for record in records:
                if record["method"] == label and length in (ALL_LENGTHS, record["context_length"]):
                    if _prompt(record) in answered:
                        dense_hits += 1
                        kept += record["exact_match"]
            row = _row(summary, label, length)
            assert (row["dense_hits"], row["kept"]) == (dense_hits, kept)
            assert row["kept_of_dense"] == pytest.approx(kept / dense_hits)
            assert (row["kept_low"], row["kept_high"]) == pytest.approx(_wilson(kept, dense_hits), abs=1e-12)
    all_dense = sum(_prompt(r)[0] == 64 for r in records if r["method"] == "sdpa" and r["exact_match"])
    assert _row(summary, "cab-frc@0.90", 64)["dense_hits"] + (dropped["context_length"] == 64) == all_dense
    dense = _row(summary, "sdpa", 64)
    assert math.isnan(dense["kept_of_dense"]) and math.isnan(dense["kept_low"]) and dense["kept"] == dense["hits"]


def test_block_budgets_have_no_sparsity_and_their_own_best():
    summary = summarize_niah(_records(seed=2))
    section = summary[summary["context_length"] == 64]
    assert list(section["method"]) == [
        "sdpa",
        "cab-frc@0.50",
        "cab-streaming@0.50",
        "cab-frc@0.90",
        "cab-quest@8blocks",  # block budgets after the sparsities, the most blocks first
        "cab-quest@4blocks",
        "cab-max_l2@4blocks",
    ]
    assert list(section["budget"]) == ["dense", "0.50", "0.50", "0.90", "8 blocks", "4 blocks", "4 blocks"]
    assert list(section["name"]) == ["sdpa", "frc", "streaming", "frc", "quest", "quest", "max_l2"]
    quest = _row(summary, "cab-quest@4blocks", 64)
    assert math.isnan(quest["sparsity"]) and quest["kept_blocks"] == 4 and quest["score"] == "bound"
    assert _row(summary, "cab-frc@0.50", 64)["sparsity"] == 0.5 and pd.isna(_row(summary, "sdpa", 64)["score"])
    for length in (64, 128, ALL_LENGTHS):  # one best per budget: highest accuracy, then log-prob
        section = summary[(summary["context_length"] == length) & (summary["method"] != "sdpa")]
        for budget, group in section.groupby("budget"):
            assert group["best"].sum() == 1
            best = group[group["best"]].iloc[0]
            top = max(zip(group["accuracy"], group["answer_logprob"], strict=True))
            assert (best["accuracy"], best["answer_logprob"]) == top, budget
    assert not summary.loc[summary["method"] == "sdpa", "best"].any()


def test_records_of_older_files_count_as_single_number_without_scores():
    records = _records(seed=3, lengths=(64,))
    old = [
        {k: v for k, v in r.items() if k not in ("score", "kept_blocks", "variant", "value_kind", "achieved_sparsity")}
        for r in records
        if r["kept_blocks"] is None  # older files had sparsity budgets only
    ]
    summary = summarize_niah(old)
    assert set(summary["variant"]) == {"single"} and set(summary["value_kind"]) == {"number"}
    assert set(summary["context_length"]) == {64}  # one length: no pooled rows
    assert summary["achieved_sparsity"].isna().all() and summary["score"].isna().all()
    assert summary["kept_blocks"].isna().all()
    new = summarize_niah([r for r in records if r["kept_blocks"] is None])
    for column in ("n", "hits", "accuracy", "accuracy_low", "kept", "kept_of_dense", "kept_high", "pct_of_dense"):
        assert summary[column].tolist() == pytest.approx(new[column].tolist(), nan_ok=True), column
    with pytest.raises(ValueError, match=r"records lack the fields \['exact_match'\]"):
        summarize_niah([{k: v for k, v in r.items() if k != "exact_match"} for r in old])
    with pytest.raises(ValueError, match="records must not be empty"):
        summarize_niah([])


def test_needle_settings_are_separate_sections_and_dense_is_matched_within_them():
    single = _records(seed=4, lengths=(64,))
    multikey = _records(seed=5, lengths=(64, 128), variant="multikey", value_kind="word")
    summary = summarize_niah(single + multikey)
    columns = (summary["variant"], summary["value_kind"], summary["context_length"])
    sections = list(dict.fromkeys(zip(*columns, strict=True)))
    assert sections == [
        ("single", "number", 64),
        ("multikey", "word", 64),
        ("multikey", "word", 128),
        ("multikey", "word", ALL_LENGTHS),
    ]
    for records, variant, value_kind in [(single, "single", "number"), (multikey, "multikey", "word")]:
        alone = summarize_niah(records)
        for label, *_ in METHODS:
            row, expected = _row(summary, label, 64, variant, value_kind), _row(alone, label, 64, variant, value_kind)
            assert (row["hits"], row["n"], row["kept"], row["dense_hits"]) == (
                expected["hits"],
                expected["n"],
                expected["kept"],
                expected["dense_hits"],
            )


def test_markdown_shows_intervals_budgets_and_sections(tmp_path):
    records = _records(seed=6)
    written = write_niah_report(records, tmp_path)
    assert set(written) >= {"summary.csv", "summary.md", "accuracy_vs_sparsity.png", "heatmap_cab-quest@4blocks.png"}
    assert len([name for name in written if name.startswith("heatmap_")]) == len(METHODS)
    text = (tmp_path / "summary.md").read_text()
    assert [line for line in text.splitlines() if line.startswith("### ")] == [
        "### context length 64",
        "### context length 128",
        "### all lengths",
    ]
    summary = summarize_niah(records)
    row = _row(summary, "cab-quest@4blocks", 128)
    star = " ★" if row["best"] else ""
    method = f"**cab-quest@4blocks**{star}" if row["best"] else "cab-quest@4blocks"
    accuracy = f"{row['accuracy']:.3f} [{row['accuracy_low']:.3f}, {row['accuracy_high']:.3f}]"
    kept = f"{row['kept']}/{row['dense_hits']} [{row['kept_low']:.3f}, {row['kept_high']:.3f}]"
    line = f"| {method} | magnitude (bound score) | 4 blocks | 18 | {accuracy} | {kept} | {row['pct_of_dense']:.1f} |"
    assert line in text
    dense = _row(summary, "sdpa", 64)
    assert f"| sdpa | sdpa | dense | 18 | {dense['accuracy']:.3f} [" in text and "| – | 100.0 |" in text
    assert "95% Wilson score intervals" in text
    csv = (tmp_path / "summary.csv").read_text().splitlines()
    assert csv[0] == ",".join(SUMMARY_COLUMNS) and len(csv) == 1 + len(summary)


def test_the_accuracy_figure_has_a_panel_per_length_and_a_labelled_line_per_method(tmp_path, kept_figures):
    figures = kept_figures(plotting)
    records = _records(seed=7)
    write_niah_report(records, tmp_path)
    fig = figures["accuracy_vs_sparsity.png"]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["context length 64 tokens", "context length 128 tokens"]
    assert "95% Wilson" in fig.get_suptitle()
    summary = summarize_niah(records)
    for ax, length in zip(panels, (64, 128), strict=True):
        assert ax.get_xlabel().startswith("achieved sparsity") and ax.get_ylabel() == "exact-match accuracy"
        handles, labels = ax.get_legend_handles_labels()
        assert sorted(labels) == sorted(["frc", "streaming", "quest", "max_l2", "dense (sdpa), 95% band"])
        lines = dict(zip(labels, handles, strict=True))
        for name in ["frc", "streaming", "quest", "max_l2"]:  # an errorbar container: points at achieved sparsity
            handle = lines[name]
            x, y = handle.lines[0].get_data()
            rows = summary[(summary["context_length"] == length) & (summary["name"] == name)]
            rows = rows.sort_values("achieved_sparsity")
            assert list(x) == pytest.approx(list(rows["achieved_sparsity"]))
            assert list(y) == pytest.approx(list(rows["accuracy"]))
        dense = _row(summary, "sdpa", length)
        assert list(lines["dense (sdpa), 95% band"].get_ydata()) == pytest.approx([dense["accuracy"]] * 2)


def test_method_name():
    assert method_name("sdpa") == "sdpa" and method_name("cab-frc@0.90") == "frc"
    assert method_name("cab-max_l2@16blocks") == "max_l2" and method_name("cab-hybrid@0.975") == "hybrid"
    assert method_name("custom", "frc") == "frc" and method_name("custom") == "custom"


def _report_figures(records, tmp_path, kept_figures):
    """``write_niah_report``'s figures by file name, drawn."""
    figures = kept_figures(plotting)
    write_niah_report(records, tmp_path)
    for fig in figures.values():
        fig.canvas.draw()
    return figures


def _titles(fig):
    shown = [ax.title for ax in fig.axes if ax.get_visible() and ax.get_title()]
    return [fig._suptitle, *shown] if fig._suptitle is not None else shown


def _inside(fig, text) -> bool:
    box, frame = text.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


@pytest.mark.parametrize("settings", [[("single", "number")], [("single", "number"), ("multikey", "word")]])
def test_long_method_labels_wrap_inside_the_heatmap_and_its_panels(tmp_path, kept_figures, settings):
    long = "cab-hybrid_with_a_rather_long_policy_name_from_a_sweep@0.975"
    records = [
        {**r, "method": long} if r["method"] == "cab-frc@0.90" else r
        for variant, value_kind in settings
        for r in _records(seed=9, lengths=(64,), variant=variant, value_kind=value_kind)
    ]
    figures = _report_figures(records, tmp_path, kept_figures)
    for name, fig in figures.items():
        for title in _titles(fig):
            assert _inside(fig, title), (name, title.get_text())
    fig = figures[f"heatmap_{long}.png"]
    assert "".join(fig.get_suptitle().split()) == f"Needleinahaystack:{long}"  # wrapped, nothing dropped
    panels = [title.get_window_extent(fig.canvas.get_renderer()) for title in _titles(fig)[1:]]
    assert len(panels) == (len(settings) if len(settings) > 1 else 0)  # each needle setting over its panel
    assert all(left.x1 < right.x0 for left, right in zip(panels[:-1], panels[1:], strict=True))  # apart


def _legend_texts(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_coinciding_methods_stay_visible_and_are_named_in_the_legend(tmp_path, kept_figures):
    records = _records(seed=8)
    # magnitude exactly under frc: the same hits at the same achieved sparsity
    records += [{**r, "method": r["method"].replace("frc", "magnitude")} for r in records if "frc" in r["method"]]
    fig = _report_figures(records, tmp_path, kept_figures)["accuracy_vs_sparsity.png"]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    for ax in panels:
        legend = _legend_texts(ax)
        assert "magnitude (same points as frc)" in legend and "frc" in legend
        bars = {c.get_label(): c for c in ax.containers}
        frc, magnitude = bars["frc"].lines[0], bars["magnitude (same points as frc)"].lines[0]
        assert list(frc.get_xdata()) == list(magnitude.get_xdata())  # plotted where they are: no offset
        assert list(frc.get_ydata()) == list(magnitude.get_ydata())
        assert frc.get_marker() != magnitude.get_marker() and frc.get_linestyle() != magnitude.get_linestyle()
        assert frc.get_markersize() > magnitude.get_markersize()  # the later one shows inside the earlier one
        styles = {(line.get_marker(), line.get_linestyle()) for line in (c.lines[0] for c in ax.containers)}
        assert len(styles) == len(ax.containers)  # every method drawn its own way
        # every line is a method's (its errorbar's) or dense, and the legend names it
        in_bars = {id(line) for c in ax.containers for line in c.get_children()}
        for line in ax.get_lines():
            if id(line) not in in_bars:
                assert not line.get_label().startswith("_") and line.get_label() in legend
        assert all(c.get_label() in legend for c in ax.containers)
    assert all(_inside(fig, title) for title in _titles(fig))


def test_value_recall_scores_each_value_of_a_multivalue_answer_and_the_table_shows_it():
    """RULER scores a several-values needle by the share of values named: 3 of 4 is 0.75, where exact match is 0."""
    from hf_icl.evaluation.niah_report import _summary_markdown, summarize_niah

    def record(method, generated, sample):
        return dict(
            method=method, policy=method, score=None, sparsity=0.0, kept_blocks=None, context_length=256,
            depth=0.5, sample=sample, answer="11, 22, 33, 44", generated=generated,
            exact_match=generated == "11, 22, 33, 44", answer_logprob=-1.0, preservation=1.0,
            achieved_sparsity=0.0, variant="multivalue", value_kind="number",
        )  # fmt: skip

    records = [
        record("sdpa", "11, 22, 33, 44", 0),
        record("sdpa", "22. 11. 44", 1),  # 3 of 4, out of order
        record("cab-magnitude@16blocks", "11, 99", 0),
        record("cab-magnitude@16blocks", "nothing", 1),
    ]
    summary = summarize_niah(records)
    recall = dict(zip(summary["method"], summary["value_recall"], strict=True))
    assert recall == {"sdpa": (1.0 + 0.75) / 2, "cab-magnitude@16blocks": (0.25 + 0.0) / 2}
    assert dict(zip(summary["method"], summary["accuracy"], strict=True))["sdpa"] == 0.5
    table = _summary_markdown(summary)
    assert "values recalled |" in table and "| 0.875 |" in table and "| 0.125 |" in table
    single = summarize_niah([{**r, "variant": "single", "answer": "11", "generated": g} for r, g in
                             zip(records, ["11", "12", "11", "x"], strict=True)])  # fmt: skip
    assert list(single["value_recall"]) == [0.5, 0.5]  # one value: recall is exact match
    assert "values recalled" not in _summary_markdown(single)
