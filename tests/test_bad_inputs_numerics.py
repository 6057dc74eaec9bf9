"""Numerics that do not fail on finite inputs (issue 30), table-driven like ``tests/test_bad_inputs.py``.

Each row is a call that used to give NaN silently (a finite but extreme prompt entry, a NaN kernel parameter, an
overflowing GD kernel, a predictor returning NaN) and must now raise a ``ValueError`` whose message holds the
listed words (the argument, the value, where it is, what is allowed). The good paths follow: at a tenth of the
magnitude bound every model family stays finite and causal, the GD transformer at inputs × 100 equals its
reference, and both equal functional GD written out as loops.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch
from bad_input_rows import assert_rejects, row
from torch import nn

from hf_icl.data.tasks import get_task
from hf_icl.estimators import RandomFourierFeatures
from hf_icl.evaluation import evaluate_context_scaling
from hf_icl.modeling import build_model
from hf_icl.modeling.gd_transformer import (
    GDTransformerForInContextClassification,
    causal_functional_gd_logits,
    functional_gd_logits,
)
from hf_icl.modeling.prompts import check_prompt
from hf_icl.similarity.row_kernels import dot_product_scores, ga_scores, row_kernel_scores

D, N, B, C = 3, 8, 2, 3
POS = 5  # where the extreme entry goes: positions 0..4 must not see it

# -- tiny fixtures (built once, on first use) ------------------------------------------------------------------------

#: the model families and the config fields of each variant measured for the bound
FAMILIES = {
    "gpt2": ("gpt2_icl", {}),
    "gpt2-concatenated": ("gpt2_icl", {"prompt_format": "concatenated"}),
    "sgpt": ("sgpt", {}),
    "linear-gpt": ("linear_gpt", {}),
    "linear-gpt-quadratic": ("linear_gpt", {"linear_attention_feature_map": "quadratic"}),
    "kernel-icl": ("kernel_icl", {}),
    "kernel-icl-ga-columns": ("kernel_icl", {"row_kernel": "ga", "use_column_attention": True}),
    "gd-normalised": ("gd_transformer", {"n_classes": C, "normalize_attention": True}),
    "gd-rbf": ("gd_transformer", {"n_classes": C, "kernel": "rbf"}),
    "gd-causal": ("gd_transformer", {"n_classes": C, "context_attention": "causal", "normalize_attention": True}),
    "mlp-vectorized": ("mlp_icl", {"mlp_input": "vectorized"}),
    "mlp-hilbert": ("mlp_icl", {"mlp_input": "features", "feature_map": "hilbert"}),
    "mlp-psi-linear": ("mlp_icl", {"mlp_input": "both", "feature_map": "linear"}),
    "one-layer-psi-linear": ("one_layer_feature_map", {"feature_map": "linear"}),
}
#: what the bound was measured with, written out (independent of the package's table): {dtype: (degree 2, 3)}
BOUNDS = {torch.float16: (1e3, 1e1), torch.float32: (1e16, 1e10), torch.float64: (1e150, 1e100)}


@cache
def model(name: str, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model_type, fields = FAMILIES[name]
    return build_model(model_type, "tiny", n_dims=D, n_points=N, **fields).to(dtype).eval()


def is_cubic(name: str) -> bool:
    return "psi-linear" in name


def prompt(categorical: bool = False, dtype=torch.float32, scale: float = 1.0):
    generator = torch.Generator().manual_seed(0)
    xs = torch.randn(B, N, D, generator=generator, dtype=torch.float64) * scale
    ys = torch.randint(C, (B, N), generator=generator) if categorical else torch.randn(B, N, generator=generator)
    return xs.to(dtype), (ys if categorical else ys.to(dtype))


def with_entry(tensor: torch.Tensor, index: tuple, value) -> torch.Tensor:
    out = tensor.clone()
    out[index] = value
    return out


def outputs(net, xs, ys, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = net(xs, ys, **kwargs)
    return out.logits if getattr(out, "logits", None) is not None else out.predictions


def embeddings(dtype=torch.float64) -> torch.Tensor:
    return torch.randn(4, C, generator=torch.Generator().manual_seed(1), dtype=dtype)


@cache
def construction(kernel: str = "softmax", normalize: bool = False, context: str = "full"):
    return GDTransformerForInContextClassification.from_gd_construction(
        2, 0.5, kernel, embeddings(), n_dims=D, n_points=N, normalize_attention=normalize, context_attention=context
    )


@cache
def random_gd():
    torch.manual_seed(0)
    return build_model("gd_transformer", "tiny", n_dims=D, n_points=N, n_classes=C, n_blocks=2).eval()


@cache
def nan_embedding_model():
    net = GDTransformerForInContextClassification.from_gd_construction(2, 0.5, "rbf", embeddings(), n_dims=D)
    with torch.no_grad():
        net.class_embedding.weight[2, 1] = float("nan")  # as a damaged checkpoint would load it
    return net


class NaNModel(nn.Module):
    """A model-like predictor whose predictions are NaN at one entry."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, xs, ys):
        return with_entry(torch.zeros_like(ys), (1, 4), float("nan")) + self.weight


