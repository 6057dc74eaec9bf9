"""CAB as a registered transformers attention implementation, on tiny random GPT-2 and Llama models."""

from types import SimpleNamespace

import pytest
import torch
from tiny_models import cab_llama, tiny_gpt2, tokens
from transformers import (
    AttentionInterface,
    GPT2LMHeadModel,
)
from transformers.masking_utils import AttentionMaskInterface

import hf_icl
from hf_icl.attention.cab import POLICIES, CABParams, cab_attention_forward, select_cab_blocks
from hf_icl.kernels.block_sparse_reference import token_keep_mask

SMALL = dict(block_size=16, min_seq_len=0)


def test_cab_is_registered_for_attention_and_masks():
    assert "cab" in AttentionInterface._global_mapping
    assert "cab" in AttentionMaskInterface._global_mapping


def _dense_reference(q, k, v, token_keep, scaling):
    """Full softmax over each query's own blocks, written out with the dense token mask."""
    allowed = token_keep_mask(token_keep, 16, k.shape[2])
    scores = (q.double() @ k.double().transpose(-1, -2)) * scaling
    return (torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v.double()).transpose(1, 2)


def test_attention_function_equals_dense_attention_on_selected_blocks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 100, 32, generator=g) for _ in range(3))
    params = CABParams(sparsity=0.6, policy="frc", **SMALL)
    module = SimpleNamespace(config=SimpleNamespace(**params.to_config_fields()), training=False)
    out, weights = cab_attention_forward(module, q, k, v, None, scaling=0.2)
    keep = select_cab_blocks(q, k, params, 0.2)  # (B, H, N, Mk): each token's blocks
    assert weights is None and out.shape == (2, 100, 3, 32) and keep.shape == (2, 3, 100, 7)
    torch.testing.assert_close(out.double(), _dense_reference(q, k, v, keep, 0.2), atol=1e-5, rtol=1e-5)
    own = torch.arange(100) // 16
    assert keep[..., torch.arange(100), own].all()  # each token's own block is always kept
    assert not (keep & (torch.arange(7) > own[:, None])).any()  # never a future block
    assert keep.sum() < (own + 1).sum() * 2 * 3  # really sparse


def test_no_policy_lets_later_queries_or_keys_change_earlier_outputs():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 128, 32, generator=g) for _ in range(3))
    late = [x.clone() for x in (q, k, v)]
    for x in late:
        x[:, :, 100:] = 25.0 * torch.randn(x[:, :, 100:].shape, generator=g)  # everything after position 99

    for policy in POLICIES:
        params = CABParams(sparsity=0.7, policy=policy, **SMALL)
        module = SimpleNamespace(config=SimpleNamespace(**params.to_config_fields()), training=False)
        early = [cab_attention_forward(module, *x, None, scaling=0.2)[0][:, :100] for x in ((q, k, v), late)]
        assert torch.equal(*early), policy


def test_bf16_and_fp16_attention_close_to_fp32():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 96, 32, generator=g) for _ in range(3))
    params = CABParams(sparsity=0.6, policy="hybrid", **SMALL)
    module = SimpleNamespace(config=SimpleNamespace(**params.to_config_fields()), training=False)
    for dtype in (torch.bfloat16, torch.float16):
        low = [t.to(dtype) for t in (q, k, v)]
        keep = select_cab_blocks(*low[:2], params, 0.2)  # the blocks the low-precision run selects
        expected = _dense_reference(*(t.float() for t in low), keep, 0.2)
        out = cab_attention_forward(module, *low, None, scaling=0.2)[0]
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("build", [tiny_gpt2, cab_llama])
def test_sparsity_zero_equals_sdpa(build):
    ids = tokens(2, 70)
    reference = build()
    expected = reference(ids).logits
    model = hf_icl.enable_cab(build(), sparsity=0.0, **SMALL)
    assert model.config._attn_implementation == "cab"
    torch.testing.assert_close(model(ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_padding_left_and_right_at_sparsity_zero_and_no_nan_when_sparse():
    ids = tokens(2, 48)
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    mask[1, 40:] = 0  # right padding
    expected = tiny_gpt2()(ids, attention_mask=mask).logits
    dense = hf_icl.enable_cab(tiny_gpt2(), sparsity=0.0, **SMALL)(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(dense[real], expected[real], atol=1e-5, rtol=1e-5)
    sparse = hf_icl.enable_cab(tiny_gpt2(), sparsity=0.5, **SMALL)(ids, attention_mask=mask).logits
    assert torch.isfinite(sparse).all()


def test_generation_at_sparsity_zero_matches_sdpa_token_for_token():
    prompt = tokens(1, 40)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    expected = tiny_gpt2().generate(prompt, **kwargs)
    got = hf_icl.enable_cab(tiny_gpt2(), sparsity=0.0, **SMALL).generate(prompt, **kwargs)
    assert torch.equal(got, expected)
    sparse = hf_icl.enable_cab(tiny_gpt2(), sparsity=0.7, **SMALL).generate(prompt, **kwargs)
    assert sparse.shape == expected.shape


def test_gradients_flow_through_sparse_attention(gpt2_lm):
    model = hf_icl.enable_cab(gpt2_lm, sparsity=0.5, **SMALL).train()
    ids = tokens(2, 64)
    model(ids, labels=ids).loss.backward()
    grad = model.transformer.h[0].attn.c_attn.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_hyperparameters_survive_save_and_from_pretrained(tmp_path, gpt2_lm):
    model = hf_icl.enable_cab(gpt2_lm, sparsity=0.8, policy="magnitude", **SMALL)
    model.save_pretrained(tmp_path)
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="cab")
    params = CABParams.from_config(reloaded.config)
    assert (params.sparsity, params.policy, params.block_size) == (0.8, "magnitude", 16)
    ids = tokens(1, 64)
    torch.testing.assert_close(reloaded.eval()(ids).logits, model(ids).logits)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sparsity": 1.0}, "cab_sparsity"),
        ({"sparsity": -0.1}, "cab_sparsity"),
        ({"block_size": 48}, "cab_block_size"),
        ({"block_size": 256}, "cab_block_size"),
        ({"policy": "random"}, "cab_policy"),
        ({"budget": "layer"}, "cab_budget"),
        ({"sink_blocks": -1}, "cab_sink_blocks"),
        ({"local_blocks": 0}, "cab_local_blocks"),
        ({"decode": "skip"}, "cab_decode"),
        ({"lam": -1.0}, "cab_lambda"),
    ],
)
def test_bad_hyperparameters_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hf_icl.enable_cab(tiny_gpt2(), **kwargs)


