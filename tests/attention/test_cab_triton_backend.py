"""The "cab" attention implementation on the Triton kernels (``cab_backend="triton"``) vs its PyTorch path.

On CPU the kernels run under ``TRITON_INTERPRET=1``, so forcing ``cab_backend="triton"`` exercises exactly the
dispatch a CUDA run takes with ``"auto"``: prefill kernel + backward, split-K decode, key padding, GQA.
"""

from types import SimpleNamespace

import pytest
import torch
from kernel_helpers import DEVICE, needs_triton, record_keyword
from tiny_models import cab_llama, tiny_gpt2, tokens

from hf_icl.attention import cab as cab_module
from hf_icl.attention.cab import CABParams, _key_padding_from_mask, cab_attention_forward

# streaming selects per block (uniform within a query block), which the prefill kernel runs
SPARSE = dict(sparsity=0.5, block_size=16, min_seq_len=0, policy="streaming")


def _with_backend(model, backend, **overrides):
    return cab_module.enable_cab(model.to(DEVICE), **{**SPARSE, **overrides, "backend": backend})


def _pair(build, **overrides):
    """The same random model twice: one on the kernels, one on the PyTorch path."""
    return _with_backend(build(), "triton", **overrides), _with_backend(build(), "torch", **overrides)


@needs_triton
@pytest.mark.parametrize("build", [tiny_gpt2, cab_llama], ids=["gpt2", "llama-gqa"])
def test_prefill_logits_and_gradients_match_the_pytorch_path(build):
    kernel_model, reference_model = _pair(build)
    ids = tokens(2, 72, seed=1).to(DEVICE)  # ragged: 4.5 blocks of 16
    losses = []
    for model in (kernel_model, reference_model):
        out = model(ids, labels=ids)
        out.loss.backward()
        losses.append(out)
    torch.testing.assert_close(losses[0].logits, losses[1].logits, atol=2e-5, rtol=2e-5)
    for (name, p_kernel), p_reference in zip(
        kernel_model.named_parameters(), reference_model.parameters(), strict=True
    ):
        if p_reference.grad is None:
            assert p_kernel.grad is None, name
            continue
        torch.testing.assert_close(p_kernel.grad, p_reference.grad, atol=1e-5, rtol=1e-4, msg=name)


@needs_triton
@pytest.mark.parametrize("policy", ["streaming", "magnitude", "hybrid"])
def test_kernel_path_is_actually_taken(monkeypatch, policy):
    """With cab_backend='triton' every policy's prefill goes through the key-block-major kernels and decode through
    the split-K kernel, both fed by the fused selection's block lists."""
    calls = {"prefill": 0, "decode": 0}
    prefill, decode = cab_module.token_sparse_attention_triton, cab_module.token_sparse_decode

    def count(kind, fn):
        def wrapped(*args, **kwargs):
            calls[kind] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(cab_module, "token_sparse_attention_triton", count("prefill", prefill))
    monkeypatch.setattr(cab_module, "token_sparse_decode", count("decode", decode))
    model = _with_backend(tiny_gpt2(), "triton", policy=policy)
    model.generate(tokens(1, 48).to(DEVICE), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert calls["prefill"] == 2 and calls["decode"] == 2 * 2  # 2 layers; the 1st new token comes from prefill


@needs_triton
@pytest.mark.parametrize("build", [tiny_gpt2, cab_llama], ids=["gpt2", "llama-gqa"])
def test_greedy_generation_with_decode_kernel_matches_pytorch_path(build):
    kernel_model, reference_model = _pair(build)
    prompt = tokens(1, 64, seed=2).to(DEVICE)
    generated = [
        m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0) for m in (kernel_model, reference_model)
    ]
    assert torch.equal(generated[0], generated[1])


@needs_triton
def test_forcing_triton_where_no_kernel_runs_is_a_clear_error():
    """The oracle's dense selection, a padded batch's chunked prefill and a padded decode step whose rows are not
    left-padded have no kernel route: 'triton' says why. (On the kernels' device: CPU tensors on a CUDA machine
    without the interpreter are refused earlier, for the device.)"""
    q = k = v = torch.randn(1, 2, 64, 32, device=DEVICE)
    with pytest.raises(ValueError, match="cab_backend='triton' cannot run this call: the fused selection"):
        cab_attention_forward(_module(backend="triton", policy="oracle"), q, k, v, None)
    key_valid = torch.ones(1, 64, dtype=torch.bool, device=DEVICE)
    key_valid[:, :5] = False
    chunk = torch.randn(1, 2, 8, 32, device=DEVICE)
    causal = (56 + torch.arange(8, device=DEVICE))[:, None] >= torch.arange(64, device=DEVICE)
    with pytest.raises(ValueError, match="padded batch's chunked prefill"):
        cab_attention_forward(_module(backend="triton"), chunk, k, v, (causal & key_valid)[None, None])
    one = torch.randn(1, 2, 1, 32, device=DEVICE)
    holed = key_valid.clone()
    holed[:, 20:30] = False  # padding inside the row: not how generate pads
    with pytest.raises(ValueError, match="decode step whose rows are not left-padded"):
        cab_attention_forward(_module(backend="triton"), one, k, v, holed[:, None, None, :])
    out, _ = cab_attention_forward(_module(backend="triton"), one, k, v, key_valid[:, None, None, :])  # left: runs
    assert out.shape == (1, 1, 2, 32)


