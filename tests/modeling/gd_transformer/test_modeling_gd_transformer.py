"""The functional-GD transformer (seed 004): the reference function and the constructed model against functional GD
written out in loops, causality, one pass vs per-prefix runs, reload, configs, training from scratch, and the
distance to the construction."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel

import hf_icl
from hf_icl import get_task
from hf_icl.modeling import MODEL_CLASSES, build_model
from hf_icl.modeling.gd_transformer import (
    GDTransformerConfig,
    GDTransformerForInContextClassification,
    causal_functional_gd_logits,
    distance_to_construction,
    expected_embedding,
    functional_gd_logits,
)
from hf_icl.training import train

D, N, WIDTH, C = 3, 7, 5, 4  # input dimension, prompt length, embed_dim d', classes
KERNELS = ("softmax", "rbf", "linear")
BANDWIDTH = 1.3
ETA = 0.4
Construct = GDTransformerForInContextClassification.from_gd_construction


def prompt(batch=2, n=N, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, D, generator=g, dtype=dtype), torch.randint(C, (batch, n), generator=g)


def embeddings(seed=1, dtype=torch.float64):
    return torch.randn(WIDTH, C, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def random_model(**kw):
    torch.manual_seed(0)
    fields = {"n_dims": D, "n_points": N, "n_classes": C, "embed_dim": WIDTH, "n_blocks": 2, **kw}
    return GDTransformerForInContextClassification(GDTransformerConfig(**fields)).eval()


# ---------------------------------------------------------------------------------------------------------------
# Functional GD written out: loops over steps k, positions i and context pairs j, kernel sums, no attention
# ---------------------------------------------------------------------------------------------------------------


def kappa(a, b, kernel, h):
    if kernel == "softmax":
        return math.exp(sum(a[t] * b[t] for t in range(len(a))) / h)
    if kernel == "rbf":
        return math.exp(-sum((a[t] - b[t]) ** 2 for t in range(len(a))) / (2 * h * h))
    return sum(a[t] * b[t] for t in range(len(a))) / h


def expectation(W, f):
    """Σ_c w_c softmax(W_eᵀ f)_c, entry by entry."""
    width, classes = len(W), len(W[0])
    scores = [sum(W[r][c] * f[r] for r in range(width)) for c in range(classes)]
    top = max(scores)
    probs = [math.exp(s - top) for s in scores]
    total = sum(probs)
    return [sum(W[r][c] * probs[c] / total for c in range(classes)) for r in range(width)]


def loop_latents(xs, ys, W_e, n_steps, eta, kernel, h, by_count=False, normalize_attention=False):
    """The causal variant: f_{i,K} of every prompt and position from the pairs j < i and *their* f_{j,k}."""
    xs, ys, W = xs.tolist(), ys.tolist(), W_e.tolist()
    width = len(W)
    latents = []
    for x, y in zip(xs, ys, strict=True):
        f = [[0.0] * width for _ in x]  # f[i] = f_{i,k}
        for _ in range(n_steps):
            new_f = []
            for i in range(len(x)):
                step, mass = [0.0] * width, 0.0
                for j in range(i):
                    weight = kappa(x[i], x[j], kernel, h)
                    mass += weight
                    mean = expectation(W, f[j])  # position j's own f_{j,k}
                    for r in range(width):
                        step[r] += weight * (W[r][y[j]] - mean[r])
                if normalize_attention and i > 0:
                    step = [s / mass for s in step]
                if by_count and i > 0:
                    step = [s / i for s in step]
                new_f.append([f[i][r] + eta * step[r] for r in range(width)])
            f = new_f
        latents.append(f)
    return latents


def read_out(W, f):
    return [sum(W[r][c] * f[r] for r in range(len(W))) for c in range(len(W[0]))]


def loop_reference(xs, ys, W_e, *args, **kwargs):
    """The causal variant's logits W_eᵀ f_{i,K}, (B, N, C) float64."""
    W = W_e.tolist()
    logits = [[read_out(W, f) for f in latents] for latents in loop_latents(xs, ys, W_e, *args, **kwargs)]
    return torch.tensor(logits, dtype=torch.float64)


