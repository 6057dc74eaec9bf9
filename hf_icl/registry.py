"""Name -> class registries filled by a class decorator (task families, input distributions)."""

from __future__ import annotations

from collections.abc import Callable


def named_registration(registry: dict[str, type]) -> Callable[[str], Callable[[type], type]]:
    """A decorator factory: ``@register("name")`` sets ``cls.name = "name"`` and adds ``cls`` to ``registry``.

    >>> REGISTRY = {}
    >>> register = named_registration(REGISTRY)
    >>> @register("gaussian")
    ... class Gaussian: ...
    >>> Gaussian.name, REGISTRY["gaussian"] is Gaussian
    ('gaussian', True)
    """

    def register(name: str) -> Callable[[type], type]:
        def add(cls: type) -> type:
            cls.name = name
            registry[name] = cls
            return cls

        return add

    return register