def test_key_padding_is_read_off_causal_padding_masks_only():
    n_q, n_k, offset = 5, 8, 3
    key_valid = torch.tensor([[False, False, True, True, True, True, True, True], [True] * 8])
    causal = (offset + torch.arange(n_q))[:, None] >= torch.arange(n_k)
    mask = (causal & key_valid[:, None, :]).unsqueeze(1)  # (B, 1, Nq, Nk)
    assert torch.equal(_key_padding_from_mask(mask, offset), key_valid)
    window = mask.clone()
    window[1, 0, 4, 0] = False  # a sliding-window-like hole: not expressible as key padding
    with pytest.raises(ValueError, match="causal masks with key padding only"):
        _key_padding_from_mask(window, offset)
    with pytest.raises(ValueError, match="causal masks with key padding only"):
        _key_padding_from_mask(mask, offset + 1)  # wrong causality for these positions


def _module(training=False, **fields):
    params = CABParams(**{**SPARSE, **fields})
    return SimpleNamespace(config=SimpleNamespace(**params.to_config_fields()), training=training)


def test_forcing_triton_with_dropout_or_unsupported_head_dim_is_a_clear_error():
    q = k = v = torch.randn(1, 2, 64, 32)
    with pytest.raises(ValueError, match="cab_backend='triton' cannot run this call: attention dropout"):
        cab_attention_forward(_module(training=True, backend="triton"), q, k, v, None, dropout=0.1)
    odd = torch.randn(1, 2, 64, 48)
    with pytest.raises(ValueError, match=r"head_dim must be one of \[32, 64, 128\] for the kernels, got 48"):
        cab_attention_forward(_module(backend="triton"), odd, odd, odd, None)