def loop_full_gd(x, y, W, m, n_steps, eta, kernel, h, by_count=False, normalize_attention=False):
    """The document's functional GD on one prompt: the context x[:m] updated K times from all m pairs (its own
    included), every query x[m:] read from the context's residuals of each step; the queries' logits."""
    width = len(W)

    def step(point, f_point, context_f):
        total, mass = [0.0] * width, 0.0
        for j in range(m):
            weight = kappa(point, x[j], kernel, h)
            mass += weight
            mean = expectation(W, context_f[j])
            for r in range(width):
                total[r] += weight * (W[r][y[j]] - mean[r])
        if normalize_attention and m > 0:
            total = [t / mass for t in total]
        if by_count and m > 0:
            total = [t / m for t in total]
        return [f_point[r] + eta * total[r] for r in range(width)]

    f_context = [[0.0] * width for _ in range(m)]
    f_query = [[0.0] * width for _ in range(len(x) - m)]
    for _ in range(n_steps):
        f_context, f_query = (
            [step(x[i], f_context[i], f_context) for i in range(m)],
            [step(x[m + q], f_query[q], f_context) for q in range(len(x) - m)],
        )
    return [read_out(W, f) for f in f_query]


def loop_full_reference(xs, ys, W_e, n_steps, eta, kernel, h, by_count=False, normalize_attention=False, m=None):
    """The document's GD: the queries after m context pairs (B, N - m, C), or (m=None) every position i as the
    query of the prefix before it (B, N, C)."""
    W, options = W_e.tolist(), (n_steps, eta, kernel, h, by_count, normalize_attention)
    logits = []
    for x, y in zip(xs.tolist(), ys.tolist(), strict=True):
        if m is not None:
            logits.append(loop_full_gd(x, y, W, m, *options))
        else:
            logits.append([loop_full_gd(x[: i + 1], y[: i + 1], W, i, *options)[0] for i in range(len(x))])
    return torch.tensor(logits, dtype=torch.float64)


CASES = [(k, kernel, by_count, False) for k in (1, 2, 6) for kernel in KERNELS for by_count in (False, True)]
CASES += [(k, "softmax", by_count, True) for k in (1, 2, 6) for by_count in (False, True)]


@pytest.mark.parametrize("n_steps, kernel, by_count, normalize_attention", CASES)
def test_reference_and_construction_equal_the_documents_functional_gd_in_loops(
    n_steps, kernel, by_count, normalize_attention
):
    """The goal of issue 29: the construction is the document's GD to 1e-6 (here 1e-10), at every query, in both
    protocols (the queries after a context, and every position as its prefix's query)."""
    xs, ys = prompt()
    W_e = embeddings()
    options = {"bandwidth": BANDWIDTH, "normalize_by_count": by_count, "normalize_attention": normalize_attention}
    model = Construct(n_steps, ETA, kernel, W_e, n_dims=D, n_points=N, **options)
    loop_args = (n_steps, ETA, kernel, BANDWIDTH, by_count, normalize_attention)
    for m in (0, 1, 4, N - 1):
        expected = loop_full_reference(xs, ys, W_e, *loop_args, m=m)
        reference = functional_gd_logits(xs, ys, W_e, n_steps, ETA, kernel, n_context=m, **options)
        torch.testing.assert_close(reference, expected, rtol=1e-10, atol=1e-10)
        with torch.no_grad():
            torch.testing.assert_close(model(xs, ys, n_context=m).logits, expected, rtol=1e-10, atol=1e-10)
    expected = loop_full_reference(xs, ys, W_e, *loop_args)
    torch.testing.assert_close(functional_gd_logits(xs, ys, W_e, n_steps, ETA, kernel, **options), expected,
                               rtol=1e-10, atol=1e-10)  # fmt: skip
    with torch.no_grad():
        out = model(xs, ys)
    assert out.logits.dtype == torch.float64
    torch.testing.assert_close(out.logits, expected, rtol=1e-10, atol=1e-10)
    assert torch.equal(out.logits[:, 0], torch.zeros(2, C, dtype=torch.float64))  # no pairs: f = 0, uniform


