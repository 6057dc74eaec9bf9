"""CAB decode from cached key-block summaries (hf_icl.attention.cab_cache).

The summaries a CABCache keeps incrementally must equal a recomputation from the whole key cache after every step;
selecting from them must give exactly the rule's selection; decode, chunked prefill and generate (greedy, beams,
crop, a second call, new settings) must give exactly what the uncached path gives; and a decode step must no longer
summarise the whole cache. Tiny random GPT-2 (MHA) and Llama (grouped-query attention, 4 query / 2 KV heads).
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import hf_icl
import hf_icl.attention.cab as cab_module
import hf_icl.attention.cab_cache as cab_cache
import hf_icl.kernels.token_selection.rule as token_selection
from hf_icl.attention.cab import POLICIES, CABParams
from hf_icl.attention.cab_cache import (
    CABCache,
    CABCacheLayer,
    KeyBlockSummaries,
    block_summaries_of,
    cached_block_selection,
    select_blocks_from_summaries,
    summary_kinds,
    use_cab_cache,
)
from hf_icl.kernels.token_selection.rule import SCORES, key_block_summaries, select_token_blocks

VOCAB = 97


def gpt2(seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=512, vocab_size=VOCAB, attn_pdrop=0.0)
    config.bos_token_id = config.eos_token_id = 0
    return GPT2LMHeadModel(config).eval()


def llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


MODELS = {"gpt2": gpt2, "llama": llama}


def tokens(batch, length, seed=0):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def cab(model, **settings):
    return hf_icl.enable_cab(model, **{"block_size": 16, "min_seq_len": 0, "sparsity": 0.5, **settings})


def loop_summaries(keys: torch.Tensor, block_size: int, kind: str) -> tuple[torch.Tensor, ...]:
    """The statistics written out block by block: element-wise min/max, mean, the first largest-norm key."""
    rows = []
    for start in range(0, keys.shape[2] - block_size + 1, block_size):
        block = keys[:, :, start : start + block_size].double()
        if kind == "bound":
            rows.append((block.amin(2), block.amax(2)))
        elif kind == "mean":
            rows.append((block.sum(2) / block_size,))
        else:
            norms = block.square().sum(-1)  # (B, Hk, bs)
            best = torch.stack([torch.tensor([int(torch.nonzero(n == n.max())[0]) for n in head]) for head in norms])
            rows.append((block.gather(2, best[..., None, None].expand(-1, -1, 1, block.shape[-1])).squeeze(2),))
    return tuple(torch.stack(parts, 2) for parts in zip(*rows, strict=True))


def cab_config(score="bound", block_size=16, policy="hybrid", kv_heads=2):
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2 * kv_heads, num_key_value_heads=kv_heads)
    config._attn_implementation = "cab"
    for field, value in CABParams(score=score, block_size=block_size, policy=policy).to_config_fields().items():
        setattr(config, field, value)
    return config


@pytest.fixture
def summarised(monkeypatch):
    """Spies: the lengths every key_block_summaries call summarised (cache and rule), and rule selections run."""
    record = {"lengths": [], "rule_calls": 0}

    def spy(keys, block_size, score):
        record["lengths"].append(keys.shape[2])
        return key_block_summaries(keys, block_size, score)

    real_selector = cab_module.token_block_selector

    def counted_selector(*args, **kwargs):  # the attention call's uncached selection (from the keys)
        record["rule_calls"] += 1
        return real_selector(*args, **kwargs)

    monkeypatch.setattr(token_selection, "key_block_summaries", spy)
    monkeypatch.setattr(cab_cache, "key_block_summaries", spy)
    monkeypatch.setattr(cab_module, "token_block_selector", counted_selector)
    return record


# -- the summaries ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_incremental_summaries_equal_recomputation_after_every_step(score, block_size, kv_heads, dtype):
    """Ragged updates (a prompt, single tokens, chunks across block edges): after each, the kept summaries equal
    key_block_summaries of the whole cache bit for bit, and the block loop written out; spare rows stay zero."""
    layer = CABCacheLayer(cab_config(score, block_size, policy="frc", kv_heads=kv_heads))
    g = torch.Generator().manual_seed(block_size + kv_heads)
    kinds = (score,) if score == "mean" else (score, "mean")
    for step, length in enumerate([37, 1, 1, 5, block_size, 2 * block_size + 3, *[1] * (block_size + 2), 0, 9]):
        new = torch.randn(2, kv_heads, length, 8, generator=g).to(dtype)
        keys, _ = layer.update(new, new)
        state = layer.summaries
        n_complete = keys.shape[2] // block_size
        assert state.kinds == kinds and state.n_blocks == n_complete and state.describes(keys), step
        for kind in kinds:
            cached = state.for_scoring(kind, n_complete)
            whole = tuple(t[:, :, :n_complete] for t in key_block_summaries(keys, block_size, kind))
            for mine, full, looped in zip(cached, whole, loop_summaries(keys, block_size, kind), strict=True):
                assert mine.shape == (2, kv_heads, n_complete, 8) and mine.dtype == torch.float32
                assert torch.equal(mine, full), (step, kind)
                torch.testing.assert_close(mine.double(), looped, rtol=1e-6, atol=1e-6)
            padded = state.for_scoring(kind, n_complete + 1)
            assert all(not t[:, :, -1].any() for t in padded)  # the partial block scores as zeros


def test_summaries_are_bound_to_one_key_tensor_and_its_version():
    layer = CABCacheLayer(cab_config("mean"))
    first, _ = layer.update(torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8))
    assert block_summaries_of(first) is layer.summaries
    second, _ = layer.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
    assert block_summaries_of(second) is layer.summaries
    assert block_summaries_of(first) is None  # the tensor they described before the update
    assert block_summaries_of(second.clone()) is None  # equal values, another tensor
    second.mul_(2.0)  # edited in place: the summaries no longer describe it
    assert block_summaries_of(second) is None


def test_summaries_follow_beam_reorder_crop_and_batch_edits_without_recomputing(summarised):
    layer = CABCacheLayer(cab_config("bound"))
    layer.update(torch.randn(3, 2, 70, 8), torch.randn(3, 2, 70, 8))
    edits = [
        ("reorder_cache", torch.tensor([2, 2, 0])),
        ("crop", -9),  # 70 → 61 tokens: block 3 (48..63) is no longer complete
        ("batch_repeat_interleave", 2),
        ("batch_select_indices", torch.tensor([5, 0, 3])),
        ("crop", -61),  # nothing left
    ]
    for name, argument in edits:
        summarised["lengths"].clear()
        getattr(layer, name)(argument)
        assert summarised["lengths"] == [], name  # edited along with the keys, not recomputed
        keys = layer.keys
        assert block_summaries_of(keys) is layer.summaries, name
        n = keys.shape[2] // 16
        assert layer.summaries.n_blocks == n
        if n:
            whole = key_block_summaries(keys, 16, "bound")
            for mine, full in zip(layer.summaries.for_scoring("bound", n), whole, strict=True):
                assert torch.equal(mine, full[:, :, :n]), name
    layer.update(torch.randn(3, 2, 20, 8), torch.randn(3, 2, 20, 8))  # grows again from empty
    assert layer.summaries.n_blocks == 1 and summarised["lengths"] == [16, 16]


def test_keys_replaced_behind_the_layers_back_or_reset_are_resummarised(summarised):
    layer = CABCacheLayer(cab_config("mean", policy="magnitude"))
    layer.update(torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8))
    layer.keys = torch.randn(1, 2, 64, 8)  # e.g. offloading, or a user's edit
    summarised["lengths"].clear()
    keys, _ = layer.update(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
    assert summarised["lengths"] == [64]  # from scratch, over every complete block
    assert torch.equal(layer.summaries.for_scoring("mean", 4)[0], key_block_summaries(keys, 16, "mean")[0][:, :, :4])
    layer.reset()
    assert layer.summaries is None
    keys, _ = layer.update(torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8))  # a new prompt
    assert torch.equal(layer.summaries.for_scoring("mean", 1)[0], key_block_summaries(keys, 16, "mean")[0][:, :, :1])


def test_summary_kinds_follow_the_policy():
    assert summary_kinds(CABParams(policy="magnitude", score="max_l2")) == ("max_l2",)
    assert summary_kinds(CABParams(policy="frc", score="mean")) == ("mean",)
    assert summary_kinds(CABParams(policy="frc_low", score="bound")) == ("bound", "mean")
    for policy in ("dense", "streaming", "oracle"):
        assert summary_kinds(CABParams(policy=policy)) == ()


# -- the selection ---------------------------------------------------------------------------------------------

BUDGET_SETTINGS = [
    {"budget": "row", "sparsity": 0.5},
    {"budget": "row", "sparsity": 0.8, "local_blocks": 2, "sink_blocks": 2},
    {"budget": "topk", "topk": 3},
    {"budget": "row", "sparsity": 0.6, "min_seq_len": 50},
]


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "oracle"])
@pytest.mark.parametrize("score", SCORES)
def test_selection_from_summaries_is_the_rules_selection(policy, score):
    """Decode (one query) and chunked prefill (six), block-aligned and ragged cache lengths, GQA: identical."""
    g = torch.Generator().manual_seed(1)
    for settings, n_k, n_q in itertools.product(BUDGET_SETTINGS, (96, 100, 113), (1, 6)):
        params = CABParams(block_size=16, policy=policy, score=score, **{"min_seq_len": 0, **settings})
        query = torch.randn(2, 4, n_q, 8, generator=g)
        key = torch.randn(2, 2, n_k, 8, generator=g)
        state = KeyBlockSummaries(16, summary_kinds(params) or ("mean",))
        state.extend(key)
        mine = select_blocks_from_summaries(query, n_k, state, params, scaling=0.3)
        rule = select_token_blocks(
            query,
            key,
            scaling=0.3,
            block_size=16,
            policy=policy,
            score=score,
            budget=params.budget,
            sparsity=params.sparsity,
            topk=params.topk,
            sink_blocks=params.sink_blocks,
            local_blocks=params.local_blocks,
            min_seq_len=params.min_seq_len,
            lam=params.lam,
            magnitude_fraction=params.magnitude_fraction,
        )
        assert torch.equal(mine, rule), (settings, n_k, n_q)


def test_cached_selection_declines_what_it_cannot_serve():
    params = CABParams(block_size=16, min_seq_len=0)
    key = torch.randn(1, 2, 50, 8)
    query = torch.randn(1, 2, 1, 8)
    assert cached_block_selection(query, key, params, 0.3) is None  # keys no cache produced
    layer = CABCacheLayer(cab_config("mean", policy="magnitude"))
    key, _ = layer.update(key, key)
    assert cached_block_selection(query, key, params, 0.3) is not None
    assert cached_block_selection(torch.randn(1, 2, 50, 8), key, params, 0.3) is None  # a first prefill
    padded = torch.ones(1, 50, dtype=torch.bool)
    padded[0, 0] = False
    assert cached_block_selection(query, key, params, 0.3, key_valid=padded) is None  # padding: the real-token rule
    other = CABParams(block_size=32, min_seq_len=0)
    assert cached_block_selection(query, key, other, 0.3) is None  # summaries for another block size
    bound = CABParams(block_size=16, min_seq_len=0, score="bound")
    assert cached_block_selection(query, key, bound, 0.3) is None  # summaries for another score
    assert cached_block_selection(query, key, CABParams(block_size=16, policy="oracle"), 0.3) is None


# -- models ------------------------------------------------------------------------------------------------------


def stepwise_logits(model, ids, cache, prompt, chunk=1):
    """Prefill ``prompt`` tokens, then feed the rest ``chunk`` at a time on ``cache``: every position's logits."""
    with torch.no_grad():
        out = [model(input_ids=ids[:, :prompt], past_key_values=cache, use_cache=True).logits]
        for start in range(prompt, ids.shape[1], chunk):
            out.append(model(input_ids=ids[:, start : start + chunk], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, 1)


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize(
    "policy, score", [(p, "bound") for p in POLICIES] + [("hybrid", "mean"), ("magnitude", "max_l2")]
)
def test_decode_steps_with_the_cache_equal_the_uncached_path_exactly(family, policy, score, summarised):
    model = cab(MODELS[family](), policy=policy, score=score)
    ids = tokens(1, 90)
    uncached = stepwise_logits(model, ids, DynamicCache(), prompt=30)
    summarised["lengths"].clear()
    summarised["rule_calls"] = 0
    cached = stepwise_logits(model, ids, CABCache(model.config), prompt=30)
    assert torch.equal(cached, uncached)
    n_layers, kinds = model.config.num_hidden_layers, summary_kinds(CABParams.from_config(model.config))
    if kinds:
        assert summarised["rule_calls"] == n_layers  # the prompt only; every decode step selected from the cache
        # the rule summarised the 30-token prompt; the cache its complete block, then each block as it completed
        assert sorted(set(summarised["lengths"])) == [16, 30]
        assert summarised["lengths"].count(30) == len(kinds) * n_layers
    elif policy == "oracle":
        assert summarised["rule_calls"] == n_layers * (1 + 90 - 30)  # oracle needs every key: the uncached path
    else:
        assert summarised["lengths"] == []  # dense / streaming read no summaries at all


@pytest.mark.parametrize("family", sorted(MODELS))
def test_chunked_prefill_with_the_cache_equals_the_uncached_path(family, summarised):
    model = cab(MODELS[family](), policy="hybrid", score="bound", sparsity=0.6)
    ids = tokens(1, 100, seed=2)
    uncached = stepwise_logits(model, ids, DynamicCache(), prompt=20, chunk=7)
    summarised["rule_calls"] = 0
    cached = stepwise_logits(model, ids, CABCache(model.config), prompt=20, chunk=7)
    assert torch.equal(cached, uncached)
    assert summarised["rule_calls"] == model.config.num_hidden_layers  # chunks select from the cache too


def generate(model, ids, cache=None, **kwargs):
    settings = {"max_new_tokens": 40, "do_sample": False, "pad_token_id": 0}
    settings["min_new_tokens"] = kwargs.get("max_new_tokens", settings["max_new_tokens"])  # no early stop at eos
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            past_key_values=cache,
            output_logits=True,
            return_dict_in_generate=True,
            **{**settings, **kwargs},
        )


