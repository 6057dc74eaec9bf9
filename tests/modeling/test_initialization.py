"""The shared weight inits (hf_icl.modeling.initialization) against what they claim to equal: PyTorch's own
``nn.Linear`` init drawn from the same generator state, and GPT-2's N(0, std) / zero bias as a statistical property."""

from __future__ import annotations

import torch
from torch import nn

from hf_icl.modeling.initialization import icl_io_layer, init_icl_io_layer, init_linear_normal, init_linear_uniform


def test_uniform_init_is_pytorchs_own_linear_init():
    torch.manual_seed(3)
    reference = nn.Linear(37, 11)  # reset_parameters: kaiming-uniform(a=sqrt(5)) weight, then the bias
    layer = nn.Linear(37, 11)
    torch.manual_seed(3)
    init_linear_uniform(layer)
    assert torch.equal(layer.weight, reference.weight) and torch.equal(layer.bias, reference.bias)


def test_normal_init_has_the_asked_std_and_a_zero_bias():
    torch.manual_seed(0)
    layer = nn.Linear(400, 300)
    init_linear_normal(layer, 0.02)
    weight = layer.weight.detach().double()
    assert abs(weight.mean().item()) < 0.02 * 4 / (120_000**0.5)  # four standard errors of the mean
    assert abs(weight.std().item() / 0.02 - 1) < 0.01
    assert torch.count_nonzero(layer.bias) == 0


def test_garg_io_init_touches_flagged_layers_only():
    flagged, plain = icl_io_layer(8, 4), nn.Linear(8, 4)
    for layer in (flagged, plain):
        init_linear_normal(layer, 5.0)  # far outside U(±1/sqrt(8))
    init_icl_io_layer(flagged, "garg")
    init_icl_io_layer(plain, "garg")
    bound = 1 / 8**0.5
    assert flagged.weight.abs().max() <= bound and flagged.bias.abs().max() <= bound
    assert plain.weight.abs().max() > bound  # not an io layer: left as it was
    before = flagged.weight.clone()
    init_icl_io_layer(flagged, "gpt2")  # any other io_init leaves the layer alone
    assert torch.equal(flagged.weight, before)
