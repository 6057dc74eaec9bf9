"""The SGPT document's MLPs: inputs per prefix, one-pass predictions, causality, heads, save/load, configs, training."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel

from hf_icl import build_model
from hf_icl.modeling.sgpt import (
    MLPForInContextRegression,
    MLPICLConfig,
    OneLayerFeatureMapConfig,
    OneLayerFeatureMapModel,
    feature_map,
    prompt_matrix,
)
from hf_icl.training import ICLTrainingArguments

D, P = 3, 8  # input dimension, n_points (the padded context)
MLP_INPUTS = ("vectorized", "features", "both", "estimate")


def make(config_class=MLPICLConfig, model_class=MLPForInContextRegression, **kw):
    torch.manual_seed(0)
    kw = {"n_dims": D, "n_points": P, "hidden_size": 16, **kw}
    return model_class(config_class(**kw)).eval()


def prompt(batch=3, n=P, classes=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, n, D, generator=g)
    ys = torch.randint(classes, (batch, n), generator=g) if classes else torch.randn(batch, n, generator=g)
    return xs, ys


def explicit_input(model, xs, ys, i):
    """Position i's input (B, input_width), built for its prefix alone: padded slots, then ψ of the prefix."""
    config = model.config
    labels = F.one_hot(ys.long(), config.n_classes).float() if config.target_kind == "categorical" else ys[..., None]
    batch, width = xs.shape[0], config.label_width
    parts = []
    if config.mlp_input in ("vectorized", "both"):
        x_block = torch.zeros(batch, config.n_points, D)
        y_block = torch.zeros(batch, config.n_points, width)
        for j in range(i + 1):
            x_block[:, j] = xs[:, j]
        for j in range(i):
            y_block[:, j] = labels[:, j]
        parts += [x_block.flatten(1), y_block.flatten(1)]
    if config.mlp_input != "vectorized":
        prefix = prompt_matrix(xs[:, : i + 1], labels[:, : i + 1])
        prefix[:, i, D:] = 0  # the query's label is unknown (ψ must not read it either way)
        psi = feature_map(prefix, config.feature_map, config.kernel_bandwidth, label_width=width)[:, i]
        parts.append(psi[:, D:] if config.mlp_input == "estimate" else psi)
    return torch.cat(parts, dim=-1)


def per_prefix_outputs(model, xs, ys):
    """The MLP applied position by position with its own weights: (B, N, outputs)."""
    outs = []
    for i in range(xs.shape[1]):
        hidden = explicit_input(model, xs, ys, i)
        for layer in model.layers:
            hidden = model.act(hidden @ layer.weight.T + layer.bias)
        outs.append(hidden @ model.head.read_out.weight.T + model.head.read_out.bias)
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("n_points", [P, 5])
@pytest.mark.parametrize("n_hidden_layers", [0, 1, 2])
@pytest.mark.parametrize("mlp_input", MLP_INPUTS)
def test_one_pass_equals_per_prefix_loop(mlp_input, n_hidden_layers, n_points):
    model = make(mlp_input=mlp_input, n_hidden_layers=n_hidden_layers, activation_function="gelu")
    xs, ys = prompt(n=n_points)
    expected = per_prefix_outputs(model, xs, ys).squeeze(-1)
    torch.testing.assert_close(model(xs, ys).predictions, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("feature_map_name", ["linear", "exponential", "l1"])
@pytest.mark.parametrize("mlp_input", ["both", "estimate"])
def test_other_feature_maps_and_categorical_labels(feature_map_name, mlp_input):
    bandwidth = 2.0 if feature_map_name == "exponential" else None
    kw = {"feature_map": feature_map_name, "kernel_bandwidth": bandwidth, "mlp_input": mlp_input}
    model = make(**kw)
    xs, ys = prompt()
    torch.testing.assert_close(model(xs, ys).predictions, per_prefix_outputs(model, xs, ys).squeeze(-1))
    model = make(target_kind="categorical", n_classes=4, **kw)
    xs, ys = prompt(classes=4)
    torch.testing.assert_close(model(xs, ys).logits, per_prefix_outputs(model, xs, ys), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_points", [P, 6])
@pytest.mark.parametrize("mlp_input", MLP_INPUTS)
def test_model_inputs_hold_the_documented_layout(mlp_input, n_points):
    model = make(mlp_input=mlp_input, target_kind="categorical", n_classes=3)
    xs, ys = prompt(n=n_points, classes=3)
    inputs = model.model_inputs(xs, ys)
    assert inputs.shape == (3, n_points, model.config.input_width)
    for i in range(n_points):
        torch.testing.assert_close(inputs[:, i], explicit_input(model, xs, ys, i))
    if mlp_input != "vectorized":  # the first layer's slot sums equal the layer on the padded input
        return
    layer = model.layers[0]
    first = model._first_layer(xs, F.one_hot(ys, 3).float(), None)
    torch.testing.assert_close(first, layer(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mlp_input", MLP_INPUTS)
def test_prediction_i_ignores_y_i_and_everything_later(mlp_input):
    model = make(mlp_input=mlp_input)
    xs, ys = prompt()
    base = model(xs, ys).predictions
    for i in (0, 3, P - 1):
        xs2, ys2 = xs.clone(), ys.clone()
        ys2[:, i:] += 5.0
        xs2[:, i + 1 :] -= 3.0
        moved = model(xs2, ys2).predictions
        assert torch.equal(moved[:, : i + 1], base[:, : i + 1])
        if i + 1 < P:
            assert not torch.allclose(moved[:, i + 1 :], base[:, i + 1 :])


def test_regression_loss_is_mse_over_chosen_positions():
    model = make(mlp_input="both")
    xs, ys = prompt()
    out = model(xs, ys)
    torch.testing.assert_close(out.loss, F.mse_loss(out.predictions, ys))
    subset = model(xs, ys, loss_positions=[2, 5])
    torch.testing.assert_close(subset.loss, F.mse_loss(out.predictions[:, [2, 5]], ys[:, [2, 5]]))


def test_binary_and_categorical_heads():
    xs, ys = prompt()
    labels = torch.where(ys >= 0, 1.0, -1.0)
    model = make(target_kind="binary", mlp_input="both")
    out = model(xs, labels)
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.predictions, (labels + 1) / 2))
    torch.testing.assert_close(out.predictions, per_prefix_outputs(model, xs, labels).squeeze(-1))
    xs, ys = prompt(classes=5)
    out = make(target_kind="categorical", n_classes=5)(xs, ys)
    assert out.logits.shape == (3, P, 5) and out.predictions is None
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 5), ys.reshape(-1)))
    with pytest.raises(ValueError, match="±1 labels"):
        model(xs.float(), ys.float())


