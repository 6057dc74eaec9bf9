"""Long-text perplexity under dense and CAB attention: records checked against an independent loop, CLI.

Tiny random GPT-2 and Llama models over the builder tests' byte-level BPE (no downloads); the reference
NLL is a plain forward per window with ``torch.nn.functional.cross_entropy`` in float64.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from test_niah_builder import gpt2_like
from test_niah_harness import tiny_gpt2, tiny_llama

from hf_icl.cli import main
from hf_icl.evaluation.niah import NIAHMethod, niah_methods
from hf_icl.evaluation.perplexity import (
    BUILTIN_TEXT,
    builtin_text,
    long_text_perplexity,
    perplexity_markdown,
    text_digest,
)

FIELDS = (
    "method",
    "policy",
    "sparsity",
    "length",
    "windows",
    "tokens",
    "nll",
    "perplexity",
    "ratio_to_dense",
    "achieved_sparsity",
)


@pytest.fixture(scope="module")
def tokenizer():
    return gpt2_like()


@pytest.fixture(scope="module")
def text():
    return builtin_text()


def _reference_nll(model, tokenizer, text: str, length: int, windows: int) -> float:
    """Mean NLL per predicted token: the text's first windows, one plain dense forward each."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    total, count = 0.0, 0
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for w in range(windows):
            window = torch.tensor([ids[w * length : (w + 1) * length]])
            logits = model(window).logits[0].double()
            total += float(torch.nn.functional.cross_entropy(logits[:-1], window[0, 1:], reduction="sum"))
            count += length - 1
    return total / count


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_perplexity_matches_an_independent_loop_and_sparsity_zero_is_dense(tokenizer, text, kind):
    model = tiny_gpt2(len(tokenizer)) if kind == "gpt2" else tiny_llama(len(tokenizer))
    methods = [*niah_methods(["streaming", "hybrid"], [0.0, 0.75])]
    records = long_text_perplexity(
        model, tokenizer, text, length=160, windows=2, methods=methods, block_size=16, progress=False
    )
    assert [r["method"] for r in records] == [m.label for m in methods]
    for record in records:
        assert tuple(record) == FIELDS
        assert record["tokens"] == 2 * 159 and (record["length"], record["windows"]) == (160, 2)
        assert record["perplexity"] == pytest.approx(math.exp(record["nll"]), rel=1e-12)
    dense = records[0]
    reference = _reference_nll(model, tokenizer, text, 160, 2)
    assert dense["nll"] == pytest.approx(reference, abs=1e-5)
    assert dense["ratio_to_dense"] == 1.0 and dense["achieved_sparsity"] == 0.0
    for record in records[1:]:
        if record["sparsity"] == 0:  # CAB at sparsity 0 attends densely
            assert record["nll"] == pytest.approx(dense["nll"], abs=1e-5)
            assert record["ratio_to_dense"] == pytest.approx(1.0, abs=1e-5) and record["achieved_sparsity"] == 0.0
        else:  # dropping blocks changes the numbers, and the record says how much was dropped
            assert record["nll"] != pytest.approx(dense["nll"], abs=1e-6)
            assert 0.3 < record["achieved_sparsity"] < 0.75
            assert record["ratio_to_dense"] == pytest.approx(record["perplexity"] / dense["perplexity"])
    assert model.config._attn_implementation == "sdpa" and not any(
        name.startswith("cab_") for name in model.config.to_dict()
    )


def test_without_a_dense_method_there_is_no_ratio(tokenizer, text):
    model = tiny_gpt2(len(tokenizer))
    (record,) = long_text_perplexity(
        model, tokenizer, text, length=64, methods=[NIAHMethod("streaming", 0.5)], block_size=16, progress=False
    )
    assert record["ratio_to_dense"] is None
    assert "| cab-streaming@0.50 | 0.50 |" in perplexity_markdown([record])


def test_builtin_text_is_fixed_and_long(text):
    assert builtin_text() == text and text_digest(builtin_text()) == text_digest(text)
    assert len(text) > 100_000 and "assert" in text
    assert BUILTIN_TEXT == "python-language-reference"


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
    argv = ["perplexity", "--model", str(saved), "--length", "128", "--windows", "2", "--text", str(text_file)]
    argv += ["--policies", "streaming", "--sparsities", "0.5,0.9", "--block-size", "16", "--device", "cpu"]
    argv += ["--dtype", "float32", "--output-dir", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| sdpa | 0.00 | 0.000 |" in printed and "| cab-streaming@0.90 |" in printed
    results = json.loads((out / "results.json").read_text())
    assert (out / "results.md").read_text() in printed
    header, records = results["header"], results["records"]
    assert header["text"] == str(text_file) and header["text_sha256"] == text_digest(text_file.read_text())
    assert (header["length"], header["windows"], header["block_size"], header["budget"]) == (128, 2, 16, "row")
    assert [r["method"] for r in records] == ["sdpa", "cab-streaming@0.50", "cab-streaming@0.90"]
    expected = _reference_nll(model, tokenizer, text_file.read_text(), 128, 2)
    assert records[0]["nll"] == pytest.approx(expected, abs=1e-5)
    capsys.readouterr()
    for change, match in [
        (["--length", "1"], r"--length must be .*\[2, \+inf\)"),
        (["--length", "4096"], "--length 4096 is more than the model's max_position_embeddings=256"),
        (["--windows", "500"], "fewer than length × windows = 128 × 500"),
        (["--text", str(tmp_path / "missing.txt")], "--text .*missing.txt: no such file"),
        (["--sparsities", "1.0"], r"sparsities\[0\] must be in \[0, 1\)"),
        (["--block-size", "48"], "--block-size must be a power of two"),
        (["--gguf-file", "x.gguf"], "--gguf-file x.gguf: no such file in the --model directory"),
    ]:
        assert main([*argv, *change]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "hf-icl perplexity: error:" in err and re.search(match, err), err


def test_cli_default_text_is_the_builtin_one(tokenizer, tmp_path, capsys):
    saved = tmp_path / "tiny"
    tiny_gpt2(len(tokenizer), seed=2).save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    out = tmp_path / "ppl"
    argv = ["perplexity", "--model", str(saved), "--length", "64", "--policies", "", "--device", "cpu"]
    assert main([*argv, "--output-dir", str(out), "--no-progress"]) == 0
    header = json.loads((out / "results.json").read_text())["header"]
    assert header["text"] == BUILTIN_TEXT and header["text_sha256"] == text_digest(builtin_text())
