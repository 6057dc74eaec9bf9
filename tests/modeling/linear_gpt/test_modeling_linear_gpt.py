"""Linear-attention GPT: the ICL contracts (one pass = per-prefix runs, causality, bit-exact reload) in every mode,
padding, the causal LM's loss and reload, and constant-memory generation against full recomputation."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from hf_icl.modeling import MODEL_CLASSES, build_model
from hf_icl.modeling.linear_gpt import (
    LinearAttentionCache,
    LinearGPTConfig,
    LinearGPTForCausalLM,
    LinearGPTForInContextRegression,
    LinearGPTModel,
)

D, N = 4, 7
VOCAB = 50
MODES = ("parallel", "recurrent", "chunked")
TINY = {"n_embd": 32, "n_layer": 2, "n_head": 2}


def icl_model(**kw) -> LinearGPTForInContextRegression:
    torch.manual_seed(0)
    fields = {"n_dims": D, "n_points": N, "linear_attention_chunk_size": 4, **TINY, **kw}
    return LinearGPTForInContextRegression(LinearGPTConfig(**fields)).eval()


def lm(**kw) -> LinearGPTForCausalLM:
    torch.manual_seed(0)
    fields = {"vocab_size": VOCAB, "n_positions": 96, "linear_attention_chunk_size": 8, **TINY, **kw}
    return LinearGPTForCausalLM(LinearGPTConfig(**fields)).eval()


def prompt(batch=3, classes=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, N, D, generator=g)
    ys = torch.randint(classes, (batch, N), generator=g) if classes else torch.randn(batch, N, generator=g)
    return xs, ys


def token_ids(batch, length, seed=0):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------------
# ICL model
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt_format", ["interleaved", "concatenated"])
@pytest.mark.parametrize("feature_map", ["squared_relu", "elu_plus_one"])
@pytest.mark.parametrize("mode", MODES)
def test_one_pass_equals_per_prefix_runs(mode, feature_map, prompt_format):
    model = icl_model(linear_attention_mode=mode, linear_attention_feature_map=feature_map, prompt_format=prompt_format)
    xs, ys = prompt()
    with torch.no_grad():
        one_pass = model(xs, ys).predictions
        for i in range(N):
            alone = model(xs[:, : i + 1], ys[:, : i + 1]).predictions[:, -1]
            torch.testing.assert_close(one_pass[:, i], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prompt_format", ["interleaved", "concatenated"])
@pytest.mark.parametrize("mode", MODES)
def test_prediction_i_ignores_y_i_and_everything_later(mode, prompt_format):
    model = icl_model(linear_attention_mode=mode, prompt_format=prompt_format)
    xs, ys = prompt()
    with torch.no_grad():
        base = model(xs, ys).predictions
        for i in (0, 3, N - 1):
            ys2, xs2 = ys.clone(), xs.clone()
            ys2[:, i:] += 5.0
            xs2[:, i + 1 :] -= 3.0
            moved = model(xs2, ys2).predictions
            assert torch.equal(moved[:, : i + 1], base[:, : i + 1])
            if i + 1 < N:
                assert not torch.allclose(moved[:, i + 1 :], base[:, i + 1 :])


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("feature_map", ["squared_relu", "quadratic", "quadratic_full"])
def test_modes_agree(feature_map, normalize):
    models = [
        icl_model(
            linear_attention_mode=mode, linear_attention_feature_map=feature_map, linear_attention_normalize=normalize
        )
        for mode in MODES
    ]
    xs, ys = prompt()
    with torch.no_grad():
        parallel, recurrent, chunked = (model(xs, ys).predictions for model in models)
    torch.testing.assert_close(recurrent, parallel, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked, parallel, rtol=1e-5, atol=1e-5)


def test_save_and_reload_are_bit_identical(tmp_path):
    model = icl_model(linear_attention_mode="recurrent", linear_attention_feature_map="relu", linear_attention_eps=1e-4)
    xs, ys = prompt()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    with torch.no_grad():
        expected = model(xs, ys).predictions
        for loader in (LinearGPTForInContextRegression.from_pretrained, AutoModel.from_pretrained):
            reloaded = loader(tmp_path).eval()
            assert type(reloaded) is LinearGPTForInContextRegression
            assert torch.equal(reloaded(xs, ys).predictions, expected)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, LinearGPTConfig)
    saved, loaded = model.config.to_dict(), config.to_dict()
    assert {k: v for k, v in loaded.items() if k != "_name_or_path"} == {
        k: v for k, v in saved.items() if k != "_name_or_path"
    }
    assert (config.linear_attention_mode, config.linear_attention_feature_map) == ("recurrent", "relu")


def test_heads_and_losses():
    xs, ys = prompt()
    out = icl_model()(xs, ys)
    torch.testing.assert_close(out.loss, F.mse_loss(out.predictions, ys))
    subset = icl_model()(xs, ys, loss_positions=[2, 5])
    torch.testing.assert_close(subset.loss, F.mse_loss(out.predictions[:, [2, 5]], ys[:, [2, 5]]))

    labels = torch.where(ys >= 0, 1.0, -1.0)
    out = icl_model(target_kind="binary")(xs, labels)
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.predictions, (labels + 1) / 2))

    xs, ys = prompt(classes=5)
    out = icl_model(target_kind="categorical", n_classes=5)(xs, ys, output_hidden_states=True)
    assert out.logits.shape == (3, N, 5) and out.predictions is None
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 5), ys.reshape(-1)))
    assert len(out.hidden_states) == TINY["n_layer"] + 1 and out.hidden_states[0].shape == (3, 2 * N, 32)


def test_gradients_flow_and_checkpointing_matches():
    model = icl_model().train()
    xs, ys = prompt()
    model(xs, ys).loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert plain["read_in.weight"].abs().sum() > 0 and plain["transformer.h.0.attn.c_attn.weight"].abs().sum() > 0
    assert "transformer.wte.weight" not in plain  # the unused token table is frozen
    model.zero_grad()
    model.activation_checkpointing_enable()
    model(xs, ys).loss.backward()
    for name, grad in plain.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad)


def test_gpt2_initialisation_and_garg_io_layers():
    torch.manual_seed(0)
    model = LinearGPTForInContextRegression(LinearGPTConfig(n_dims=D, n_points=N, n_embd=64, n_layer=8, n_head=2))
    block = model.transformer.h[0]
    for projection in (block.attn.c_proj, block.mlp.c_proj):  # GPT-2's 0.02 / √(2 · n_layer) = 0.005
        assert abs(projection.weight.std().item() / 0.005 - 1) < 0.1 and not projection.bias.any()
    assert abs(block.attn.c_attn.weight.std().item() / 0.02 - 1) < 0.1
    for layer in (model.read_in, model.head.read_out):  # PyTorch's default U(±1/√fan_in), as GPT2ICLConfig's "garg"
        bound = 1 / layer.in_features**0.5
        assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound


def test_registration_presets_and_build_model():
    assert MODEL_CLASSES["linear_gpt"] == (LinearGPTConfig, LinearGPTForInContextRegression)
    model = build_model("linear_gpt", "tiny", n_dims=D, n_points=N)
    assert isinstance(model, LinearGPTForInContextRegression)
    assert (model.config.n_embd, model.config.n_layer, model.config.n_head, model.config.n_positions) == (64, 3, 2, 14)
    assert build_model("linear_gpt", None, n_dims=D, n_points=N, **TINY).config.n_embd == 32
    assert LinearGPTConfig(hidden_size=48, num_attention_heads=3).n_head == 3
    with pytest.raises(ValueError, match="has none to select"):
        build_model("linear_gpt", "tiny", attn_implementation="sdpa", n_dims=D, n_points=N)
    with pytest.raises(ValueError, match="do not also pass"):
        LinearGPTConfig.from_preset("tiny", n_embd=32)
    assert isinstance(AutoModelForCausalLM.from_config(LinearGPTConfig(vocab_size=VOCAB, **TINY)), LinearGPTForCausalLM)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"linear_attention_feature_map": "softmax"},
            r"linear_attention_feature_map must be one of \[.*'identity', 'quadratic', 'quadratic_full'\], "
            "got 'softmax'",
        ),
        ({"linear_attention_eps": 0.0}, "linear_attention_eps"),
        ({"linear_attention_normalize": "yes"}, "linear_attention_normalize must be True or False"),
        ({"linear_attention_mode": "scan"}, "linear_attention_mode must be one of"),
        ({"linear_attention_backend": "cuda"}, "linear_attention_backend must be one of"),
        ({"linear_attention_chunk_size": 0}, "linear_attention_chunk_size"),
        (
            {"linear_attention_backend": "triton", "linear_attention_mode": "parallel"},
            "runs linear_attention_mode='chunked' only",
        ),
        ({"linear_attention_feature_map": "quadratic", "n_embd": 128, "n_head": 2}, "head_dim <= 32"),
        ({"linear_attention_feature_map": "quadratic_full", "n_embd": 128, "n_head": 2}, "head_dim <= 32"),
        ({"n_embd": 30, "n_head": 4}, "divisible"),
        ({"n_positions": 0}, "n_positions"),
        ({"n_dims": 0}, "n_dims"),
        ({"prompt_format": "stacked"}, "prompt_format"),
        ({"io_init": "xavier"}, "io_init"),
        ({"resid_pdrop": 1.5}, "resid_pdrop"),
        ({"n_layers": 2}, "did you mean 'n_layer'"),
        ({"linear_attention_feature": "relu"}, "did you mean 'linear_attention_feature_map'"),
        ({"model_type": "gpt2_icl"}, "model_type"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearGPTConfig(**kwargs)


def test_bad_inputs():
    model = icl_model()
    xs, ys = prompt()
    with pytest.raises(ValueError, match="at least 2 \\* n_points"):
        LinearGPTForInContextRegression(LinearGPTConfig(n_dims=D, n_points=N, n_positions=2 * N - 1, **TINY))
    with pytest.raises(ValueError, match="unexpected keyword"):
        model(xs, ys, output_attentions=True)  # linear attention has no attention matrix to return
    with pytest.raises(ValueError, match="did you mean 'loss_positions'"):
        model(xs, ys, loss_position=[0])
    with pytest.raises(ValueError, match="at most n_points"):
        model(torch.randn(1, N + 1, D), torch.randn(1, N + 1))
    with pytest.raises(ValueError, match="n_positions=96"):
        lm()(token_ids(1, 97))
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        lm().transformer()
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        lm()(token_ids(2, 5), attention_mask=torch.ones(2, 4))


# ---------------------------------------------------------------------------------------------------------------
# Padding
# ---------------------------------------------------------------------------------------------------------------


def pad_batch(rows: list[torch.Tensor], side: str, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), pad_id)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for b, row in enumerate(rows):
        where = slice(longest - len(row), None) if side == "left" else slice(0, len(row))
        ids[b, where], mask[b, where] = row, 1
    return ids, mask


@pytest.mark.parametrize("mode", ["chunked", "parallel"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_unpadded_rows(side, mode):
    model = lm(linear_attention_mode=mode, linear_attention_feature_map="elu_plus_one").transformer  # φ(0) ≠ 0
    assert isinstance(model, LinearGPTModel)
    rows = [token_ids(1, n, seed=n)[0] for n in (5, 13, 9)]
    ids, mask = pad_batch(rows, side)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask).last_hidden_state
        assert torch.equal(model(inputs_embeds=model.wte(ids), attention_mask=mask).last_hidden_state, batch)
        for b, row in enumerate(rows):
            alone = model(row[None]).last_hidden_state[0]
            torch.testing.assert_close(batch[b][mask[b].bool()], alone, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Causal LM and generation
# ---------------------------------------------------------------------------------------------------------------


def test_causal_lm_loss_is_the_shifted_cross_entropy():
    model = lm()
    ids = token_ids(3, 11)
    labels = ids.clone()
    labels[0, :4] = -100  # ignored positions
    out = model(ids, labels=labels)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    assert out.logits.shape == (3, 11, VOCAB)
    torch.testing.assert_close(model(ids, logits_to_keep=1).logits, out.logits[:, -1:])


@pytest.mark.parametrize("tie", [True, False])
def test_causal_lm_auto_round_trip_is_bit_exact(tmp_path, tie):
    model = lm(tie_word_embeddings=tie)
    assert (model.lm_head.weight is model.transformer.wte.weight) == tie
    ids = token_ids(2, 12)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is LinearGPTForCausalLM
    assert (reloaded.lm_head.weight is reloaded.transformer.wte.weight) == tie
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def tensor_bytes(obj, seen=None) -> int:
    """Bytes of every tensor reachable from ``obj`` through attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(x, seen) for x in obj.values())
    if hasattr(obj, "__dict__"):
        return tensor_bytes(vars(obj), seen)
    return 0