@pytest.mark.parametrize(
    "config_class, model_class, kw",
    [
        (MLPICLConfig, MLPForInContextRegression, {"mlp_input": "both", "feature_map": "exponential"}),
        (MLPICLConfig, MLPForInContextRegression, {"mlp_input": "estimate", "n_hidden_layers": 0}),
        (OneLayerFeatureMapConfig, OneLayerFeatureMapModel, {"feature_map": "hilbert"}),
    ],
)
def test_save_and_reload_are_bit_identical(tmp_path, config_class, model_class, kw):
    model = make(config_class, model_class, **kw)
    xs, ys = prompt()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    for loader in (model_class.from_pretrained, AutoModel.from_pretrained):
        reloaded = loader(tmp_path).eval()
        assert type(reloaded) is model_class
        fields = ("mlp_input", "feature_map", "hidden_size", "n_hidden_layers", "n_points", "n_dims")
        assert {f: getattr(reloaded.config, f) for f in fields} == {f: getattr(model.config, f) for f in fields}
        assert torch.equal(reloaded(xs, ys).predictions, model(xs, ys).predictions)
    assert type(AutoConfig.from_pretrained(tmp_path)) is config_class


def test_default_init_is_pytorchs_linear_init():
    model = make(mlp_input="vectorized", hidden_size=256)
    for layer in (*model.layers, model.head.read_out):
        bound = 1 / math.sqrt(layer.in_features)
        for tensor in (layer.weight, layer.bias):
            assert 0 < tensor.abs().max() <= bound
            if tensor.numel() >= 64:  # U(±bound) fills its range
                assert tensor.abs().max() > 0.9 * bound
    assert model.layers[0].in_features == P * (D + 1)


def test_one_layer_model_is_eq_9():
    model = make(OneLayerFeatureMapConfig, OneLayerFeatureMapModel, feature_map="linear")
    assert len(model.layers) == 1 and model.layers[0].in_features == D + 1 and model.act.__class__.__name__ == "ReLU"
    xs, ys = prompt()
    psi = feature_map(prompt_matrix(xs, ys), "linear")
    layer, read_out = model.layers[0], model.head.read_out
    expected = (torch.relu(psi @ layer.weight.T + layer.bias) @ read_out.weight.T + read_out.bias).squeeze(-1)
    torch.testing.assert_close(model(xs, ys).predictions, expected)
    assert OneLayerFeatureMapConfig().hidden_size == 256 and OneLayerFeatureMapConfig().mlp_input == "features"


def test_hidden_states_gradients_and_float64():
    model = make(n_hidden_layers=2, mlp_input="both").train()
    xs, ys = prompt()
    out = model(xs, ys, output_hidden_states=True)
    assert len(out.hidden_states) == 2 and out.hidden_states[0].shape == (3, P, 16)
    assert model(xs, ys).hidden_states is None
    out.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    double = model.double()
    assert double(xs.double(), ys.double()).predictions.dtype == torch.float64


