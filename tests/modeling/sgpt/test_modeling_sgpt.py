"""SGPT: eq. 13 written out, the one-pass all-prefix forward against the per-prefix loop, causality,
save/load, numerics and config checks."""

import math

import pytest
import torch
from transformers import AutoConfig, AutoModel

from hf_icl.modeling import MODEL_CLASSES, build_model
from hf_icl.modeling.sgpt import NORMALIZATIONS, SGPTConfig, SGPTForInContextRegression, per_prefix_predictions

D, N = 3, 6


def tiny(dtype=torch.float64, **kw) -> SGPTForInContextRegression:
    torch.manual_seed(0)
    config = SGPTConfig(n_dims=D, n_points=N, n_embd=8, n_layer=2, **kw)
    return SGPTForInContextRegression(config).to(dtype).eval()


def prompt(batch=2, dtype=torch.float64, classes=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, N, D, generator=g, dtype=dtype)
    ys = torch.randint(classes, (batch, N), generator=g) if classes else torch.randn(batch, N, generator=g, dtype=dtype)
    return xs, ys


def phi(scores: list[float], normalization: str) -> list[float]:
    """φ on one row of allowed scores, written out."""
    if normalization == "l1":
        total = sum(abs(s) for s in scores)
        return [s / total if total else 0.0 for s in scores]
    if normalization == "softmax":
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        return [e / sum(exps) for e in exps]
    if normalization == "relu":
        return [max(s, 0.0) for s in scores]
    return list(scores)


