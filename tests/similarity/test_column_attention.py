"""GA column attention (seed 000's LearnableColumnAttention): the formula in loops, the document's module, the
all-prefix weights against a per-prefix loop, finite values and gradients on degenerate columns, argument checks."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hf_icl.similarity.column_attention import column_mixing_weights, mix_columns, prefix_column_mixing_weights

PARAMS = {"beta1": 3.0, "beta2": 1.5, "diag_bias": 0.7, "wedge_mu": 0.3}  # away from the defaults


def reference_weights(x, beta1, beta2, diag_bias, wedge_mu, eps=1e-6):
    """The document's column scores and softmax for ONE sample set ``x (N, D)``, in Python floats."""
    n_samples, n_features = x.shape
    columns = [[float(x[n, d]) for n in range(n_samples)] for d in range(n_features)]
    norms = [max(math.sqrt(sum(v * v for v in column)), eps) for column in columns]
    alpha = torch.zeros(n_features, n_features, dtype=torch.float64)
    for d in range(n_features):
        scores = []
        for e in range(n_features):
            cosine = sum(a * b for a, b in zip(columns[d], columns[e], strict=True)) / (norms[d] * norms[e])
            cosine = min(max(cosine, -1 + eps), 1 - eps)
            wedge = math.sqrt(max(1 - cosine * cosine, 0.0))
            scores.append(beta1 * cosine - beta2 * (wedge - wedge_mu) ** 2 + (diag_bias if d == e else 0.0))
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        for e in range(n_features):
            alpha[d, e] = exps[e] / sum(exps)
    return alpha


class DocumentColumnAttention(nn.Module):
    """The document's ``LearnableColumnAttention``, written out as it is there (its parameters set by the test)."""

    def __init__(self, beta1, beta2, diag_bias, wedge_mu, gate):
        super().__init__()
        self.beta1 = nn.Parameter(torch.tensor(beta1))
        self.beta2 = nn.Parameter(torch.tensor(beta2))
        self.diag_bias = nn.Parameter(torch.tensor(diag_bias))
        self.wedge_mu = nn.Parameter(torch.tensor(wedge_mu))
        self.gate = nn.Parameter(torch.tensor(gate))

    def forward(self, X):
        B, N, D = X.shape
        eps = 1e-6
        X_t = X.transpose(1, 2)
        u = X_t / X_t.norm(dim=-1, keepdim=True).clamp(min=eps)
        c = torch.einsum("bdn,ben->bde", u, u).clamp(-1 + eps, 1 - eps)
        w = torch.sqrt((1 - c**2).clamp(min=0))
        score = (
            self.beta1 * c
            - self.beta2 * (w - self.wedge_mu) ** 2
            + self.diag_bias * torch.eye(D, device=X.device).unsqueeze(0)
        )
        alpha = F.softmax(score, dim=-1)
        Y = torch.einsum("bde,ben->bdn", alpha, X_t).transpose(1, 2)
        g = torch.sigmoid(self.gate)
        return (1 - g) * X + g * Y


def samples(batch=3, n=9, d=4, seed=0, dtype=torch.float64):
    return torch.randn(batch, n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_weights_follow_the_formula_written_out_in_loops():
    xs = samples()
    xs[1, :, 2] = xs[1, :, 0] * 2.5  # a parallel pair: cosine clamped at 1 - eps
    xs[2, :, 3] = -xs[2, :, 1]  # an antiparallel pair: clamped at -1 + eps
    alpha = column_mixing_weights(xs, **PARAMS)
    assert alpha.shape == (3, 4, 4) and alpha.dtype == torch.float64
    for b in range(3):
        torch.testing.assert_close(alpha[b], reference_weights(xs[b], **PARAMS), rtol=1e-12, atol=1e-12)
    defaults = column_mixing_weights(xs)  # the document's initial values 4, 1, 2, 0.5
    torch.testing.assert_close(defaults[0], reference_weights(xs[0], 4.0, 1.0, 2.0, 0.5), rtol=1e-12, atol=1e-12)


def test_mixing_equals_the_documents_module():
    xs = samples(batch=2, n=30, d=6, dtype=torch.float32)
    document = DocumentColumnAttention(gate=0.4, **PARAMS)
    ours = mix_columns(xs, column_mixing_weights(xs, **PARAMS), gate=0.4)
    torch.testing.assert_close(ours, document(xs), rtol=1e-5, atol=1e-6)
    # parameters as tensors (learnable): the same values, and gradients reach every one of them
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in PARAMS.items()}
    gate = torch.tensor(0.4, requires_grad=True)
    mixed = mix_columns(xs, column_mixing_weights(xs, **tensors), gate)
    torch.testing.assert_close(mixed, ours)
    mixed.square().sum().backward()
    assert all(t.grad is not None and t.grad != 0 for t in (*tensors.values(), gate))


