"""Input checks shared by the package's causal language models (the GD language model, the linear-attention GPT).

Each check raises a ``ValueError`` naming the argument, the value received and what is allowed, before any
embedding lookup or loss could fail inside torch with an index error. Value checks cost one device sync each.
"""

from __future__ import annotations

import torch

#: the label value transformers' loss ignores
IGNORE_INDEX = -100


def describe(x) -> str:
    """``a torch.float32 tensor of shape (2, 5)`` for a tensor, else the type's name (for error messages)."""
    return f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_input_ids(input_ids, vocab_size: int) -> tuple[int, int]:
    """``(batch, tokens)`` of ``input_ids``: a 2-D integer tensor of ids in ``[0, vocab_size)`` with at least one
    token per row; raise ``ValueError`` otherwise.

    >>> check_input_ids(torch.tensor([[0, 4, 2]]), vocab_size=5)
    (1, 3)
    >>> check_input_ids(torch.tensor([[0, 5]]), vocab_size=5)
    Traceback (most recent call last):
    ...
    ValueError: input_ids must be token ids in [0, vocab_size=5), got 5
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or _not_integer(input_ids):
        raise ValueError(f"input_ids must be a (batch, tokens) tensor of token ids, got {describe(input_ids)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids must hold at least one token per row, got shape " + str(tuple(input_ids.shape)))
    if input_ids.numel():
        low, high = torch.stack((input_ids.min(), input_ids.max())).tolist()  # the one device sync
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"input_ids must be token ids in [0, vocab_size={vocab_size}), got {bad}")
    return tuple(input_ids.shape)


def check_labels(labels, vocab_size: int, shape: tuple[int, ...]) -> None:
    """``labels`` must be an integer tensor of ``shape`` whose values are token ids in ``[0, vocab_size)`` or
    ``-100`` (ignored by the loss); raise ``ValueError`` otherwise.

    >>> check_labels(torch.tensor([[-100, 3]]), vocab_size=5, shape=(1, 2))
    >>> check_labels(torch.tensor([[-1, 3]]), vocab_size=5, shape=(1, 2))
    Traceback (most recent call last):
    ...
    ValueError: labels must be token ids in [0, vocab_size=5) or -100 (ignored), got -1
    """
    if not isinstance(labels, torch.Tensor) or _not_integer(labels):
        raise ValueError(f"labels must be a tensor of token ids (an integer dtype), got {describe(labels)}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"labels must have the shape of the tokens {tuple(shape)}, got {tuple(labels.shape)}")
    if labels.numel():
        kept = labels.masked_fill(labels == IGNORE_INDEX, 0)
        low, high = torch.stack((kept.min(), kept.max())).tolist()  # the one device sync
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"labels must be token ids in [0, vocab_size={vocab_size}) or {IGNORE_INDEX} (ignored), got {bad}"
            )


def real_token_mask(attention_mask, batch: int, length: int, past: int, device) -> torch.Tensor | None:
    """The ``(B, length)`` bool mask of the new tokens (True = real) from a 2-D ``attention_mask`` of shape
    ``(B, length)`` or ``(B, past + length)`` (cached + new tokens, as ``generate`` passes it); None if none given.
    Raise ``ValueError`` for a mask that is not a 2-D tensor or of any other shape."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be a 2-D (batch, tokens) tensor of 0/1, got {describe(attention_mask)}")
    allowed = (length,) if not past else (length, past + length)
    if attention_mask.shape[0] != batch or attention_mask.shape[1] not in allowed:
        shapes = " or ".join(f"({batch}, {n})" for n in allowed)
        cached = f" ({past} cached + {length} new tokens)" if past else " (one entry per token of input_ids)"
        raise ValueError(f"attention_mask must have shape {shapes}{cached}, got {tuple(attention_mask.shape)}")
    return attention_mask[:, -length:].to(device=device, dtype=torch.bool)


def check_position_ids(position_ids, batch: int, length: int, n_positions: int) -> None:
    """``position_ids`` must be an integer tensor of shape ``(B, length)``, ``(1, length)`` or ``(length,)`` with
    values in ``[0, n_positions)`` (the model's learned positions); raise ``ValueError`` otherwise."""
    if not isinstance(position_ids, torch.Tensor) or _not_integer(position_ids):
        raise ValueError(f"position_ids must be a tensor of integer positions, got {describe(position_ids)}")
    if tuple(position_ids.shape) not in ((batch, length), (1, length), (length,)):
        raise ValueError(
            f"position_ids must have shape ({batch}, {length}) or ({length},) (one position per token of the input), "
            f"got {tuple(position_ids.shape)}"
        )
    if position_ids.numel():
        low, high = torch.stack((position_ids.min(), position_ids.max())).tolist()  # the one device sync
        if low < 0:
            raise ValueError(f"position_ids must be positions in [0, n_positions={n_positions}), got {low}")
        if high >= n_positions:
            raise ValueError(
                f"sequences reach {high + 1} tokens (position_ids up to {high}) but the model has "
                f"n_positions={n_positions} learned positions"
            )


def check_generate_inputs(inputs, kwargs: dict, vocab_size: int, n_positions: int) -> None:
    """What ``generate(inputs, **kwargs)`` would otherwise fail on inside transformers (a 1-D or mis-shaped
    ``attention_mask``), silently drop (an all-ones mask of the wrong length) or reach only after generating: the
    prompt's ids, the mask's shape, and ``max_new_tokens`` against ``n_positions``. The model reads a prompt of
    ``R`` real tokens plus the ``max_new_tokens - 1`` tokens it feeds back, so ``R + max_new_tokens - 1`` must not
    exceed ``n_positions`` (the forward checks the same for any other way of setting the length)."""
    ids = kwargs.get("input_ids") if inputs is None else inputs
    if ids is None:
        return
    batch, length = check_input_ids(ids, vocab_size)
    mask = kwargs.get("attention_mask")
    real = length
    if mask is not None:
        real = int(real_token_mask(mask, batch, length, 0, ids.device).sum(dim=1).max())
    new = kwargs.get("max_new_tokens")
    if isinstance(new, int) and not isinstance(new, bool) and new > 0 and real + new - 1 > n_positions:
        raise ValueError(
            f"max_new_tokens={new} with a prompt of {real} tokens would feed the model {real + new - 1} tokens, more "
            f"than its n_positions={n_positions}; allowed: max_new_tokens <= {n_positions + 1 - real}"
        )


def _not_integer(x: torch.Tensor) -> bool:
    return x.is_floating_point() or x.is_complex() or x.dtype == torch.bool
