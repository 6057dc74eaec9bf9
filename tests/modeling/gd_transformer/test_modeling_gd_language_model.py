"""The functional-GD language model (seed 004's TinyStories model): its f against functional GD written out in loops
and against the classification package's reference, one pass vs per-prefix runs, causality, the cache (continuation,
greedy generation, padding, beams, crop), reload, configs, gradients, training, and the parameter counts."""

import doctest
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, GPT2Config, GPT2LMHeadModel

import hf_icl
from hf_icl.modeling import MODEL_CLASSES
from hf_icl.modeling.gd_transformer import (
    QK_FORMS,
    GDLanguageModelCache,
    GDLanguageModelConfig,
    GDTransformerForCausalLM,
    attention_parameter_counts,
    causal_functional_gd_logits,
)

VOCAB, CONTEXT, WIDTH, HEADS = 7, 24, 4, 2
KERNELS = ("softmax", "rbf", "linear")


def lm(dtype=torch.float64, seed=0, **fields):
    """A tiny model; a large ``initializer_range`` so that kernels, expectations and steps all matter."""
    torch.manual_seed(seed)
    values = dict(vocab_size=VOCAB, n_positions=CONTEXT, embed_dim=WIDTH, n_heads=HEADS, n_blocks=2)
    values.update(initializer_range=0.5, **fields)
    return GDTransformerForCausalLM(GDLanguageModelConfig(**values)).to(dtype).eval()


