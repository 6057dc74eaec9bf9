"""The value types of ``hf-icl``'s flags beyond argparse's own, shared by the live parsers (:mod:`hf_icl.cli.parser`)
and the torch-free front door (:mod:`hf_icl_cli.early_checks`), so both refuse the same values with the same words.
Each carries ``cli_kind``, the name :mod:`hf_icl.cli.argument_specs` writes down for it. Imports nothing heavy."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def json_object(text: str) -> dict:
    """A JSON object (``--task-params '{"noise_std": 0.5}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


json_object.cli_kind = "json_object"


def comma_names(text: str) -> list[str]:
    """Comma-separated names, stripped (``--estimators least_squares, knn``)."""
    return [item.strip() for item in text.split(",")]


comma_names.cli_kind = "str"

_ELEMENTS = {"int": (int, "integers"), "float": (float, "numbers"), "str": (str, "names")}


def comma_separated(kind: type) -> Callable[[str], list]:
    """A comma-separated list of ``kind`` values (int, float or str), empty items dropped (``''``: none)."""
    element, plural = _ELEMENTS[kind.__name__]

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            return [element(item) for item in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {plural}, got {text!r}") from None

    parse.cli_kind = f"csv_{kind.__name__}"
    return parse


def truthy(text: str) -> bool:
    """A boolean flag's value, as transformers' ``HfArgumentParser`` reads it (``--bf16 true``, ``--fp16 0``)."""
    lowered = text.lower()
    if lowered in ("yes", "true", "t", "y", "1"):
        return True
    if lowered in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {text} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


truthy.cli_kind = "bool"

#: a written-down kind → the type the front door parses it with (None: any string)
TYPES: dict[str, Callable | None] = {
    "str": None,
    "any": None,
    "int": int,
    "float": float,
    "bool": truthy,
    "json_object": json_object,
    **{f"csv_{kind.__name__}": comma_separated(kind) for kind in (int, float, str)},
}


def below_minimum(flag: str, value, minimum: int | None) -> str | None:
    """The refusal of an integer flag (or each element of a list flag) below its ``minimum``, worded as
    :func:`hf_icl.validation.check_int` words it; None when ``value`` is fine (or unset)."""
    if minimum is None:
        return None
    for element in value if isinstance(value, list) else [value]:
        if element is not None and element < minimum:
            return f"{flag} must be an integer in [{minimum}, +inf), got {element}"
    return None
