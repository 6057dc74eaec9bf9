"""Deprecated names, in one place: a name that moved keeps working at its old path for one release, with a
``DeprecationWarning`` that names the new path; a retired name raises an ``AttributeError`` that says what replaces
it; a renamed argument value keeps working with a warning.

This module imports nothing from ``hf_icl`` (nor anything heavy), so every layer may use it. A module's aliases are
one line::

    __getattr__ = moved(__name__, {"old_name": "hf_icl.new.home"})

The new home is imported only when an old name is asked for (:func:`importlib.import_module`), so an alias never
creates an import edge, a cycle, or an upward import between layers.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["moved", "renamed_value", "retired"]

Getattr = Callable[[str], Any]


def _missing(module_name: str) -> Getattr:
    def __getattr__(name: str) -> Any:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__


def moved(
    module_name: str,
    names: Mapping[str, str],
    *,
    renamed: Mapping[str, str] | None = None,
    fallback: Getattr | None = None,
) -> Getattr:
    """A module ``__getattr__`` serving the names that moved out of ``module_name``.

    ``names`` maps each old name to its new module (``{"row_kernel_scores": "hf_icl.similarity.row_kernels"}``);
    ``renamed`` maps an old name to its new name where it changed too. Asking for an old name imports the new module,
    warns ``DeprecationWarning`` ("hf_icl.x.NAME moved to hf_icl.y.NAME; the old path goes in the next release") and
    returns the object itself (the same object, not a copy). Any other name goes to ``fallback`` (another module
    ``__getattr__``, e.g. :func:`retired`'s), or is a plain ``AttributeError``.
    """
    names, renamed = dict(names), dict(renamed or {})
    otherwise = fallback or _missing(module_name)

    def __getattr__(name: str) -> Any:
        if name not in names:
            return otherwise(name)
        new_name = renamed.get(name, name)
        warnings.warn(
            f"{module_name}.{name} moved to {names[name]}.{new_name}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(names[name]), new_name)

    return __getattr__


def retired(
    module_name: str, names: Mapping[str, str], *, reason: str = "", fallback: Getattr | None = None
) -> Getattr:
    """A module ``__getattr__`` for names that were removed: asking for one raises ``AttributeError``
    "MODULE.NAME was retired[ REASON]; use REPLACEMENT", with ``names`` mapping each name to its replacement.
    Any other name goes to ``fallback``, or is a plain ``AttributeError``."""
    names = dict(names)
    otherwise = fallback or _missing(module_name)
    why = f" {reason}" if reason else ""

    def __getattr__(name: str) -> Any:
        if name not in names:
            return otherwise(name)
        raise AttributeError(f"{module_name}.{name} was retired{why}; use {names[name]}")

    return __getattr__


def renamed_value(argument: str, value: Any, renames: Mapping[Any, Any], *, stacklevel: int = 3) -> Any:
    """``value``, or its new spelling with a ``DeprecationWarning`` when ``renames`` lists it as an old one
    (``renamed_value("backend", "reference", {"reference": "torch"})`` warns and returns ``"torch"``). Values that
    are not hashable pass through unchanged, to be rejected by the caller's own check."""
    try:
        if value not in renames:
            return value
    except TypeError:  # an unhashable value: not an old spelling
        return value
    new = renames[value]
    warnings.warn(
        f"{argument}={value!r} is deprecated, use {argument}={new!r}; the old value goes in the next release",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return new