def assert_same_generation(a, b):
    assert torch.equal(a.sequences, b.sequences)
    assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))


def assert_summaries_current(cache):
    for layer in cache.layers:
        state = layer.summaries
        assert block_summaries_of(layer.keys) is state
        n = layer.keys.shape[2] // state.block_size
        for kind in state.kinds:
            whole = key_block_summaries(layer.keys, state.block_size, kind)
            assert all(torch.equal(m, w[:, :, :n]) for m, w in zip(state.for_scoring(kind, n), whole, strict=True))


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("settings", [{"policy": "hybrid", "score": "bound"}, {}])
def test_greedy_generate_builds_the_cache_and_equals_the_uncached_path(family, settings, summarised):
    """enable_cab makes generate use a CABCache (no user step); tokens and every step's logits are identical."""
    model = cab(MODELS[family](), **settings)
    ids = tokens(1, 45, seed=3)
    summarised["lengths"].clear()
    uncached = generate(model, ids, DynamicCache())
    full_lengths = [n for n in summarised["lengths"] if n > 16]
    assert len(full_lengths) >= 39 * model.config.num_hidden_layers  # the old way: the whole cache every step
    summarised["lengths"].clear()
    cached = generate(model, ids)
    assert type(cached.past_key_values) is CABCache
    assert_same_generation(cached, uncached)
    assert_summaries_current(cached.past_key_values)
    # the rule summarised the 45-token prompt, the cache its 2 complete blocks, then one block at a time
    kinds = summary_kinds(CABParams.from_config(model.config))
    assert sorted(set(summarised["lengths"])) == [16, 32, 45]
    assert summarised["lengths"].count(45) == summarised["lengths"].count(32) == len(kinds) * 2


