"""Loading that keeps predictions bit-identical to the model that was saved."""

from __future__ import annotations

import torch

ALIGNMENT = 64  # bytes; CPU GEMM kernels choose their SIMD path by operand alignment


def realign_tensors(model: torch.nn.Module) -> None:
    """Copy every parameter and buffer that sits at an unaligned address into fresh memory.

    ``from_pretrained`` memory-maps safetensors, so weights land at arbitrary file offsets; CPU
    matmuls on such operands take another kernel path and differ from the saved model in the
    last bit. Fresh allocations are aligned, which makes reloaded predictions bit-identical.
    """
    with torch.no_grad():
        for module in model.modules():
            for tensors in (module._parameters, module._buffers):
                for tensor in tensors.values():
                    if tensor is not None and tensor.data_ptr() % ALIGNMENT:
                        tensor.data = tensor.data.clone()


class BitExactLoadingMixin:
    """Put first in a ``PreTrainedModel``'s bases: ``from_pretrained`` then realigns the weights."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        realign_tensors(model)
        return model
