"""The needle-in-a-haystack harness: records checked against independent computations, resume, report, CLI.

A tiny random GPT-2 over the builder tests' on-the-fly byte-level BPE (no downloads). Exact match and the
answer log-prob are recomputed with plain forwards; the preservation score is recomputed from queries and
keys captured with forward hooks, with full dense softmax and the full token mask.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch
from tiny_models import gpt2_like, tiny_gpt2, tiny_llama
from tokenizers import processors
from transformers import PreTrainedTokenizerFast

import hf_icl.evaluation.niah as niah
from hf_icl.attention.cab import BUDGETS, CABParams, enable_cab, select_cab_blocks
from hf_icl.attention.preservation import attention_preservation
from hf_icl.cli import main
from hf_icl.data.niah import MULTIKEY_QUESTION, WORDS, NeedleInAHaystackConfig
from hf_icl.evaluation import cab_methods
from hf_icl.evaluation.intervals import wilson_interval
from hf_icl.evaluation.niah import (
    RECORD_FIELDS,
    NIAHMethod,
    load_niah_results,
    needle_preservation,
    niah_methods,
    run_niah,
)
from hf_icl.evaluation.niah_report import summarize_niah, write_niah_report

GRID = {"context_lengths": [96, 128], "depths": [0.0, 0.5, 1.0], "samples_per_cell": 1}
# at sparsity 0.25 the row budget leaves each query block one block beyond its forced two: policies differ
POLICIES = ["frc", "streaming", "oracle"]
N_METHODS = 1 + 3 * 2 + 2
TYPES = {
    "method": str,
    "policy": str,
    "sparsity": float,
    "context_length": int,
    "depth": float,
    "sample": int,
    "answer": str,
    "generated": str,
    "exact_match": bool,
    "answer_logprob": float,
    "preservation": float,
    "achieved_sparsity": float,
    "needle_start": int,
    "needle_end": int,
    "variant": str,
    "value_kind": str,
}


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_gpt2(len(tokenizer))


@pytest.fixture(scope="module")
def records(model, tokenizer):
    methods = [*niah_methods(POLICIES, [0.25, 0.9]), NIAHMethod("dense", 0.9), NIAHMethod("magnitude", 0.0)]
    return run_niah(model, tokenizer, methods=methods, block_size=16, progress=False, **GRID)


def _rows(tokenizer, **grid):
    return list(NeedleInAHaystackConfig(tokenizer=tokenizer, **{**GRID, **grid}).rows())


def _question_tokens(tokenizer) -> int:
    row = _rows(tokenizer, depths=[1.0])[0]
    return row["context_length"] - row["needle_end"]  # at depth 1 the question follows the needle


def test_methods_and_labels():
    methods = niah_methods()
    assert methods[0] == NIAHMethod("sdpa", 0.0) and methods[0].label == "sdpa"
    assert len(methods) == 1 + 6 * 4
    assert {m.policy for m in methods[1:]} == {"frc", "frc_low", "magnitude", "hybrid", "streaming", "oracle"}
    assert NIAHMethod("frc", 0.9).label == "cab-frc@0.90" and NIAHMethod("hybrid", 0.975).label == "cab-hybrid@0.975"
    for bad, match in [
        (lambda: NIAHMethod("nope", 0.5), "method must be one of"),
        (lambda: NIAHMethod("frc", 1.0), r"sparsity must be in \[0, 1\)"),
        (lambda: NIAHMethod("sdpa", 0.5), "sdpa.*sparsity must be 0"),
        (lambda: niah_methods(["frc", "bogus"], [0.5]), r"policies\[1\] must be one of"),
        (lambda: niah_methods(["frc"], [0.5, 1.2]), r"sparsities\[1\] must be in \[0, 1\)"),
        (lambda: niah_methods(["frc", "frc"], [0.5]), "policies must not repeat"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()


def test_records_cover_the_grid_with_typed_fields(records):
    assert len(records) == N_METHODS * 2 * 3 * 1
    keys = {(r["method"], r["context_length"], r["depth"], r["sample"]) for r in records}
    assert len(keys) == len(records)
    for record in records:
        assert tuple(record) == RECORD_FIELDS
        for name, kind in TYPES.items():
            assert type(record[name]) is kind, (name, record[name])
        assert 0.0 <= record["preservation"] <= 1.0 + 1e-6
        assert 0.0 <= record["achieved_sparsity"] < 1.0
        assert math.isfinite(record["answer_logprob"]) and record["answer_logprob"] < 0
        assert record["exact_match"] == (record["generated"] == record["answer"])


def test_answer_logprob_and_exact_match_match_independent_loops(records, model, tokenizer):
    dense = [r for r in records if r["method"] == "sdpa"]
    rows = _rows(tokenizer)
    assert len(dense) == len(rows)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for record, row in zip(dense, rows, strict=True):
            assert (record["context_length"], record["depth"]) == (row["context_length"], row["depth"])
            ids = list(row["input_ids"])
            logprob = 0.0
            for i, token in enumerate(row["answer_ids"]):  # one forward per answer token
                logits = model(torch.tensor([ids + row["answer_ids"][:i]])).logits[0, -1]
                logprob += float(torch.log_softmax(logits.double(), -1)[token])
            assert record["answer_logprob"] == pytest.approx(logprob, abs=1e-4)
            greedy = list(ids)
            for _ in row["answer_ids"]:  # argmax token by token, no cache
                greedy.append(int(model(torch.tensor([greedy])).logits[0, -1].argmax()))
            text = tokenizer.decode(greedy[len(ids) :]).strip()
            assert record["generated"] == text
            assert record["exact_match"] == (text == row["answer"])


def test_dense_selections_preserve_everything(records):
    for record in records:
        if record["method"] in ("sdpa", "cab-dense@0.90", "cab-magnitude@0.00"):
            assert record["preservation"] == pytest.approx(1.0, abs=1e-6)
            assert record["achieved_sparsity"] == 0.0
        elif record["method"].endswith("@0.90"):  # the forced sink and diagonal blocks weigh a lot at 96-128 tokens
            assert 0.4 < record["achieved_sparsity"] < 0.9
    # the dense policy runs CAB's sparse path over every causal block: the same model outputs as dense
    by_key = {(r["method"], r["context_length"], r["depth"]): r for r in records}
    for (method, length, depth), record in by_key.items():
        if method == "cab-dense@0.90":
            assert record["answer_logprob"] == pytest.approx(by_key["sdpa", length, depth]["answer_logprob"], abs=1e-4)


def test_dropping_the_needle_blocks_loses_its_attention(records):
    # streaming at 0.9 keeps the sink block and the question's own block only (8 blocks of 16 at length 128)
    record = next(r for r in records if r["method"] == "cab-streaming@0.90" and r["context_length"] == 128)
    assert record["depth"] == 0.0 and record["needle_start"] == 0  # the needle sits in the kept sink block
    assert record["preservation"] > 0.0
    middle = next(
        r for r in records if r["method"] == "cab-streaming@0.90" and r["context_length"] == 128 and r["depth"] == 0.5
    )
    assert 16 <= middle["needle_start"] and middle["needle_end"] <= 112  # the needle lies in dropped blocks only
    assert middle["preservation"] == 0.0
    assert any(0.0 < r["preservation"] < 1.0 for r in records)
    # with a free block per row the policies choose differently, and it shows in the score
    by_policy = {
        policy: [r["preservation"] for r in records if r["method"] == f"cab-{policy}@0.25"] for policy in POLICIES
    }
    assert by_policy["frc"] != by_policy["streaming"] and by_policy["oracle"] != by_policy["streaming"]


def _captured_qk(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's query and key, ``(1, H, N, D)``, read off GPT-2's fused qkv projection with hooks."""
    captured = []
    heads, dim = model.config.n_head, model.config.n_embd // model.config.n_head

    def hook(module, inputs, output):
        q, k, _ = output.split(model.config.n_embd, dim=2)
        captured.append(tuple(x.view(1, -1, heads, dim).transpose(1, 2) for x in (q, k)))

    handles = [block.attn.c_attn.register_forward_hook(hook) for block in model.transformer.h]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return captured


