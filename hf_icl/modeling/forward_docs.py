"""The docstring of the ICL prompt models' ``forward``, written once.

GPT-2, SGPT, the linear-attention GPT and the MLPs take the same ``forward(xs, ys, loss_positions, ..., check_inputs)``
(each model file repeats the signature, under a ``# Copied from GPT2ForInContextRegression.forward`` marker that
``tests/test_copies.py`` checks) and document it in the same words but for a few phrases of their own: what
``output_hidden_states`` returns and why, without the value check, an invalid entry can turn earlier positions NaN.
A model file builds its docstring from those phrases with :func:`icl_forward_docstring` and sets it with
:func:`add_forward_docstring`, as transformers' model files do with their ``*_INPUTS_DOCSTRING``, so ``help()`` and
:func:`inspect.getdoc` show the whole text.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TypeVar

#: the first line
SUMMARY = "Predict every position of the prompts ``xs (B, N, n_dims)``, ``ys (B, N)`` with ``N <= n_points``."
#: the ``loss_positions`` entry
LOSS_POSITIONS = "a ``(N,)`` bool mask or integer indices of the positions in the loss (default all)."
#: what :func:`~hf_icl.modeling.prompts.check_model_prompt` checks of the values
PROMPT_VALUES = (
    "finite ``xs``; ``ys`` finite, ±1 or class ids in ``[0, n_classes)`` by ``config.target_kind``; ``|x|`` and real "
    "``|y|`` at most :func:`.max_prompt_magnitude` of the model's dtype"
)
#: the width of the generated docstring's lines
WIDTH = 116

Function = TypeVar("Function", bound=Callable)


def hidden_states_entry(unit: str) -> str:
    """The ``output_hidden_states`` entry of a model whose hidden states come after each ``unit`` (layer, block)."""
    return f"also return the hidden state of every token after each {unit}."


def check_inputs_entry(nan_cause: str, values: str = PROMPT_VALUES) -> str:
    """The ``check_inputs`` entry: the values it checks, and ``nan_cause``, why an invalid entry left unchecked can
    make earlier positions NaN in this model."""
    return (
        f"check the prompt's *values* ({values}) and raise a ``ValueError`` naming the first bad entry. This costs one "
        "device sync; pass ``False`` for prompts you built yourself (the trainer does, for the tasks it samples). "
        "Shapes, dtypes and devices are checked either way. With ``False`` a NaN, inf or out-of-bound entry can make "
        f"*earlier* positions NaN too ({nan_cause}), so the predictions are causal only for valid inputs."
    )


def icl_forward_docstring(*, nan_cause: str, values: str = PROMPT_VALUES, **entries: str) -> str:
    """:data:`SUMMARY`, then ``Args:``: ``loss_positions``, the model's own ``entries`` (``name=text``, in signature
    order) and ``check_inputs`` (:func:`check_inputs_entry` of ``nan_cause`` and ``values``), each wrapped."""
    args = {"loss_positions": LOSS_POSITIONS, **entries, "check_inputs": check_inputs_entry(nan_cause, values)}
    wrapped = [
        textwrap.fill(
            f"{name}: {text}",
            WIDTH,
            initial_indent="    ",
            subsequent_indent="        ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for name, text in args.items()
    ]
    return "\n".join([SUMMARY, "", "Args:", *wrapped])


def add_forward_docstring(docstring: str) -> Callable[[Function], Function]:
    """Decorator: set the decorated function's docstring to ``docstring``."""

    def decorate(function: Function) -> Function:
        function.__doc__ = docstring
        return function

    return decorate