@pytest.mark.parametrize("feature_map", ["quadratic", "quadratic_full"])
def test_cache_is_constant_size_state_in_float32(feature_map):
    model = lm(linear_attention_feature_map=feature_map)
    with torch.no_grad():
        short = model(token_ids(2, 8), use_cache=True).past_key_values
        long = model(token_ids(2, 64), use_cache=True).past_key_values
    assert isinstance(long, LinearAttentionCache) and long.get_seq_length() == 64
    assert tensor_bytes(short) == tensor_bytes(long) > 0
    head_dim = 16  # the study's map keeps the products x_i x_j with i ≤ j; the full one every ordered pair
    features = 1 + head_dim + (head_dim * (head_dim + 1) // 2 if feature_map == "quadratic" else head_dim**2)
    s, z = long.layers[0].state
    assert s.shape == (2, 2, features, head_dim) and z.shape == (2, 2, features)
    assert s.dtype == z.dtype == torch.float32
    before = tensor_bytes(long)
    with torch.no_grad():
        model(token_ids(2, 1), past_key_values=long)  # a decode step
    assert tensor_bytes(long) == before and long.get_seq_length() == 65


@pytest.mark.parametrize("mode", MODES)
def test_lm_logits_do_not_depend_on_later_tokens(mode):
    model = lm(linear_attention_mode=mode)
    ids = token_ids(2, 20)
    with torch.no_grad():
        base = model(ids).logits
        for t in (1, 7, 19):
            moved = ids.clone()
            moved[:, t:] = (moved[:, t:] + 1) % VOCAB
            assert torch.equal(model(moved).logits[:, :t], base[:, :t])


@pytest.mark.parametrize("mode", ["chunked", "parallel"])
def test_cached_continuation_equals_full_forward(mode):
    model = lm(linear_attention_mode=mode)
    ids = token_ids(2, 20)
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids[:, :9], use_cache=True).past_key_values
        chunk = model(ids[:, 9:13], past_key_values=cache).logits  # several tokens after a prefill
        steps = [model(ids[:, t : t + 1], past_key_values=cache).logits for t in range(13, 20)]
    torch.testing.assert_close(chunk, full[:, 9:13], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 13:], rtol=1e-5, atol=1e-5)
    before = [layer.state for layer in cache.layers]
    with torch.no_grad():  # a padded token (mask 0) in row 0 leaves that row's state and position alone
        model(token_ids(2, 1), attention_mask=torch.tensor([[0], [1]]), past_key_values=cache)
    for layer, (s, z) in zip(cache.layers, before, strict=True):
        assert torch.equal(layer.state[0][0], s[0]) and torch.equal(layer.state[1][0], z[0])
        assert not torch.equal(layer.state[0][1], s[1])
    assert cache.positions.tolist() == [20, 21] and cache.get_seq_length() == 21