def nan_estimator(xs, ys):
    return with_entry(torch.zeros_like(ys), (3, 5), float("nan"))


xs, ys = prompt()
xs64, ids = prompt(categorical=True, dtype=torch.float64)
LINEAR = get_task("linear_regression", n_dims=D)
RFF = RandomFourierFeatures()

# -- the rows --------------------------------------------------------------------------------------------------------

MAGNITUDE_ROWS = [
    row(
        "gpt2-label-1e30",
        lambda: model("gpt2")(xs, with_entry(ys, (0, 6), 1e30)),
        ["ys", "magnitude", "1e+30", "ys[0, 6]", "position 6", "1e+16", "float32"],
    ),
    row(
        "gpt2-x-1e30",
        lambda: model("gpt2")(with_entry(xs, (1, 2, 0), -1e30), ys),
        ["xs", "magnitude", "-1e+30", "xs[1, 2, 0]", "prompt 1, position 2", "1e+16", "float32"],
    ),
    row(
        "linear-gpt-label-1e30",
        lambda: model("linear-gpt")(xs, with_entry(ys, (0, 6), 1e30)),
        ["ys", "1e+30", "ys[0, 6]", "1e+16"],
    ),
    row("sgpt-label-1e20", lambda: model("sgpt")(xs, with_entry(ys, (0, 6), 1e20)), ["ys", "1e+20", "ys[0, 6]"]),
    row(
        "kernel-icl-x-1e20",
        lambda: model("kernel-icl")(with_entry(xs, (0, 3, 1), 1e20), ys),
        ["xs", "1e+20", "xs[0, 3, 1]", "1e+16"],
    ),
    row(
        "kernel-icl-context-query-label-1e20",
        lambda: model("kernel-icl")(xs, with_entry(ys, (1, 2), 1e20), n_context=4),
        ["ys", "1e+20", "ys[1, 2]"],
    ),
    row(
        "mlp-psi-linear-cubic-bound",
        lambda: model("mlp-psi-linear")(with_entry(xs, (0, 4, 0), 1e13), ys),
        ["xs", "1e+13", "xs[0, 4, 0]", "1e+10", "float32"],
    ),
    row(
        "gd-transformer-x-1e20",
        lambda: model("gd-normalised")(with_entry(xs, (0, 1, 2), 1e20), prompt(categorical=True)[1]),
        ["xs", "1e+20", "xs[0, 1, 2]", "1e+16"],
    ),
    row(
        "float16-gpt2-inputs-x-1e6",
        lambda: model("gpt2", torch.float16)(xs * 1e6, ys),
        ["xs", "magnitude", "at most 1000", "float16", "max_prompt_magnitude"],
    ),
    row(
        "float16-gpt2-float64-label-2e3",
        lambda: model("gpt2", torch.float16)(xs, with_entry(ys, (1, 7), 2e3).double()),
        ["ys", "2000", "ys[1, 7]", "float16"],
    ),
    row(
        "check-prompt-model-dtype",
        lambda: check_prompt(xs, with_entry(ys, (0, 0), 5000.0), D, dtype=torch.float16),
        ["ys", "5000", "ys[0, 0]", "at most 1000", "float16"],
    ),
    row(
        "float16-column-attention-x-500",
        lambda: model("kernel-icl-ga-columns", torch.float16)(with_entry(xs, (0, 2, 2), 500.0), ys),
        ["xs", "500", "xs[0, 2, 2]", "at most 10", "float16"],
    ),
    row(
        "reference-x-1e200-float64",
        lambda: functional_gd_logits(with_entry(xs64, (0, 2, 1), 1e200), ids, embeddings(), 2, 0.5, "rbf"),
        ["xs", "1e+200", "xs[0, 2, 1]", "1e+150", "float64"],
    ),
]

