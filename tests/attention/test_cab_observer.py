"""CAB's observer hook (hf_icl.attention.cab_observer): every CAB call, each layer, prefill and decode, hands its
callback the per-token selection it attended over, equal to the public selection computed independently."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_gpt2, tiny_llama

from hf_icl.attention.cab import CABSelection, enable_cab, observe_cab_selection, select_cab_blocks
from hf_icl.attention.cab_observer import is_observed

BS = 16


def _calls_of(model, ids: torch.Tensor) -> list[CABSelection]:
    calls = []
    with observe_cab_selection(calls.append), torch.no_grad():
        model(ids, use_cache=False)
    return calls


@pytest.mark.parametrize("factory", [tiny_gpt2, tiny_llama])
@pytest.mark.parametrize(
    "rule", [{"sparsity": 0.5, "policy": "frc"}, {"topk": 2, "policy": "hybrid"}, {"sparsity": 0.6, "policy": "oracle"}]
)
def test_every_layer_reports_the_selection_it_attended_over(factory, rule):
    model = enable_cab(factory(64), block_size=BS, min_seq_len=0, **rule)
    ids = torch.randint(0, 64, (1, 75), generator=torch.Generator().manual_seed(0))
    calls = _calls_of(model, ids)
    assert len(calls) == 2 and all(call.route == "torch" and call.is_prefill for call in calls)
    for call in calls:
        expected = select_cab_blocks(call.query, call.key, call.params, call.scaling)  # the public selection
        assert call.token_keep.shape == (1, call.query.shape[1], 75, 5) and torch.equal(call.token_keep, expected)
    assert not is_observed()  # the observer is gone after the block


def test_the_dense_route_reports_no_selection_and_observers_nest():
    model = enable_cab(tiny_gpt2(64), sparsity=0.5, block_size=BS, min_seq_len=200)  # shorter: dense
    outer, inner = [], []
    with observe_cab_selection(outer.append), torch.no_grad():
        with observe_cab_selection(inner.append), pytest.warns(UserWarning, match="CAB ran dense attention"):
            model(torch.arange(40)[None], use_cache=False)  # the short-prompt warning, once per model
        model(torch.arange(40)[None], use_cache=False)
    assert len(inner) == 2 and len(outer) == 4
    assert all(call.route == "dense" and call.token_keep is None for call in outer)
    with pytest.raises(ValueError, match="callback must be callable"), observe_cab_selection(None):
        pass
