"""The methods NIAH and perplexity evaluate: budgets in blocks (the anchors' unit) beside sparsities, and the scored
aliases ``quest`` and ``max_l2``; each checked against CAB switched on by hand and against a count of the rule."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_gpt2

from hf_icl.attention.cab import enable_cab
from hf_icl.cli import main
from hf_icl.evaluation.niah import METHOD_NAMES, NIAHMethod, niah_methods
from hf_icl.evaluation.perplexity import builtin_text, long_text_perplexity

BLOCK = 16
LENGTH = 160  # ten blocks of 16


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_gpt2(len(tokenizer), seed=3)


@pytest.fixture(scope="module")
def window(tokenizer):
    return tokenizer(builtin_text(), add_special_tokens=False)["input_ids"][:LENGTH]


def test_labels_fields_and_errors():
    quest = NIAHMethod("quest", kept_blocks=16)
    assert quest.label == "cab-quest@16blocks" and (quest.policy, quest.score, quest.budget) == (
        "magnitude",
        "bound",
        "topk",
    )
    assert quest.record_fields() == {
        "method": "cab-quest@16blocks",
        "policy": "magnitude",
        "score": "bound",
        "sparsity": None,
        "kept_blocks": 16,
    }
    frc = NIAHMethod("frc", 0.9)
    assert (frc.label, frc.score, frc.budget) == ("cab-frc@0.90", None, None)
    assert NIAHMethod("max_l2", 0.5).score == "max_l2" and NIAHMethod().record_fields()["policy"] == "sdpa"
    assert set(METHOD_NAMES) >= {"sdpa", "quest", "max_l2", "magnitude", "streaming", "oracle"}
    labels = [m.label for m in niah_methods(["streaming", "quest"], [0.9], [4, 8])]
    assert labels == [
        "sdpa",
        "cab-streaming@0.90",
        "cab-streaming@4blocks",
        "cab-streaming@8blocks",
        "cab-quest@0.90",
        "cab-quest@4blocks",
        "cab-quest@8blocks",
    ]
    assert [m.label for m in niah_methods(["magnitude"], [], [16])] == ["sdpa", "cab-magnitude@16blocks"]
    for bad, match in [
        (lambda: NIAHMethod("frc", 0.5, kept_blocks=4), "sparsity or kept_blocks, not both"),
        (lambda: NIAHMethod("frc", kept_blocks=0), "kept_blocks must be"),
        (lambda: NIAHMethod("sdpa", kept_blocks=4), "sdpa.*kept_blocks None"),
        (lambda: NIAHMethod("qest", kept_blocks=4), "method must be one of"),
        (lambda: niah_methods(["frc"], [], [4, 0]), r"kept_blocks\[1\] must be"),
        (lambda: niah_methods(["frc"], [], [4, 4]), "kept_blocks must not repeat"),
        (lambda: niah_methods(["frc"], [], []), "sparsities or kept_blocks must not both be empty"),
        (lambda: niah_methods(["sdpa"], [0.5]), r"policies\[0\] must be one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            bad()


def _manual_nll(model, ids: list[int], **cab) -> float:
    """Summed NLL of ``ids[1:]`` with CAB switched on by hand (every token sparse), the config put back after."""
    saved = dict(model.config.__dict__)
    enable_cab(model, block_size=BLOCK, min_seq_len=0, **cab)
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="sum"))
    finally:
        model.config.__dict__.clear()
        model.config.__dict__.update(saved)
        model.set_attn_implementation("sdpa")


def _kept_fraction_under_topk(kept_blocks: int, length: int, sink_blocks: int = 1) -> float:
    """The rule's block count written out: token t in block c keeps min(c + 1, max(K, forced)) of its c + 1 visible
    blocks (forced: the sinks and its own block)."""
    kept = total = 0
    for t in range(length):
        c = t // BLOCK
        forced = len(set(range(min(sink_blocks, c + 1))) | {c})
        kept += min(c + 1, max(kept_blocks, forced))
        total += c + 1
    return kept / total


@pytest.mark.parametrize(
    ("method", "cab"),
    [
        (NIAHMethod("quest", kept_blocks=3), {"policy": "magnitude", "score": "bound", "budget": "topk", "topk": 3}),
        (NIAHMethod("max_l2", kept_blocks=4), {"policy": "magnitude", "score": "max_l2", "budget": "topk", "topk": 4}),
        (NIAHMethod("streaming", kept_blocks=2), {"policy": "streaming", "budget": "topk", "topk": 2}),
        (NIAHMethod("magnitude", 0.6), {"policy": "magnitude", "sparsity": 0.6, "budget": "row"}),
    ],
)
def test_a_method_runs_cab_as_switched_on_by_hand(model, tokenizer, window, method, cab):
    text = tokenizer.decode(window)
    assert tokenizer(text, add_special_tokens=False)["input_ids"][:LENGTH] == window
    (record,) = long_text_perplexity(
        model, tokenizer, text, length=LENGTH, methods=[method], block_size=BLOCK, progress=False
    )
    assert record["nll"] * (LENGTH - 1) == pytest.approx(_manual_nll(model, window, **cab), rel=1e-5)
    assert (record["score"], record["kept_blocks"]) == (method.score, method.kept_blocks)
    assert model.config._attn_implementation == "sdpa" and not hasattr(model.config, "cab_topk")
    if method.kept_blocks is not None:
        expected = 1 - _kept_fraction_under_topk(method.kept_blocks, LENGTH)
        assert record["achieved_sparsity"] == pytest.approx(expected, abs=1e-12)
        assert record["sparsity"] is None


def test_a_block_budget_covering_every_block_is_dense(model, tokenizer, window):
    text = tokenizer.decode(window)
    dense, full = long_text_perplexity(
        model,
        tokenizer,
        text,
        length=LENGTH,
        methods=[NIAHMethod(), NIAHMethod("quest", kept_blocks=LENGTH // BLOCK)],
        block_size=BLOCK,
        progress=False,
    )
    assert full["achieved_sparsity"] == 0.0 and full["nll"] == pytest.approx(dense["nll"], rel=1e-5)


def test_cli_checks_kept_blocks_before_loading_a_model(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["perplexity", "--model", str(tmp_path), "--length", "64", "--kept-blocks", "4,x"])
    assert "--kept-blocks" in capsys.readouterr().err
    # the folder holds no model: the budget is refused first
    bad = main(["perplexity", "--model", str(tmp_path), "--length", "64", "--policies", "quest", "--kept-blocks", "0"])
    assert bad == 2 and "kept_blocks[0]" in capsys.readouterr().err
