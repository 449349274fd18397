"""Explicit, guarded registration of attention variants.

A registered name maps to a class and the keyword defaults that make it that variant
(``sdpa_math`` is ``SDPA(backend="math")``). Registering a name twice is an error; the built-in
variants are registered in :mod:`attnbench.variants` in one explicit table.
"""

from __future__ import annotations

from typing import Any

from attnbench.variants.base import Variant

_REGISTRY: dict[str, tuple[type[Variant], dict[str, Any]]] = {}


def register(name: str, cls: type[Variant], **defaults: Any) -> None:
    """Register ``cls(**defaults)`` under ``name``.

    Raises:
        ValueError: if ``name`` is empty or already registered.
        TypeError: if ``cls`` is not a :class:`Variant` subclass.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"variant name must be a non-empty str, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Variant)):
        raise TypeError(f"cls must be a Variant subclass, got {cls!r}")
    if name in _REGISTRY:
        raise ValueError(f"variant {name!r} is already registered ({_REGISTRY[name][0].__name__})")
    _REGISTRY[name] = (cls, dict(defaults))


def unregister(name: str) -> None:
    """Remove a registered name (for tests and plugins); unknown names raise ``KeyError``."""
    del _REGISTRY[name]


def variant_names() -> list[str]:
    """Registered variant names in registration order."""
    return list(_REGISTRY)


def get_variant(name: str, **options: Any) -> Variant:
    """A fresh instance of a registered variant; ``options`` override its registered defaults.

    Example:
        >>> get_variant("chunked", q_chunk=128).q_chunk
        128

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown variant {name!r}; known variants: {', '.join(_REGISTRY)}")
    cls, defaults = _REGISTRY[name]
    variant = cls(**{**defaults, **options})
    variant.name = name
    return variant