def test_bad_prompts_and_keywords():
    model = make()
    xs, ys = prompt()
    with pytest.raises(ValueError, match="at most n_points=8"):
        model(torch.randn(1, P + 1, D), torch.randn(1, P + 1))
    with pytest.raises(ValueError, match="xs must have shape"):
        model(xs[..., :2], ys)
    with pytest.raises(ValueError, match="did you mean 'loss_positions'"):
        model(xs, ys, loss_position=[1])
    with pytest.raises(ValueError, match="output_attentions"):
        model(xs, ys, output_attentions=True)
    with pytest.raises(ValueError, match="must hold finite values"):
        model(xs, ys.masked_fill(ys > 1, float("nan")))
    model(xs, ys, return_dict=True, output_attentions=False)  # harmless keywords pass


@pytest.mark.parametrize(
    "config_class, kwargs, match",
    [
        (MLPICLConfig, {"n_hiden_layers": 2}, "unknown field 'n_hiden_layers'; did you mean 'n_hidden_layers'"),
        (MLPICLConfig, {"mlp_input": "flat"}, r"mlp_input must be one of \['vectorized', 'features', 'both'"),
        (MLPICLConfig, {"feature_map": "gauss"}, "feature_map must be one of"),
        (MLPICLConfig, {"kernel_bandwidth": 0.5}, "kernel_bandwidth applies to feature_map='exponential' only"),
        (MLPICLConfig, {"feature_map": "exponential", "kernel_bandwidth": -1.0}, "kernel_bandwidth must be"),
        (MLPICLConfig, {"n_hidden_layers": -1}, r"n_hidden_layers must be an integer in \[0, \+inf\), got -1"),
        (MLPICLConfig, {"hidden_size": 0}, "hidden_size must be an integer in"),
        (MLPICLConfig, {"activation_function": "swishy"}, "activation_function must be one of"),
        (MLPICLConfig, {"target_kind": "ordinal"}, "target_kind"),
        (MLPICLConfig, {"n_points": 0}, "n_points"),
        (OneLayerFeatureMapConfig, {"mlp_input": "vectorized"}, r"mlp_input must be one of \['features'\]"),
        (OneLayerFeatureMapConfig, {"model_type": "mlp_icl"}, "model_type"),
    ],
)
def test_config_validation(config_class, kwargs, match):
    with pytest.raises(ValueError, match=match):
        config_class(**kwargs)


def test_presets_build_model_and_training_arguments():
    assert [MLPICLConfig.from_preset(s).hidden_size for s in ("tiny", "small", "standard")] == [256, 512, 1024]
    assert OneLayerFeatureMapConfig.from_preset("tiny").hidden_size == 64
    with pytest.raises(ValueError, match="hidden_size"):
        MLPICLConfig.from_preset("tiny", hidden_size=8)
    with pytest.raises(ValueError, match="size must be one of"):
        MLPICLConfig.from_preset("huge")
    model = build_model("mlp_icl", "tiny", n_dims=4, n_points=10)
    assert type(model) is MLPForInContextRegression and model.config.hidden_size == 256
    assert type(build_model("one_layer_feature_map", "small", n_dims=4, n_points=10)) is OneLayerFeatureMapModel
    with pytest.raises(ValueError, match="model_type='mlp_icl' has none to select"):
        build_model("mlp_icl", "tiny", attn_implementation="sdpa", n_dims=4, n_points=10)
    args = ICLTrainingArguments(model_type="mlp_icl", model_size="tiny", n_dims=4, n_points=10, report_to="none")
    assert args.model_type == "mlp_icl"
    with pytest.raises(ValueError, match="mlp_input"):
        ICLTrainingArguments(model_type="mlp_icl", n_dims=4, n_points=10, model_overrides='{"mlp_input": "x"}')


def test_training_on_linear_regression_reduces_the_loss():
    torch.manual_seed(0)
    model = MLPForInContextRegression(
        MLPICLConfig.from_preset("tiny", n_dims=4, n_points=10, mlp_input="both", feature_map="linear")
    ).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    def batch(size=64):
        xs = torch.randn(size, 10, 4, generator=g)
        return xs, torch.einsum("bnd,bd->bn", xs, torch.randn(size, 4, generator=g))  # a fresh w per prompt

    eval_xs, eval_ys = batch(512)
    with torch.no_grad():
        before = model(eval_xs, eval_ys).loss.item()
    for _ in range(300):
        xs, ys = batch()
        loss = model(xs, ys, check_inputs=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = model(eval_xs, eval_ys).loss.item()
    assert after < 0.6 * before, (before, after)  # measured: 4.64 -> 2.39