@pytest.mark.parametrize("n_steps, kernel, by_count, normalize_attention", CASES)
def test_the_causal_variant_equals_its_loops_and_the_document_for_one_step_only(
    n_steps, kernel, by_count, normalize_attention
):
    xs, ys = prompt()
    W_e = embeddings()
    expected = loop_reference(xs, ys, W_e, n_steps, ETA, kernel, BANDWIDTH, by_count, normalize_attention)
    options = {"bandwidth": BANDWIDTH, "normalize_by_count": by_count, "normalize_attention": normalize_attention}
    reference = causal_functional_gd_logits(xs, ys, W_e, n_steps, ETA, kernel, **options)
    torch.testing.assert_close(reference, expected, rtol=1e-10, atol=1e-10)
    model = Construct(n_steps, ETA, kernel, W_e, n_dims=D, n_points=N, context_attention="causal", **options)
    with torch.no_grad():
        torch.testing.assert_close(model(xs, ys).logits, expected, rtol=1e-10, atol=1e-10)
    document = functional_gd_logits(xs, ys, W_e, n_steps, ETA, kernel, **options)
    if n_steps == 1:
        torch.testing.assert_close(document, expected, rtol=1e-10, atol=1e-10)
    else:  # the context's own states differ: position j's f used the pairs before j only
        assert (document - expected).abs().max() > 1e-3


def test_more_steps_change_the_logits_through_the_expectation():
    """The later steps are not copies of the first: with the expectation held at w̄ (linear GD) they would be."""
    xs, ys = prompt()
    W_e = embeddings()
    one = functional_gd_logits(xs, ys, W_e, 1, ETA, "rbf")
    two = functional_gd_logits(xs, ys, W_e, 2, ETA, "rbf")
    assert not torch.allclose(two, 2 * one)
    torch.testing.assert_close(two, loop_full_reference(xs, ys, W_e, 2, ETA, "rbf", 1.0))


@pytest.mark.parametrize("kernel", KERNELS)
def test_simplified_block_is_one_step(kernel):
    xs, ys = prompt(seed=3)
    W_e = embeddings(seed=4)
    model = Construct(1, ETA, kernel, W_e, n_dims=D, n_points=N, bandwidth=BANDWIDTH, simplified=True)
    assert model.config.state_width == D + WIDTH  # (x, f): no scratch slot
    assert not hasattr(model.blocks[0].self_attention, "erase_query") and model.blocks[0].cross_attention is None
    with torch.no_grad():
        logits = model(xs, ys).logits
    torch.testing.assert_close(logits, loop_reference(xs, ys, W_e, 1, ETA, kernel, BANDWIDTH), rtol=1e-10, atol=1e-10)


def test_construction_with_feed_forward_and_in_float32():
    xs, ys = prompt(seed=5)
    W_e = embeddings(seed=6)
    expected = loop_full_reference(xs, ys, W_e, 3, ETA, "softmax", 2.0, by_count=True)
    model = Construct(3, ETA, "softmax", W_e, n_dims=D, n_points=N, bandwidth=2.0, normalize_by_count=True,
                      use_feed_forward=True)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(model(xs, ys).logits, expected, rtol=1e-10, atol=1e-10)
        single = Construct(3, ETA, "softmax", W_e.float(), n_dims=D, bandwidth=2.0, normalize_by_count=True)
        torch.testing.assert_close(single(xs.float(), ys).logits.double(), expected, rtol=1e-4, atol=1e-5)


