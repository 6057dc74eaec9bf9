"""CAB's contracts on real transformers models: causality, prefill == generation, padding, any head dim.

Tiny random GPT-2 (MHA, 16-dim heads) and Llama (grouped-query attention) models in float64, so a near-tie in a
block ranking cannot flip between a batched prefill and a one-token decode step.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import hf_icl
from hf_icl.attention.cab import BUDGETS, POLICIES, CABParams

LENGTH = 80  # five 16-token blocks: every policy has real choices at these budgets


def gpt2(head_dim=16, seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=2 * head_dim, n_head=2, n_positions=256, vocab_size=97, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).double().eval()


def llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        vocab_size=97,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).double().eval()


MODELS = {"gpt2": gpt2, "llama": llama}


def tokens(batch, length, seed=0):
    return torch.randint(97, (batch, length), generator=torch.Generator().manual_seed(seed))


def cab(model, **settings):
    return hf_icl.enable_cab(model, min_seq_len=0, sink_blocks=1, **settings)


def logits(model, ids, mask=None):
    """One forward; a padded batch gets each row's own positions (as ``generate`` gives them)."""
    positions = None if mask is None else (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits


SETTINGS = [
    {"budget": "row", "sparsity": 0.5},
    {"budget": "row", "sparsity": 0.75},
    {"budget": "topk", "topk": 2},
    {"budget": "row", "sparsity": 0.75, "local_blocks": 2},
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("block_size", [16, 32])
def test_changing_the_future_never_changes_the_past(policy, block_size):
    """Every policy × budget × block size: logits at positions ≤ p ignore every token after p."""
    model = cab(gpt2(), policy=policy, block_size=block_size)
    ids = tokens(1, LENGTH)
    for settings, p in itertools.product(SETTINGS, (20, 47, 64)):
        hf_icl.enable_cab(model, **{"local_blocks": 1, **settings})
        changed = ids.clone()
        changed[:, p + 1 :] = tokens(1, LENGTH - p - 1, seed=p)
        torch.testing.assert_close(
            logits(model, ids)[:, : p + 1], logits(model, changed)[:, : p + 1], rtol=0, atol=1e-9
        )


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("policy", POLICIES)
def test_teacher_forced_logits_equal_step_by_step_generation(family, policy):
    """Prefill of the whole sequence == prefill of a prefix, then one cached decode step per token."""
    model = cab(MODELS[family](), policy=policy, block_size=16, score="bound")
    ids = tokens(1, LENGTH)
    for settings in (SETTINGS[0], SETTINGS[2], SETTINGS[3]):  # row, topk, and a two-block local window
        hf_icl.enable_cab(model, **{"local_blocks": 1, **settings})
        full = logits(model, ids)
        with torch.no_grad():
            out = model(input_ids=ids[:, :40], use_cache=True)
            steps, cache = [out.logits], out.past_key_values
            for t in range(40, LENGTH):
                out = model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                steps.append(out.logits)
                cache = out.past_key_values
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-9)


def _padded(ids_rows, side):
    width = max(len(row) for row in ids_rows)
    ids = torch.zeros(len(ids_rows), width, dtype=torch.long)
    mask = torch.zeros(len(ids_rows), width, dtype=torch.long)
    for i, row in enumerate(ids_rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("sparsity", [0.5, 0.75, 0.9])
def test_a_padded_batch_equals_each_row_alone(family, side, sparsity):
    model = cab(MODELS[family](), policy="hybrid", block_size=16, sparsity=sparsity)
    rows = [tokens(1, LENGTH, seed=1)[0], tokens(1, LENGTH - 27, seed=2)[0]]
    ids, mask = _padded(rows, side)
    batched = logits(model, ids, mask)
    for i, row in enumerate(rows):
        alone = logits(model, row[None])[0]
        real = mask[i].bool()
        torch.testing.assert_close(batched[i, real], alone, rtol=0, atol=1e-9)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_left_padded_generation_equals_each_row_alone(family):
    """Decode steps with a left-padded cache: each row's greedy tokens and logits are those it gets alone."""
    model = cab(MODELS[family](), policy="magnitude", block_size=16, sparsity=0.75)
    rows = [tokens(1, 70, seed=3)[0], tokens(1, 45, seed=4)[0]]
    ids, mask = _padded(rows, "left")
    with torch.no_grad():
        batched = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        for i, row in enumerate(rows):
            alone = model.generate(
                row[None],
                attention_mask=torch.ones(1, len(row), dtype=torch.long),
                max_new_tokens=12,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            assert batched.sequences[i, ids.shape[1] :].tolist() == alone.sequences[0, len(row) :].tolist()
            for step_b, step_a in zip(batched.logits, alone.logits, strict=True):
                torch.testing.assert_close(step_b[i], step_a[0], rtol=0, atol=1e-9)


def test_sixteen_dim_heads_and_grouped_query_attention_run_sparse():
    """Head dims the kernels do not cover (16 here) run on the PyTorch path, and really sparsely."""
    model = cab(gpt2(head_dim=16), policy="magnitude", block_size=16, sparsity=0.9)
    dense = gpt2(head_dim=16)
    ids = tokens(1, 160)
    assert not torch.allclose(logits(model, ids)[:, 40:], logits(dense, ids)[:, 40:])
    torch.testing.assert_close(logits(model, ids)[:, :32], logits(dense, ids)[:, :32])  # only own + sink blocks


@pytest.mark.parametrize("field, value", [("cab_budget", "global"), ("cab_policy", "reference")])
def test_selections_that_cannot_be_causal_are_refused_with_the_reason(field, value):
    name = field.removeprefix("cab_")
    with pytest.raises(ValueError, match=rf"{field}={value!r} is not causal"):
        CABParams(**{name: value})
    assert value not in (BUDGETS if name == "budget" else POLICIES)