GD_ROWS = [
    row(
        "reference-softmax-x100",
        lambda: functional_gd_logits(xs64 * 100, ids, embeddings(), 2, 0.5),
        ["functional_gd_logits", "unnormalised softmax kernel", "overflows float64", "709.8", "normalize_attention"],
    ),
    row(
        "reference-softmax-x100-context",
        lambda: functional_gd_logits(xs64 * 100, ids, embeddings(), 1, 0.5, n_context=5),
        ["unnormalised softmax kernel", "largest kernel score", "prompt"],
    ),
    row(
        "causal-reference-softmax-x100",
        lambda: causal_functional_gd_logits(xs64 * 100, ids, embeddings(), 2, 0.5),
        ["causal_functional_gd_logits", "unnormalised softmax kernel", "overflows float64"],
    ),
    row(
        "construction-softmax-x100",
        lambda: construction()(xs64 * 100, ids),
        ["GDTransformerForInContextClassification", "unnormalised softmax kernel", "block 0", "709.8"],
    ),
    row(
        "construction-causal-softmax-x100",
        lambda: construction(context="causal")(xs64 * 100, ids),
        ["unnormalised softmax kernel", "overflows float64", "block"],
    ),
    row(
        "random-gd-float32-x100",
        lambda: random_gd()(xs * 100, ids),
        ["unnormalised softmax kernel", "float32", "88.72", "block"],
    ),
    row(
        "reference-xs-nan",
        lambda: functional_gd_logits(with_entry(xs64, (1, 3, 2), float("nan")), ids, embeddings(), 1, 0.5),
        ["xs must hold finite values only", "nan", "xs[1, 3, 2]", "prompt 1, position 3"],
    ),
    row(
        "causal-reference-xs-inf",
        lambda: causal_functional_gd_logits(with_entry(xs64, (0, 0, 0), float("inf")), ids, embeddings(), 1, 0.5),
        ["xs must hold finite values only", "inf", "xs[0, 0, 0]"],
    ),
    row(
        "reference-class-id-float",
        lambda: functional_gd_logits(xs64, with_entry(ids.double(), (0, 4), 1.5), embeddings(), 1, 0.5),
        ["ys must be integer class ids", "1.5", "ys[0, 4]"],
    ),
    row(
        "reference-W_e-nan",
        lambda: functional_gd_logits(xs64, ids, with_entry(embeddings(), (2, 1), float("nan")), 1, 0.5),
        ["W_e", "finite", "nan", "W_e[2, 1]"],
    ),
    row(
        "causal-reference-W_e-inf",
        lambda: causal_functional_gd_logits(xs64, ids, with_entry(embeddings(), (0, 0), float("inf")), 1, 0.5),
        ["W_e", "finite", "inf", "W_e[0, 0]"],
    ),
    row(
        "construction-W_e-nan",
        lambda: GDTransformerForInContextClassification.from_gd_construction(
            1, 0.5, "softmax", with_entry(embeddings(), (3, 2), float("nan")), n_dims=D
        ),
        ["W_e", "finite", "nan", "W_e[3, 2]"],
    ),
    row(
        "model-class-embedding-nan",
        lambda: nan_embedding_model()(xs64, ids),
        ["class_embedding.weight", "finite", "nan", "[2, 1]"],
    ),
]