def token_ids(batch, length, seed=0, vocab=VOCAB):
    return torch.randint(vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def pad_batch(rows, side):
    """Rows of different lengths padded with token 0 on ``side``, and their attention mask."""
    longest = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for b, row in enumerate(rows):
        where = slice(longest - len(row), longest) if side == "left" else slice(0, len(row))
        ids[b, where], mask[b, where] = row, 1
    return ids, mask


# ---------------------------------------------------------------------------------------------------------------
# Functional GD written out: loops over steps k, rows r, heads h and context pairs j; no attention, no batching
# ---------------------------------------------------------------------------------------------------------------


def layer_norm(v, gain, bias=None, eps=1e-5):
    mean = sum(v) / len(v)
    var = sum((x - mean) ** 2 for x in v) / len(v)
    out = torch.stack([(x - mean) / math.sqrt(var + eps) for x in v]) * gain
    return out if bias is None else out + bias


def head_map(weight, p):
    """A head's query or key: ``w ⊙ p`` (diagonal form) or ``W p`` (full form)."""
    if weight.dim() == 1:
        return weight * p
    return torch.stack([sum(weight[a, b] * p[b] for b in range(len(p))) for a in range(weight.shape[0])])


def kappa(q, k, kernel, h):
    if kernel == "softmax":
        return math.exp(float(q @ k) / h)
    if kernel == "rbf":
        return math.exp(-float(((q - k) ** 2).sum()) / (2 * h * h))
    return float(q @ k) / h


def expectation(W, f):
    """Σ_c w_c softmax(W f)_c over the vocabulary, term by term."""
    scores = [float(W[c] @ f) for c in range(len(W))]
    top = max(scores)
    probs = [math.exp(s - top) for s in scores]
    return sum(W[c] * probs[c] for c in range(len(W))) / sum(probs)


def loop_latents_and_logits(model, ids):
    """``f[r][k]`` (row r = query P_r over the pairs j < r, after k steps) and the logits of one sequence."""
    config, params = model.config, dict(model.named_parameters())
    eps = config.layer_norm_epsilon
    W = [layer_norm(row, params["ln_token.weight"], eps=eps) for row in params["wte.weight"]]
    P = [layer_norm(row, params["ln_position.weight"], eps=eps) for row in params["wpe.weight"]]
    query_weight = params["kernel.query_weight"]
    key_weight = params.get("kernel.key_weight", query_weight)
    T, K, H = len(ids), config.n_blocks, config.n_heads
    zero = torch.zeros(config.embed_dim, dtype=W[0].dtype)
    f = [[zero] * (K + 1) for _ in range(T + 1)]
    for k in range(K):
        W_o = params[f"steps.{k}.output.weight"]
        for r in range(T + 1):
            heads = []
            for h in range(H):
                q = head_map(query_weight[h], P[r])
                weights = [kappa(q, head_map(key_weight[h], P[j]), config.kernel, config.bandwidth) for j in range(r)]
                if config.normalize_attention and r > 0:
                    weights = [w / sum(weights) for w in weights]
                update = zero.clone()
                for j in range(r):
                    update = update + weights[j] * (W[ids[j]] - expectation(W, f[j][k]))
                heads.append(update / max(r, 1) if config.normalize_by_count else update)
            f[r][k + 1] = f[r][k] + W_o @ torch.cat(heads)
    logits = []
    for t in range(T):  # the token after t is predicted by row t + 1
        out = f[t + 1][K]
        if config.use_feed_forward:
            hidden = layer_norm(out, params["feed_forward.norm.weight"], params["feed_forward.norm.bias"], eps=eps)
            hidden = F.gelu(params["feed_forward.fc_in.weight"] @ hidden + params["feed_forward.fc_in.bias"])
            out = out + params["feed_forward.fc_out.weight"] @ hidden + params["feed_forward.fc_out.bias"]
        logits.append(torch.stack([out @ W[c] for c in range(len(W))]))
    return f, torch.stack(logits)


LOOP_CASES = {
    "softmax diag, 1/r": dict(kernel="softmax", qk_form="diag"),
    "softmax full, attention-normalised, FF": dict(
        kernel="softmax", qk_form="full", normalize_attention=True, use_feed_forward=True, ff_hidden_size=5
    ),
    "rbf diag_shared, 3 steps": dict(kernel="rbf", qk_form="diag_shared", n_blocks=3, bandwidth=0.7),
    "linear full_shared, no 1/r": dict(kernel="linear", qk_form="full_shared", normalize_by_count=False),
    "rbf full, FF, 1 head": dict(kernel="rbf", qk_form="full", n_heads=1, use_feed_forward=True),
}


@pytest.mark.parametrize("fields", LOOP_CASES.values(), ids=LOOP_CASES.keys())
def test_every_step_equals_functional_gd_written_out(fields):
    model = lm(**fields)
    ids = token_ids(2, 6, seed=3)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        assert len(out.hidden_states) == model.config.n_blocks + 1
        for b in range(2):
            f, logits = loop_latents_and_logits(model, ids[b].tolist())
            for k, latents in enumerate(out.hidden_states):
                expected = torch.stack([f[t + 1][k] for t in range(6)])
                torch.testing.assert_close(latents[b], expected, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(out.logits[b], logits, rtol=1e-10, atol=1e-12)
    assert out.hidden_states[1].abs().max() > 0.05  # the steps move f at this scale: the comparison is not of zeros


@pytest.mark.parametrize(
    ("kernel", "normalize_attention"), [("softmax", False), ("softmax", True), ("rbf", False), ("linear", False)]
)
def test_one_head_with_a_scalar_step_is_the_classification_packages_functional_gd(kernel, normalize_attention):
    """Shared query/key maps, one head and ``W_o = η I``: row r is functional GD at x_r = W P_r from the pairs j < r,
    i.e. :func:`causal_functional_gd_logits` (the causal variant: a language model's token r sees the tokens before
    it only) on the prompt (x_j = W P_j, y_j = token j) with class embeddings LN(wte)ᵀ."""
    eta = 0.7
    model = lm(kernel=kernel, qk_form="full_shared", n_heads=1, n_blocks=3, normalize_attention=normalize_attention)
    with torch.no_grad():
        for step in model.steps:
            step.output.weight.copy_(eta * torch.eye(WIDTH, dtype=torch.float64))
        ids = token_ids(3, 9, seed=5)
        positions = model.ln_position(model.wpe.weight)[: ids.shape[1] + 1]
        xs = (positions @ model.kernel.query_weight[0].T).expand(3, -1, -1)  # (B, T + 1, d'): the queries x_r
        ys = torch.cat((ids, torch.zeros_like(ids[:, :1])), dim=1)  # the last pair is never used (no row after it)
        W_e = model.token_embeddings().T
        reference = causal_functional_gd_logits(
            xs, ys, W_e, n_steps=3, learning_rate=eta, kernel=kernel, bandwidth=model.config.bandwidth,
            normalize_by_count=True, normalize_attention=normalize_attention,
        )  # fmt: skip
        torch.testing.assert_close(model(ids).logits, reference[:, 1:], rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Causality: one pass == per-prefix runs; nothing depends on later tokens
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("qk_form", QK_FORMS)
def test_one_pass_equals_per_prefix_runs(kernel, qk_form):
    model = lm(kernel=kernel, qk_form=qk_form, use_feed_forward=True)
    ids = token_ids(2, 10)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        for t in range(ids.shape[1]):
            prefix = model(ids[:, : t + 1], use_cache=False).logits[:, -1]
            torch.testing.assert_close(full[:, t], prefix, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_logits_do_not_depend_on_later_tokens(kernel):
    model = lm(kernel=kernel, normalize_attention=kernel == "softmax")
    ids = token_ids(2, 12)
    with torch.no_grad():
        before = model(ids).logits
        for t in (0, 4, 10):
            changed = ids.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + torch.arange(11 - t)) % VOCAB
            after = model(changed).logits
            assert torch.equal(after[:, : t + 1], before[:, : t + 1])
            assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


# ---------------------------------------------------------------------------------------------------------------
# The cache and generate
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
def test_cached_continuation_equals_full_forward(kernel):
    model = lm(kernel=kernel, qk_form="full", use_feed_forward=True, n_blocks=3)
    ids = token_ids(2, 16)
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids[:, :6], use_cache=True).past_key_values
        chunk = model(ids[:, 6:10], past_key_values=cache).logits  # several tokens after a prefill
        steps = [model(ids[:, t : t + 1], past_key_values=cache).logits for t in range(10, 16)]
    torch.testing.assert_close(chunk, full[:, 6:10], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 10:], rtol=1e-12, atol=1e-12)
    assert isinstance(cache, GDLanguageModelCache) and cache.get_seq_length() == 16
    assert cache.keys.shape == (2, HEADS, 16, WIDTH) and cache.real.all()
    assert [layer.values.shape for layer in cache.layers] == [(2, 16, WIDTH)] * 3


def test_cache_holds_the_values_and_keys_of_the_gd_formula():
    """What the cache keeps is what the formula says: values e_j − E|f_{j,k} (row j's own f) and positional keys."""
    model = lm(qk_form="diag")
    ids = token_ids(1, 5)
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        f, _ = loop_latents_and_logits(model, ids[0].tolist())
        W = model.token_embeddings()
        for k, layer in enumerate(cache.layers):
            for j in range(5):
                residual = W[ids[0, j]] - (W.T @ (W @ f[j][k]).softmax(0))
                torch.testing.assert_close(layer.values[0, j], residual, rtol=1e-10, atol=1e-12)
        positions = model.ln_position(model.wpe.weight)
        torch.testing.assert_close(cache.keys[0], model.kernel.key_weight[:, None, :] * positions[:5])


def test_crop_is_exact():
    model = lm()
    ids = token_ids(2, 12)
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids, use_cache=True).past_key_values
        cache.crop(-4)  # forget the last 4 tokens, then feed them again
        assert cache.get_seq_length() == 8 and cache.keys.shape[2] == 8 and cache.layers[1].values.shape[1] == 8
        again = model(ids[:, 8:], past_key_values=cache).logits
    torch.testing.assert_close(again, full[:, 8:], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="tokens_to_remove must be 0 or a negative integer"):
        cache.crop(3)


