"""GPT-2 ICL model: prompt layout, causality, heads and losses, save/load, attention backends."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel

from hf_icl.modeling import GPT2ForInContextRegression, GPT2ICLConfig, build_model
from hf_icl.modeling.prompts import ConcatenatedPrompt, InterleavedPrompt

D, N = 4, 7


def tiny(**kw) -> GPT2ForInContextRegression:
    torch.manual_seed(0)
    return GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=D, n_points=N, **kw)).eval()


def prompt(batch=3, classes=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(batch, N, D, generator=g)
    ys = torch.randint(classes, (batch, N), generator=g) if classes else torch.randn(batch, N, generator=g)
    return xs, ys


def test_interleaved_tokens_match_explicit_layout():
    xs, ys = prompt()
    tokens = InterleavedPrompt(D, 1).tokens(xs, ys.unsqueeze(-1))
    for b in range(xs.shape[0]):
        for i in range(N):
            assert torch.equal(tokens[b, 2 * i], xs[b, i])
            assert tokens[b, 2 * i + 1, 0] == ys[b, i] and not tokens[b, 2 * i + 1, 1:].any()


def test_concatenated_tokens_and_context_mask():
    xs, ys = prompt()
    tokens = ConcatenatedPrompt(D, 1).tokens(xs, ys.unsqueeze(-1))
    assert torch.equal(tokens[:, 0::2, :D], xs) and not tokens[:, 0::2, D].any()  # queries [x_i, 0]
    assert torch.equal(tokens[:, 1::2, :D], xs) and torch.equal(tokens[:, 1::2, D], ys)  # context [x_i, y_i]
    mask = ConcatenatedPrompt.context_mask(N)
    for q in range(2 * N):
        for k in range(2 * N):
            allowed = k == q or (k < q and k % 2 == 1)
            assert bool(mask[q, k]) == allowed


@pytest.mark.parametrize("prompt_format", ["interleaved", "concatenated"])
def test_prediction_i_ignores_y_i_and_everything_later(prompt_format):
    model = tiny(prompt_format=prompt_format)
    xs, ys = prompt()
    base = model(xs, ys).predictions
    for i in (0, 3, N - 1):
        ys2, xs2 = ys.clone(), xs.clone()
        ys2[:, i:] += 5.0
        if i + 1 < N:
            xs2[:, i + 1 :] -= 3.0
        moved = model(xs2, ys2).predictions
        assert torch.equal(moved[:, : i + 1], base[:, : i + 1])
        if i + 1 < N:
            assert not torch.allclose(moved[:, i + 1 :], base[:, i + 1 :])


def test_regression_loss_is_mse_over_chosen_positions():
    model = tiny()
    xs, ys = prompt()
    out = model(xs, ys)
    torch.testing.assert_close(out.loss, F.mse_loss(out.predictions, ys))
    subset = model(xs, ys, loss_positions=[2, 5])
    torch.testing.assert_close(subset.loss, F.mse_loss(out.predictions[:, [2, 5]], ys[:, [2, 5]]))
    mask = torch.zeros(N, dtype=torch.bool)
    mask[[2, 5]] = True
    torch.testing.assert_close(model(xs, ys, loss_positions=mask).loss, subset.loss)


def test_binary_and_categorical_heads():
    xs, ys = prompt()
    labels = torch.where(ys >= 0, 1.0, -1.0)
    out = tiny(target_kind="binary")(xs, labels)
    expected = F.binary_cross_entropy_with_logits(out.predictions, (labels + 1) / 2)
    torch.testing.assert_close(out.loss, expected)

    xs, ys = prompt(classes=5)
    out = tiny(target_kind="categorical", n_classes=5)(xs, ys)
    assert out.logits.shape == (3, N, 5) and out.predictions is None
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 5), ys.reshape(-1)))


def test_save_and_reload_are_bit_identical(tmp_path):
    model = tiny()
    xs, ys = prompt()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    for loader in (GPT2ForInContextRegression.from_pretrained, AutoModel.from_pretrained):
        reloaded = loader(tmp_path).eval()
        assert type(reloaded) is GPT2ForInContextRegression
        assert torch.equal(reloaded(xs, ys).predictions, model(xs, ys).predictions)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), GPT2ICLConfig)


def test_attention_backends_agree(tmp_path):
    tiny().save_pretrained(tmp_path)
    xs, ys = prompt()
    eager = AutoModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    sdpa = AutoModel.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    out = eager(xs, ys, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(out.predictions, sdpa(xs, ys).predictions, atol=1e-5, rtol=1e-5)
    assert len(out.attentions) == 3 and out.attentions[0].shape == (3, 2, 2 * N, 2 * N)
    assert len(out.hidden_states) == 4


def test_gradients_flow_and_checkpointing_matches():
    model = tiny().train()
    xs, ys = prompt()
    model(xs, ys).loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert plain["model.read_in.weight"].abs().sum() > 0 and plain["head.read_out.weight"].abs().sum() > 0
    model.zero_grad()
    model.activation_checkpointing_enable()
    model(xs, ys).loss.backward()
    for name, grad in plain.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad)


def test_presets_and_build_model():
    assert (GPT2ICLConfig.from_preset("small").n_embd, GPT2ICLConfig.from_preset("small").n_layer) == (128, 6)
    standard = GPT2ICLConfig.from_preset("standard", n_points=41)
    assert (standard.n_embd, standard.n_layer, standard.n_head, standard.n_positions) == (256, 12, 8, 82)
    assert standard.resid_pdrop == standard.attn_pdrop == standard.embd_pdrop == 0.0
    model = build_model("gpt2_icl", "tiny", attn_implementation="eager", n_dims=3, n_points=5)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_dims": 0}, "n_dims"),
        ({"n_points": -1}, "n_points"),
        ({"target_kind": "ordinal"}, "target_kind"),
        ({"n_classes": 1}, "n_classes"),
        ({"prompt_format": "stacked"}, "prompt_format"),
        ({"n_embd": 30, "n_head": 4}, "divisible"),
        ({"resid_pdrop": 1.5}, "resid_pdrop"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPT2ICLConfig(**kwargs)


def test_bad_prompts_and_presets():
    model = tiny()
    xs, ys = prompt()
    with pytest.raises(ValueError, match="xs must have shape"):
        model(xs[..., :2], ys)
    with pytest.raises(ValueError, match="ys must have shape"):
        model(xs, ys[:, :3])
    with pytest.raises(ValueError, match="at most n_points"):
        model(torch.randn(1, N + 1, D), torch.randn(1, N + 1))
    with pytest.raises(ValueError, match="loss_positions"):
        model(xs, ys, loss_positions=[N])
    with pytest.raises(ValueError, match="size"):
        GPT2ICLConfig.from_preset("huge")
    with pytest.raises(ValueError, match="n_embd"):
        GPT2ICLConfig.from_preset("tiny", n_embd=32)
    with pytest.raises(ValueError, match="model_type"):
        build_model("gpt5", "tiny")


def test_garg_io_init_is_pytorchs_default_linear_init_and_survives_reload(tmp_path):
    torch.manual_seed(0)
    config = GPT2ICLConfig.from_preset("tiny", n_dims=5, n_points=8, io_init="garg")
    model = GPT2ForInContextRegression(config)
    for layer in (model.model.read_in, model.head.read_out):
        bound = 1 / layer.in_features**0.5  # kaiming_uniform(a=√5) on a fan_in-wide layer
        for tensor in (layer.weight, layer.bias):
            assert tensor.abs().max() <= bound and tensor.abs().min() > 0
            if tensor.numel() >= 64:  # U(±bound) fills its range; its variance is bound²/3 (within 40 %)
                assert tensor.abs().max() > 0.9 * bound
                assert abs(tensor.var().item() / (bound**2 / 3) - 1) < 0.4
    # every other layer keeps GPT-2's N(0, 0.02)
    assert abs(model.model.backbone.h[0].attn.c_attn.weight.std().item() - 0.02) < 0.002
    gpt2 = GPT2ForInContextRegression(GPT2ICLConfig.from_preset("tiny", n_dims=5, n_points=8, io_init="gpt2"))
    assert abs(gpt2.model.read_in.weight.std().item() - 0.02) < 0.003 and not gpt2.model.read_in.bias.any()
    assert GPT2ICLConfig().io_init == "garg"  # the default is Garg et al.'s
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path)
    assert reloaded.config.io_init == "garg"
    assert torch.equal(reloaded.model.read_in.weight, model.model.read_in.weight)
    with pytest.raises(ValueError, match="io_init"):
        GPT2ICLConfig(io_init="xavier")