def test_construction_states_hold_the_documented_layout():
    """After block k: f = f_{i,k+1}, scratch = E(w_e)|f_{i,k+1} − w̄_e; head 2 attends to its own position only
    (the causal variant, whose every position's latent the loops give)."""
    xs, ys = prompt(seed=7)
    W_e = embeddings(seed=8)
    model = Construct(3, ETA, "rbf", W_e, n_dims=D, n_points=N, context_attention="causal")
    with torch.no_grad():
        out = model(xs, ys, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 4 and len(out.attentions) == 3
    mean = W_e.mean(dim=1)
    for k, states in enumerate(out.hidden_states):
        f, scratch = states[..., D : D + WIDTH], states[..., D + WIDTH :]
        assert torch.equal(states[..., :D], xs)
        reference_f = torch.tensor(loop_latents(xs, ys, W_e, k, ETA, "rbf", 1.0), dtype=torch.float64)
        torch.testing.assert_close(f, reference_f, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(scratch, expected_embedding(f, W_e) - mean, rtol=1e-10, atol=1e-10)
    for weights in out.attentions:
        assert weights.shape == (2, 2, N, N)
        assert torch.equal(weights[:, 1], torch.eye(N, dtype=torch.float64).expand(2, N, N))  # the erase head
        assert torch.equal(weights[:, 0].triu(), torch.zeros(2, N, N, dtype=torch.float64))  # head 1: j < i


def test_full_context_attention_reads_the_context_only():
    """The document's protocol: head 1 of every token attends to the m context pairs (a context token to itself
    too), head 2 to its own position; the context's latents after block k are k steps of GD on the whole context."""
    xs, ys = prompt(seed=7)
    W_e = embeddings(seed=8)
    m = 4
    model = Construct(2, ETA, "rbf", W_e, n_dims=D, n_points=N)
    with torch.no_grad():
        out = model(xs, ys, n_context=m, output_hidden_states=True, output_attentions=True)
    for weights in out.attentions:
        assert weights.shape == (2, 2, N, N)
        assert bool((weights[:, 0, :, :m] > 0).all()) and torch.equal(
            weights[:, 0, :, m:], torch.zeros(2, N, N - m, dtype=torch.float64)
        )
        assert torch.equal(weights[:, 1], torch.eye(N, dtype=torch.float64).expand(2, N, N))  # the erase head
    # a context point's latent after K steps is the query reading of a prompt whose query is that point itself
    for k, states in enumerate(out.hidden_states):
        f = states[..., D : D + WIDTH]
        as_queries = torch.cat([xs[:, :m], xs[:, :m]], dim=1), torch.cat([ys[:, :m], ys[:, :m]], dim=1)
        expected = functional_gd_logits(*as_queries, W_e, k, ETA, "rbf", n_context=m)
        torch.testing.assert_close(f[:, :m] @ W_e, expected, rtol=1e-10, atol=1e-10)


def test_functional_gd_logits_bad_inputs():
    xs, ys = prompt()
    W_e = embeddings()
    with pytest.raises(ValueError, match="kernel must be one of"):
        functional_gd_logits(xs, ys, W_e, 1, ETA, kernel="cosine")
    with pytest.raises(ValueError, match="normalize=True applies to kernel='softmax' only"):
        functional_gd_logits(xs, ys, W_e, 1, ETA, kernel="rbf", normalize_attention=True)
    with pytest.raises(ValueError, match="n_steps must be an integer"):
        functional_gd_logits(xs, ys, W_e, -1, ETA)
    with pytest.raises(ValueError, match="bandwidth must be a number"):
        functional_gd_logits(xs, ys, W_e, 1, ETA, bandwidth=0.0)
    with pytest.raises(ValueError, match=r"ys must be class ids in \[0, 4\)"):
        functional_gd_logits(xs, ys + C, W_e, 1, ETA)
    with pytest.raises(ValueError, match="W_e must be a floating-point"):
        functional_gd_logits(xs, ys, W_e[0], 1, ETA)
    with pytest.raises(ValueError, match="ys must be a"):
        functional_gd_logits(xs, ys[:, :3], W_e, 1, ETA)


# ---------------------------------------------------------------------------------------------------------------
# Protocol: causality, one pass = per-prefix runs
# ---------------------------------------------------------------------------------------------------------------

MODELS = {
    "random softmax + FF": dict(use_feed_forward=True),
    "random rbf, normalised": dict(kernel="rbf", normalize_by_count=True),
    "random softmax attention": dict(normalize_attention=True, n_blocks=3),
    "random linear simplified": dict(kernel="linear", n_blocks=1, simplified=True),
    "random causal variant + FF": dict(context_attention="causal", use_feed_forward=True, n_blocks=3),
}


def any_model(name):
    if name == "construction":
        return Construct(3, ETA, "softmax", embeddings(dtype=torch.float32), n_dims=D, n_points=N)
    return random_model(**MODELS[name])


@pytest.mark.parametrize("name", [*MODELS, "construction"])
def test_prediction_i_ignores_y_i_and_everything_later(name):
    model = any_model(name)
    xs, ys = prompt(dtype=torch.float32)
    with torch.no_grad():
        base = model(xs, ys).logits
        for i in (0, 3, N - 1):
            xs2, ys2 = xs.clone(), ys.clone()
            ys2[:, i:] = (ys2[:, i:] + 1) % C
            xs2[:, i + 1 :] += 2.0
            moved = model(xs2, ys2).logits
            assert torch.equal(moved[:, : i + 1], base[:, : i + 1])
            if i + 1 < N:
                assert not torch.allclose(moved[:, i + 1 :], base[:, i + 1 :])


@pytest.mark.parametrize("name", [*MODELS, "construction"])
def test_one_pass_equals_per_prefix_runs(name):
    model = any_model(name)
    xs, ys = prompt(batch=3, dtype=torch.float32)
    with torch.no_grad():
        one_pass = model(xs, ys).logits
        for i in range(N):
            alone = model(xs[:, : i + 1], ys[:, : i + 1]).logits[:, -1]
            torch.testing.assert_close(one_pass[:, i], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in MODELS if "causal" not in n] + ["construction"])
def test_a_query_reads_the_context_only(name):
    """n_context=m: a query's logits ignore its own label, the other queries and their labels; context-only labels
    give the same logits and no loss; one query at a time equals all queries at once."""
    model = any_model(name)
    xs, ys = prompt(batch=3, dtype=torch.float32)
    m = 4
    with torch.no_grad():
        out = model(xs, ys, n_context=m)
        assert out.logits.shape == (3, N - m, C) and out.loss is not None
        torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, C), ys[:, m:].reshape(-1)))
        context_only = model(xs, ys[:, :m], n_context=m)
        assert context_only.loss is None and torch.equal(context_only.logits, out.logits)
        ys2, xs2 = ys.clone(), xs.clone()
        ys2[:, m:] = (ys2[:, m:] + 1) % C
        xs2[:, m + 1 :] += 2.0  # every query but the first moves
        moved = model(xs2, ys2, n_context=m).logits
        assert torch.equal(moved[:, 0], out.logits[:, 0]) and not torch.allclose(moved[:, 1:], out.logits[:, 1:])
        for q in range(m, N):
            alone = torch.cat([xs[:, :m], xs[:, q : q + 1]], dim=1), torch.cat([ys[:, :m], ys[:, q : q + 1]], dim=1)
            torch.testing.assert_close(model(*alone, n_context=m).logits[:, 0], out.logits[:, q - m], rtol=1e-5,
                                       atol=1e-6)  # fmt: skip
        ys3 = ys.clone()
        ys3[:, 0] = (ys3[:, 0] + 1) % C  # a context label changes every query
        assert not torch.allclose(model(xs, ys3, n_context=m).logits, out.logits)


