"""The "pairs" section of ``hf-icl bench cab``, its work model (roofline) and the q/k capture script, on tiny sizes."""

import importlib.util
import json
import math
import sys

import pytest
import torch
from repo_paths import REPO
from safetensors import safe_open
from safetensors.torch import save_file

from hf_icl.attention.cab import CABParams, select_cab_blocks
from hf_icl.benchmarks import cab_pairs
from hf_icl.benchmarks.cab import parse_args
from hf_icl.kernels.block_sparse_reference import selected_block_indices
from hf_icl.kernels.roofline import dense_causal_pairs, token_sparse_work
from hf_icl.kernels.token_selection.rule import achieved_sparsity

SCRIPT = REPO / "scripts" / "capture_cab_qk.py"


def load_script():
    spec = importlib.util.spec_from_file_location("capture_cab_qk", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["capture_cab_qk"] = module
    spec.loader.exec_module(module)
    return module


# -- the work model ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_q, n_k, block, offset", [(5, 5, 2, 0), (64, 64, 16, 0), (7, 20, 4, 13), (1, 9, 4, 8)])
def test_dense_causal_pairs_counts_every_token_s_visible_blocks(n_q, n_k, block, offset):
    expected = sum(1 for t in range(n_q) for j in range(math.ceil(n_k / block)) if j <= (offset + t) // block)
    assert dense_causal_pairs(n_q, n_k, block, q_offset=offset) == expected


def _work_by_loop(keep, block, dim, size, n_keys, q_offset, kv_heads):
    """The documented model, pair by pair: FLOPs 4·D·visible keys; bytes q row + fp32 partial out + lse (written and
    read) per pair, the output once per token, each (row, KV head, block) K/V tile once."""
    batch, heads, n_q, m_k = keep.shape
    flops = byts = pairs = 0
    tiles = set()
    for b in range(batch):
        for h in range(heads):
            for t in range(n_q):
                p = q_offset + t
                kept = [j for j in range(m_k) if keep[b, h, t, j]]
                for j in kept:
                    visible = max(0, min(block, min(p + 1, n_keys) - j * block))
                    flops += 4 * dim * visible
                    byts += dim * size + 2 * (4 * dim + 4)
                    pairs += 1
                    tiles.add((b, h // (heads // kv_heads), j))
                if kept:
                    byts += dim * size
    byts += sum(2 * dim * size * min(block, n_keys - j * block) for _, _, j in tiles)
    return flops, byts, pairs, len(tiles)


def test_token_sparse_work_equals_the_model_written_out_in_a_loop():
    g = torch.Generator().manual_seed(0)
    block, n_keys, n_q, q_offset, heads, kv_heads, dim = 4, 22, 9, 13, 4, 2, 8
    m_k = math.ceil(n_keys / block)
    keep = torch.rand(2, heads, n_q, m_k, generator=g) < 0.4
    own = (q_offset + torch.arange(n_q)) // block
    keep &= torch.arange(m_k) <= own[:, None]  # causal
    keep[..., 0, :] = False  # a token that keeps nothing
    indices, valid = selected_block_indices(keep)
    counts = valid.sum(-1)
    work = token_sparse_work(
        counts, block, dim, 2, n_keys, q_offset=q_offset, kv_heads=kv_heads, heads=heads, indices=indices
    )
    flops, byts, pairs, tiles = _work_by_loop(keep, block, dim, 2, n_keys, q_offset, kv_heads)
    assert (work.flops, work.bytes, work.pairs, work.kv_tiles) == (flops, byts, pairs, tiles)
    assert work.compulsory_bytes < work.bytes


def test_token_sparse_work_without_indices_assumes_the_own_block_and_full_blocks_before_it():
    """CAB's rule: the own block (partly visible) plus complete earlier blocks; prefill reads every block."""
    g = torch.Generator().manual_seed(1)
    block, n, heads, dim = 4, 18, 2, 4
    m_k = math.ceil(n / block)
    own = torch.arange(n) // block
    keep = (torch.rand(1, heads, n, m_k, generator=g) < 0.5) & (torch.arange(m_k) < own[:, None])
    keep |= torch.arange(m_k) == own[:, None]  # the own block, always
    counts = keep.sum(-1)
    work = token_sparse_work(counts, block, dim, 4, n)
    flops, byts, pairs, tiles = _work_by_loop(keep, block, dim, 4, n, 0, heads)
    assert (work.flops, work.bytes, work.pairs, work.kv_tiles) == (flops, byts, pairs, tiles)


def test_token_sparse_work_counts_a_group_shared_selection_for_each_of_its_heads():
    counts = torch.tensor([[[1, 1, 2, 2]]])  # one selection row shared by the 3 heads of one KV head
    shared = token_sparse_work(counts, 2, 4, 2, 4, kv_heads=1, heads=3)
    per_head = token_sparse_work(counts.expand(1, 3, 4), 2, 4, 2, 4, kv_heads=1)
    assert shared.pairs == 18  # 6 pairs × 3 heads
    assert (shared.flops, shared.bytes, shared.kv_tiles) == (per_head.flops, per_head.bytes, per_head.kv_tiles)
    with pytest.raises(ValueError, match="counts has 2 heads"):
        token_sparse_work(torch.ones(1, 2, 4, dtype=torch.int64), 2, 4, 2, 4, kv_heads=1, heads=3)


# -- the section ---------------------------------------------------------------------------------------------------


def write_capture(path, length=64, heads=4, kv_heads=2, dim=16, layers=(1, 5)):
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for layer in layers:
        tensors[f"layer{layer}.query"] = torch.randn(1, heads, length, dim, generator=g).to(torch.bfloat16)
        tensors[f"layer{layer}.key"] = torch.randn(1, kv_heads, length, dim, generator=g).to(torch.bfloat16)
    info = {"model": "tiny-test", "prompt": "random", "length": length, "dtype": "bfloat16", "date": "2026-01-01"}
    save_file(tensors, str(path), metadata={"capture": json.dumps(info)})
    return path


def table_rows(lines, first_cell):
    return [line for line in lines if line.startswith(f"| {first_cell} |")]


def test_pairs_section_reports_every_column_on_random_and_captured_inputs(tmp_path, capsys):
    qk = write_capture(tmp_path / "qk.safetensors")
    argv = ["--smoke", "--pairs-only", "--pairs-lengths", "64", "96", "--qk", str(qk)]
    args = parse_args(argv)
    assert args.block_size == 16 and args.shapes[0] == (1, 2, 32) and args.memory is False
    random_lines, captured_lines = (list(lines) for lines in cab_pairs.pairs_sections(args))
    header = cab_pairs.COLUMNS.split("|")[1:-1]
    assert len(header) == 14 and random_lines[3] == cab_pairs.COLUMNS
    rows = table_rows(random_lines, 64) + table_rows(random_lines, 96)
    assert len(rows) == 2 and all(row.count("|") == len(header) + 1 for row in rows)
    assert "`hf-icl bench cab --smoke --pairs-only" in random_lines[1] and "float32" in random_lines[1]
    # captured: both layers at T = 64 with their own head counts; T = 96 skipped with the note
    layer_rows = table_rows(captured_lines, 1) + table_rows(captured_lines, 5)
    assert [row.split("|")[2].strip() for row in layer_rows] == ["4 / 2", "4 / 2"]
    assert all(row.split("|")[3].strip() == "64" for row in layer_rows)
    assert any("Skipped T = 96: above the captured length (64 tokens)" in line for line in captured_lines)
    assert "tiny-test" in captured_lines[1]
    for row in rows + layer_rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]][-14:]
        assert cells[2] == "magnitude" and 0 < float(cells[3]) <= 1
        assert cells[12] == "n/a"  # memory off under --smoke
        assert cells[8].endswith("×") and cells[10].endswith("%")
    assert "pairs: random T=64 sparsity=0.9" in capsys.readouterr().err  # progress on stderr


def test_pairs_ratio_is_one_minus_the_achieved_sparsity_of_the_same_selection(tmp_path):
    qk = write_capture(tmp_path / "qk.safetensors", length=96)
    args = parse_args(["--smoke", "--pairs-only", "--pairs-sparsities", "0.75", "--qk", str(qk)])
    specs = [
        cab_pairs.InputSpec("random", 96, 32, 2, 2, "float32"),
        cab_pairs.InputSpec("captured", 80, 16, 4, 2, "float32", path=str(qk), layer=5),
    ]
    for spec in specs:
        row = cab_pairs.measure_row(spec, 0.75, args, sdpa_mib=None)
        q, k, _ = cab_pairs.build_inputs(spec, "cpu")
        keep = select_cab_blocks(q, k, CABParams(sparsity=0.75, block_size=16, min_seq_len=0), spec.dim**-0.5)
        assert row.pairs_ratio == pytest.approx(1 - float(achieved_sparsity(keep, 16, spec.length)), abs=1e-6)
        assert 0.25 <= row.pairs_ratio < 1 and row.gflop > 0 and row.megabytes > 0
    # shorter lengths take the capture's first T tokens
    q, k, _ = cab_pairs.build_inputs(specs[1], "cpu")
    with safe_open(str(qk), framework="pt") as handle:
        assert torch.equal(q, handle.get_tensor("layer5.query")[:, :, :80].float())
        assert k.shape == (1, 2, 80, 16)


def test_peak_extra_memory_runs_in_a_fresh_process():
    spec = cab_pairs.InputSpec("random", 256, 32, 2, 2, "float32")
    extra = cab_pairs.peak_extra_bytes("cab", spec, CABParams(block_size=16, min_seq_len=0), torch.device("cpu"))
    assert extra is not None and extra >= 0


def test_bad_pairs_options_give_one_line_errors(tmp_path, capsys):
    bad_file = tmp_path / "bad.safetensors"
    save_file({"something": torch.zeros(2)}, str(bad_file))
    cases = [
        (["--qk", str(tmp_path / "missing.safetensors")], "--qk: no such file"),
        (["--qk", str(bad_file)], "expected only layer{i}.query and layer{i}.key"),
        (["--pairs-lengths", "0"], "--pairs-lengths must be positive"),
        (["--pairs-sparsities", "1.0"], "--pairs-sparsities must lie in [0, 1)"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit):
            parse_args(["--smoke", *extra])
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in error and error.startswith("usage") is False


# -- the capture script --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_capture_saves_what_the_attention_receives(tmp_path, tiny_llama, capsys):
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    script = load_script()
    output = tmp_path / "qk.safetensors"
    argv = ["--model", str(tiny_llama), "--prompt", "random-ids", "--length", "40", "--layers", "0", "2"]
    script.main([*argv, "--output", str(output)])
    assert "RoPE extrapolates" in capsys.readouterr().err  # 40 tokens > 32 positions
    with safe_open(str(output), framework="pt") as handle:
        info = json.loads(handle.metadata()["capture"])
        captured = {name: handle.get_tensor(name) for name in handle.keys()}
    assert sorted(captured) == ["layer0.key", "layer0.query", "layer2.key", "layer2.query"]
    assert captured["layer2.query"].shape == (1, 4, 40, 16) and captured["layer2.key"].shape == (1, 2, 40, 16)
    assert captured["layer2.query"].dtype == torch.bfloat16
    assert info["length"] == 40 and info["layers"] == [0, 2] and "rope_extrapolated" in info

    # recompute layer 2's q_proj / k_proj + RoPE from the inputs its attention module receives
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="sdpa").eval()
    seen = {}
    attention = model.model.layers[2].self_attn
    attention.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    ids = torch.randint(97, (1, 40), generator=torch.Generator().manual_seed(0))  # the script's random ids, seed 0
    with torch.no_grad():
        model(input_ids=ids)
        hidden = seen["hidden_states"]
        q = attention.q_proj(hidden).view(1, 40, -1, 16).transpose(1, 2)
        k = attention.k_proj(hidden).view(1, 40, -1, 16).transpose(1, 2)
        before_rope = q
        q, k = apply_rotary_pos_emb(q, k, *seen["position_embeddings"])
    assert not torch.allclose(captured["layer2.query"].float(), before_rope, rtol=8e-3, atol=1e-3)  # after RoPE
    torch.testing.assert_close(captured["layer2.query"].float(), q, rtol=8e-3, atol=1e-3)
    torch.testing.assert_close(captured["layer2.key"].float(), k, rtol=8e-3, atol=1e-3)


def test_capture_rejects_bad_arguments_with_one_line_errors(tmp_path, tiny_llama, capsys):
    script = load_script()
    cases = [
        (["--model", str(tmp_path / "nope")], "--model: no such folder"),
        (["--model", str(tiny_llama), "--gguf-file", "x.gguf"], "--gguf-file: no such file"),
        (["--model", str(tiny_llama), "--length", "0"], "--length must be at least 1"),
        (["--model", str(tiny_llama), "--layers", "1", "1"], "--layers must be distinct"),
        (["--model", str(tiny_llama), "--layers", "3", "--prompt", "random-ids"], "--layers must lie in [0, 3)"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            script.main([*argv, "--output", str(tmp_path / "out.safetensors")])
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "out.safetensors").exists()