def greedy_by_recomputation(model, ids, mask, new_tokens):
    """The reference: the whole sequence through the model again for every token, argmax of the last logits."""
    for _ in range(new_tokens):
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


@pytest.mark.parametrize("kernel", KERNELS)
def test_greedy_generate_equals_recomputing_the_sequence_and_feeds_one_token_at_a_time(kernel):
    model = lm(kernel=kernel, use_feed_forward=True, dtype=torch.float32)
    ids = token_ids(2, 8)
    lengths = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    # an explicit mask: generate would otherwise read token 0, the pad token, as padding
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False, pad_token_id=0,
        return_dict_in_generate=True, output_logits=True,
    )  # fmt: skip
    hook.remove()
    assert lengths == [8] + [1] * 9  # the prompt once, then only the new token: the prefix is not recomputed
    assert isinstance(out.past_key_values, GDLanguageModelCache) and out.past_key_values.get_seq_length() == 17
    expected = greedy_by_recomputation(model, ids, torch.ones_like(ids), 10)
    assert torch.equal(out.sequences, expected)
    with torch.no_grad():
        full_logits = model(expected[:, :-1]).logits[:, 7:]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_unpadded_rows(side):
    model = lm(use_feed_forward=True, normalize_attention=True)
    rows = [token_ids(1, n, seed=n)[0] for n in (3, 9, 6)]
    ids, mask = pad_batch(rows, side)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        for b, row in enumerate(rows):
            alone = model(row[None]).logits[0]
            real = mask[b].bool()
            torch.testing.assert_close(logits[b, real], alone, rtol=1e-12, atol=1e-12)