def eq13_per_prefix(model: SGPTForInContextRegression, xs, ys) -> torch.Tensor:
    """The document's model, one prefix matrix A^i at a time, every layer written out row by row."""
    config = model.config
    w0 = model.model.read_in
    scale = 1 / math.sqrt(config.n_embd) if config.scale_attn_weights else 1.0
    preds = torch.zeros(xs.shape[:2], dtype=xs.dtype)
    largest = 0.0
    for b in range(xs.shape[0]):
        for i in range(xs.shape[1]):
            a = torch.cat((xs[b, : i + 1], ys[b, : i + 1, None]), dim=1)
            a[i, D] = 0.0
            h = a @ w0
            for layer in model.model.layers:
                g = torch.zeros_like(h)
                for t in range(h.shape[0]):
                    weights = phi([float(h[t] @ h[s]) * scale for s in range(t + 1)], config.normalization)
                    g[t] = sum(w * h[s] for s, w in enumerate(weights))
                proj = g @ layer.proj.weight.T + layer.proj.bias
                mlp = h @ layer.mlp.weight.T + layer.mlp.bias
                h = torch.nn.functional.gelu(proj + mlp) + proj + h
            largest = max(largest, float(h.abs().max()))
            preds[b, i] = h[-1] @ model.head.read_out.weight[0] + model.head.read_out.bias[0]
    return preds, largest


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("scale", [False, True])
def test_one_pass_equals_eq13_per_prefix_loop(normalization, scale):
    model = tiny(normalization=normalization, scale_attn_weights=scale)
    xs, ys = prompt()
    with torch.no_grad():
        one_pass = model(xs, ys).predictions
    with torch.no_grad():
        reference, largest_hidden = eq13_per_prefix(model, xs, ys)
    # float64 throughout; the unnormalised φ's grow hidden states cubically per layer and the read-out
    # cancels them back to O(1), so rounding is measured against the largest hidden entry
    atol = 1e-13 * largest_hidden
    torch.testing.assert_close(one_pass, reference, rtol=1e-7, atol=atol)
    torch.testing.assert_close(per_prefix_predictions(model, xs, ys), reference, rtol=1e-7, atol=atol)


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_one_pass_equals_per_prefix_loop_in_float32(normalization):
    model = tiny(dtype=torch.float32, normalization=normalization, scale_attn_weights=normalization in ("none", "relu"))
    xs, ys = prompt(batch=4, dtype=torch.float32)
    with torch.no_grad():
        one_pass = model(xs, ys).predictions
    torch.testing.assert_close(one_pass, per_prefix_predictions(model, xs, ys), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("prompt_format", ["concatenated", "interleaved"])
def test_prediction_i_ignores_y_i_and_everything_later(prompt_format):
    model = tiny(prompt_format=prompt_format)
    xs, ys = prompt()
    with torch.no_grad():
        base = model(xs, ys).predictions
        for i in range(N):
            xs2, ys2 = xs.clone(), ys.clone()
            ys2[:, i:] = torch.randn_like(ys2[:, i:]) * 10
            xs2[:, i + 1 :] = torch.randn_like(xs2[:, i + 1 :]) * 10
            moved = model(xs2, ys2).predictions
            torch.testing.assert_close(moved[:, : i + 1], base[:, : i + 1], rtol=0, atol=1e-12)
            if i + 1 < N:  # and later positions do read them
                assert not torch.allclose(moved[:, i + 1 :], base[:, i + 1 :])


def test_interleaved_prompt_is_causal_over_tokens():
    """Interleaved: the prediction at i from the whole prompt equals the last one from the prompt cut after x_i."""
    model = tiny(prompt_format="interleaved")
    xs, ys = prompt()
    with torch.no_grad():
        full = model(xs, ys).predictions
        for i in range(N):
            torch.testing.assert_close(model(xs[:, : i + 1], ys[:, : i + 1]).predictions[:, -1], full[:, i])


def test_no_query_key_value_weights_and_read_in_is_a_fixed_saved_buffer():
    model = tiny(dtype=torch.float32)
    names = {name for name, _ in model.named_parameters()}
    per_layer = {f"model.layers.{i}.{p}.{w}" for i in range(2) for p in ("proj", "mlp") for w in ("weight", "bias")}
    assert names == per_layer | {"head.read_out.weight", "head.read_out.bias"}
    assert "model.read_in" in model.state_dict() and model.model.read_in.shape == (D + 1, 8)
    assert not model.model.read_in.requires_grad
    std = SGPTForInContextRegression(SGPTConfig(n_dims=20, n_points=4, n_embd=512, n_layer=1)).model.read_in.std()
    assert abs(float(std) - 1 / math.sqrt(21)) < 0.01  # W₀ ~ N(0, 1/token_width)


@pytest.mark.parametrize("prompt_format", ["concatenated", "interleaved"])
def test_save_and_reload_are_bit_identical(tmp_path, prompt_format):
    model = tiny(dtype=torch.float32, prompt_format=prompt_format)
    xs, ys = prompt(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(reloaded) is SGPTForInContextRegression
    assert isinstance(AutoConfig.from_pretrained(tmp_path), SGPTConfig)
    assert torch.equal(reloaded.model.read_in, model.model.read_in)
    with torch.no_grad():
        assert torch.equal(reloaded(xs, ys).predictions, model(xs, ys).predictions)


def test_zero_rows_stay_finite_and_low_precision_forward_is_finite():
    model = tiny(dtype=torch.float32)
    zeros = torch.zeros(2, N, D)
    with torch.no_grad():
        out = model(zeros, torch.zeros(2, N)).predictions
        assert torch.isfinite(out).all()  # 0/0 in the l1 normalisation is defined as a zero row
        torch.testing.assert_close(out, model.head.read_out.bias.expand(2, N))  # zero rows stay zero
        xs, ys = prompt(dtype=torch.float32)
        reference = model(xs, ys).predictions
        for dtype in (torch.bfloat16, torch.float16):
            low = model.to(dtype)(xs.to(dtype), ys.to(dtype)).predictions
            assert low.dtype == dtype and torch.isfinite(low).all()
            torch.testing.assert_close(low.float(), reference, rtol=0.1, atol=0.05)
            model.float()


def test_large_inputs_do_not_overflow_half_precision_scores():
    model = tiny(dtype=torch.float16)
    xs, ys = prompt(dtype=torch.float16)
    with torch.no_grad():
        assert torch.isfinite(model(xs * 300, ys * 300).predictions).all()


def test_every_prompt_length_up_to_n_points_and_no_longer():
    model = tiny(dtype=torch.float32)
    xs, ys = prompt(dtype=torch.float32)
    with torch.no_grad():
        full = model(xs, ys).predictions
        for n in range(1, N + 1):
            torch.testing.assert_close(model(xs[:, :n], ys[:, :n]).predictions, full[:, :n])
    with pytest.raises(ValueError, match="at most n_points=6"):
        model(torch.randn(1, N + 1, D), torch.randn(1, N + 1))


def test_binary_and_categorical_heads_and_loss_positions():
    xs, ys = prompt(dtype=torch.float32)
    regression = tiny(dtype=torch.float32)
    out = regression(xs, ys, loss_positions=[1, 4])
    torch.testing.assert_close(out.loss, (out.predictions[:, [1, 4]] - ys[:, [1, 4]]).square().mean())
    binary = tiny(dtype=torch.float32, target_kind="binary")
    signs = torch.where(ys > 0, 1.0, -1.0)
    logits = binary(xs, signs).predictions
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, (signs + 1) / 2)
    torch.testing.assert_close(binary(xs, signs).loss, expected)
    categorical = tiny(dtype=torch.float32, target_kind="categorical", n_classes=3)
    _, labels = prompt(classes=3)
    out = categorical(xs, labels)
    assert out.logits.shape == (2, N, 3) and categorical.model.read_in.shape[0] == D + 3
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), labels))
    torch.testing.assert_close(out.logits, per_prefix_predictions(categorical, xs, labels))


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny(dtype=torch.float32).train()
    xs, ys = prompt(dtype=torch.float32)
    model(xs, ys).loss.backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.activation_checkpointing_enable()
    model(xs, ys).loss.backward()
    for a, p in zip(plain, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, a)