KERNEL_ROWS = [
    row("ga-beta1-nan", lambda: ga_scores(xs[0], xs[0], beta1=float("nan")), ["beta1", "finite", "nan"]),
    row(
        "ga-beta1-tensor-nan",
        lambda: ga_scores(xs[0], xs[0], beta1=torch.tensor(float("nan"), requires_grad=True)),
        ["beta1", "finite", "nan"],
    ),
    row("ga-beta2-inf", lambda: ga_scores(xs[0], xs[0], beta2=float("inf")), ["beta2", "finite", "inf"]),
    row("ga-wedge-mu-nan", lambda: ga_scores(xs[0], xs[0], wedge_mode="well", wedge_mu=math.nan), ["wedge_mu", "nan"]),
    row("dot-scale-nan", lambda: dot_product_scores(xs[0], xs[0], scale=float("nan")), ["scale", "finite", "nan"]),
    row(
        "row-kernel-softmax-scale-tensor-inf",
        lambda: row_kernel_scores(xs[0], xs[0], "softmax", scale=torch.tensor(float("inf"))),
        ["scale", "finite", "inf"],
    ),
    row(
        "cosine-temperature-tensor-nan",
        lambda: row_kernel_scores(xs[0], xs[0], "cosine", temperature=torch.tensor(float("nan"))),
        ["temperature", "finite positive", "nan"],
    ),
    row(
        "rff-input-1e38",
        lambda: RFF(with_entry(torch.zeros(2, 5, 1), (1, 3, 0), 1e38)),
        ["xs", "random Fourier features", "xs[1, 3]", "1e+38", "float32", "8.38861e+06", "float64"],
    ),
    row(
        "rff-input-1e7",
        lambda: RFF(with_entry(torch.zeros(2, 5, 1), (0, 2, 0), 1e7)),
        ["xs[0, 2]", "1e+07", "8.38861e+06"],
    ),
    row("rff-input-nan", lambda: RFF(with_entry(torch.zeros(4, 1), (2, 0), math.nan)), ["xs", "nan", "xs[2]"]),
]

EVALUATION_ROWS = [
    row(
        "context-scaling-nan-estimator",
        lambda: evaluate_context_scaling({"nan_estimator": nan_estimator}, LINEAR, n_prompts=8, n_points=N),
        ["predictor 'nan_estimator'", "non-finite", "nan", "prompt 3", "position 5"],
    ),
    row(
        "context-scaling-nan-estimator-second-batch",
        lambda: evaluate_context_scaling(
            {"nan_estimator": nan_estimator}, LINEAR, n_prompts=16, n_points=N, batch_size=8, n_bootstrap=10
        ),
        ["predictor 'nan_estimator'", "prompt 3", "position 5"],
    ),
    row(
        "context-scaling-nan-model",
        lambda: evaluate_context_scaling({"nan_model": NaNModel()}, LINEAR, n_prompts=8, n_points=N, batch_size=4),
        ["predictor 'nan_model'", "non-finite", "prompt 1", "position 4"],
    ),
]


@pytest.mark.parametrize("call, error, words", MAGNITUDE_ROWS + GD_ROWS + KERNEL_ROWS + EVALUATION_ROWS)
def test_rejects(call, error, words):
    assert_rejects(call, error, words)


# -- the good paths --------------------------------------------------------------------------------------------------


