"""Out-of-distribution task variants: the moments of their inputs and targets, and clear refusals."""

import math

import pytest
import torch

from hf_icl.data.inputs import DiagonalGaussianInputs, UniformInputs
from hf_icl.data.tasks import NoisyLinearRegression, get_task
from hf_icl.evaluation import OOD_KINDS, ood_task


def input_sample(task, n_prompts=4000, n_points=10, seed=0):
    """``(n_prompts · n_points, d)`` inputs, float64."""
    xs, _ = task.sample(n_prompts, n_points, seed=seed)
    return xs.reshape(-1, task.n_dims).double()


def test_kinds_are_listed():
    assert set(OOD_KINDS) == {
        "scaled_x",
        "scaled_y",
        "skewed_covariance",
        "half_subspace",
        "noisy_labels",
        "anisotropic",
    }


@pytest.mark.parametrize("k", [2.0, 3.0])
def test_scaled_x_multiplies_the_input_variance_by_k_squared(k):
    x = input_sample(ood_task(get_task("linear_regression", n_dims=4), "scaled_x", k=k))
    # 40 000 draws: each coordinate's variance is within ~2% of k²
    torch.testing.assert_close(x.var(dim=0), torch.full((4,), k**2, dtype=torch.float64), rtol=0.05, atol=0)


def test_scaled_x_default_is_two_and_it_scales_other_input_distributions():
    assert ood_task(get_task("linear_regression", n_dims=2), "scaled_x").inputs.scale == 2.0
    diagonal = get_task("linear_regression", n_dims=2, inputs=DiagonalGaussianInputs(variances=(1.0, 4.0)))
    assert ood_task(diagonal, "scaled_x", k=3).inputs.variances == (9.0, 36.0)
    uniform = get_task("linear_regression", n_dims=2, inputs=UniformInputs(low=-1, high=2))
    shifted = ood_task(uniform, "scaled_x", k=2).inputs
    assert (shifted.low, shifted.high) == (-2.0, 4.0)


def test_scaled_y_multiplies_the_targets_on_the_same_prompts():
    task = get_task("linear_regression", n_dims=3, scale=1.5)
    shifted = ood_task(task, "scaled_y", k=2)
    assert shifted.scale == 3.0
    xs, ys = task.sample(16, 5, seed=1)
    xs2, ys2 = shifted.sample(16, 5, seed=1)
    assert torch.equal(xs, xs2)
    torch.testing.assert_close(ys2, 2 * ys)


def test_skewed_covariance_has_an_inverse_square_spectrum_of_trace_d():
    d = 5
    x = input_sample(ood_task(get_task("linear_regression", n_dims=d), "skewed_covariance"), n_prompts=8000)
    eigenvalues = torch.linalg.eigvalsh(x.T @ x / len(x)).flip(0)
    raw = torch.tensor([1 / i**2 for i in range(1, d + 1)], dtype=torch.float64)
    expected = d * raw / raw.sum()
    torch.testing.assert_close(eigenvalues, expected, rtol=0.1, atol=0)
    assert abs(float(eigenvalues.sum()) - d) < 0.1 * d
    # a random rotation: the covariance is not diagonal
    covariance = x.T @ x / len(x)
    assert float((covariance - torch.diag(torch.diagonal(covariance))).abs().max()) > 0.1


@pytest.mark.parametrize("match_norm, mean_square_norm", [(False, 3.0), (True, 6.0)])
def test_half_subspace_inputs_span_d_over_2_dimensions(match_norm, mean_square_norm):
    task = ood_task(get_task("linear_regression", n_dims=6), "half_subspace", match_norm=match_norm)
    x = input_sample(task)
    singular = torch.linalg.svdvals(x)
    assert float(singular[2]) > 1e3 * float(singular[3])  # rank 3 up to float32 rounding
    assert abs(float(x.square().sum(dim=1).mean()) - mean_square_norm) < 0.05 * mean_square_norm


def test_half_subspace_dimension_is_configurable():
    x = input_sample(ood_task(get_task("linear_regression", n_dims=5), "half_subspace", subspace_dim=1), 500)
    singular = torch.linalg.svdvals(x)
    assert float(singular[0]) > 1e3 * float(singular[1])


def test_anisotropic_variances_are_tiled_to_d():
    task = ood_task(get_task("linear_regression", n_dims=7), "anisotropic")
    expected = torch.tensor([0.5, 1.0, 1.5, 1.0, 1.75, 0.5, 1.0], dtype=torch.float64)
    torch.testing.assert_close(input_sample(task).var(dim=0), expected, rtol=0.05, atol=0)
    truncated = ood_task(get_task("linear_regression", n_dims=3), "anisotropic", variances=(2.0, 3.0, 4.0, 5.0))
    assert truncated.inputs.variances == (2.0, 3.0, 4.0)


def test_noisy_labels_adds_unit_noise_to_linear_regression_and_keeps_the_pool():
    task = get_task("linear_regression", n_dims=3, n_tasks=8, pool_seed=4, weight_prior="scaled")
    noisy = ood_task(task, "noisy_labels")
    assert isinstance(noisy, NoisyLinearRegression)
    assert (noisy.noise_std, noisy.n_tasks, noisy.pool_seed, noisy.weight_prior) == (1.0, 8, 4, "scaled")
    torch.testing.assert_close(noisy.task_pool()["w"], task.task_pool()["w"])
    _, ys, params = noisy.sample(3000, 10, seed=0, return_params=True)
    noise = ys - params["signal"]
    assert abs(float(noise.std()) - 1.0) < 0.03
    again = ood_task(get_task("noisy_linear_regression", n_dims=3, noise_std=(0.1, 0.2)), "noisy_labels", noise_std=0.5)
    assert again.noise_std == 0.5 and again.noise_probs is None


def test_unknown_kinds_bad_arguments_and_unsupported_families_are_refused():
    task = get_task("linear_regression", n_dims=4)
    with pytest.raises(ValueError, match="unknown OOD kind 'rotated'.*scaled_x"):
        ood_task(task, "rotated")
    with pytest.raises(ValueError, match="bad arguments for OOD kind 'scaled_x'"):
        ood_task(task, "scaled_x", factor=2)
    with pytest.raises(ValueError, match="k must be"):
        ood_task(task, "scaled_x", k=-1)
    with pytest.raises(ValueError, match="noisy_labels is defined for linear_regression"):
        ood_task(get_task("sparse_linear_regression", n_dims=4), "noisy_labels")
    with pytest.raises(ValueError, match="draws its own inputs"):
        ood_task(get_task("latent_group_sinusoid"), "skewed_covariance")
    with pytest.raises(ValueError, match="'scale' hyperparameter"):
        ood_task(get_task("decision_tree", n_dims=3), "scaled_y")
    with pytest.raises(ValueError, match="unknown task family"):
        ood_task("nope", "scaled_x")


def test_variants_keep_everything_else_and_accept_task_dicts():
    task = {"name": "sparse_linear_regression", "n_dims": 6, "sparsity": 2, "n_tasks": 5}
    shifted = ood_task(task, "skewed_covariance", rotation_seed=3)
    assert (shifted.name, shifted.sparsity, shifted.n_tasks) == ("sparse_linear_regression", 2, 5)
    assert shifted.inputs.rotation_seed == 3
    assert math.isclose(shifted.inputs.mean_square_norm(6), 6.0)
