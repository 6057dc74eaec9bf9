"""Long-text perplexity under dense and CAB attention: records checked against an independent loop, the built-in
texts, intervals over windows, CLI.

Tiny random GPT-2 and Llama models over the builder tests' byte-level BPE (no downloads); the reference
NLL is a plain forward per window with ``torch.nn.functional.cross_entropy`` in float64, the reference intervals
scipy's Student-t intervals.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from scipy import stats
from tiny_models import tiny_gpt2, tiny_llama

from hf_icl.cli import main
from hf_icl.evaluation.niah import NIAHMethod, niah_methods
from hf_icl.evaluation.perplexity import (
    BUILTIN_TEXT,
    builtin_text,
    builtin_texts,
    load_builtin_text,
    long_text_perplexity,
    perplexity_markdown,
    text_digest,
)

FIELDS = (
    "method",
    "policy",
    "score",
    "sparsity",
    "kept_blocks",
    "length",
    "windows",
    "tokens",
    "nll",
    "perplexity",
    "perplexity_low",
    "perplexity_high",
    "ratio_to_dense",
    "ratio_low",
    "ratio_high",
    "achieved_sparsity",
    "window_nll",
)


@pytest.fixture(scope="module")
def text():
    return builtin_text()


def _reference_window_nlls(model, tokenizer, text: str, length: int, windows: int) -> list[float]:
    """Mean NLL per predicted token of each of the text's first windows, one plain dense forward each."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    nlls = []
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for w in range(windows):
            window = torch.tensor([ids[w * length : (w + 1) * length]])
            logits = model(window).logits[0].double()
            nlls.append(float(torch.nn.functional.cross_entropy(logits[:-1], window[0, 1:], reduction="mean")))
    return nlls


def _reference_nll(model, tokenizer, text: str, length: int, windows: int) -> float:
    """Mean NLL per predicted token over the text's first windows (every window scores ``length - 1`` tokens)."""
    return float(np.mean(_reference_window_nlls(model, tokenizer, text, length, windows)))