def test_n_context_errors():
    model = random_model()
    xs, ys = prompt(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"n_context must be in \[0, 6\] for prompts of 7 points"):
        model(xs, ys, n_context=N)
    with pytest.raises(ValueError, match="n_context must be an integer or None, got True"):
        model(xs, ys, n_context=True)
    with pytest.raises(ValueError, match="loss_positions applies to the all-prefix protocol"):
        model(xs, ys, n_context=3, loss_positions=[4])
    with pytest.raises(ValueError, match=r"ys must have shape \(2, 7\).*or \(2, 3\)"):
        model(xs, ys[:, :5], n_context=3)
    with pytest.raises(ValueError, match="needs context_attention='full', got context_attention='causal'"):
        random_model(context_attention="causal")(xs, ys, n_context=3)
    with pytest.raises(ValueError, match=r"context_attention must be one of \['full', 'causal'\], got 'bidirectional'"):
        GDTransformerConfig(context_attention="bidirectional")
    with pytest.raises(ValueError, match="n_context must be an integer in"):
        functional_gd_logits(xs.double(), ys, embeddings(), 1, ETA, n_context=N)


# ---------------------------------------------------------------------------------------------------------------
# The model as a transformers model
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["random softmax + FF", "random linear simplified", "construction"])
def test_save_and_reload_are_bit_identical(tmp_path, name):
    model = any_model(name)
    xs, ys = prompt(dtype=torch.float32)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert type(AutoConfig.from_pretrained(tmp_path)) is GDTransformerConfig
    with torch.no_grad():
        expected = model(xs, ys).logits
        for loader in (GDTransformerForInContextClassification.from_pretrained, AutoModel.from_pretrained):
            reloaded = loader(tmp_path).eval()
            assert type(reloaded) is GDTransformerForInContextClassification
            fields = ("n_dims", "n_classes", "embed_dim", "n_blocks", "kernel", "erase_temperature", "simplified")
            assert {f: getattr(reloaded.config, f) for f in fields} == {f: getattr(model.config, f) for f in fields}
            assert torch.equal(reloaded(xs, ys).logits, expected)