def test_presets_registration_and_build_model():
    assert MODEL_CLASSES["sgpt"] == (SGPTConfig, SGPTForInContextRegression)
    model = build_model("sgpt", "small", n_dims=5, n_points=11)
    assert (model.config.n_embd, model.config.n_layer) == (128, 6)
    assert SGPTConfig(hidden_size=32).n_embd == 32
    assert SGPTConfig(attn_normalization="softmax").normalization == "softmax"
    with pytest.raises(ValueError, match="do not also pass"):
        SGPTConfig.from_preset("tiny", n_embd=32)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"normalization": "l2"}, "normalization must be one of"),
        ({"n_embd": 0}, "n_embd"),
        ({"n_layer": 0}, "n_layer"),
        ({"activation_function": "swishy"}, "activation_function"),
        ({"prompt_format": "rows"}, "prompt_format"),
        ({"scale_attn_weights": "yes"}, "scale_attn_weights must be True or False"),
        ({"n_layers": 2}, "did you mean 'n_layer'"),
        ({"normalisation": "l1"}, "did you mean 'normalization'"),
        ({"use_cache": True}, "use_cache must be False"),
        ({"model_type": "gpt2_icl"}, "model_type"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGPTConfig(**kwargs)


def test_bad_forward_keywords_and_prompts():
    model = tiny(dtype=torch.float32)
    xs, ys = prompt(dtype=torch.float32)
    with pytest.raises(ValueError, match="did you mean 'loss_positions'"):
        model(xs, ys, loss_position=[0])
    with pytest.raises(ValueError, match="unexpected keyword"):
        model(xs, ys, position_ids=torch.arange(N))
    with pytest.raises(ValueError, match="finite"):
        model(xs, ys.masked_fill(ys > 0, float("nan")))
    with pytest.raises(ValueError, match="concatenated"):
        per_prefix_predictions(tiny(prompt_format="interleaved"), *prompt())


def test_attn_implementation_is_refused_for_sgpt_and_the_mlps():
    from hf_icl.training import ICLTrainingArguments

    for model_type in ("sgpt", "mlp_icl", "one_layer_feature_map"):
        with pytest.raises(ValueError, match=f"model_type='{model_type}' has none to select"):
            build_model(model_type, "tiny", attn_implementation="sdpa", n_dims=D, n_points=N)
        with pytest.raises(ValueError, match="has none to select"):
            ICLTrainingArguments(
                model_type=model_type, model_size="tiny", attn_implementation="eager", report_to="none"
            )
    build_model("gpt2_icl", "tiny", attn_implementation="eager", n_dims=D, n_points=N)  # GPT-2 takes any


def test_the_trainer_trains_sgpt_and_reloads_it(tmp_path):
    from training_helpers import tiny_args

    from hf_icl.data.tasks import get_task
    from hf_icl.training import train

    xs, ys = get_task("linear_regression", n_dims=3).sample(256, 6, seed=7)
    untrained = build_model("sgpt", "tiny", n_dims=3, n_points=6).eval()
    result = train(
        tiny_args(
            tmp_path, model_type="sgpt", max_steps=200, per_device_train_batch_size=32, save_steps=0, learning_rate=3e-3
        )
    )
    model = result.model.eval()
    assert isinstance(model, SGPTForInContextRegression)
    with torch.no_grad():
        before, after = untrained(xs, ys).loss, model(xs, ys).loss
        assert after < 0.75 * before, (before, after)  # 3.15 -> 2.01 measured
        reloaded = AutoModel.from_pretrained(tmp_path).eval()
        assert torch.equal(reloaded(xs, ys).predictions, model(xs, ys).predictions)


def test_attention_scores_stay_float32_under_autocast():
    model = tiny(dtype=torch.float32)
    block = model.model.layers[0]
    h = torch.randn(2, 2 * N, 8) * 3
    plain = block._attend_context(h)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = block._attend_context(h)
        queries = block._attend_queries(h[:, :N], h[:, N:])
    assert autocast.dtype == torch.float32 and torch.equal(autocast, plain)
    assert torch.equal(queries, block._attend_queries(h[:, :N], h[:, N:]))


@pytest.mark.parametrize("prompt_format", ["concatenated", "interleaved"])
def test_query_states_only_skips_nothing_that_a_prediction_reads(prompt_format):
    model = tiny(dtype=torch.float32, prompt_format=prompt_format)
    xs, ys = prompt(dtype=torch.float32)
    with torch.no_grad():
        full = model.model(xs, ys).last_hidden_state
        queries = model.model(xs, ys, queries_only=True).last_hidden_state
        with_states = model.model(xs, ys, queries_only=True, output_hidden_states=True)
    assert queries.shape == (2, N, 8)
    torch.testing.assert_close(queries, full[:, 0::2], rtol=0, atol=0)
    torch.testing.assert_close(with_states.last_hidden_state, queries, rtol=0, atol=0)
    torch.testing.assert_close(with_states.hidden_states[-1], full, rtol=0, atol=0)  # every token when asked


@pytest.mark.parametrize("spelling", [None, "none"])
def test_no_size_preset_takes_the_shape_from_model_overrides(spelling):
    import json

    from hf_icl.modeling import build_config
    from hf_icl.training import ICLTrainingArguments

    shape = {"n_embd": 24, "n_layer": 5}
    args = ICLTrainingArguments(
        model_type="sgpt",
        model_size=spelling,
        model_overrides=json.dumps(shape),
        n_dims=3,
        n_points=6,
        report_to="none",
    )
    assert args.model_size is None
    config = build_config("sgpt", None, **args.model_config_fields(args.task_family()))
    assert (config.n_embd, config.n_layer, config.n_dims) == (24, 5, 3)
    assert build_config("gpt2_icl", None, n_embd=32, n_layer=2, n_head=4).n_head == 4
    with pytest.raises(ValueError, match="model_size must be one of"):
        ICLTrainingArguments(model_type="sgpt", model_size="huge", report_to="none")


def test_the_training_arguments_offer_every_registered_model_type():
    from typing import get_args

    from hf_icl.training.arguments import ModelType

    # model_type is a typed choice (--help lists it); it must name exactly the registered architectures
    assert get_args(ModelType) == tuple(MODEL_CLASSES)
