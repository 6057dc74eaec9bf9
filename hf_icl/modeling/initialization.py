"""Weight initialisations the ICL models share, through ``transformers.initialization`` (so that weights that
``from_pretrained`` just loaded are left alone), and the flag that marks a read-in or read-out layer for ``io_init``."""

from __future__ import annotations

import math

from torch import nn
from transformers import initialization as init


def init_linear_uniform(module: nn.Linear) -> None:
    """PyTorch's own ``nn.Linear`` init: U(±1/√fan_in) for weight and bias (kaiming-uniform with a=√5 is
    U(±1/√fan_in)), the init of the documents' PyTorch modules and of Garg et al.'s read-in/read-out."""
    bound = 1 / math.sqrt(module.in_features)
    init.uniform_(module.weight, -bound, bound)
    if module.bias is not None:
        init.uniform_(module.bias, -bound, bound)


def init_linear_normal(module: nn.Linear, std: float) -> None:
    """GPT-2's init of a linear layer: weight N(0, std), bias zero."""
    init.normal_(module.weight, mean=0.0, std=std)
    if module.bias is not None:
        init.zeros_(module.bias)


def icl_io_layer(in_features: int, out_features: int) -> nn.Linear:
    """A read-in or read-out ``nn.Linear``, flagged (``is_icl_io_layer``) for :func:`init_icl_io_layer`."""
    layer = nn.Linear(in_features, out_features)
    layer.is_icl_io_layer = True
    return layer


def init_icl_io_layer(module: nn.Module, io_init: str) -> None:
    """``io_init="garg"``: :func:`init_linear_uniform` for a layer made by :func:`icl_io_layer`, as Garg et al.'s
    read-in/read-out get it (the GPT-2 scheme the models apply first gives them N(0, 0.02)); nothing otherwise."""
    if io_init == "garg" and getattr(module, "is_icl_io_layer", False):
        init_linear_uniform(module)
