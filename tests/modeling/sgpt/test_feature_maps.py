"""The one-layer feature maps ψ (seed 001, eq. 9–12): every prefix in one call, against the formulas per prefix."""

import math

import pytest
import torch

from hf_icl.estimators.nadaraya_watson import NadarayaWatson
from hf_icl.modeling.sgpt import FEATURE_MAPS, feature_map, prompt_matrix, psi_kernel, psi_linear

B, N, D = 3, 9, 4


def prompt(batch=B, n=N, d=D, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, d, generator=g, dtype=dtype), torch.randn(batch, n, generator=g, dtype=dtype)


def kernel_value(kernel, xi, xj, bandwidth=1.0):
    """K(x_i, x_j) written out for one pair (floats)."""
    if kernel == "exponential":
        return math.exp(float(xi @ xj) / bandwidth)
    if kernel == "hilbert":
        return float((xi - xj).norm()) ** -len(xi)
    return float(xi @ xj)


def smoother_row(A, i, kernel, label_width=1, bandwidth=1.0):
    """Σ_{j<i} K(x_i, x_j) A_j / Σ_{j<i} K(x_i, x_j) for one prompt (2-D ``A``), a loop over j (eq. 11)."""
    d = A.shape[-1] - label_width
    numerator, denominator = torch.zeros(A.shape[-1], dtype=A.dtype), 0.0
    for j in range(i):
        if kernel == "hilbert" and torch.equal(A[i, :d], A[j, :d]):
            continue  # coincident points are excluded
        weight = kernel_value(kernel, A[i, :d], A[j, :d], bandwidth)
        numerator += weight * A[j]
        denominator += abs(weight) if kernel == "l1" else weight
    return numerator / denominator if denominator > 0 else numerator * 0


@pytest.mark.parametrize("label_width", [1, 3])
def test_psi_linear_rows_are_last_rows_of_the_prefix_products(label_width):
    xs, _ = prompt()
    labels = torch.randn(B, N, label_width, dtype=torch.float64)
    A = prompt_matrix(xs, labels)
    out = psi_linear(A, label_width=label_width)
    assert out.shape == (B, N, D + label_width) and out.dtype == torch.float64
    for i in range(N):
        prefix = A[:, : i + 1].clone()
        prefix[:, i, D:] = 0  # the document's A^i: the query row's label is unknown
        expected = (prefix @ prefix.transpose(1, 2) @ prefix)[:, -1]
        torch.testing.assert_close(out[:, i], expected)


def test_psi_linear_last_label_entry_is_one_step_gd():
    xs, ys = prompt()
    out = psi_linear(prompt_matrix(xs, ys))
    # x_Nᵀ Xᵀ y over the N-1 labelled points (eq. 10)
    expected = torch.einsum("bd,bjd,bj->b", xs[:, -1], xs[:, :-1], ys[:, :-1])
    torch.testing.assert_close(out[:, -1, D], expected)


@pytest.mark.parametrize("kernel, bandwidth", [("exponential", None), ("exponential", 0.7), ("hilbert", None)])
def test_psi_kernel_label_column_is_nadaraya_watson(kernel, bandwidth):
    xs, ys = prompt()
    out = psi_kernel(prompt_matrix(xs, ys), kernel, bandwidth)
    estimator = NadarayaWatson(kernel="exp" if kernel == "exponential" else "hilbert", bandwidth=bandwidth)
    torch.testing.assert_close(out[..., D], estimator(xs, ys))


@pytest.mark.parametrize(
    "kernel, bandwidth", [("exponential", 1.0), ("exponential", 2.5), ("hilbert", 1.0), ("l1", 1.0)]
)
@pytest.mark.parametrize("label_width", [1, 2])
def test_psi_kernel_rows_equal_the_smoother_written_out(kernel, bandwidth, label_width):
    xs, _ = prompt(seed=1)
    A = prompt_matrix(xs, torch.randn(B, N, label_width, dtype=torch.float64))
    out = psi_kernel(A, kernel, bandwidth if kernel == "exponential" else None, label_width=label_width)
    for b in range(B):
        for i in range(N):
            torch.testing.assert_close(out[b, i], smoother_row(A[b], i, kernel, label_width, bandwidth))


def test_hilbert_excludes_coincident_points():
    xs, ys = prompt(batch=1)
    xs[0, 5] = xs[0, 2]  # x_5 repeats x_2
    xs[0, 1] = xs[0, 0]  # x_1's only earlier point coincides with it
    A = prompt_matrix(xs, ys)
    out = psi_kernel(A, "hilbert")
    torch.testing.assert_close(out[0, 5], smoother_row(A[0], 5, "hilbert"))
    assert torch.equal(out[0, 1], torch.zeros(D + 1, dtype=torch.float64))  # every earlier point excluded
    assert out.isfinite().all()
    # NadarayaWatson's rule is the opposite (the duplicate takes all the weight): they differ exactly there
    nw = NadarayaWatson(kernel="hilbert")(xs, ys)
    torch.testing.assert_close(nw[0, 5], ys[0, 2])
    assert not torch.isclose(out[0, 5, D], nw[0, 5])


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_rows_use_only_earlier_pairs_and_their_own_input(name):
    xs, ys = prompt()
    base = feature_map(prompt_matrix(xs, ys), name)
    for i in (0, 4, N - 1):
        xs2, ys2 = xs.clone(), ys.clone()
        ys2[:, i:] += 3.0
        xs2[:, i + 1 :] -= 2.0
        moved = feature_map(prompt_matrix(xs2, ys2), name)
        assert torch.equal(moved[:, : i + 1], base[:, : i + 1])
        if i + 1 < N:
            assert not torch.allclose(moved[:, i + 1 :], base[:, i + 1 :])