def test_auto_backend_falls_back_to_pytorch_for_dropout_and_cpu(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("kernels must not run here")

    monkeypatch.setattr(cab_module, "token_sparse_attention_triton", fail)
    monkeypatch.setattr(cab_module, "token_sparse_decode", fail)
    q = k = v = torch.randn(1, 2, 64, 32)
    out, _ = cab_attention_forward(_module(training=True), q, k, v, None, dropout=0.1)  # CPU + dropout
    assert out.shape == (1, 64, 2, 32)


def test_backend_field_is_validated():
    with pytest.raises(ValueError, match="cab_backend"):
        CABParams(backend="cuda")


ROUTE_TABLE = [
    # (overrides, call) → route, words of the reason
    (dict(), dict(device="cpu"), "torch", "tensors on cpu"),
    (dict(backend="torch"), dict(device="cuda"), "torch", "cab_backend='torch'"),
    (dict(), dict(device="cuda"), "triton_prefill", None),
    (dict(policy="hybrid"), dict(device="cuda"), "triton_prefill", None),
    (dict(), dict(device="cuda", n_q=1), "triton_decode", None),
    (dict(), dict(device="cuda", padded=True), "triton_prefill", None),
    (dict(), dict(device="cuda", padded=True, n_q=1), "triton_decode", None),  # left padding assumed
    (dict(), dict(device="cuda", padded=True, n_q=1, left_padded=False), "torch", "not left-padded"),
    (dict(), dict(device="cuda", padded=True, n_q=8), "torch", "padded batch's chunked prefill"),
    (dict(backend="triton"), dict(device="cuda", padded=True, n_q=1), "triton_decode", None),
    (dict(), dict(device="cuda", dropout=0.1), "torch", "attention dropout"),
    (dict(), dict(device="cuda", head_dim=48), "torch", "head_dim must be one of"),
    (dict(policy="oracle"), dict(device="cuda"), "torch", "fused selection cannot run it"),
    (dict(), dict(device="cuda", n_k=32), "dense", None),  # below min_seq_len
    (dict(decode="dense"), dict(device="cuda", n_q=1), "dense", None),
]


@needs_triton
@pytest.mark.parametrize("overrides, call, route, reason", ROUTE_TABLE)
def test_the_route_table(overrides, call, route, reason):
    """cab_route decides each call once from (device, policy, padding, dtype, head dim, dropout)."""
    params = CABParams(**{**SPARSE, "min_seq_len": 64, **overrides})
    arguments = {**dict(n_q=128, n_k=128, head_dim=64, dtype=torch.bfloat16, padded=False, dropout=0.0), **call}
    arguments["device"] = torch.device(arguments["device"])
    decided = cab_module.cab_route(params, **arguments)
    assert decided.name == route
    assert (decided.reason is None) == (reason is None)
    if reason:
        assert reason in decided.reason
    assert decided.compact == (route == "triton_prefill" and arguments["padded"])


def _padding_mask(key_valid: torch.Tensor) -> torch.Tensor:
    """The bool (B, 1, N, N) causal + key-padding mask transformers hands an attention function."""
    n = key_valid.shape[1]
    return (torch.ones(n, n, dtype=torch.bool).tril() & key_valid[:, None, :]).unsqueeze(1)


@needs_triton
@pytest.mark.parametrize(
    "policy, budget",
    [("magnitude", "row"), ("hybrid", "row"), ("streaming", "row"), ("frc", "topk"), ("frc_low", "topk")],
)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left and right padding"])
@pytest.mark.parametrize("ranges", [False, True], ids=["one range", "many query ranges"])
def test_kernel_route_equals_the_pytorch_route(policy, budget, padded, ranges, monkeypatch):
    """The registered call on the kernels (fused selection lists → key-block-major kernels, padded rows compacted,
    query ranges) equals the PyTorch route on the same inputs, values and gradients, grouped-query heads, every
    fused policy and both budgets."""
    if ranges:  # a few tokens per range: the key summaries are computed once and sliced per range
        monkeypatch.setattr(cab_module, "_KERNEL_RANGE_BYTES", 1)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 90, 32, generator=g).to(DEVICE).requires_grad_(True)
    k, v = (torch.randn(2, 2, 90, 32, generator=g).to(DEVICE).requires_grad_(True) for _ in range(2))
    mask = None
    if padded:
        key_valid = torch.ones(2, 90, dtype=torch.bool)
        key_valid[0, :7] = False
        key_valid[1, -5:] = False
        mask = _padding_mask(key_valid).to(DEVICE)
    results = []
    for backend in ("triton", "torch"):
        module = _module(backend=backend, policy=policy, sparsity=0.6, budget=budget, topk=2)
        out, _ = cab_attention_forward(module, q, k, v, mask)
        grads = torch.autograd.grad(
            (out * torch.linspace(-1, 1, out.numel(), device=DEVICE).view_as(out)).sum(), (q, k, v)
        )
        results.append((out, *grads))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def _left_padded_decode_inputs(lengths, n_k, seed=5):
    """A decode step of a left-padded batch: q (B, 4, 1, 32), k / v (B, 2, Nk, 32) with junk in the padding, the
    (B, 1, 1, Nk) bool mask transformers hands over, and the per-row key starts."""
    g = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    q = torch.randn(batch, 4, 1, 32, generator=g).to(DEVICE)
    k, v = (torch.randn(batch, 2, n_k, 32, generator=g).to(DEVICE) for _ in range(2))
    starts = [n_k - length for length in lengths]
    key_valid = torch.arange(n_k)[None, :] >= torch.tensor(starts)[:, None]
    for b, start in enumerate(starts):
        k[b, :, :start], v[b, :, :start] = 30.0, -30.0
    return q, k, v, key_valid[:, None, None, :].to(DEVICE), starts


@needs_triton
@pytest.mark.parametrize(
    "policy, budget",
    [("magnitude", "row"), ("hybrid", "row"), ("streaming", "row"), ("frc", "topk"), ("frc_low", "topk")],
)
def test_a_left_padded_decode_step_on_the_kernel_equals_pytorch_and_each_row_alone(policy, budget, monkeypatch):
    """A left-padded batch's decode step (rows of 90, 61, 33 and 17 real tokens) runs the split-K kernel with per-row
    key starts (no PyTorch attention), and equals the PyTorch route on the same inputs and each row run alone
    (unpadded, on the kernels: the fused selection) with grouped-query heads, every fused policy and both budgets."""
    q, k, v, mask, starts = _left_padded_decode_inputs([90, 61, 33, 17], 90)
    seen = record_keyword(monkeypatch, cab_module, "token_sparse_decode", "row_starts")
    monkeypatch.setattr(cab_module, "attend_selected", lambda *a, **kw: pytest.fail("the PyTorch path ran"))
    fields = dict(policy=policy, sparsity=0.6, budget=budget, topk=2)
    kernel, _ = cab_attention_forward(_module(backend="triton", **fields), q, k, v, mask)
    assert len(seen) == 1 and seen[0].tolist() == starts
    monkeypatch.undo()
    reference, _ = cab_attention_forward(_module(backend="torch", **fields), q, k, v, mask)
    torch.testing.assert_close(kernel, reference, atol=1e-5, rtol=1e-5)
    for b, start in enumerate(starts):
        alone, _ = cab_attention_forward(
            _module(backend="triton", **fields), q[b : b + 1], k[b : b + 1, :, start:], v[b : b + 1, :, start:], None
        )
        torch.testing.assert_close(kernel[b : b + 1], alone, atol=1e-5, rtol=1e-5)