def test_the_bound_table_is_the_measured_one():
    from hf_icl.modeling.prompts import max_prompt_magnitude

    for dtype, (square, cubic) in BOUNDS.items():
        assert max_prompt_magnitude(dtype) == square and max_prompt_magnitude(dtype, 3) == cubic
    assert max_prompt_magnitude(torch.bfloat16) == max_prompt_magnitude(torch.float32)  # one exponent range
    with pytest.raises(ValueError, match="dtype must be a floating-point dtype"):
        max_prompt_magnitude(torch.int64)
    with pytest.raises(ValueError, match="degree must be one of"):
        max_prompt_magnitude(torch.float32, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_tenth_of_the_bound_is_finite_and_causal(name, dtype):
    """One x entry and one y entry at bound / 10 at position POS: every prediction finite, and the positions before
    POS exactly those of the prompt without the entries (the entry reaches no earlier position)."""
    net = model(name, dtype)
    categorical = net.config.target_kind == "categorical"
    base_xs, base_ys = prompt(categorical, dtype)
    value = BOUNDS[dtype][1 if is_cubic(name) else 0] / 10
    big_xs = with_entry(base_xs, (0, POS, 1), -value)
    big_ys = base_ys if categorical else with_entry(base_ys, (0, POS), value)
    big, small = outputs(net, big_xs, big_ys), outputs(net, base_xs, base_ys)
    assert torch.isfinite(big).all()
    torch.testing.assert_close(big[:, :POS], small[:, :POS], rtol=0, atol=0)
    # and the entry did reach its own position's prediction (it is not ignored)
    assert not torch.equal(big[0, POS], small[0, POS])


def test_float16_gpt2_finite_below_its_bound():
    net = model("gpt2", torch.float16)
    base_xs, base_ys = prompt()
    big = outputs(net, with_entry(base_xs, (0, POS, 0), 100.0), with_entry(base_ys, (1, POS), -100.0))
    assert big.dtype == torch.float16 and torch.isfinite(big).all()
    with pytest.raises(ValueError, match="at most 1000 .the bound for a float16 model"):
        net(with_entry(base_xs, (0, POS, 0), 1001.0), base_ys)


# -- the GD transformer: inputs × 100, and the formula written out ------------------------------------------------


@pytest.mark.parametrize(
    "kernel, normalize",
    [("softmax", True), ("rbf", False), ("linear", False)],
    ids=["softmax-normalised", "rbf", "linear"],
)
def test_gd_inputs_times_100_are_finite_and_equal_the_reference(kernel, normalize):
    net = construction(kernel, normalize)
    big = xs64 * 100
    expected = functional_gd_logits(big, ids, embeddings(), 2, 0.5, kernel, normalize_attention=normalize)
    got = outputs(net, big, ids)
    assert torch.isfinite(got).all() and torch.isfinite(expected).all()
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=0)
    # the document's protocol (context then queries) too
    context = functional_gd_logits(big, ids, embeddings(), 2, 0.5, kernel, normalize_attention=normalize, n_context=5)
    torch.testing.assert_close(outputs(net, big, ids, n_context=5), context, rtol=1e-9, atol=0)
    if kernel != "linear":  # the linear kernel's logits at × 100 are ~1e8: compare relatively (done above)
        causal = causal_functional_gd_logits(big, ids, embeddings(), 2, 0.5, kernel, normalize_attention=normalize)
        causal_model = construction(kernel, normalize, "causal")
        torch.testing.assert_close(outputs(causal_model, big, ids), causal, rtol=1e-9, atol=0)