@pytest.mark.parametrize("kernel", ["exponential", "hilbert", "l1"])
def test_position_zero_and_zero_normaliser_give_zero_rows(kernel):
    xs, ys = prompt()
    assert not psi_kernel(prompt_matrix(xs, ys), kernel)[:, 0].any()
    # x_1 orthogonal to x_0: the l1 normaliser Σ|x_1·x_0| is 0
    xs = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])
    out = psi_kernel(prompt_matrix(xs, torch.tensor([[1.0, 2.0, 3.0]])), kernel)
    if kernel == "l1":
        assert not out[0, 1].any()
    torch.testing.assert_close(
        out[0, 1], smoother_row(prompt_matrix(xs, torch.tensor([[1.0, 2.0, 3.0]]))[0], 1, kernel)
    )


def test_huge_kernel_values_do_not_overflow():
    xs, ys = prompt(dtype=torch.float32)
    xs = xs * 30
    out = psi_kernel(prompt_matrix(xs, ys), "exponential", bandwidth=1e-3)  # exp(x·x'/τ) ~ exp(1e6)
    assert out.isfinite().all()
    nearest = (xs[:, -1:] @ xs[:, :-1].transpose(1, 2)).argmax(-1).squeeze(-1)  # the softmax collapses on it
    torch.testing.assert_close(out[:, -1, D], ys[torch.arange(B), nearest])
    xs[:, 6] = xs[:, 3] + 1e-6  # ‖x_6 - x_3‖^-4 ~ 1e24 in float32
    out = psi_kernel(prompt_matrix(xs, ys), "hilbert")
    assert out.isfinite().all()
    torch.testing.assert_close(out[:, 6, D], ys[:, 3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_dtypes_and_leading_batch_shapes(name):
    xs, ys = prompt(batch=6)
    A = prompt_matrix(xs, ys)
    out = feature_map(A, name)
    single = feature_map(A.float(), name)
    assert single.dtype == torch.float32
    torch.testing.assert_close(single, out.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(feature_map(A.reshape(2, 3, N, D + 1), name), out.reshape(2, 3, N, D + 1))
    torch.testing.assert_close(feature_map(A[4], name), out[4])  # one prompt, (N, d + 1)


def test_feature_map_dispatches():
    A = prompt_matrix(*prompt())
    assert torch.equal(feature_map(A, "linear"), psi_linear(A))
    assert torch.equal(feature_map(A, "exponential", 0.5), psi_kernel(A, "exponential", 0.5))
    assert torch.equal(feature_map(A, "l1"), psi_kernel(A, "l1"))


def test_prompt_matrix_rows():
    xs, ys = prompt()
    A = prompt_matrix(xs, ys.float())
    assert A.dtype == torch.float64 and torch.equal(A[..., :D], xs) and torch.equal(A[..., D], ys.float().double())
    onehot = torch.nn.functional.one_hot(torch.arange(N) % 3, 3).expand(B, N, 3)
    assert torch.equal(prompt_matrix(xs, onehot)[..., D:], onehot.double())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda A: feature_map(A, "gaussian"), r"name must be one of \['linear', 'exponential', 'hilbert', 'l1'\]"),
        (lambda A: psi_kernel(A, "linear"), r"kernel must be one of .*got 'linear'"),
        (lambda A: feature_map(A, "hilbert", 2.0), "bandwidth applies to the 'exponential' .*'hilbert'.*2.0"),
        (lambda A: feature_map(A, "linear", 2.0), "bandwidth applies to the 'exponential'"),
        (lambda A: psi_kernel(A, "l1", 1.0), "bandwidth applies to the 'exponential'"),
        (lambda A: psi_kernel(A, "exponential", 0.0), r"bandwidth must be a number in \(0.0"),
        (lambda A: psi_linear(A.long()), "A must have a floating-point dtype"),
        (lambda A: psi_linear(A[0, 0]), r"A must have shape \(\.\.\., N, d \+ 1\)"),
        (lambda A: psi_kernel(A[..., :1], "hilbert"), r"A must have shape .*got \(3, 9, 1\)"),
        (lambda A: psi_linear(A, label_width=0), "label_width must be an integer in"),
        (lambda A: psi_linear(A.tolist()), "A must be a torch.Tensor"),
        (lambda A: prompt_matrix(A[..., :D], A[:, :4, 0]), r"ys must have shape \(3, 9\)"),
        (lambda A: prompt_matrix(A[..., :D].long(), A[..., 0]), "xs must be a floating-point tensor"),
    ],
)
def test_bad_inputs(call, match):
    A = prompt_matrix(*prompt())
    with pytest.raises(ValueError, match=match):
        call(A)


def test_nadaraya_watsons_names_of_the_exponential_kernel_are_accepted():
    A = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = psi_kernel(A, "exponential", 0.5)
    for name in ("exp", "softmax"):
        assert torch.equal(psi_kernel(A, name, 0.5), expected)
        assert torch.equal(feature_map(A, name, 0.5), expected)