def test_oracle_policy_keeps_the_blocks_with_the_most_true_attention_mass(gpt2_lm):
    """cab_policy='oracle': each token keeps its own block plus the past block carrying the most of its true
    (dense causal softmax) attention mass, at a budget of 2 blocks."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 128, 32, generator=g), torch.randn(1, 2, 128, 32, generator=g)
    params = CABParams(sparsity=0.0, policy="oracle", sink_blocks=0, budget="topk", topk=2, **SMALL)
    keep = select_cab_blocks(q, k, params, 0.2)
    causal = torch.ones(128, 128, dtype=torch.bool).tril()
    probs = torch.softmax((q @ k.transpose(-1, -2) * 0.2).masked_fill(~causal, float("-inf")), -1)
    for t in range(16, 128, 7):
        own = t // 16
        mass = torch.stack([probs[0, 0, t, 16 * j : 16 * j + 16].sum() for j in range(own)])  # past blocks
        kept = keep[0, 0, t, :own]
        assert keep[0, 0, t, own] and int(kept.sum()) == 1
        assert int(mass.argmax()) == int(kept.nonzero())
    sparse_model = hf_icl.enable_cab(gpt2_lm, sparsity=0.5, policy="oracle", **SMALL)
    assert torch.isfinite(sparse_model(tokens(1, 64)).logits).all()


def test_the_budget_follows_what_is_given():
    """A sparsity alone is the row budget, a block count alone (or nothing) the top-k budget of 16 blocks; both
    without a budget are refused; enable_cab switches the budget of a model that had the other one."""
    default = CABParams()
    assert (default.budget, default.topk, default.sparsity) == ("topk", 16, 0.9)
    assert CABParams(sparsity=0.5).budget == "row" and CABParams(topk=4).budget == "topk"
    assert CABParams(sparsity=0.5, topk=4, budget="topk").budget == "topk"
    with pytest.raises(ValueError, match="cab_sparsity=0.5 and cab_topk=4 are both given without cab_budget"):
        CABParams(sparsity=0.5, topk=4)
    model = hf_icl.enable_cab(tiny_gpt2(), **SMALL)
    assert (model.config.cab_budget, model.config.cab_topk) == ("topk", 16)
    hf_icl.enable_cab(model, sparsity=0.5)
    assert (model.config.cab_budget, model.config.cab_sparsity) == ("row", 0.5)
    hf_icl.enable_cab(model, topk=3)
    assert (model.config.cab_budget, model.config.cab_topk) == ("topk", 3)
    with pytest.raises(ValueError, match="without budget"):
        hf_icl.enable_cab(model, sparsity=0.5, topk=3)
    # saved and reloaded, the resolved budget stays
    again = CABParams.from_config(model.config)
    assert (again.budget, again.topk, again.sparsity) == ("topk", 3, 0.5)


def test_a_top_k_budget_covering_every_block_is_dense_and_a_smaller_one_is_not():
    ids = tokens(1, 96)  # six blocks of 16
    dense = tiny_gpt2()(ids).logits
    covering = hf_icl.enable_cab(tiny_gpt2(), topk=6, **SMALL)(ids).logits
    torch.testing.assert_close(covering, dense, rtol=0, atol=0)
    smaller = hf_icl.enable_cab(tiny_gpt2(), topk=3, **SMALL)(ids).logits
    assert not torch.allclose(smaller[:, 48:], dense[:, 48:], atol=1e-4)  # tokens past block 3 drop blocks
    torch.testing.assert_close(smaller[:, :48], dense[:, :48], rtol=1e-5, atol=1e-5)  # the first 3 blocks see all


def test_a_prompt_shorter_than_cab_min_seq_len_runs_dense_and_says_so_once():
    """Below cab_min_seq_len (default 1024) CAB runs dense by design; a user who asked for sparsity is told once per
    model, not once per layer or call, and not at all when nothing would have been sparse anyway."""
    import warnings

    model = hf_icl.enable_cab(tiny_gpt2(), sparsity=0.9, block_size=16)
    assert CABParams.from_config(model.config).min_seq_len == 1024
    ids = tokens(1, 200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = model(ids).logits
        model(tokens(1, 150))
    messages = [str(w.message) for w in caught if "CAB ran dense attention" in str(w.message)]
    assert len(messages) == 1 and "200 tokens" in messages[0] and "cab_min_seq_len=1024" in messages[0]
    torch.testing.assert_close(logits, tiny_gpt2()(ids).logits)  # dense indeed
    quiet = [
        hf_icl.enable_cab(tiny_gpt2(), sparsity=0.0, block_size=16),  # dense by its budget: nothing to say
        hf_icl.enable_cab(tiny_gpt2(), sparsity=0.9, block_size=16, min_seq_len=0),  # sparse: nothing to say
    ]
    for other in quiet:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            other(ids)
        assert not [w for w in caught if "CAB ran dense attention" in str(w.message)]