def greedy_by_recomputation(model, ids, mask, new_tokens):
    """The reference: the whole sequence through the model again for every token, argmax of the last logits."""
    for _ in range(new_tokens):
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


@pytest.mark.parametrize("feature_map", ["squared_relu", "elu_plus_one"])
def test_greedy_generate_equals_recomputing_the_sequence(feature_map):
    model = lm(linear_attention_feature_map=feature_map)
    ids = token_ids(2, 10)
    out = model.generate(
        ids, max_new_tokens=12, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True
    )
    assert isinstance(out.past_key_values, LinearAttentionCache)
    expected = greedy_by_recomputation(model, ids, torch.ones_like(ids), 12)
    assert torch.equal(out.sequences, expected)
    with torch.no_grad():
        full_logits = model(expected[:, :-1]).logits[:, 9:]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full_logits, rtol=1e-4, atol=1e-5)


def test_greedy_generate_with_left_padding():
    model = lm()
    rows = [token_ids(1, n, seed=n)[0] for n in (4, 11, 7)]
    ids, mask = pad_batch(rows, "left")
    out = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(out, greedy_by_recomputation(model, ids, mask, 10))
    for b, row in enumerate(rows):  # each row as if it were alone
        alone = model.generate(row[None], max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert torch.equal(out[b, ids.shape[1] :], alone[0, len(row) :])


def test_beam_search_and_sampling_run_on_the_cache():
    model = lm()
    rows = [token_ids(1, n, seed=n)[0] for n in (4, 8)]
    ids, mask = pad_batch(rows, "left")
    settings = dict(attention_mask=mask, max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, **settings)  # beams reorder the cache (reorder_cache)
    assert torch.equal(cached, model.generate(ids, use_cache=False, **settings))
    torch.manual_seed(1)
    sampled = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, num_return_sequences=2)
    assert sampled.shape == (4, ids.shape[1] + 4)


