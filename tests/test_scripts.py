"""The benchmarks (``hf-icl bench``) and the scripts run end to end on tiny sizes."""

import importlib.util
import itertools
import math
import sys

import pytest
import torch
from repo_paths import REPO

from hf_icl.benchmarks import BENCHMARKS, run_benchmark
from hf_icl.benchmarks.cab import flex_block_mask
from hf_icl.cli import main
from hf_icl.estimators import get_estimator

SCRIPTS = REPO / "scripts"


def load(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_cab_smoke_runs_every_section(tmp_path):
    """The GPU benchmark's code paths on tiny shapes: coarsening, attention (kernel + flex), prefill, decode."""
    out = tmp_path / "cab.md"
    argv = ["--smoke", "--lengths", "64", "--sparsities", "0.5", "0.9", "--output", str(out)]
    table = run_benchmark("cab", argv)
    assert "| 64 | 0.50 |" in table and "| 64 | 0.90 |" in table  # one row per (T, sparsity)
    for heading in ("Coarsening", "Prefill attention", "End-to-end prefill", "Decode latency"):
        assert heading in table
    attention_rows = [row for row in table.splitlines() if row.startswith("| 64 |") and row.count("|") == 13]
    flex_column = [row.split("|")[10].strip() for row in attention_rows]
    assert len(flex_column) == 2
    for row in attention_rows:  # achieved (token) and executed (tile-union) sparsity, both in [0, nominal]
        nominal, achieved, executed = (float(row.split("|")[i]) for i in (2, 3, 4))
        assert 0 <= executed <= achieved <= nominal
    assert all(cell != "n/a" for cell in flex_column)  # FlexAttention ran with our block mask
    assert out.read_text().strip() == table.strip()


def test_flex_block_mask_is_the_same_selection():
    """FlexAttention with the benchmark's BlockMask runs what the benchmark's block-granular kernel runs: the tile
    unions of CAB's per-token selection (a query block visits every key block any of its tokens kept). Checked
    against dense attention masked token by token with a mask built here, in plain loops, from the per-token
    selection; the block mask lists exactly the union's blocks."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from hf_icl.attention.cab import CABParams, select_cab_blocks
    from hf_icl.benchmarks.cab import tile_unions

    n, size = 96, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for _ in range(3))
    params = CABParams(sparsity=0.5, block_size=size, policy="frc", min_seq_len=0)
    token_keep = select_cab_blocks(q, k, params, 0.2)
    assert token_keep.shape == (1, 2, n, n // size)  # one row per query token
    rows = token_keep[0].tolist()
    union_mask, token_mask = (torch.zeros(1, 2, n, n, dtype=torch.bool) for _ in range(2))
    for h in range(2):
        for t in range(n):
            tile = range(t // size * size, t // size * size + size)  # the query block of t
            for s in range(t + 1):
                token_mask[0, h, t, s] = rows[h][t][s // size]
                union_mask[0, h, t, s] = any(rows[h][u][s // size] for u in tile)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    assert not torch.equal(union_mask[0, 0], causal)  # a real sparse selection
    assert not torch.equal(union_mask, token_mask)  # ... whose tiles' tokens choose differently

    block_keep = tile_unions(token_keep, size)  # (B, H, Mq, Mk): per query block
    block_mask = flex_block_mask(block_keep, size, n)
    assert torch.equal(block_mask.to_dense().bool(), block_keep)
    out = flex_attention(q, k, v, block_mask=block_mask, scale=0.2)
    probs = torch.softmax((q @ k.transpose(-1, -2) * 0.2).masked_fill(~union_mask, float("-inf")), dim=-1)
    torch.testing.assert_close(out, probs @ v, atol=1e-5, rtol=1e-5)


def test_bench_samplers_reports_every_family(capsys):
    from hf_icl.data.tasks import available_tasks

    argv = ["bench", "samplers", "--batch-size", "4", "--n-points", "5", "--n-dims", "3", "--repeats", "1"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name in available_tasks())


def test_bench_estimators_agrees_with_the_anchor_and_times_every_vectorised_estimator():
    from hf_icl.benchmarks.estimators import VECTORISED

    table = run_benchmark("estimators", ["--batch", "3", "--n-points", "6", "--n-dims", "2", "--repeats", "1"])
    assert "agrees" in table and "DISAGREES" not in table
    assert all(f"`{get_estimator(name, **kwargs).name}`" in table for name, kwargs in VECTORISED)


def test_bench_lists_the_benchmarks_and_rejects_unknown_names(capsys):
    assert main(["bench"]) == 0
    listing = capsys.readouterr().out
    assert all(f"  {name} " in listing for name in BENCHMARKS)
    assert main(["bench", "nope"]) == 2
    allowed = "['cab', 'estimators', 'linear-attention', 'samplers', 'seeds', 'sgpt', 'startup']"
    assert f"benchmark='nope' is unknown; allowed: {allowed}" in capsys.readouterr().err


def test_bench_scripts_are_the_cli_benchmarks(monkeypatch, capsys):
    import runpy

    monkeypatch.setattr(sys, "argv", ["bench_samplers.py", "--batch-size", "2", "--n-points", "3", "--repeats", "1"])
    runpy.run_path(str(SCRIPTS / "bench_samplers.py"), run_name="__main__")
    assert "`hf-icl bench samplers --batch-size 2 --n-points 3" in capsys.readouterr().out


def test_train_niah_retriever_saves_a_reloadable_model_with_card_and_eval(tmp_path):
    """A few steps of the retriever script: save_pretrained output reloads, the card and the eval agree."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "retriever"
    argv = ["--output-dir", str(out), "--steps", "4", "--ramp-steps", "2", "--batch-size", "2", "--layers", "1"]
    argv += ["--width", "32", "--heads", "2", "--max-length", "128", "--eval-lengths", "64", "128"]
    argv += ["--eval-depths", "0.5", "--eval-samples", "1"]
    accuracy = load("train_niah_retriever").main(argv)
    assert set(accuracy) == {64, 128} and all(0.0 <= a <= 1.0 for a in accuracy.values())
    assert json.loads((out / "retrieval_eval.json").read_text()) == {str(k): v for k, v in accuracy.items()}
    card = (out / "README.md").read_text()
    assert all(f"| {length} | {100 * a:.1f}% |" in card for length, a in accuracy.items())
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model.config.use_cache  # saved for inference, not with the Trainer's training-time setting
    ids = tokenizer("The pass key is 12345.", return_tensors="pt").input_ids
    assert all(len(tokenizer.convert_ids_to_tokens([i])[0].strip("Ġ")) <= 1 for i in ids[0, 4:9].tolist())
    assert torch.isfinite(model(ids).logits).all()


def test_train_niah_retriever_continues_at_a_longer_length(tmp_path):
    """--init-from keeps the trained position rows and grows the table for the longer prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    script = load("train_niah_retriever")
    small = ["--steps", "2", "--ramp-steps", "1", "--batch-size", "2", "--layers", "1", "--width", "32", "--heads", "2"]
    evaluation = ["--eval-lengths", "64", "--eval-depths", "0.5", "--eval-samples", "1"]
    first, second = tmp_path / "first", tmp_path / "second"
    script.main(["--output-dir", str(first), "--max-length", "96", *small, *evaluation])
    script.main(["--output-dir", str(second), "--init-from", str(first), "--max-length", "160", *small, *evaluation])
    before, after = (AutoModelForCausalLM.from_pretrained(path) for path in (first, second))
    assert before.config.n_positions == 96 + 16 and after.config.n_positions == 160 + 16
    assert after.transformer.wpe.weight.shape[0] == 176
    moved = (after.transformer.wpe.weight[:112] - before.transformer.wpe.weight).abs().max()
    assert 0 < moved < 0.1  # trained on (two small steps), not re-initialised
    assert torch.isfinite(after(torch.zeros(1, 170, dtype=torch.long)).logits).all()


def test_retrieval_prompts_give_each_dataloader_worker_its_own_stream(monkeypatch):
    """Workers must not all replay one stream (that would repeat every batch num_workers times)."""
    import argparse
    import itertools
    from types import SimpleNamespace

    script = load("train_niah_retriever")
    args = argparse.Namespace(seed=0, min_length=64, max_length=96, ramp_steps=1, batch_size=2)
    niah = script.NeedleInAHaystackConfig(tokenizer=script.build_tokenizer(300), context_lengths=[96], depths=[0.5])
    prompts = script.RetrievalPrompts(niah, args)

    def first_rows(worker_id):
        worker = None if worker_id is None else SimpleNamespace(id=worker_id, num_workers=2)
        monkeypatch.setattr(script, "get_worker_info", lambda: worker)
        return [row["input_ids"].tolist() for row in itertools.islice(iter(prompts), 4)]

    assert first_rows(0) == first_rows(0) == first_rows(None)  # deterministic, and worker 0 is the main stream
    assert first_rows(0) != first_rows(1)


def test_length_ramp_counts_global_batches_across_workers(monkeypatch):
    """Worker w of n makes global batches w, w + n, ...: its ramp must advance n times faster than its own count."""
    import argparse
    import itertools
    from types import SimpleNamespace

    script = load("train_niah_retriever")
    args = argparse.Namespace(seed=0, min_length=64, max_length=1064, ramp_steps=100, batch_size=1)
    niah = script.NeedleInAHaystackConfig(tokenizer=script.build_tokenizer(300), context_lengths=[96], depths=[0.5])
    prompts = script.RetrievalPrompts(niah, args)
    assert [prompts.length_cap(step) for step in (0, 50, 100, 400)] == [64, 564, 1064, 1064]
    monkeypatch.setattr(script, "get_worker_info", lambda: SimpleNamespace(id=3, num_workers=4))
    lengths = [len(row["input_ids"]) - 6 for row in itertools.islice(iter(prompts), 30)]  # minus the answer
    assert all(length <= prompts.length_cap(4 * i + 3) for i, length in enumerate(lengths))
    assert max(lengths) > prompts.length_cap(29)  # a per-worker count would have capped every prompt here


def test_train_niah_retriever_time_limit_stops_and_still_saves(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "capped"
    argv = ["--output-dir", str(out), "--steps", "50", "--ramp-steps", "2", "--batch-size", "2", "--layers", "1"]
    argv += ["--width", "32", "--heads", "2", "--max-length", "96", "--eval-lengths", "64", "--eval-depths", "0.5"]
    argv += ["--eval-samples", "1", "--max-minutes", "1e-6"]
    load("train_niah_retriever").main(argv)
    assert "time limit reached after 1 steps" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(out).config.n_layer == 1
    with pytest.raises(SystemExit):
        load("train_niah_retriever").parse_args(["--output-dir", str(out), "--max-minutes", "0"])


def test_perplexity_by_position_groups_tokens_by_block_offset_and_position():
    script = load("perplexity_by_position")
    losses = torch.arange(1.0, 17.0) / 10  # tokens 1..16 predicted, blocks of 8: offsets 1..7, 0, 1..7, 0
    groups = dict(script.grouped_perplexities(losses, block_size=8, split=6))
    position = list(range(1, 17))
    by_hand = {
        "all": position,
        "offset 0-1": [p for p in position if p % 8 < 2],
        "offset 6-7": [p for p in position if p % 8 >= 6],
        "position < 6": [1, 2, 3, 4, 5],
        "position >= 6": list(range(6, 17)),
    }
    for name, chosen in by_hand.items():
        assert groups[name] == pytest.approx(math.exp(sum(p / 10 for p in chosen) / len(chosen)))


def test_bench_startup_times_every_case_in_fresh_interpreters(capsys):
    from hf_icl.benchmarks.startup import CASES

    report = main(["bench", "startup", "--repeats", "1"]) == 0 and capsys.readouterr().out
    for case in CASES:
        row = next(line for line in report.splitlines() if line.startswith(f"| {case} |"))
        assert float(row.split("|")[2]) > 0
    assert "`import hf_icl` adds" in report and "`hf-icl --help` takes" in report


def test_gpu_check_script_dry_run(tmp_path):
    """scripts/gpu_check.sh --dry-run: the GPU check's steps at tiny sizes on CPU, each logged, the bench table
    written, a clear summary line last."""
    import os
    import subprocess

    env = {**os.environ, "PYTHON": sys.executable, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), "--dry-run", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.strip().endswith("all steps passed")
    for name in ("environment", "kernel_tests", "bench", "profile"):
        assert (tmp_path / f"{name}.log").exists()
    table = (tmp_path / "cab_bench.md").read_text()
    assert "selected pairs / dense causal pairs" in table
    # the profile step: the per-kernel table, then the sweep, where every launch shape selects what the default does
    # (the launch shape only decides which program computes a row; the dry run's small random inputs have no
    # near-ties for the dot's other summation order to break the other way)
    profile = (tmp_path / "profile.md").read_text()
    assert "Profile:" in profile and "cab_call" in profile and "sdpa_call" in profile
    ranges = [line.split("|") for line in profile.splitlines() if line.startswith(("| 1 |", "| 0.015625 |"))]
    assert [int(row[2]) for row in ranges] == [1, 16]  # 1 MiB holds the tiny run's one range; 16 KiB, one per block
    sweep = [line.split("|") for line in profile.splitlines() if line.startswith(("| outer |", "| dot |"))]
    assert {(row[1].strip(), row[2].strip()) for row in sweep} == set(
        itertools.product(("outer", "dot"), ("32 passes", "early exit"))
    )
    assert len(sweep) == 8 and all(int(row[6]) == 0 for row in sweep), sweep