def _exp_t_interval(values, confidence=0.95) -> tuple[float, float]:
    """exp of scipy's Student-t interval of the mean of ``values``."""
    values = np.asarray(values, dtype=np.float64)
    low, high = stats.t.interval(confidence, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    return math.exp(low), math.exp(high)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_perplexity_matches_an_independent_loop_and_sparsity_zero_is_dense(tokenizer, text, kind):
    model = tiny_gpt2(len(tokenizer)) if kind == "gpt2" else tiny_llama(len(tokenizer))
    methods = [*niah_methods(["streaming", "hybrid"], [0.0, 0.75])]
    records = long_text_perplexity(
        model, tokenizer, text, length=160, windows=3, methods=methods, block_size=16, progress=False
    )
    assert [r["method"] for r in records] == [m.label for m in methods]
    for record in records:
        assert tuple(record) == FIELDS
        assert record["tokens"] == 3 * 159 and (record["length"], record["windows"]) == (160, 3)
        assert record["perplexity"] == pytest.approx(math.exp(record["nll"]), rel=1e-12)
        assert len(record["window_nll"]) == 3 and record["nll"] == pytest.approx(np.mean(record["window_nll"]))
    dense = records[0]
    reference = _reference_window_nlls(model, tokenizer, text, 160, 3)
    assert dense["window_nll"] == pytest.approx(reference, abs=1e-5)
    assert dense["nll"] == pytest.approx(np.mean(reference), abs=1e-5)
    assert dense["ratio_to_dense"] == 1.0 and dense["achieved_sparsity"] == 0.0
    assert (dense["ratio_low"], dense["ratio_high"]) == (1.0, 1.0)  # no difference from itself in any window
    for record in records:  # intervals over windows: scipy's t interval of the window NLLs, exponentiated
        low, high = _exp_t_interval(record["window_nll"])
        assert (record["perplexity_low"], record["perplexity_high"]) == pytest.approx((low, high), rel=1e-9)
        assert record["perplexity_low"] <= record["perplexity"] <= record["perplexity_high"]
    for record in records[1:]:
        differences = np.subtract(record["window_nll"], dense["window_nll"])  # paired by window
        assert record["ratio_to_dense"] == pytest.approx(math.exp(differences.mean()), rel=1e-9)
        if record["sparsity"] == 0:  # CAB at sparsity 0 attends densely
            assert record["window_nll"] == pytest.approx(dense["window_nll"], abs=1e-5)
            assert record["ratio_to_dense"] == pytest.approx(1.0, abs=1e-5) and record["achieved_sparsity"] == 0.0
        else:  # dropping blocks changes the numbers, and the record says how much was dropped
            assert record["nll"] != pytest.approx(dense["nll"], abs=1e-6)
            assert 0.3 < record["achieved_sparsity"] < 0.75
            assert record["ratio_to_dense"] == pytest.approx(record["perplexity"] / dense["perplexity"])
            low, high = _exp_t_interval(differences)
            assert (record["ratio_low"], record["ratio_high"]) == pytest.approx((low, high), rel=1e-9)
            assert record["ratio_low"] <= record["ratio_to_dense"] <= record["ratio_high"]
    assert model.config._attn_implementation == "sdpa" and not any(
        name.startswith("cab_") for name in model.config.to_dict()
    )
    table = perplexity_markdown(records, confidence=0.95)
    row = next(line for line in table.splitlines() if line.startswith("| cab-streaming@0.75 |"))
    r = next(r for r in records if r["method"] == "cab-streaming@0.75")
    ppl = f"{r['perplexity']:.4f} [{r['perplexity_low']:.4f}, {r['perplexity_high']:.4f}]"
    ratio = f"{r['ratio_to_dense']:.4f} [{r['ratio_low']:.4f}, {r['ratio_high']:.4f}]"
    assert row == f"| cab-streaming@0.75 | 0.75 | {r['achieved_sparsity']:.3f} | {ppl} | {ratio} |"
    assert "95% Student-t over the 3 windows" in table


def test_a_99_percent_interval_is_wider(tokenizer, text):
    model = tiny_gpt2(len(tokenizer))
    base = {"length": 64, "windows": 4, "methods": niah_methods(["streaming"], [0.5]), "block_size": 16}
    narrow = long_text_perplexity(model, tokenizer, text, progress=False, **base)
    wide = long_text_perplexity(model, tokenizer, text, progress=False, confidence=0.99, **base)
    for a, b in zip(narrow, wide, strict=True):
        assert a["window_nll"] == b["window_nll"]
        assert b["perplexity_low"] < a["perplexity_low"] and a["perplexity_high"] < b["perplexity_high"]
        assert (b["perplexity_low"], b["perplexity_high"]) == pytest.approx(_exp_t_interval(b["window_nll"], 0.99))
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\)"):
        long_text_perplexity(model, tokenizer, text, progress=False, confidence=95, **base)


def test_without_a_dense_method_there_is_no_ratio(tokenizer, text):
    model = tiny_gpt2(len(tokenizer))
    (record,) = long_text_perplexity(
        model, tokenizer, text, length=64, methods=[NIAHMethod("streaming", 0.5)], block_size=16, progress=False
    )
    assert record["ratio_to_dense"] is None and (record["ratio_low"], record["ratio_high"]) == (None, None)
    assert (record["perplexity_low"], record["perplexity_high"]) == (None, None)  # one window: no interval
    assert len(record["window_nll"]) == 1 and record["window_nll"][0] == pytest.approx(record["nll"])
    table = perplexity_markdown([record])
    assert (
        f"| cab-streaming@0.50 | 0.50 | {record['achieved_sparsity']:.3f} | {record['perplexity']:.4f} | – |" in table
    )
    assert "Student-t" not in table
    blocks = {**record, "sparsity": None, "kept_blocks": 2, "method": "cab-quest@2blocks"}
    assert "| cab-quest@2blocks | 2 blocks |" in perplexity_markdown([blocks])


def test_builtin_text_is_fixed_and_long(text):
    assert builtin_text() == text and text_digest(builtin_text()) == text_digest(text)
    assert len(text) > 100_000 and "assert" in text
    assert BUILTIN_TEXT == "python-language-reference" and load_builtin_text(BUILTIN_TEXT) == text


