"""CAB's evaluation helpers (hf_icl.evaluation.cab_methods) and the observer hook they read CAB's selection through
(hf_icl.attention.cab.observe_cab_selection): each call hands over the selection it attended over, so an evaluation
selects nothing itself; the probes' numbers against an independent dense computation; the retired per-block names."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
from kernel_helpers import needs_triton
from tiny_models import tiny_gpt2, tiny_llama

import hf_icl.attention as attention
from hf_icl.attention import cab
from hf_icl.attention.cab import enable_cab, observe_cab_selection, select_cab_blocks
from hf_icl.attention.preservation import attention_preservation
from hf_icl.evaluation.cab_methods import (
    NIAHMethod,
    PreservationProbe,
    SelectionCounter,
    apply_method,
    observing,
    restoring_attention,
)

BS = 16


def test_decode_steps_are_observed_too_and_counters_skip_them():
    model = enable_cab(tiny_gpt2(64), sparsity=0.5, block_size=BS, min_seq_len=0)
    calls, counter = [], SelectionCounter()
    with observe_cab_selection(calls.append), observing(counter), torch.no_grad():
        model.generate(torch.arange(50)[None], max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert [call.query.shape[2] for call in calls] == [50, 50, 1, 1]
    assert [call.token_keep.shape[2] for call in calls] == [50, 50, 1, 1]
    assert counter.calls == 2  # the prefill's two layers only


def test_the_selection_runs_once_per_layer_per_prefill(monkeypatch):
    """The probe reads the call's own selection: one selector per layer, none of the public selections."""
    counts = {"token_block_selector": 0, "select_token_blocks": 0, "select_cab_blocks": 0}

    def counting(name, original):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        return wrapper

    for name in counts:
        monkeypatch.setattr(cab, name, counting(name, getattr(cab, name)))
    model = tiny_gpt2(64)
    with restoring_attention(model):
        apply_method(model, NIAHMethod("frc", 0.5), BS, "row")
        probe = PreservationProbe(20, 30, 5, 80)
        with observing(probe), torch.no_grad():
            model(torch.arange(84)[None] % 64, use_cache=False)
    assert counts == {"token_block_selector": 2, "select_token_blocks": 0, "select_cab_blocks": 0}
    assert len(probe.scores) == probe.calls == 2
    assert model.config._attn_implementation != "cab" and not hasattr(model.config, "cab_sparsity")


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
@pytest.mark.parametrize("method", [NIAHMethod("frc", 0.5), NIAHMethod("quest", kept_blocks=2)])
def test_the_probe_equals_an_independent_dense_computation(factory, method):
    """Preservation and achieved sparsity from the observed forward, recomputed from each layer's queries and keys
    with full dense softmax over the selected blocks (token by token), the selection made again here."""
    model = factory(64)
    ids = torch.randint(0, 64, (1, 90), generator=torch.Generator().manual_seed(1))
    prompt, needle, rows = 86, (33, 41), 7
    with restoring_attention(model):
        apply_method(model, method, BS, "row")
        probe, calls = PreservationProbe(*needle, rows, prompt), []  # calls: the queries and keys the probe saw
        with observing(probe), observe_cab_selection(calls.append), torch.no_grad():
            model(ids, use_cache=False)
    scores, kept_pairs, causal_pairs = [], 0, 0
    for call in calls:
        q, k = call.query, call.key
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        token_keep = select_cab_blocks(q, call.key, call.params, call.scaling)
        n = q.shape[2]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        probs = torch.softmax(
            (q.float() @ k.float().transpose(-1, -2) * call.scaling).masked_fill(~causal, -math.inf), -1
        )
        kept = torch.zeros(1, q.shape[1], n, n, dtype=torch.bool)
        for t in range(n):
            for s in range(t + 1):
                kept[0, :, t, s] = token_keep[0, :, t, s // BS]
        on_needle = torch.zeros(prompt, dtype=torch.bool)
        on_needle[needle[0] : needle[1]] = True
        scored = slice(prompt - rows, prompt)
        p = probs[:, :, scored, :prompt]
        share = (p * kept[:, :, scored, :prompt] * on_needle).sum((-2, -1)) / (p * on_needle).sum((-2, -1))
        scores.append(float(share.mean()))
        block_causal = (torch.arange(n)[:, None] // BS) >= torch.arange(token_keep.shape[-1])
        kept_pairs += int((token_keep & block_causal).sum())
        causal_pairs += int(block_causal.sum()) * token_keep.shape[1]
    assert probe.value() == pytest.approx(sum(scores) / len(scores), abs=1e-5)
    assert probe.achieved_sparsity() == pytest.approx(1 - kept_pairs / causal_pairs, abs=1e-12)


def test_a_counter_that_saw_nothing_says_so():
    with pytest.raises(RuntimeError, match="no attention call reached the CAB probe"):
        SelectionCounter().achieved_sparsity()


@needs_triton
@pytest.mark.parametrize("padded", [False, True])
def test_the_kernel_routes_report_their_block_lists_as_the_same_selection(padded):
    """``cab_backend="triton"`` (the interpreter on CPU): the prefill's and a decode step's block lists, turned into
    the bool selection the observer gets, equal the public per-token selection."""
    model = enable_cab(tiny_gpt2(64), sparsity=0.5, block_size=BS, min_seq_len=0, backend="triton", policy="magnitude")
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :7] = 0
    calls = []
    with observe_cab_selection(calls.append), torch.no_grad():
        out = model(ids, attention_mask=mask, use_cache=True)
        if not padded:
            model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    assert [call.route for call in calls] == ["triton_prefill"] * 2 + ([] if padded else ["triton_decode"] * 2)
    for call in calls:
        key_valid = mask.bool() if padded else None
        expected = select_cab_blocks(
            call.query, call.key, dataclasses.replace(call.params, backend="torch"), call.scaling, None, key_valid
        )
        if padded:  # a padded query attends nothing
            expected = expected & mask.bool()[:, None, :, None]
        assert torch.equal(call.token_keep, expected)


# -- attention preservation and the retired per-block selection ------------------------------------------------


def test_attention_preservation():
    probs = torch.tensor([[[[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.2, 0.3, 0.5]]]])
    keep = torch.tensor([[True, False, False], [False, True, False], [True, False, True]])
    # chosen keys {0, 1}: mass on them 1 + 1 + 0.5 = 2.5; kept 1 + 0.75 + 0.2 = 1.95
    out = attention_preservation(probs, keep, torch.tensor([0, 1]))
    torch.testing.assert_close(out, torch.tensor([[1.95 / 2.5]]))
    out_bool = attention_preservation(probs, keep, torch.tensor([True, True, False]))
    torch.testing.assert_close(out_bool, out)
    # all keys: (1 + 0.75 + 0.7) / 3
    torch.testing.assert_close(attention_preservation(probs, keep), torch.tensor([[2.45 / 3]]))
    # chosen key without mass → 1.0, never NaN
    torch.testing.assert_close(attention_preservation(probs, keep, torch.tensor([2]))[0, 0], torch.tensor(0.5 / 0.5))
    zero = attention_preservation(torch.zeros(1, 1, 2, 2), torch.ones(2, 2, dtype=torch.bool))
    assert torch.equal(zero, torch.ones(1, 1))


def test_retired_per_block_names_say_what_replaces_them():
    from hf_icl.attention import selection

    for name in (
        "select_blocks",
        "SELECTION_POLICIES",
        "block_scores",
        "true_block_mass",
        "reference_cab_v3_selection",
    ):
        with pytest.raises(AttributeError, match=f"hf_icl.attention.{name} was retired.*use "):
            getattr(attention, name)
        with pytest.raises(AttributeError, match=f"selection.{name} was retired"):
            getattr(selection, name)
    assert not hasattr(attention, "select_blocks") and not hasattr(attention, "no_such_name")
    assert attention.BUDGETS == ("row", "topk")  # one BUDGETS: the per-token rule's
    with pytest.warns(DeprecationWarning, match="moved to hf_icl.attention.preservation"):
        assert selection.attention_preservation is attention_preservation
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attention.attention_preservation is attention_preservation