@pytest.mark.parametrize("family", sorted(MODELS))
def test_beam_search_with_the_cache_equals_the_uncached_path(family):
    model = cab(MODELS[family](), policy="hybrid", score="bound")
    ids = tokens(2, 40, seed=4)
    settings = {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 30}
    uncached = generate(model, ids, DynamicCache(), **settings)
    cached = generate(model, ids, **settings)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert all(torch.equal(x, y) for x, y in zip(cached.logits, uncached.logits, strict=True))
    assert_summaries_current(cached.past_key_values)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_crop_then_continue_equals_the_uncached_path(family):
    """Crop back across block edges (as assisted decoding does), continue on other tokens: identical logits."""
    model = cab(MODELS[family](), policy="frc", score="bound")
    ids, other = tokens(1, 80, seed=5), tokens(1, 40, seed=6)
    results = []
    for cache in (DynamicCache(), CABCache(model.config)):
        logits = [stepwise_logits(model, ids, cache, prompt=30)]
        for crop, start in ((-13, 0), (-1, 10), (-20, 20)):
            cache.crop(crop)
            logits.append(stepwise_logits(model, other[:, start:], cache, prompt=1))
        results.append(torch.cat(logits, 1))
        if isinstance(cache, CABCache):
            assert_summaries_current(cache)
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("family", sorted(MODELS))
def test_a_second_generate_and_new_settings_use_fresh_summaries(family):
    model = cab(MODELS[family](), policy="magnitude", score="bound")
    first, second = tokens(1, 70, seed=7), tokens(1, 33, seed=8)
    assert_same_generation(generate(model, first), generate(model, first, DynamicCache()))
    assert_same_generation(generate(model, second), generate(model, second, DynamicCache()))
    # one cache reused across a settings change: the next update recomputes for the new block size and score
    cache, reference = CABCache(model.config), DynamicCache()
    stepwise_logits(model, first, cache, prompt=60)
    stepwise_logits(model, first, reference, prompt=60)
    hf_icl.enable_cab(model, block_size=32, score="max_l2")
    with torch.no_grad():
        step = model(input_ids=second[:, :1], past_key_values=cache).logits
        expected = model(input_ids=second[:, :1], past_key_values=reference).logits
    assert torch.equal(step, expected)
    assert cache.layers[0].summaries.block_size == 32 and cache.layers[0].summaries.kinds == ("max_l2",)