@pytest.mark.parametrize("name", builtin_texts())
def test_every_builtin_text_loads_offline_is_long_and_fixed(tokenizer, name):
    text = load_builtin_text(name)
    again = load_builtin_text.__wrapped__(name)  # built a second time, not from the cache
    assert again == text and text_digest(again) == text_digest(text)
    # ≥ 4 windows of 8,192 tokens with room to spare under a real BPE (about 4 characters a token for English, 3
    # for code): 80k tokens at 4 characters each; the tests' 700-token BPE cuts far finer
    assert len(text) >= 320_000
    assert len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]) >= 80_000
    assert "\x00" not in text and text.count("\n") > 5_000  # lines of text, no binary bytes
    assert len(set(text.split("\n\n"))) > 1_000  # thousands of distinct paragraphs, not a repeated few


def test_the_builtin_texts_are_what_they_say():
    names = builtin_texts()
    assert names[0] == BUILTIN_TEXT and len(names) >= 3 and len(set(names)) == len(names)
    source = load_builtin_text("python-stdlib-source")
    assert source.startswith("# Lib/argparse.py\n") and "class ArgumentParser(" in source and "# Lib/ast.py\n" in source
    docstrings = load_builtin_text("python-stdlib-docstrings")
    assert docstrings.startswith("Abstract Base Classes (ABCs) according to PEP 3119.")
    assert "def " not in docstrings.split("\n\n")[0] and "class ArgumentParser(" not in docstrings
    assert len({text_digest(load_builtin_text(name)) for name in names}) == len(names)


def test_an_unknown_builtin_text_suggests_the_close_names():
    with pytest.raises(
        ValueError,
        match=r"unknown built-in text 'python-stdlib-sorce' \(did you mean "
        r"'python-stdlib-source'( or '[a-z-]+')?\?\); built-in texts: python-language-reference, ",
    ):
        load_builtin_text("python-stdlib-sorce")
    with pytest.raises(ValueError, match=r"unknown built-in text 'wikitext'; built-in texts: "):
        load_builtin_text("wikitext")