def formula_logits(xs, ys, W_e, n_steps, eta, kernel, normalize):
    """Functional GD of the document, from its formula, one prompt and one prefix at a time with Python floats:
    position i's context is the pairs j < i; f_{j,k+1} = f_{j,k} + η Σ_l κ(x_j, x_l)(w_{y_l} − W_e softmax(W_eᵀf_{l,k}))
    for context points and the query alike; logits W_eᵀ f_{i,K}."""
    W = W_e.tolist()
    dim, n_classes = len(W), len(W[0])

    def column(c):
        return [W[r][c] for r in range(dim)]

    def expected_embedding(f):
        scores = [sum(W[r][c] * f[r] for r in range(dim)) for c in range(n_classes)]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        return [sum(W[r][c] * weights[c] / total for c in range(n_classes)) for r in range(dim)]

    def kappa_row(a, keys):
        dots = [sum(p * q for p, q in zip(a, b, strict=True)) for b in keys]
        if kernel == "rbf":
            return [math.exp(-sum((p - q) ** 2 for p, q in zip(a, b, strict=True)) / 2) for b in keys]
        if kernel == "linear":
            return dots
        weights = [math.exp(s) for s in dots]
        return [w / sum(weights) for w in weights] if normalize else weights

    out = []
    for b in range(len(xs)):
        rows = []
        for i in range(len(xs[b])):
            context, query = xs[b][:i], xs[b][i]
            f = [[0.0] * dim for _ in range(i)]
            f_query = [0.0] * dim
            for _ in range(n_steps):
                residuals = []
                for j in range(i):
                    expected = expected_embedding(f[j])
                    residuals.append([column(ys[b][j])[r] - expected[r] for r in range(dim)])
                new_f = []
                for j in range(i):
                    k = kappa_row(context[j], context)
                    new_f.append([f[j][r] + eta * sum(k[l] * residuals[l][r] for l in range(i)) for r in range(dim)])
                k = kappa_row(query, context) if i else []
                f_query = [f_query[r] + eta * sum(k[l] * residuals[l][r] for l in range(i)) for r in range(dim)]
                f = new_f
            rows.append([sum(W[r][c] * f_query[r] for r in range(dim)) for c in range(n_classes)])
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize(
    "kernel, normalize",
    [("softmax", False), ("softmax", True), ("rbf", False), ("linear", False)],
    ids=["softmax", "softmax-normalised", "rbf", "linear"],
)
def test_gd_model_and_reference_equal_the_formula_at_normal_scale(kernel, normalize):
    expected = formula_logits(xs64.tolist(), ids.tolist(), embeddings(), 2, 0.5, kernel, normalize)
    reference = functional_gd_logits(xs64, ids, embeddings(), 2, 0.5, kernel, normalize_attention=normalize)
    torch.testing.assert_close(reference, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(outputs(construction(kernel, normalize), xs64, ids), expected, rtol=1e-9, atol=1e-12)


def test_reference_and_model_refuse_a_bad_prompt_with_the_same_message():
    bad = with_entry(xs64, (1, 3, 2), float("nan"))
    messages = []
    for call in (lambda: construction()(bad, ids), lambda: functional_gd_logits(bad, ids, embeddings(), 2, 0.5)):
        with pytest.raises(ValueError) as caught:
            call()
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


def test_rff_accepts_large_inputs_in_float64_and_ordinary_ones_in_float32():
    features = RFF(with_entry(torch.zeros(2, 5, 1, dtype=torch.float64), (1, 3, 0), 1e7))
    assert features.dtype == torch.float64 and torch.isfinite(features).all()
    assert torch.isfinite(RFF(torch.randn(3, 4, 1) * 100)).all()


def test_row_kernels_accept_finite_tensor_parameters_with_gradients():
    beta1 = torch.tensor(4.0, requires_grad=True)
    ga_scores(xs[0], xs[0], beta1=beta1).sum().backward()
    assert beta1.grad is not None and torch.isfinite(beta1.grad)


def test_evaluation_accepts_minus_inf_class_logits():
    """Class logits of -inf are log-probabilities of 0, not an error (a NaN logit is)."""

    def log_probabilities(xs, ys):
        logits = torch.zeros(*ys.shape, 2)
        logits[..., 1] = -torch.inf
        return logits

    result = evaluate_context_scaling(
        {"always_first": log_probabilities},
        get_task("categorical", n_dims=D, n_classes=2),
        n_prompts=8,
        n_points=N,
        n_bootstrap=10,
    )
    assert torch.isfinite(result.curves["always_first"]).all()


@pytest.mark.parametrize("name", ["gpt2", "sgpt", "linear-gpt", "kernel-icl", "gd-rbf", "mlp-vectorized"])
def test_check_inputs_false_documents_that_earlier_positions_can_turn_nan(name):
    doc = " ".join(type(model(name)).forward.__doc__.split())
    assert "check_inputs" in doc and "*earlier* positions NaN" in doc and "causal only for valid inputs" in doc