def test_the_summaries_are_kept_per_kv_head():
    model = cab(llama(), policy="magnitude", score="bound")
    out = generate(model, tokens(1, 40), max_new_tokens=3)
    for layer in out.past_key_values.layers:
        kmin, kmax = layer.summaries.for_scoring("bound", 2)
        assert kmin.shape == kmax.shape == (1, 2, 2, 16)  # 2 KV heads (the model has 4 query heads)


def test_a_left_padded_batch_keeps_the_uncached_path_and_equals_each_row_alone(summarised):
    model = cab(llama().double(), policy="hybrid", score="bound")  # float64: padded and alone round alike
    rows = [tokens(1, 60, seed=9)[0], tokens(1, 41, seed=10)[0]]
    ids = torch.zeros(2, 60, dtype=torch.long)
    mask = torch.zeros(2, 60, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, 60 - len(row) :], mask[i, 60 - len(row) :] = row, 1
    summarised["rule_calls"] = 0
    with torch.no_grad():
        batched = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert summarised["rule_calls"] == 12 * model.config.num_hidden_layers  # every step: the padded rule
    for i, row in enumerate(rows):
        alone = generate(model, row[None], max_new_tokens=12)
        assert batched[i, 60:].tolist() == alone.sequences[0, len(row) :].tolist()