def test_loss_is_cross_entropy_over_chosen_positions_and_floats_ids_are_accepted():
    model = random_model()
    xs, ys = prompt(dtype=torch.float32)
    with torch.no_grad():
        out = model(xs, ys, loss_positions=[2, 5])
        expected = F.cross_entropy(out.logits[:, [2, 5]].reshape(-1, C), ys[:, [2, 5]].reshape(-1))
        torch.testing.assert_close(out.loss, expected)
        torch.testing.assert_close(model(xs, ys).loss, F.cross_entropy(out.logits.reshape(-1, C), ys.reshape(-1)))
        assert torch.equal(model(xs, ys.float()).logits, out.logits)  # integral floats are class ids
    assert out.predictions is None and out.hidden_states is None and out.attentions is None


def test_bad_prompts_and_keywords():
    model = random_model()
    xs, ys = prompt(dtype=torch.float32)
    with pytest.raises(ValueError, match="class ids in"):
        model(xs, ys + C)
    with pytest.raises(ValueError, match="class ids in"):
        model(xs, ys + 0.5)
    with pytest.raises(ValueError, match="at most n_points=7"):
        model(torch.randn(1, N + 1, D), torch.zeros(1, N + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="xs must have shape"):
        model(xs[..., :2], ys)
    with pytest.raises(ValueError, match="did you mean 'loss_positions'"):
        model(xs, ys, loss_position=[1])
    with pytest.raises(ValueError, match="position_ids"):
        model(xs, ys, position_ids=torch.arange(N))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"target_kind": "regression"}, "target_kind must be 'categorical'.*got target_kind='regression'"),
        ({"n_block": 2}, "unknown field 'n_block'; did you mean 'n_blocks'"),
        ({"kernel": "cosine"}, r"kernel must be one of \['softmax', 'rbf', 'linear'\], got 'cosine'"),
        ({"bandwidth": 0.0}, r"bandwidth must be a number in \(0"),
        ({"erase_temperature": -1.0}, "erase_temperature must be a number in"),
        ({"embed_dim": 0}, "embed_dim must be an integer in"),
        ({"n_blocks": 0}, "n_blocks must be an integer in"),
        ({"simplified": True, "n_blocks": 2}, "simplified=True .* needs n_blocks=1, got n_blocks=2"),
        ({"normalize_attention": True, "kernel": "rbf"}, "needs kernel='softmax', got kernel='rbf'"),
        ({"normalize_by_count": 1}, "normalize_by_count must be True or False, got 1"),
        ({"ff_hidden_size": 8}, "ff_hidden_size .* needs use_feed_forward=True"),
        ({"use_feed_forward": True, "ff_hidden_size": 0}, "ff_hidden_size must be an integer in"),
        ({"n_classes": 1}, "n_classes must be an integer in"),
        ({"model_type": "gpt2_icl"}, "model_type"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GDTransformerConfig(**kwargs)


def test_construction_argument_errors():
    W_e = embeddings()
    with pytest.raises(ValueError, match="sets n_blocks=2 from its arguments; got n_blocks=3"):
        Construct(2, ETA, "softmax", W_e, n_blocks=3)
    with pytest.raises(ValueError, match="sets embed_dim=5"):
        Construct(2, ETA, "softmax", W_e, embed_dim=8)
    with pytest.raises(ValueError, match="W_e must be a floating-point"):
        Construct(2, ETA, "softmax", W_e.long())
    with pytest.raises(ValueError, match="n_steps must be an integer in"):
        Construct(0, ETA, "softmax", W_e)
    with pytest.raises(ValueError, match="kernel must be one of"):
        Construct(1, ETA, "gauss", W_e)
    with pytest.raises(ValueError, match="needs n_blocks=1"):
        Construct(2, ETA, "softmax", W_e, simplified=True)


def test_registration_presets_and_build_model():
    assert MODEL_CLASSES["gd_transformer"] == (GDTransformerConfig, GDTransformerForInContextClassification)
    assert hf_icl.GDTransformerForInContextClassification is GDTransformerForInContextClassification
    assert hf_icl.GDTransformerConfig is GDTransformerConfig
    assert [GDTransformerConfig.from_preset(s).embed_dim for s in ("tiny", "small", "standard")] == [16, 32, 64]
    with pytest.raises(ValueError, match="do not also pass embed_dim"):
        GDTransformerConfig.from_preset("tiny", embed_dim=8)
    model = build_model("gd_transformer", "tiny", n_dims=4, n_points=10, target_kind="categorical", n_classes=3)
    assert type(model) is GDTransformerForInContextClassification and model.config.embed_dim == 16
    with pytest.raises(ValueError, match="has none to select"):
        build_model("gd_transformer", "tiny", attn_implementation="sdpa", n_dims=4, n_classes=3)


# ---------------------------------------------------------------------------------------------------------------
# Training from scratch ("Trained TF")
# ---------------------------------------------------------------------------------------------------------------


def test_gradients_reach_every_parameter():
    model = random_model(use_feed_forward=True).train()
    xs, ys = prompt(dtype=torch.float32)
    model(xs, ys).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing
    assert len(list(model.parameters())) == 1 + 2 * (8 + 4 + 6)  # W_e; per block two heads, cross-attention, FF


def test_gradient_checkpointing_gives_the_same_gradients():
    xs, ys = prompt(dtype=torch.float32)
    grads = []
    for checkpointing in (False, True):
        model = random_model().train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert all(block.gradient_checkpointing for block in model.blocks)
        model(xs, ys).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, checkpointed)