def test_greedy_generate_with_left_padding():
    model = lm(dtype=torch.float32)
    rows = [token_ids(1, n, seed=n)[0] for n in (4, 11, 7)]
    ids, mask = pad_batch(rows, "left")
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(out, greedy_by_recomputation(model, ids, mask, 8))
    for b, row in enumerate(rows):  # each row as if it were alone
        alone = model.generate(
            row[None], attention_mask=torch.ones_like(row[None]), max_new_tokens=8, do_sample=False, pad_token_id=0
        )
        assert torch.equal(out[b, ids.shape[1] :], alone[0, len(row) :])


def test_a_padded_token_after_a_prefill_changes_nothing_for_its_row():
    model = lm()
    ids = token_ids(2, 9)
    with torch.no_grad():
        cache = model(ids[:, :5], use_cache=True).past_key_values
        model(token_ids(2, 1, seed=7), attention_mask=torch.tensor([[0], [1]]), past_key_values=cache)
        assert cache.real[:, -1].tolist() == [False, True] and cache.real_tokens().tolist() == [5, 6]
        mask = torch.tensor([[1] * 5 + [0] + [1] * 4, [1] * 10])
        rest = model(ids[:, 5:], attention_mask=mask, past_key_values=cache).logits
        alone = model(ids[:1]).logits[0, 5:]
    torch.testing.assert_close(rest[0], alone, rtol=1e-12, atol=1e-12)


def test_beam_search_and_sampling_run_on_the_cache():
    model = lm(dtype=torch.float32)
    rows = [token_ids(1, n, seed=n)[0] for n in (4, 8)]
    ids, mask = pad_batch(rows, "left")
    settings = dict(attention_mask=mask, max_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, **settings)  # beams reorder the cache (reorder_cache)
    assert torch.equal(cached, model.generate(ids, use_cache=False, **settings))
    torch.manual_seed(1)
    sampled = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, num_return_sequences=2)
    assert sampled.shape == (4, ids.shape[1] + 4)


# ---------------------------------------------------------------------------------------------------------------
# Loss, reload, registration, configs, bad inputs
# ---------------------------------------------------------------------------------------------------------------


def test_loss_is_the_shifted_cross_entropy():
    model = lm()
    ids = token_ids(3, 10)
    labels = ids.clone()
    labels[0, 4] = -100  # ignored
    out = model(ids, labels=labels)
    logits, targets = out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)
    reference = F.cross_entropy(logits, targets, ignore_index=-100)  # transformers' loss runs in float32
    torch.testing.assert_close(out.loss, reference.float(), rtol=1e-6, atol=1e-6)
    last = model(ids, logits_to_keep=2).logits
    torch.testing.assert_close(last, out.logits[:, -2:])
    with pytest.raises(ValueError, match="need the logits of every position"):
        model(ids, labels=ids, logits_to_keep=1)