def test_mix_columns_per_sample_and_broadcast_over_weight_sets():
    xs = samples(batch=2, n=5, d=3)
    weights = torch.rand(2, 4, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mixed = mix_columns(xs[:, None], weights, gate=-0.8)  # 4 weight sets for the same samples
    assert mixed.shape == (2, 4, 5, 3)
    g = 1 / (1 + math.exp(0.8))
    for b in range(2):
        for p in range(4):
            for n in range(5):
                for d in range(3):
                    mixed_value = sum(float(weights[b, p, d, e] * xs[b, n, e]) for e in range(3))
                    expected = (1 - g) * float(xs[b, n, d]) + g * mixed_value
                    assert math.isclose(float(mixed[b, p, n, d]), expected, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_prefix_weights_equal_the_weights_of_every_prefix(dtype, tol):
    xs = samples(batch=2, n=12, d=5, dtype=dtype)
    xs[1, :, 4] = 0.0  # a feature switched off (the dimension curriculum zeroes trailing coordinates)
    every = prefix_column_mixing_weights(xs, **PARAMS)
    assert every.shape == (2, 12, 5, 5) and every.dtype == dtype
    for i in range(12):  # the independent reference: the full weights of the samples j < i, one prefix at a time
        expected = column_mixing_weights(xs[:, :i], **PARAMS)
        torch.testing.assert_close(every[:, i], expected, rtol=tol, atol=tol)
    # position 0 has no samples: every cosine is 0, so every row is softmax(-β₂(1 - μ)² + diag_bias·[d = e])
    row = torch.full((5,), -PARAMS["beta2"] * (1 - PARAMS["wedge_mu"]) ** 2, dtype=dtype)
    row[0] += PARAMS["diag_bias"]
    torch.testing.assert_close(every[0, 0, 0], torch.softmax(row, 0), rtol=tol, atol=tol)
    # a later sample never changes an earlier prefix
    later = xs.clone()
    later[:, 7:] += 3.0
    assert torch.equal(prefix_column_mixing_weights(later, **PARAMS)[:, :8], every[:, :8])


@pytest.mark.parametrize("prefix", [False, True])
def test_constant_and_zero_columns_keep_values_and_gradients_finite(prefix):
    xs = samples(batch=2, n=6, d=4, dtype=torch.float32)
    xs[:, :, 0] = 0.0  # a zero column
    xs[:, :, 1] = 1.5  # two constant columns: parallel, cosine at the clamp
    xs[:, :, 2] = -0.5
    xs.requires_grad_(True)
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in PARAMS.items()}
    weights_of = prefix_column_mixing_weights if prefix else column_mixing_weights
    weights = weights_of(xs, **tensors)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    samples_view = xs[:, None] if prefix else xs  # per-position weights mix the samples once per position
    mixed = mix_columns(samples_view, weights, gate=torch.tensor(0.0, requires_grad=True))
    (mixed.square().sum() + weights.square().sum()).backward()
    for tensor in (xs, *tensors.values()):
        assert torch.isfinite(tensor.grad).all()
    # the zero column has cosine 0 with every other column (it does not look parallel to anything)
    if prefix:  # the last position's weights come from the samples before it
        got, expected = weights[0, -1], reference_weights(xs[0, :-1].detach().double(), **PARAMS)
    else:
        got, expected = weights[0], reference_weights(xs[0].detach().double(), **PARAMS)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_value_errors_naming_them():
    xs = samples()
    with pytest.raises(ValueError, match=r"xs must be a floating-point tensor of shape \(\.\.\., n_samples"):
        column_mixing_weights(torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="xs must be a floating-point tensor"):
        prefix_column_mixing_weights(torch.ones(5))
    with pytest.raises(ValueError, match=r"eps must be a number in \(0.0, 0.5\], got 0.0"):
        column_mixing_weights(xs, eps=0.0)
    with pytest.raises(ValueError, match="eps must be"):
        prefix_column_mixing_weights(xs, eps=2.0)
    with pytest.raises(ValueError, match=r"weights must be a tensor of shape \(\.\.\., 4, 4\)"):
        mix_columns(xs, torch.ones(3, 3, 3, dtype=xs.dtype))
    with pytest.raises(ValueError, match="weights must be a tensor"):
        mix_columns(xs, [[1.0]])
