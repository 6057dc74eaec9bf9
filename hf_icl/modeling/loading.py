"""Loading that checks the folder first and keeps predictions bit-identical to the model that was saved."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .model_folder import verify_model_folder

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
    """Put first in a ``PreTrainedModel``'s bases: ``from_pretrained`` then verifies a local folder before
    loading it and realigns the weights after."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, verify: bool = True, **kwargs):
        """``PreTrainedModel.from_pretrained``, with the folder checked first.

        ``verify=True`` (the default) and a local directory: :func:`~hf_icl.modeling.model_folder.verify_model_folder`
        runs before anything is loaded (its manifest, the safetensors headers, the config's keys and shapes
        against the weights', finite weights), and a folder that fails is a one-line
        :class:`~hf_icl.modeling.model_folder.ModelFolderError`. The config checked against is the ``config``
        argument when one is given, else the folder's ``config.json``; ``ignore_mismatched_sizes=True`` lets
        mis-shaped keys pass (transformers reinitialises them). A Hub id (not a local directory) is not verified
        here: transformers downloads it and loads it as usual. ``verify=False`` skips the check (e.g. to inspect
        a folder with non-finite weights).
        """
        if not isinstance(verify, bool):
            raise ValueError(f"verify must be True or False, got {verify!r}")
        source = pretrained_model_name_or_path
        if verify and isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
            folder = Path(source) / kwargs["subfolder"] if kwargs.get("subfolder") else Path(source)
            config = kwargs.get("config")
            verify_model_folder(
                folder,
                config if config is not None and not isinstance(config, (str, os.PathLike)) else None,
                model_class=cls,
                check_shapes=not kwargs.get("ignore_mismatched_sizes", False),
            )
        model = super().from_pretrained(source, *model_args, **kwargs)
        realign_tensors(model)
        return model