@pytest.mark.parametrize("qk_form", ["diag", "full_shared"])
def test_auto_round_trip_is_bit_exact(tmp_path, qk_form):
    model = lm(dtype=torch.float32, qk_form=qk_form, use_feed_forward=True, kernel="rbf", n_blocks=3)
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is GDLanguageModelConfig
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is GDTransformerForCausalLM
    saved, loaded = model.config.to_dict(), reloaded.config.to_dict()
    assert {k: v for k, v in loaded.items() if k != "_name_or_path"} == {
        k: v for k, v in saved.items() if k != "_name_or_path"
    }
    ids = token_ids(2, 12)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_registration_and_exports():
    config = AutoConfig.for_model("gd_transformer_lm", vocab_size=VOCAB, embed_dim=WIDTH, n_heads=HEADS)
    assert isinstance(AutoModelForCausalLM.from_config(config), GDTransformerForCausalLM)
    assert hf_icl.GDTransformerForCausalLM is GDTransformerForCausalLM
    assert hf_icl.GDLanguageModelConfig is GDLanguageModelConfig
    assert hf_icl.attention_parameter_counts is attention_parameter_counts
    assert "gd_transformer_lm" not in MODEL_CLASSES  # a language model, not an ICL prompt model
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (WIDTH, 1, HEADS)
    assert config.bandwidth == pytest.approx(math.sqrt(WIDTH))  # the default scale of qᵀk is 1/√d'


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kernel": "gauss"}, "kernel must be one of"),
        ({"qk_form": "low_rank"}, "qk_form must be one of"),
        ({"n_heads": 0}, "n_heads must be an integer in"),
        ({"n_blocks": 1.5}, "n_blocks must be an integer"),
        ({"vocab_size": 0}, "vocab_size must be an integer in"),
        ({"n_positions": -1}, "n_positions must be an integer in"),
        ({"bandwidth": 0.0}, "bandwidth must be a number in"),
        ({"normalize_attention": True, "kernel": "rbf"}, "needs kernel='softmax'"),
        ({"normalize_by_count": 1}, "normalize_by_count must be True or False"),
        ({"ff_hidden_size": 8}, "ff_hidden_size .* needs use_feed_forward=True"),
        ({"use_feed_forward": True, "ff_hidden_size": 0}, "ff_hidden_size must be an integer in"),
        ({"attn_pdrop": 1.5}, "attn_pdrop must be a number in"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings must be True"),
        ({"eos_token_id": 99}, "eos_token_id must be an integer in"),
        ({"n_block": 2}, "unknown field 'n_block'; did you mean 'n_blocks'"),
        ({"model_type": "gd_transformer"}, "reads configs of model_type 'gd_transformer_lm' only"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GDLanguageModelConfig(**{"vocab_size": VOCAB, **kwargs})


def test_bad_inputs():
    model = lm()
    ids = token_ids(2, 5)
    with pytest.raises(ValueError, match="input_ids must be a \\(batch, tokens\\) tensor of token ids"):
        model(ids.double())
    with pytest.raises(ValueError, match="input_ids must be a \\(batch, tokens\\) tensor"):
        model(ids[0])
    with pytest.raises(ValueError, match=f"token ids in \\[0, vocab_size={VOCAB}\\), got {VOCAB}"):
        model(torch.full((1, 3), VOCAB))
    with pytest.raises(ValueError, match="at least one token"):
        model(ids[:, :0])
    with pytest.raises(ValueError, match="attention_mask must have shape \\(2, 5\\)"):
        model(ids, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="past_key_values must be a GDLanguageModelCache"):
        model(ids, past_key_values=DynamicCache())
    with pytest.raises(ValueError, match=f"reach {CONTEXT + 1} tokens but the model has n_positions={CONTEXT}"):
        model(token_ids(1, CONTEXT + 1))
    model(token_ids(1, CONTEXT))  # the longest context fits
    cache = model(token_ids(1, CONTEXT - 1), use_cache=True).past_key_values
    with pytest.raises(ValueError, match="n_positions"):
        model(token_ids(1, 2), past_key_values=cache)
    assert cache.get_seq_length() == CONTEXT - 1  # a refused forward leaves the cache as it was
    with pytest.raises(ValueError, match="'position_id' \\(did you mean 'position_ids'\\?\\)"):
        model(ids, position_id=None)
    with pytest.raises(ValueError, match="would ignore: output_attentions=True"):
        model(ids, output_attentions=True)
    with pytest.raises(ValueError, match="model must be a GDTransformerForCausalLM or a GPT2LMHeadModel"):
        attention_parameter_counts(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------------------------
# Parameter counts
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qk_form", QK_FORMS)
def test_attention_parameter_counts_of_the_gd_model(qk_form):
    d, heads, steps = 6, 3, 2
    per_map = heads * (d if qk_form.startswith("diag") else d * d)
    maps = 1 if qk_form.endswith("_shared") else 2
    model = GDTransformerForCausalLM(
        GDLanguageModelConfig(vocab_size=11, n_positions=9, embed_dim=d, n_heads=heads, n_blocks=steps,
                              qk_form=qk_form, use_feed_forward=True, ff_hidden_size=5)
    )  # fmt: skip
    counts = attention_parameter_counts(model)
    feed_forward = 2 * d + (d * 5 + 5) + (5 * d + d)  # LayerNorm, fc_in, fc_out
    assert counts == {
        "query_key": maps * per_map,
        "value": 0,  # values are e_j − E|f: no parameters
        "output": steps * heads * d * d,
        "attention": maps * per_map,
        "non_embedding": 10 * d + 2 * d + maps * per_map + steps * heads * d * d + feed_forward,  # wpe: 9 + 1 rows
    }


def test_attention_parameter_counts_of_the_documents_sizes_and_of_gpt2():
    paper = GDLanguageModelConfig(vocab_size=10, n_positions=8, embed_dim=512, n_heads=8, qk_form="diag")
    assert attention_parameter_counts(GDTransformerForCausalLM(paper))["attention"] == 8192  # the document's "8K"
    shared = GDLanguageModelConfig(vocab_size=10, n_positions=8, embed_dim=512, n_heads=8, qk_form="diag_shared")
    assert attention_parameter_counts(GDTransformerForCausalLM(shared))["attention"] == 4096
    d, layers = 16, 2
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=12, n_embd=d, n_head=4, n_layer=layers))
    counts = attention_parameter_counts(gpt2)
    assert counts["query_key"] == layers * 2 * (d * d + d)
    assert counts["value"] == layers * (d * d + d)
    assert counts["output"] == layers * (d * d + d)
    assert counts["attention"] == layers * 3 * (d * d + d)
    block = 2 * 2 * d + 3 * (d * d + d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)  # LNs, attn, MLP
    assert counts["non_embedding"] == 12 * d + layers * block + 2 * d  # wpe, blocks, ln_f (lm_head is tied to wte)
    assert attention_parameter_counts(gpt2.transformer) == counts


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qk_form", QK_FORMS)
def test_gradients_reach_every_parameter(qk_form):
    model = lm(qk_form=qk_form, use_feed_forward=True, dtype=torch.float32).train()
    ids = token_ids(2, 9)
    model(ids, labels=ids).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    maps = 1 if qk_form.endswith("_shared") else 2
    assert len(list(model.parameters())) == 4 + maps + 2 + 6  # wte, wpe, 2 LNs; query/key maps; 2 steps; FF


def test_a_fresh_model_predicts_nearly_uniformly():
    """The layers that write into f start small enough for near-uniform logits (loss ≈ log V), with the feed-forward
    layer too (measured 5.702 vs log 300 = 5.704; GPT-2's residual init of the step projections gives 6.9 here)."""
    torch.manual_seed(0)
    config = GDLanguageModelConfig(vocab_size=300, n_positions=32, embed_dim=128, n_heads=8, use_feed_forward=True)
    model = GDTransformerForCausalLM(config)
    ids = token_ids(4, 32, vocab=300)
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    assert loss == pytest.approx(math.log(300), abs=0.05)
    std = model.steps[0].output.weight.std().item()
    assert std == pytest.approx(0.02 / math.sqrt(2 * 1 * 8 * 128), rel=0.05)


def repeated_patterns(n_sequences, length, seed, vocab=16, period=3):
    """Each sequence repeats its own random pattern of ``period`` tokens: predictable from the context only."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randint(vocab, (n_sequences, period), generator=g)
    return patterns.repeat(1, length // period + 1)[:, :length]


def test_loss_falls_on_a_repetitive_token_stream():
    torch.manual_seed(0)
    config = GDLanguageModelConfig(vocab_size=16, n_positions=32, embed_dim=16, n_heads=2, n_blocks=2)
    model = GDTransformerForCausalLM(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    held_out = repeated_patterns(64, 24, seed=10_000)
    with torch.no_grad():
        before = model(held_out, labels=held_out).loss.item()
    for step in range(100):
        ids = repeated_patterns(32, 24, seed=step)
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = model(held_out, labels=held_out).loss.item()
    assert before == pytest.approx(math.log(16), abs=0.05)  # nearly uniform at initialisation
    assert after < 0.5, (before, after)  # measured: 2.77 -> 0.24 (it learns to attend three positions back)


def test_the_transformers_trainer_trains_it(tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GDTransformerForCausalLM(GDLanguageModelConfig(vocab_size=16, n_positions=16, embed_dim=8, n_heads=2))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    dataset = [{"input_ids": row, "labels": row} for row in repeated_patterns(32, 12, seed=1)]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, learning_rate=1e-2,
        report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    result = Trainer(model=model, args=args, train_dataset=dataset).train()
    assert result.global_step == 4 and math.isfinite(result.training_loss)
    assert all(not torch.equal(p.detach(), before[name]) for name, p in model.named_parameters())
    model.save_pretrained(tmp_path / "model")
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "model")) is GDTransformerForCausalLM


def test_docstring_examples_run():
    from hf_icl.modeling.gd_transformer import (
        configuration_gd_language_model,
        layers,
        modeling_gd_language_model,
    )

    for module in (configuration_gd_language_model, layers, modeling_gd_language_model):
        assert doctest.testmod(module, raise_on_error=True).attempted > 0