@pytest.mark.parametrize(
    "context_attention, n_context",
    [("full", 10), ("causal", None)],  # the document's prompt (10 pairs, 10 queries); the variant, every prefix
)
def test_training_from_scratch_on_the_categorical_task_reduces_the_loss(context_attention, n_context):
    task = get_task("categorical", n_dims=4, n_classes=3, function="linear")
    torch.manual_seed(0)
    config = GDTransformerConfig(n_dims=4, n_points=20, n_classes=3, embed_dim=8, n_blocks=2,
                                 context_attention=context_attention)  # fmt: skip
    model = GDTransformerForInContextClassification(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    eval_xs, eval_ys = task.sample(512, 20, seed=10_000)
    with torch.no_grad():
        before = model(eval_xs, eval_ys, n_context=n_context).loss.item()
    for step in range(100):
        xs, ys = task.sample(64, 20, seed=step)
        loss = model(xs, ys, n_context=n_context, check_inputs=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = model(eval_xs, eval_ys, n_context=n_context).loss.item()
    assert before == pytest.approx(math.log(3), abs=1e-2)  # nearly uniform at initialisation
    assert after < before - 0.1, (before, after)  # measured: 1.099 -> 0.961 (full), 0.890 (causal)


def test_the_trainer_trains_it_on_the_categorical_task_and_evaluation_reads_its_logits(tmp_path):
    from training_helpers import tiny_args

    args = tiny_args(
        tmp_path, task="categorical", task_params='{"n_classes": 3}', model_type="gd_transformer",
        model_overrides='{"n_blocks": 2}', eval_steps=5,
    )  # fmt: skip
    train(args)
    model = AutoModel.from_pretrained(tmp_path).eval()
    assert type(model) is GDTransformerForInContextClassification
    assert (model.config.n_classes, model.config.n_blocks, model.config.embed_dim) == (3, 2, 16)
    task = get_task("categorical", n_dims=3, n_classes=3)
    result = hf_icl.evaluate_context_scaling({"gd": model}, task, n_points=6, n_prompts=32)
    assert result.values["gd"].shape == (6,) and bool(((result.values["gd"] >= 0) & (result.values["gd"] <= 1)).all())


# ---------------------------------------------------------------------------------------------------------------
# Distance to the construction
# ---------------------------------------------------------------------------------------------------------------


def distances(result):
    return {k: v for k, v in result.items() if not k.endswith(".scale")}


@pytest.mark.parametrize("kernel", KERNELS)
def test_construction_is_at_distance_zero_with_its_step_size(kernel):
    model = Construct(2, ETA, kernel, embeddings(), n_dims=D, use_feed_forward=True)
    result = distance_to_construction(model)
    groups = [
        f"blocks.{b}.{head}.{part}" for b in (0, 1) for head in ("update", "erase", "expect") for part in ("qk", "ov")
    ]
    assert sorted(distances(result)) == sorted(groups)
    assert max(distances(result).values()) < 1e-12
    for name in groups:
        assert result[name + ".scale"] == pytest.approx(ETA if name.endswith("update.ov") else 1.0)
    simplified = distance_to_construction(Construct(1, ETA, kernel, embeddings(), n_dims=D, simplified=True))
    assert sorted(distances(simplified)) == ["blocks.0.update.ov", "blocks.0.update.qk"]


def test_distance_ignores_head_reparametrisations_and_sees_departures():
    model = Construct(2, ETA, "softmax", embeddings(), n_dims=D)
    xs, ys = prompt()
    with torch.no_grad():
        before = model(xs, ys).logits
        g = torch.Generator().manual_seed(2)
        attention = model.blocks[0].self_attention
        mix = torch.randn(D, D, generator=g, dtype=torch.float64) + 3 * torch.eye(D, dtype=torch.float64)
        attention.update_query.weight.copy_(mix @ attention.update_query.weight)  # q -> M q, k -> M^-T k
        attention.update_key.weight.copy_(torch.linalg.inv(mix).T @ attention.update_key.weight)
        rotation = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64)).Q
        attention.erase_query.weight.copy_(rotation @ attention.erase_query.weight)  # a rotation of both
        attention.erase_key.weight.copy_(rotation @ attention.erase_key.weight)
        values = torch.randn(WIDTH, WIDTH, generator=g, dtype=torch.float64) + 3 * torch.eye(WIDTH, dtype=torch.float64)
        attention.update_value.weight.copy_(values @ attention.update_value.weight)  # v -> V v, W_O -> W_O V^-1
        attention.update_output.weight.copy_(attention.update_output.weight @ torch.linalg.inv(values))
        torch.testing.assert_close(model(xs, ys).logits, before, rtol=1e-8, atol=1e-8)
        assert max(distances(distance_to_construction(model)).values()) < 1e-10

        cross = model.blocks[1].cross_attention
        cross.query.weight.add_(0.5 * torch.randn(cross.query.weight.shape, generator=g, dtype=torch.float64))
        moved = distance_to_construction(model)
        assert moved["blocks.1.expect.qk"] > 0.1 and moved["blocks.0.update.qk"] < 1e-10
        cross.output.weight.neg_()  # pointing away from the construction: nothing of it explained
        assert distance_to_construction(model)["blocks.1.expect.ov"] == 1.0


def test_random_model_is_far_from_the_construction():
    result = distance_to_construction(random_model())
    assert min(distances(result).values()) > 0.5


def test_gradients_match_finite_differences():
    # every path matters at this scale (at 0.5 the unnormalised kernel sums over whole contexts overflow)
    model = random_model(use_feed_forward=True, initializer_range=0.3).double()
    xs, ys = prompt(n=5)
    params = {name: p.detach() for name, p in model.named_parameters()}
    names = (
        "class_embedding.weight",  # label slots, cross-attention keys/values and read-out
        "blocks.0.self_attention.update_key.weight",
        "blocks.1.self_attention.erase_query.weight",
        "blocks.0.cross_attention.query.weight",
    )

    for n_context in (None, 3):  # every position as its prefix's query; queries after a context

        def loss_of(*values, n_context=n_context):
            weights = {**params, **dict(zip(names, values, strict=True))}
            return torch.func.functional_call(model, weights, (xs, ys), {"n_context": n_context}).loss

        assert torch.autograd.gradcheck(loss_of, tuple(params[n].clone().requires_grad_() for n in names))