def test_the_trainer_trains_and_reloads_linear_gpt(tmp_path):
    from training_helpers import tiny_args

    from hf_icl.training import train

    result = train(tiny_args(tmp_path, model_type="linear_gpt", max_steps=3, save_steps=0))
    assert isinstance(result.model, LinearGPTForInContextRegression)
    xs, ys = torch.randn(2, 6, 3), torch.randn(2, 6)
    with torch.no_grad():
        reloaded = AutoModel.from_pretrained(tmp_path).eval()
        assert torch.equal(reloaded(xs, ys).predictions, result.model.eval()(xs, ys).predictions)


def test_a_config_saved_when_quadratic_meant_the_full_product_is_refused(tmp_path):
    """'quadratic' changed meaning (issue 29): saved with the new map it round-trips; without the marker it is refused
    with the fix, never loaded with another map than the one it was trained with."""
    import json

    from transformers import AutoModel

    from hf_icl.modeling import LinearGPTConfig, LinearGPTForInContextRegression

    config = LinearGPTConfig(n_dims=3, n_points=5, n_embd=32, n_layer=1, n_head=4,
                             linear_attention_feature_map="quadratic")  # fmt: skip
    LinearGPTForInContextRegression(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["quadratic_map"] == "upper_triangle"
    assert AutoModel.from_pretrained(tmp_path).config.linear_attention_feature_map == "quadratic"
    del saved["quadratic_map"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="now 'quadratic_full'.*Set linear_attention_feature_map to 'quadratic_full'"):
        AutoModel.from_pretrained(tmp_path)
    saved["linear_attention_feature_map"] = "quadratic_full"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert AutoModel.from_pretrained(tmp_path).config.linear_attention_feature_map == "quadratic_full"