@pytest.mark.parametrize("method", ["cab-frc@0.25", "cab-streaming@0.25", "cab-oracle@0.25", "cab-frc@0.90"])
def test_preservation_matches_an_independent_full_computation(records, model, tokenizer, method):
    # the probe watches the teacher-forced forward over prompt + answer and scores the prompt's last queries
    policy, sparsity = method[4:].split("@")
    n_rows = _question_tokens(tokenizer)
    params = CABParams(sparsity=float(sparsity), policy=policy, block_size=16, min_seq_len=0)
    for row in _rows(tokenizer, context_lengths=[128]):
        record = next(
            r for r in records if (r["method"], r["context_length"], r["depth"]) == (method, 128, row["depth"])
        )
        full = row["input_ids"] + row["answer_ids"]
        enable_cab(model, **{k: getattr(params, k) for k in ("sparsity", "policy", "block_size", "min_seq_len")})
        try:
            layers = _captured_qk(model, torch.tensor([full]))
        finally:
            model.set_attn_implementation("sdpa")
        assert len(layers) == 2
        n, p = len(full), len(row["input_ids"])
        needle = torch.zeros(p, dtype=torch.bool)
        needle[row["needle_start"] : row["needle_end"]] = True
        scores, kept_pairs, causal_pairs = [], 0, 0
        for q, k in layers:
            scaling = q.shape[-1] ** -0.5
            token_keep = select_cab_blocks(q, k, params, scaling)  # (1, H, n, Mk): one row per query token
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            probs = torch.softmax((q @ k.transpose(-1, -2) * scaling).masked_fill(~causal, -math.inf), -1)
            kept = token_keep.repeat_interleave(16, dim=3)[..., :n] & causal  # token level
            rows = slice(p - n_rows, p)
            scores.append(attention_preservation(probs[:, :, rows, :p], kept[:, :, rows, :p], needle).mean())
            block_causal = (torch.arange(n)[:, None] // 16) >= torch.arange(token_keep.shape[-1])
            kept_pairs += int((token_keep & block_causal).sum())
            causal_pairs += int(block_causal.sum()) * token_keep.shape[1]
        assert record["preservation"] == pytest.approx(float(torch.stack(scores).mean()), abs=1e-5)
        assert record["achieved_sparsity"] == pytest.approx(1 - kept_pairs / causal_pairs, abs=1e-9)


@pytest.mark.parametrize(("n_q", "n_k", "rows"), [(100, 100, 9), (100, 100, 40), (37, 69, 5), (64, 128, 64)])
def test_needle_preservation_equals_full_masked_softmax(n_q, n_k, rows):
    g = torch.Generator().manual_seed(n_q + rows)
    q, k = torch.randn(2, 4, n_q, 32, generator=g), torch.randn(2, 2, n_k, 32, generator=g)  # grouped-query heads
    token_keep = torch.rand(2, 4, n_q, -(-n_k // 16), generator=g) < 0.5  # per query token
    offset = n_k - n_q
    got = needle_preservation(
        q, k, token_keep, block_size=16, scaling=0.2, needle_start=20, needle_end=50, last_rows=rows
    )
    k_full = k.repeat_interleave(2, dim=1)
    causal = (offset + torch.arange(n_q))[:, None] >= torch.arange(n_k)
    probs = torch.softmax((q @ k_full.transpose(-1, -2) * 0.2).masked_fill(~causal, -math.inf), -1)
    # written out: query i (position offset + i) sees key j iff j's block is kept for it and j <= its position
    kept = token_keep.repeat_interleave(16, dim=3)[..., :n_k] & causal
    needle = torch.arange(n_k)
    expected = attention_preservation(probs[:, :, -rows:], kept[:, :, -rows:], (needle >= 20) & (needle < 50))
    assert got.shape == (2, 4)
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="token_keep must be a per-token selection"):
        needle_preservation(
            q, k, token_keep[:, :, :3], block_size=16, scaling=0.2, needle_start=20, needle_end=50, last_rows=rows
        )


def test_attention_implementation_and_mode_are_restored(tokenizer):
    model = tiny_gpt2(len(tokenizer))
    model.set_attn_implementation("eager")
    model.train()
    methods = [NIAHMethod(), NIAHMethod("hybrid", 0.75)]
    run_niah(model, tokenizer, methods=methods, progress=False, context_lengths=[96], depths=[0.5], samples_per_cell=1)
    assert model.config._attn_implementation == "eager" and model.training
    assert not any(name.startswith("cab_") for name in model.config.to_dict())


def test_a_file_from_before_a_cab_field_resumes_with_its_default(tokenizer, model, tmp_path):
    path = tmp_path / "old.jsonl"
    grid = {"methods": [NIAHMethod("magnitude", 0.5)], "context_lengths": [96], "depths": [0.5], "samples_per_cell": 1}
    grid["progress"] = False
    first = run_niah(model, tokenizer, results_file=path, **grid)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    del header["niah_header"]["cab"]["local_blocks"]  # as written before cab_local_blocks existed (default 1)
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert run_niah(model, tokenizer, results_file=path, **grid) == first
    model.config.cab_local_blocks = 2
    try:
        with pytest.raises(ValueError, match="another configuration.*local_blocks"):
            run_niah(model, tokenizer, results_file=path, **grid)
    finally:
        del model.config.cab_local_blocks


def test_resume_skips_done_records_and_refuses_another_config(tokenizer, model, tmp_path, monkeypatch):
    path = tmp_path / "niah" / "results.jsonl"
    methods = [NIAHMethod(), NIAHMethod("frc", 0.75)]
    partial = {"context_lengths": [96], "depths": [0.0, 1.0], "samples_per_cell": 1}
    first = run_niah(model, tokenizer, methods=methods, results_file=path, progress=False, **partial)
    assert len(first) == 4
    computed = []
    original = niah._evaluate_row

    def counting(model, tokenizer, row, method, *args):
        computed.append((method.label, row["context_length"], row["depth"], row["sample"]))
        return original(model, tokenizer, row, method, *args)

    monkeypatch.setattr(niah, "_evaluate_row", counting)
    with path.open("a") as handle:  # a crash in the middle of a write leaves a partial line
        handle.write('{"method": "sdpa", "context_len')
    full = run_niah(model, tokenizer, methods=methods, results_file=path, progress=True, **GRID)
    assert len(full) == 2 * 2 * 3
    done = {(r["method"], r["context_length"], r["depth"], r["sample"]) for r in first}
    assert len(computed) == len(full) - len(first) and not done & set(computed)
    lines = path.read_text().splitlines()
    assert "niah_header" in json.loads(lines[0])
    stored = [json.loads(line) for line in lines[1:]]
    keys = [(r["method"], r["context_length"], r["depth"], r["sample"]) for r in stored]
    assert len(keys) == len(set(keys)) == len(full)
    assert load_niah_results(path) == stored
    assert [r for r in full if r in first] == first  # loaded records come back as they were written
    computed.clear()
    again = run_niah(model, tokenizer, methods=methods, results_file=path, progress=False, **GRID)
    assert again == full and computed == []
    other_budget = next(budget for budget in BUDGETS if budget != "row")
    for change in ({"seed": 1}, {"block_size": 32}, {"budget": other_budget}):
        with pytest.raises(ValueError, match="another configuration.*" + next(iter(change))):
            run_niah(model, tokenizer, methods=methods, results_file=path, progress=False, **{**GRID, **change})
    with pytest.raises(ValueError, match="tokenizer"):
        other = gpt2_like()
        other.add_tokens(["<extra>"])
        run_niah(model, other, methods=methods, results_file=path, progress=False, **GRID)


def test_summary_and_report(records, tmp_path):
    summary = summarize_niah(records)
    order = [
        "sdpa",
        "cab-magnitude@0.00",
        "cab-frc@0.25",
        "cab-streaming@0.25",
        "cab-oracle@0.25",
        "cab-frc@0.90",
        "cab-streaming@0.90",
        "cab-oracle@0.90",
        "cab-dense@0.90",
    ]
    assert list(summary["context_length"]) == [96] * N_METHODS + [128] * N_METHODS + ["all"] * N_METHODS
    for length, n in [(96, 3), (128, 3), ("all", 6)]:  # one section per context length, then all lengths pooled
        section = summary[summary["context_length"] == length]
        assert list(section["method"]) == order and (section["n"] == n).all()
    pooled = summary[summary["context_length"] == "all"]
    frc = [r for r in records if r["method"] == "cab-frc@0.90"]
    row = pooled.set_index("method").loc["cab-frc@0.90"]
    hits = sum(r["exact_match"] for r in frc)
    assert row["accuracy"] == pytest.approx(hits / 6) and row["hits"] == hits
    assert (row["accuracy_low"], row["accuracy_high"]) == pytest.approx(wilson_interval(hits, 6))
    assert row["answer_logprob"] == pytest.approx(sum(r["answer_logprob"] for r in frc) / 6)
    assert row["preservation"] == pytest.approx(sum(r["preservation"] for r in frc) / 6)
    assert pooled.groupby("sparsity")["best"].sum().to_dict() == {0.0: 1, 0.25: 1, 0.9: 1}
    for length in (96, 128):
        assert summary[summary["context_length"] == length].groupby("sparsity")["best"].sum().to_dict() == {
            0.0: 1,
            0.25: 1,
            0.9: 1,
        }
    written = write_niah_report(records, tmp_path / "report")
    for name in [
        "summary.csv",
        "summary.md",
        "accuracy_vs_sparsity.png",
        "heatmap_sdpa.png",
        "heatmap_cab-frc@0.90.png",
    ]:
        assert (tmp_path / "report" / name).stat().st_size > 0 and name in written
    assert len([p for p in written if p.startswith("heatmap_")]) == N_METHODS
    table = [line for line in (tmp_path / "report" / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 3 * (1 + N_METHODS)  # per section (96, 128, all lengths): header + one row per method
    assert sum("★" in line for line in table) == 3 * 3


def test_percent_of_dense_and_best_policy():
    def record(method, sparsity, hit, logprob):
        policy = "sdpa" if method == "sdpa" else method
        label = "sdpa" if method == "sdpa" else f"cab-{method}@{sparsity:.2f}"
        return {
            "method": label,
            "policy": policy,
            "sparsity": sparsity,
            "context_length": 96,
            "depth": 0.5,
            "sample": 0,
            "answer": "1",
            "generated": "1" if hit else "2",
            "exact_match": hit,
            "answer_logprob": logprob,
            "preservation": 1.0,
        }

    records = [record("sdpa", 0.0, True, -1.0), record("sdpa", 0.0, True, -1.0)]
    records += [record("frc", 0.5, True, -2.0), record("frc", 0.5, False, -2.0)]
    records += [record("magnitude", 0.5, True, -1.0), record("magnitude", 0.5, False, -1.0)]  # tie: log-prob wins
    records += [record("frc", 0.9, False, -3.0), record("frc", 0.9, False, -3.0)]
    summary = summarize_niah(records).set_index("method")
    assert summary.loc["cab-frc@0.50", "pct_of_dense"] == pytest.approx(50.0)
    assert summary.loc["cab-frc@0.90", "pct_of_dense"] == 0.0
    assert summary.loc["cab-magnitude@0.50", "best"] and not summary.loc["cab-frc@0.50", "best"]
    assert summary.loc["cab-frc@0.90", "best"] and not summary.loc["sdpa", "best"]


def test_a_model_that_answers_right_scores_exact_match(tokenizer, monkeypatch):
    model = tiny_gpt2(len(tokenizer))
    row = _rows(tokenizer, context_lengths=[96], depths=[0.5])[0]

    def echo(ids, **kwargs):  # a perfect retriever: the prompt followed by the passkey's tokens
        assert kwargs["max_new_tokens"] == len(row["answer_ids"]) and kwargs["do_sample"] is False
        return torch.cat([ids, torch.tensor([row["answer_ids"]])], dim=1)

    monkeypatch.setattr(model, "generate", echo)
    (record,) = run_niah(
        model, tokenizer, methods=[NIAHMethod()], progress=False, context_lengths=[96], depths=[0.5], samples_per_cell=1
    )
    assert record["generated"] == row["answer"] and record["exact_match"] is True


def test_bad_arguments_raise_naming_them(model, tokenizer):
    base = {"methods": [NIAHMethod()], "progress": False, **GRID}
    for change, match in [
        ({"depths": [0.5, 1.5]}, r"depths\[1\].*1.5"),
        ({"block_size": 24}, "cab_block_size"),
        ({"budget": "nope"}, "cab_budget"),
        ({"methods": ["sdpa"]}, r"methods\[0\] must be a NIAHMethod"),
        ({"methods": [NIAHMethod(), NIAHMethod()]}, "methods must not repeat"),
        ({"context_lengths": [300]}, "max_position_embeddings=256"),
        ({"preservation_queries": 0}, "preservation_queries"),
    ]:
        with pytest.raises(ValueError, match=match):
            run_niah(model, tokenizer, **{**base, **change})


def test_cli_end_to_end_and_resume(tokenizer, tmp_path, capsys):
    saved = tmp_path / "tiny"
    tiny_gpt2(len(tokenizer), seed=1).save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    out = tmp_path / "niah"
    argv = ["niah", "--model", str(saved), "--lengths", "96,128", "--depths", "0,0.5", "--samples", "1"]
    argv += ["--policies", "frc,streaming", "--sparsities", "0.5,0.9", "--device", "cpu", "--dtype", "float32"]
    argv += ["--output-dir", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| cab-streaming@0.90 |" in printed or "**cab-streaming@0.90**" in printed
    results = (out / "results.jsonl").read_text()
    assert len(results.splitlines()) == 1 + 5 * 2 * 2
    for name in ["summary.csv", "summary.md", "accuracy_vs_sparsity.png", "heatmap_cab-frc@0.50.png"]:
        assert (out / name).exists()
    assert main(argv) == 0  # a rerun resumes: nothing is recomputed or appended
    assert (out / "results.jsonl").read_text() == results
    capsys.readouterr()
    for change, match in [
        (["--depths", "0,1.5"], r"depths\[1\]"),
        (["--sparsities", "0.5,1"], r"sparsities\[1\] must be in \[0, 1\)"),
        (["--policies", "frc,nope"], r"policies\[1\] must be one of"),
        (["--block-size", "32"], "another configuration"),
        (["--sink-blocks", "2"], "another configuration"),  # the knob reaches the config the header records
        (["--magnitude-fraction", "1.5"], "cab_magnitude_fraction"),
        (["--lam", "-1"], "cab_lambda"),
    ]:
        assert main([*argv, *change]) == 2
        err = capsys.readouterr().err
        assert "hf-icl niah: error:" in err and re.search(match, err), err


def _saved_tiny_gpt2(tokenizer, tmp_path):
    saved = tmp_path / "tiny"
    tiny_gpt2(len(tokenizer), seed=2).save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    return saved


def _selection_spy(monkeypatch):
    """Records the selection rule of every CAB attention call's selection (a namespace of the rule's fields);
    returns (the list, the spy) so callers can patch more places."""
    from types import SimpleNamespace

    from hf_icl.attention import cab

    seen, original = [], cab.token_block_selector

    def spy(query, key, **rule):
        seen.append(SimpleNamespace(**rule))
        return original(query, key, **rule)

    monkeypatch.setattr(cab, "token_block_selector", spy)
    return seen, spy


def test_cli_cab_knobs_are_recorded_and_used(tokenizer, tmp_path, monkeypatch):
    saved = _saved_tiny_gpt2(tokenizer, tmp_path)
    seen, _ = _selection_spy(monkeypatch)
    out = tmp_path / "knobs"
    argv = [
        "niah",
        "--model",
        str(saved),
        "--lengths",
        "96",
        "--depths",
        "0.5",
        "--samples",
        "1",
        "--policies",
        "hybrid",
    ]
    argv += ["--sparsities", "0.5", "--device", "cpu", "--output-dir", str(out), "--no-progress"]
    argv += ["--sink-blocks", "0", "--lam", "0.25", "--magnitude-fraction", "1"]
    assert main(argv) == 0
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])["niah_header"]
    assert {name: header["cab"][name] for name in ("lam", "sink_blocks", "magnitude_fraction")} == {
        "lam": 0.25,
        "sink_blocks": 0,
        "magnitude_fraction": 1.0,
    }
    # every other CAB field is recorded too; the ones run_niah sets per method are not
    assert set(header["cab"]) == set(CABParams.__dataclass_fields__) - set(cab_methods.CAB_FIELDS_SET_BY_RUN)
    assert header["chat_template"] is False and header["gguf_file"] is None
    assert seen and all((p.sink_blocks, p.lam, p.magnitude_fraction) == (0, 0.25, 1.0) for p in seen)


def test_a_bos_token_the_tokenizer_adds_is_prepended(monkeypatch):
    tokenizer = gpt2_like()
    backend = tokenizer.backend_tokenizer
    backend.add_special_tokens(["<s>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")
    assert tokenizer("The sky")["input_ids"][0] == bos
    model = tiny_gpt2(len(tokenizer))
    seen, spans = [], []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda ids, **kw: seen.append(ids[0].tolist()) or generate(ids, **kw))

    class Probe(niah.PreservationProbe):
        def __init__(self, start, end, rows, prompt_length):
            spans.append((start, end, prompt_length))
            super().__init__(start, end, rows, prompt_length)

    monkeypatch.setattr(niah, "PreservationProbe", Probe)
    grid = {"context_lengths": [96], "depths": [0.5], "samples_per_cell": 1}
    (record,) = run_niah(model, tokenizer, methods=[NIAHMethod("streaming", 0.25)], progress=False, **grid)
    (row,) = _rows(tokenizer, **grid)
    assert seen == [[bos, *row["input_ids"]]]  # the random model misses the passkey: generate runs on the prompt
    assert spans == [(row["needle_start"] + 1, row["needle_end"] + 1, 1 + len(row["input_ids"]))]
    assert (record["needle_start"], record["needle_end"]) == (row["needle_start"], row["needle_end"])


# -- greedy exact match from the teacher-forced forward ----------------------------------------------


@pytest.mark.parametrize("method", [NIAHMethod(), NIAHMethod("streaming", 0.5), NIAHMethod("hybrid", 0.5)])
def test_the_teacher_forced_shortcut_gives_the_record_generate_gives(tokenizer, monkeypatch, method):
    model = tiny_gpt2(len(tokenizer), seed=3)
    (row,) = _rows(tokenizer, context_lengths=[128], depths=[0.5])
    calls = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda ids, **kw: calls.append(1) or generate(ids, **kw))
    original_predicate = niah._greedy_is_answer
    with cab_methods.restoring_attention(model):
        model.eval()
        cab_methods.apply_method(model, method, 16, "row")
        # a row whose answer is the model's own greedy continuation (cached decoding), so the shortcut applies
        with torch.no_grad():
            out = generate(torch.tensor([row["input_ids"]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
        own = out[0, len(row["input_ids"]) :].tolist()
        hit = {**row, "answer_ids": own, "answer": tokenizer.decode(own).strip()}
        for case, expect_shortcut in ((hit, True), (row, False)):
            calls.clear()
            fast = niah._evaluate_row(model, tokenizer, case, method, 9, 0, niah._PromptWrap())
            assert (calls == []) is expect_shortcut  # generate runs only when the argmax misses the answer
            monkeypatch.setattr(niah, "_greedy_is_answer", lambda *args: False)  # force the generate path
            try:
                slow = niah._evaluate_row(model, tokenizer, case, method, 9, 0, niah._PromptWrap())
            finally:
                monkeypatch.setattr(niah, "_greedy_is_answer", original_predicate)
            assert calls and fast == slow
        assert fast["exact_match"] is False and slow["generated"] != row["answer"]


# -- chat models: prompts wrapped in the tokenizer's chat template -------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """The builder tests' byte-level BPE with two control tokens and a ChatML template."""
    tokenizer = gpt2_like()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _chat_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The ChatML text around a user message, tokenised by hand (not through apply_chat_template)."""

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return ids("<|im_start|>user\n"), ids("<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_wraps_every_prompt(monkeypatch, tmp_path):
    tokenizer = chat_tokenizer()
    model = tiny_llama(len(tokenizer))
    prefix, suffix = _chat_ids(tokenizer)
    assert prefix[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and len(suffix) > 2
    forwards, probes = [], []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: forwards.append(kwargs["input_ids"][0].tolist()), with_kwargs=True
    )

    class Probe(niah.PreservationProbe):
        def __init__(self, start, end, rows, prompt_length):
            probes.append((start, end, rows, prompt_length))
            super().__init__(start, end, rows, prompt_length)

    monkeypatch.setattr(niah, "PreservationProbe", Probe)
    grid = {"context_lengths": [96], "depths": [0.0, 1.0], "samples_per_cell": 1}
    methods = [NIAHMethod(), NIAHMethod("streaming", 0.5)]
    path = tmp_path / "chat.jsonl"
    records = run_niah(
        model, tokenizer, methods=methods, chat_template=True, block_size=16, progress=False, results_file=path, **grid
    )
    hook.remove()
    rows = _rows(tokenizer, **grid)
    question = _question_tokens(tokenizer)
    # the teacher-forced forwards see prefix + row + suffix + answer (generate's calls come after, per record)
    teacher_forced = [ids for ids in forwards if ids[: len(prefix)] == prefix and len(ids) > 96]
    for row in rows:
        assert [*prefix, *row["input_ids"], *suffix, *row["answer_ids"]] in teacher_forced
    shift, prompt = len(prefix), len(prefix) + 96 + len(suffix)
    assert probes == [
        (row["needle_start"] + shift, row["needle_end"] + shift, question + len(suffix), prompt) for row in rows
    ]
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        for record, row in zip(records[:2], rows, strict=True):  # dense: recomputed with a plain loop
            assert (record["needle_start"], record["needle_end"]) == (row["needle_start"], row["needle_end"])
            ids = [*prefix, *row["input_ids"], *suffix]
            logprob, greedy = 0.0, list(ids)
            for i, token in enumerate(row["answer_ids"]):
                logits = model(torch.tensor([ids + row["answer_ids"][:i]])).logits[0, -1].double()
                logprob += float(torch.log_softmax(logits, -1)[token])
                greedy.append(int(model(torch.tensor([greedy])).logits[0, -1].argmax()))
            assert record["answer_logprob"] == pytest.approx(logprob, abs=1e-4)
            assert record["generated"] == tokenizer.decode(greedy[len(ids) :], skip_special_tokens=True).strip()
    header = json.loads(path.read_text().splitlines()[0])["niah_header"]
    assert header["chat_template"] is True
    with pytest.raises(ValueError, match="another configuration.*chat_template"):
        run_niah(model, tokenizer, methods=methods, block_size=16, progress=False, results_file=path, **grid)


def test_answer_prefix_opens_the_assistant_turn(tmp_path):
    tokenizer = chat_tokenizer()
    model = tiny_llama(len(tokenizer))
    prefix, suffix = _chat_ids(tokenizer)
    opening = tokenizer("The pass key is", add_special_tokens=False)["input_ids"]
    forwards = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: forwards.append(kwargs["input_ids"][0].tolist()), with_kwargs=True
    )
    grid = {"context_lengths": [96], "depths": [0.5], "samples_per_cell": 1}
    path = tmp_path / "prefixed.jsonl"
    run_niah(
        model,
        tokenizer,
        methods=[NIAHMethod()],
        chat_template=True,
        answer_prefix="The pass key is",
        progress=False,
        results_file=path,
        **grid,
    )
    hook.remove()
    (row,) = _rows(tokenizer, **grid)
    assert [*prefix, *row["input_ids"], *suffix, *opening, *row["answer_ids"]] in forwards
    header = json.loads(path.read_text().splitlines()[0])["niah_header"]
    assert header["answer_prefix"] == "The pass key is"
    with pytest.raises(ValueError, match="another configuration.*answer_prefix"):
        run_niah(
            model, tokenizer, methods=[NIAHMethod()], chat_template=True, progress=False, results_file=path, **grid
        )
    with pytest.raises(ValueError, match="answer_prefix must be a non-empty string"):
        run_niah(model, tokenizer, methods=[NIAHMethod()], answer_prefix="  ", progress=False, **grid)


def test_chat_template_needs_one_that_writes_the_message_once(tokenizer, model):
    grid = {"methods": [NIAHMethod()], "progress": False, "context_lengths": [96], "depths": [0.5]}
    with pytest.raises(ValueError, match="chat_template=True needs a tokenizer with a chat_template"):
        run_niah(model, tokenizer, chat_template=True, samples_per_cell=1, **grid)
    twice = chat_tokenizer()
    twice.chat_template = "{% for m in messages %}{{ m['content'] }} {{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="verbatim exactly once"):
        run_niah(tiny_gpt2(len(twice)), twice, chat_template=True, samples_per_cell=1, **grid)


# -- GGUF checkpoints ----------------------------------------------------------------------------------


def write_tiny_gguf(path, model, tokenizer) -> None:
    """Write a Llama and its byte-level BPE tokenizer (with chat template) as an F32 GGUF file, as llama.cpp's
    converter lays it out: q/k rows permuted to its rotary layout, which transformers undoes on loading."""
    import numpy as np

    gguf = pytest.importorskip("gguf")
    config = model.config
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    special = set(tokenizer.all_special_tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_chat_template(tokenizer.chat_template)

    def permute(weight, heads):  # llama.cpp's rotary layout of q and k rows
        return weight.reshape(heads, 2, weight.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)

    names = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm"}
    leaves = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for layer in range(config.num_hidden_layers):
        names.update({f"model.layers.{layer}.{hf}": f"blk.{layer}.{gg}" for hf, gg in leaves.items()})
    for name, tensor in model.state_dict().items():
        weight = tensor.detach().float().numpy()
        target = names[name.removesuffix(".weight")]
        if target.endswith("attn_q"):
            weight = permute(weight, config.num_attention_heads)
        elif target.endswith("attn_k"):
            weight = permute(weight, config.num_key_value_heads)
        writer.add_tensor(f"{target}.weight", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    tokenizer = chat_tokenizer()
    model = tiny_llama(len(tokenizer), seed=4)
    directory = tmp_path_factory.mktemp("gguf")
    write_tiny_gguf(directory / "tiny.gguf", model, tokenizer)
    return directory, model, tokenizer


def test_gguf_round_trip_is_exact(gguf_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, model, tokenizer = gguf_dir
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file="tiny.gguf", dtype=torch.float32)
    loaded_tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file="tiny.gguf")
    text = "The sky is blue. The pass key is 12345. What is the pass key?"
    ids = tokenizer(text)["input_ids"]
    assert loaded_tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded_tokenizer.chat_template == CHAT_TEMPLATE
    with torch.no_grad():
        torch.testing.assert_close(loaded(torch.tensor([ids])).logits, model(torch.tensor([ids])).logits)


def test_cli_reads_a_gguf_checkpoint_with_its_chat_template(gguf_dir, tmp_path, capsys):
    directory, model, tokenizer = gguf_dir
    out = tmp_path / "niah"
    argv = ["niah", "--model", str(directory), "--gguf-file", "tiny.gguf", "--lengths", "96", "--depths", "0,1"]
    argv += ["--samples", "1", "--policies", "streaming", "--sparsities", "0.5", "--device", "cpu"]
    argv += ["--dtype", "float32", "--output-dir", str(out), "--no-progress", "--block-size", "16"]
    assert main(argv) == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    header = json.loads(lines[0])["niah_header"]
    assert header["gguf_file"] == "tiny.gguf" and header["chat_template"] is True  # auto: the file has a template
    records = [json.loads(line) for line in lines[1:]]
    grid = {"context_lengths": [96], "depths": [0.0, 1.0], "samples_per_cell": 1}
    methods = [NIAHMethod(), NIAHMethod("streaming", 0.5)]
    expected = run_niah(model, tokenizer, methods=methods, chat_template=True, block_size=16, progress=False, **grid)
    for got, want in zip(records, expected, strict=True):  # the same weights and tokenizer as the in-memory pair
        assert got["answer_logprob"] == pytest.approx(want["answer_logprob"], abs=1e-4)
        assert {k: v for k, v in got.items() if k != "answer_logprob"} == {
            k: v for k, v in want.items() if k != "answer_logprob"
        }
    capsys.readouterr()
    assert main([*argv, "--chat-template", "off"]) == 2  # another setting refuses the results file
    assert re.search("another configuration.*chat_template", capsys.readouterr().err)


def test_cli_gguf_errors_are_one_line(tokenizer, tmp_path, capsys, monkeypatch):
    import hf_icl.cli.lm_commands as lm_commands

    saved = tmp_path / "tiny"
    tiny_gpt2(len(tokenizer)).save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    capsys.readouterr()
    base = ["niah", "--lengths", "96", "--depths", "0.5", "--samples", "1", "--output-dir", str(tmp_path / "o")]
    cases = [
        (["--model", str(saved), "--gguf-file", "nope.gguf"], r"--gguf-file nope.gguf: no such file in the --model"),
        (["--model", str(tmp_path / "model.gguf")], "is a GGUF file: pass its directory as --model and its name"),
        (["--model", str(saved), "--chat-template", "on"], "--chat-template on: the tokenizer has no chat_template"),
        (["--model", str(saved), "--budget", "topk", "--topk", "0", "--policies", "frc"], "cab_topk"),
    ]
    for extra, match in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "hf-icl niah: error:" in err and re.search(match, err), err
    monkeypatch.setattr(lm_commands, "_gguf_available", lambda: False)
    assert main([*base, "--model", str(tmp_path), "--gguf-file", "model.gguf"]) == 2
    err = capsys.readouterr().err
    assert "needs the gguf package" in err and "pip install 'hf_icl[llm]'" in err


def test_cli_passes_topk_and_score_to_the_config(tokenizer, tmp_path, monkeypatch):
    saved = _saved_tiny_gpt2(tokenizer, tmp_path)
    seen, _ = _selection_spy(monkeypatch)
    out = tmp_path / "topk"
    argv = ["niah", "--model", str(saved), "--lengths", "96", "--depths", "0.5", "--samples", "1"]
    argv += ["--policies", "magnitude", "--sparsities", "0.5", "--budget", "topk", "--topk", "2", "--score", "mean"]
    argv += ["--device", "cpu", "--output-dir", str(out), "--no-progress", "--chat-template", "off"]
    argv += ["--block-size", "16"]
    assert main(argv) == 0
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])["niah_header"]
    assert header["budget"] == "topk" and (header["cab"]["topk"], header["cab"]["score"]) == (2, "mean")
    assert seen and all((p.budget, p.topk, p.score) == ("topk", 2, "mean") for p in seen)


@pytest.mark.skipif(
    not os.environ.get("HF_ICL_SMOLLM2_DIR"),
    reason="opt-in: set HF_ICL_SMOLLM2_DIR to the directory of SmolLM2-135M-Instruct.Q4_1.gguf",
)
def test_smollm2_gguf_retrieves_the_passkey_densely(tmp_path, capsys):
    pytest.importorskip("gguf")
    out = tmp_path / "smollm2"
    argv = ["niah", "--model", os.environ["HF_ICL_SMOLLM2_DIR"], "--gguf-file", "SmolLM2-135M-Instruct.Q4_1.gguf"]
    argv += ["--lengths", "512", "--samples", "1", "--policies", "streaming", "--sparsities", "0.5"]
    argv += ["--device", "cpu", "--dtype", "float32", "--output-dir", str(out), "--no-progress"]
    argv += ["--chat-template", "off", "--depths", "0.5"]
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()[1:]]
    dense = [r for r in records if r["method"] == "sdpa"]
    assert dense and all(r["exact_match"] for r in dense), dense


# -- RULER-style needle variants -----------------------------------------------------------------------


def test_a_variant_run_records_it_and_refuses_another_variant(tokenizer, model, tmp_path, monkeypatch):
    path = tmp_path / "multikey.jsonl"
    grid = {"context_lengths": [224], "depths": [0.0, 1.0], "samples_per_cell": 1}
    variant = {"variant": "multikey", "value_kind": "word", "n_keys": 2}
    methods = [NIAHMethod(), NIAHMethod("streaming", 0.5)]
    seen = []
    original = niah._evaluate_row

    def spy(model, tokenizer, row, method, last_rows, *args):
        seen.append((row["key"], last_rows))
        return original(model, tokenizer, row, method, last_rows, *args)

    monkeypatch.setattr(niah, "_evaluate_row", spy)
    run = {"methods": methods, "results_file": path, "progress": False, **grid}
    records = run_niah(model, tokenizer, **run, **variant)
    rows = list(NeedleInAHaystackConfig(tokenizer=tokenizer, **grid, **variant).rows())
    assert len(records) == 2 * 2
    for record in records:
        assert tuple(record) == RECORD_FIELDS
        assert (record["variant"], record["value_kind"]) == ("multikey", "word") and record["answer"] in WORDS
        assert record["exact_match"] == (record["generated"] == record["answer"])
    assert [r["answer"] for r in records] == [row["answer"] for row in rows] * 2
    assert [(r["needle_start"], r["needle_end"]) for r in records[:2]] == [
        (row["needle_start"], row["needle_end"]) for row in rows
    ]
    # the preservation queries are each row's own question, which names its key
    for key, last_rows in seen:
        question = MULTIKEY_QUESTION.replace("{kind}", "word").replace("{key}", key)
        assert last_rows == len(tokenizer(question, add_special_tokens=False)["input_ids"])
    assert {key for key, _ in seen} == {row["key"] for row in rows}
    header = json.loads(path.read_text().splitlines()[0])["niah_header"]
    assert (header["variant"], header["value_kind"], header["n_keys"]) == ("multikey", "word", 2)
    assert "n_values" not in header
    seen.clear()
    assert run_niah(model, tokenizer, **run, **variant) == records and seen == []  # resumes: nothing recomputed
    for change, match in [
        ({"variant": "multivalue", "n_keys": 4, "n_values": 2}, "another configuration.*variant"),
        ({"value_kind": "number"}, "another configuration.*value_kind"),
        ({"n_keys": 3}, "another configuration.*n_keys"),
        ({"variant": "single", "n_keys": 4}, "another configuration.*variant"),
    ]:
        with pytest.raises(ValueError, match=match):
            run_niah(model, tokenizer, **run, **{**variant, **change})


def test_a_file_from_before_the_variants_resumes_as_single_number(tokenizer, model, tmp_path):
    path = tmp_path / "old.jsonl"
    grid = {"methods": [NIAHMethod()], "context_lengths": [96], "depths": [0.5], "samples_per_cell": 1}
    grid["progress"] = False
    first = run_niah(model, tokenizer, results_file=path, **grid)
    assert first[0]["variant"] == "single" and first[0]["value_kind"] == "number"
    header, *records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in [header["niah_header"], *records]:  # as written before the variants existed
        del record["variant"], record["value_kind"]
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *records]))
    assert load_niah_results(path) == first
    assert run_niah(model, tokenizer, results_file=path, **grid) == first
    with pytest.raises(ValueError, match="another configuration.*value_kind"):
        run_niah(model, tokenizer, results_file=path, value_kind="word", **grid)


def test_cli_variant_flags_reach_the_prompts(tokenizer, tmp_path, capsys):
    saved = _saved_tiny_gpt2(tokenizer, tmp_path)
    out = tmp_path / "multivalue"
    argv = ["niah", "--model", str(saved), "--lengths", "240", "--depths", "0.5", "--samples", "1"]
    argv += ["--policies", "streaming", "--sparsities", "0.5", "--device", "cpu", "--output-dir", str(out)]
    argv += ["--no-progress", "--variant", "multivalue", "--value-kind", "word"]
    assert main([*argv, "--values", "3"]) == 0
    header, *records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    header = header["niah_header"]
    assert (header["variant"], header["value_kind"], header["n_values"]) == ("multivalue", "word", 3)
    prompts = {"context_lengths": [240], "depths": [0.5], "samples_per_cell": 1, "variant": "multivalue"}
    (row,) = NeedleInAHaystackConfig(tokenizer=tokenizer, value_kind="word", n_values=3, **prompts).rows()
    assert len(row["answer"].split(", ")) == 3 and all(v in WORDS for v in row["answer"].split(", "))
    assert len(records) == 2
    assert all((r["variant"], r["value_kind"], r["answer"]) == ("multivalue", "word", row["answer"]) for r in records)
    capsys.readouterr()
    for change, match in [
        (["--values", "2"], "another configuration.*n_values"),
        (["--values", "1"], r"--values must be an integer in \[2, \+inf\), got 1"),
        (["--variant", "multikey", "--values", "3"], "--values applies only to --variant multivalue"),
        (["--variant", "multikey", "--keys", "9"], r"context_lengths\[0\]=240 is too short.*9 needles"),
        (["--variant", "single", "--keys", "2"], "--keys applies only to --variant multikey"),
        (["--values", "3", "--value-kind", "number"], "another configuration.*value_kind"),
    ]:
        assert main([*argv, *change]) == 2
        err = capsys.readouterr().err
        assert "hf-icl niah: error:" in err and re.search(match, err), err
    for bad in (["--variant", "multi"], ["--value-kind", "hex"]):  # argparse's choices
        with pytest.raises(SystemExit):
            main([*argv, *bad])
    assert "invalid choice" in capsys.readouterr().err


def test_cli_choices_are_the_builders():
    from hf_icl.cli import build_parser
    from hf_icl.data.niah import VALUE_KINDS, VARIANTS

    niah_parser = build_parser()._subparsers._group_actions[0].choices["niah"]
    choices = {action.dest: action.choices for action in niah_parser._actions}
    assert tuple(choices["variant"]) == VARIANTS and tuple(choices["value_kind"]) == VALUE_KINDS