def test_a_copied_model_builds_its_own_cache():
    model = cab(gpt2())
    twin = copy.deepcopy(model)
    assert twin._prepare_cache_for_generation.model is twin  # the hook follows the copy, not the original
    ids = tokens(1, 40)
    assert_same_generation(generate(twin, ids, max_new_tokens=5), generate(model, ids, max_new_tokens=5))
    assert type(generate(twin, ids, max_new_tokens=2).past_key_values) is CABCache


def test_a_user_cache_and_other_attention_are_left_alone():
    model = cab(gpt2())
    user_cache = DynamicCache()
    out = generate(model, tokens(1, 20), user_cache, max_new_tokens=2)
    assert out.past_key_values is user_cache and type(user_cache) is DynamicCache
    model.set_attn_implementation("sdpa")
    assert type(generate(model, tokens(1, 20), max_new_tokens=2).past_key_values) is DynamicCache


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="config must be a transformers PretrainedConfig"):
        CABCache(None)
    with pytest.raises(ValueError, match="model must be a transformers model that can generate"):
        use_cab_cache(torch.nn.Linear(2, 2))
    state = KeyBlockSummaries(16, ("mean",))
    state.extend(torch.randn(1, 1, 40, 4))
    with pytest.raises(ValueError, match="asked for kind 'bound'"):
        state.for_scoring("bound", 2)
    with pytest.raises(ValueError, match=r"over 5 blocks \(allowed: 2 or 3\)"):
        state.for_scoring("mean", 5)


def test_decode_benchmark_reports_cached_uncached_and_dense():
    from hf_icl.benchmarks.cab import decode_section, parse_args

    args = parse_args(["--smoke", "--device", "cpu", "--cache-lengths", "80", "160"])
    table = decode_section(args)
    header = next(line for line in table if line.startswith("| cache length"))
    assert "cached" in header and "uncached" in header and "sdpa" in header
    rows = [line for line in table if line.startswith("| 80 ") or line.startswith("| 160 ")]
    assert len(rows) == 2 and all(float(cell) > 0 for cell in rows[0].strip("|").split("|")[1:4])