@needs_triton
def test_a_left_padded_decode_step_is_observed_as_its_own_selection():
    """An observer sees the kernel route's per-token selection, the same as the PyTorch route's."""
    q, k, v, mask, _ = _left_padded_decode_inputs([90, 40], 90)
    seen = {}
    for backend in ("triton", "torch"):
        with cab_module.observe_cab_selection(lambda call, backend=backend: seen.__setitem__(backend, call)):
            cab_attention_forward(_module(backend=backend, policy="magnitude"), q, k, v, mask)
    assert seen["triton"].route == "triton_decode" and seen["torch"].route == "torch"
    assert torch.equal(seen["triton"].token_keep, seen["torch"].token_keep)


@needs_triton
@pytest.mark.parametrize("build", [tiny_gpt2, cab_llama], ids=["gpt2", "llama-gqa"])
def test_left_padded_generation_on_the_decode_kernel_matches_pytorch_and_each_row_alone(build):
    """Greedy generation of a left-padded batch: every decode step on the split-K kernel (per-row key starts) gives
    the tokens of the PyTorch route and of each row generated alone."""
    kernel_model, reference_model = _pair(build, policy="magnitude")
    rows = [tokens(1, 70, seed=3)[0], tokens(1, 45, seed=4)[0]]
    ids = torch.zeros(2, 70, dtype=torch.long)
    mask = torch.zeros(2, 70, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, 70 - len(row) :], mask[i, 70 - len(row) :] = row, 1
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    routes = []
    with torch.no_grad(), cab_module.observe_cab_selection(lambda call: routes.append(call.route)):
        batched = kernel_model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert routes.count("triton_decode") == 4 * kernel_model.config.num_hidden_layers
    with torch.no_grad():
        reference = reference_model.generate(
            ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0
        )
        assert torch.equal(batched, reference)
        for i, row in enumerate(rows):
            alone = kernel_model.generate(row[None].to(DEVICE), max_new_tokens=5, do_sample=False, pad_token_id=0)
            assert batched[i, 70:].tolist() == alone[0, len(row) :].tolist()


@needs_triton
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_selection_alone_runs_range_by_range_as_the_call_does(backend, monkeypatch):
    """run_selection_only (what the benchmark times as the selection's share) asks the same selector for the same
    ranges as the attention call: the fused lists per kernel range, the PyTorch rule per executor range."""
    monkeypatch.setattr(cab_module, "_KERNEL_RANGE_BYTES", 1)  # one block of queries per kernel range
    params = CABParams(**{**SPARSE, "policy": "magnitude", "backend": backend})
    q = k = torch.randn(1, 2, 80, 32).to(DEVICE)
    asked = []
    name = "fused_block_selector" if backend == "triton" else "token_block_selector"
    real = getattr(cab_module, name)

    def spy(*args, **kwargs):
        select = real(*args, **kwargs)

        def recorded(*call):
            asked.append(call[1] if backend == "triton" else call)
            return select(*call)

        return recorded

    monkeypatch.setattr(cab_module, name, spy)
    ranges = cab_module.run_selection_only(q, k, params, 32**-0.5)
    if backend == "triton":  # keys up to each range's last query: 16, 32, …, 80
        assert ranges == 5 and asked == [16, 32, 48, 64, 80]
    else:
        assert ranges == 1 and asked == [(0, 80)]
    assert cab_module.run_selection_only(q, k, CABParams(**{**SPARSE, "min_seq_len": 1024}), 32**-0.5) == 0


def test_the_config_is_parsed_once_per_config_and_again_only_when_a_field_changes(monkeypatch):
    """Every layer of every decode step asks for the CAB parameters: they are parsed once per config object, and a
    changed cab_* field is seen at the next call."""
    from transformers import PretrainedConfig

    from hf_icl.attention import cab_params

    calls = []
    real = cab_params.CABParams.from_config.__func__

    def counted(cls, config):
        calls.append(config)
        return real(cls, config)

    monkeypatch.setattr(cab_params.CABParams, "from_config", classmethod(counted))
    config = PretrainedConfig(**CABParams(sparsity=0.5).to_config_fields())
    first = [cab_params.cab_params_of(config) for _ in range(5)]
    assert len(calls) == 1 and all(p == first[0] for p in first)
    config.cab_sparsity = 0.75
    assert cab_params.cab_params_of(config).sparsity == 0.75 and len(calls) == 2
    config.cab_sparsty = 0.1  # a typo is still refused when the fields change
    with pytest.raises(ValueError, match="unknown CAB field 'cab_sparsty'"):
        cab_params.cab_params_of(config)