def test_bad_inputs_raise_naming_them(tokenizer):
    model = tiny_gpt2(len(tokenizer))  # 256 positions
    short = "The sky is blue. " * 10
    n_tokens = len(tokenizer(short, add_special_tokens=False)["input_ids"])
    base = {"methods": [NIAHMethod()], "progress": False, "block_size": 16}
    cases = [
        ({"length": 64, "windows": 4}, rf"the text has {n_tokens} tokens, fewer than length × windows = 64 × 4"),
        ({"length": 1}, r"length must be .*\[2, \+inf\)"),
        ({"length": 32, "windows": 0}, r"windows must be .*\[1, \+inf\)"),
        ({"length": 300}, "length=300 is more than the model's max_position_embeddings=256"),
        ({"length": 32, "methods": []}, "methods must be a non-empty list"),
        ({"length": 32, "budget": "global"}, "cab_budget"),
        ({"length": 32, "block_size": 24}, "cab_block_size"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            long_text_perplexity(model, tokenizer, short, **{**base, **change})
    with pytest.raises(ValueError, match="text must be a string"):
        long_text_perplexity(model, tokenizer, None, length=32, **base)


def test_cli_end_to_end(tokenizer, tmp_path, capsys):
    saved = tmp_path / "tiny"
    model = tiny_gpt2(len(tokenizer), seed=1)
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    text_file = tmp_path / "text.txt"
    text_file.write_text(builtin_text()[:20_000], encoding="utf-8")
    out = tmp_path / "ppl"
    texts = f"{text_file},python-stdlib-source"
    argv = ["perplexity", "--model", str(saved), "--length", "128,64", "--windows", "2", "--text", texts]
    argv += ["--policies", "streaming", "--sparsities", "0.5,0.9", "--block-size", "16", "--device", "cpu"]
    argv += ["--dtype", "float32", "--output-dir", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| sdpa | 0.00 | 0.000 |" in printed and "| cab-streaming@0.90 |" in printed
    results = json.loads((out / "results.json").read_text())
    report = (out / "results.md").read_text()
    assert report in printed
    header, records = results["header"], results["records"]
    source = load_builtin_text("python-stdlib-source")
    assert header["texts"] == [
        {"name": str(text_file), "sha256": text_digest(text_file.read_text()), "characters": 20_000},
        {"name": "python-stdlib-source", "sha256": text_digest(source), "characters": len(source)},
    ]
    assert (header["lengths"], header["windows"], header["block_size"], header["budget"]) == ([128, 64], 2, 16, "row")
    methods = ["sdpa", "cab-streaming@0.50", "cab-streaming@0.90"]
    runs = [(str(text_file), 128), (str(text_file), 64), ("python-stdlib-source", 128), ("python-stdlib-source", 64)]
    assert [(r["text"], r["length"], r["method"]) for r in records] == [(*run, m) for run in runs for m in methods]
    for (name, length), start in zip(runs, range(0, 12, 3), strict=True):
        text = text_file.read_text() if name == str(text_file) else source
        expected = _reference_window_nlls(model, tokenizer, text, length, 2)
        dense = records[start]
        assert dense["window_nll"] == pytest.approx(expected, abs=1e-5) and dense["windows"] == 2
        interval = _exp_t_interval(dense["window_nll"])  # two windows: t's 12.7 would magnify float32 noise
        assert (dense["perplexity_low"], dense["perplexity_high"]) == pytest.approx(interval, rel=1e-9)
        heading = f"### {name} (sha256 {text_digest(text)[:12]}), windows of {length} tokens"
        assert heading in report
        table = report.split(heading)[1].split("###")[0]
        assert table.count("| cab-streaming@") == 2 and f"| sdpa | 0.00 | 0.000 | {dense['perplexity']:.4f} [" in table
    assert report.count("### ") == 4
    capsys.readouterr()
    for change, match in [
        (["--length", "1"], r"--length must be .*\[2, \+inf\)"),
        (["--length", "64,1"], r"--length must be .*\[2, \+inf\), got 1"),
        (["--length", ""], "--length must name at least one window length"),
        (["--length", "64,64"], "--length must not repeat a length"),
        (["--length", "64,4096"], "--length 4096 is more than the model's max_position_embeddings=256"),
        (["--windows", "500"], f"--text {re.escape(str(text_file))}: .*fewer than length × windows = 128 × 500"),
        (
            ["--text", str(tmp_path / "missing.txt")],
            "--text .*missing.txt: no such file, nor a built-in text; built-in",
        ),
        (
            ["--text", "python-stdlib-sorce"],
            "--text python-stdlib-sorce: no such file, nor a built-in text "
            r"\(did you mean 'python-stdlib-source'( or '[a-z-]+')?\?\); built-in texts: python-language-reference, ",
        ),
        (["--text", "python-stdlib-source,python-stdlib-source"], "--text must not repeat a text"),
        (["--text", " , "], "--text must name at least one built-in text"),
        (["--sparsities", "1.0"], r"sparsities\[0\] must be in \[0, 1\)"),
        (["--block-size", "48"], "--block-size must be a power of two"),
        (["--gguf-file", "x.gguf"], "--gguf-file x.gguf: no such file in the --model directory"),
    ]:
        assert main([*argv, *change]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "hf-icl perplexity: error:" in err and re.search(match, err), err


def test_cli_default_text_is_every_builtin_one(tokenizer, tmp_path, capsys):
    saved = tmp_path / "tiny"
    tiny_gpt2(len(tokenizer), seed=2).save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    out = tmp_path / "ppl"
    argv = ["perplexity", "--model", str(saved), "--length", "64", "--policies", "", "--device", "cpu"]
    assert main([*argv, "--output-dir", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [t["name"] for t in results["header"]["texts"]] == list(builtin_texts())
    assert [t["sha256"] for t in results["header"]["texts"]] == [
        text_digest(load_builtin_text(n)) for n in builtin_texts()
    ]
    assert results["header"]["texts"][0] == {
        "name": BUILTIN_TEXT,
        "sha256": text_digest(builtin_text()),
        "characters": len(builtin_text()),
    }
    assert [(r["text"], r["method"]) for r in results["records"]] == [(name, "sdpa") for name in builtin_texts()]
    assert all(r["perplexity_low"] is None and r["window_nll"] for r in results["records"])  # one window each
    with pytest.raises(SystemExit):
        main(["perplexity", "--help"])
    usage = capsys.readouterr().out
    assert all(name in " ".join(usage.split()) for name in builtin_texts())
