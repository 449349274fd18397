"""Explicit, guarded registration of attention variants.

A registered name maps to a class and the keyword defaults that make it that variant
(``sdpa_math`` is ``SDPA(backend="math")``). Registering a name twice is an error. The built-in
variants are registered at the bottom of this module from one explicit table (order = display
order) naming each class by module path: their modules are imported on first use, so this module
imports no variant, and no variant imports it (an option naming another variant, such as
``compiled_batched``'s ``base``, is built here: ``Variant.VARIANT_OPTIONS``).

:func:`variant_class` and :func:`variant_defaults` answer questions about a variant without
building one; building one (:func:`get_variant`) has no global side effects either.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from attnbench.variants.base import Variant

__all__ = [
    "register",
    "NAME",
    "unregister",
    "variant_names",
    "default_variants",
    "variant_class",
    "variant_defaults",
    "get_variant",
    "BUILTINS",
]

_REGISTRY: dict[str, tuple[type[Variant] | str, dict[str, Any]]] = {}


def register(name: str, cls: type[Variant], **defaults: Any) -> None:
    """Register ``cls(**defaults)`` under ``name``.

    Raises:
        ValueError: if ``name`` is empty or already registered.
        TypeError: if ``cls`` is not a :class:`Variant` subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, Variant)):
        raise TypeError(f"cls must be a Variant subclass, got {cls!r}")
    _add(name, cls, defaults)


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
"""What a variant may be called: a name ``--variants a,b`` and ``ATTNBENCH_ASV_VARIANTS`` can select
(no comma, no space)."""


def _add(name: str, cls: type[Variant] | str, defaults: dict[str, Any]) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            "variant name must be letters, digits, '_', '.' or '-' (starting with a letter "
            f"or '_'), so that --variants can select it; got {name!r}"
        )
    if name in _REGISTRY:
        raise ValueError(
            f"variant {name!r} is already registered ({_class_name(_REGISTRY[name][0])})"
        )
    _REGISTRY[name] = (cls, dict(defaults))


def _class_name(cls: type[Variant] | str) -> str:
    return cls.rsplit(":", 1)[-1] if isinstance(cls, str) else cls.__name__


def unregister(name: str) -> None:
    """Remove a registered name (for tests and plugins); unknown names raise ``KeyError``."""
    del _REGISTRY[name]


def variant_names() -> list[str]:
    """Registered variant names in registration order."""
    return list(_REGISTRY)


def default_variants() -> list[str]:
    """The variants a sweep runs when none are named: every registered one but those opting out.

    Opting out is ``IN_DEFAULT_SWEEP = False``: compiled variants, which recompile per shape.
    """
    return [n for n in variant_names() if get_variant(n).IN_DEFAULT_SWEEP]


def _entry(name: str) -> tuple[type[Variant] | str, dict[str, Any]]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown variant {name!r}; known variants: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def variant_class(name: str) -> type[Variant]:
    """The class registered under ``name`` (imported if needed; nothing is built).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    cls, defaults = _entry(name)
    if isinstance(cls, str):
        module, attr = cls.split(":")
        cls = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = (cls, defaults)
    return cls


def variant_defaults(name: str) -> dict[str, Any]:
    """A copy of the keyword defaults registered with ``name``."""
    return dict(_entry(name)[1])


def get_variant(name: str, **options: Any) -> Variant:
    """A fresh instance of a registered variant; ``options`` override its registered defaults.

    Example:
        >>> get_variant("chunked", q_chunk=128).q_chunk
        128

    Raises:
        ValueError: for an unknown name, listing the known ones; TypeError/ValueError from the
            class for a bad option (checked here, when built, not when first called).
    """
    cls = variant_class(name)
    options = {**variant_defaults(name), **options}
    for option, built_with in cls.VARIANT_OPTIONS.items():
        # a registered name: built here, with the options the class asks for
        if isinstance(options.get(option), str):
            options[option] = get_variant(options[option], **built_with.get(options[option], {}))
    variant = cls(**options)
    variant.name = name
    return variant


_V = "attnbench.variants."
BUILTINS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("loop", _V + "loop:LoopAttention", {}),
    ("vectorized", _V + "vectorized:VectorizedAttention", {}),
    ("batched", _V + "batched:BatchedAttention", {}),
    ("multihead", _V + "multihead:MultiheadAttentionCore", {}),
    ("torch_mha", _V + "torch_mha:TorchMHA", {}),
    ("sdpa", _V + "sdpa:SDPA", {"backend": "auto"}),
    ("sdpa_dense_mask", _V + "sdpa:SDPA", {"backend": "auto", "dense_mask": True}),
    ("sdpa_math", _V + "sdpa:SDPA", {"backend": "math"}),
    ("sdpa_flash", _V + "sdpa:SDPA", {"backend": "flash"}),
    ("sdpa_efficient", _V + "sdpa:SDPA", {"backend": "efficient"}),
    ("sdpa_cudnn", _V + "sdpa:SDPA", {"backend": "cudnn"}),
    ("chunked", _V + "chunked:ChunkedAttention", {}),
    ("local", _V + "local:LocalAttention", {}),
    ("block_sparse", _V + "block_sparse:BlockSparseAttention", {}),
    ("linear_elu", _V + "linear:LinearElu", {}),
    ("performer", _V + "linear:Performer", {}),
    ("dot", _V + "scoring:ScoringAttention", {"score": "dot"}),
    ("scaled_dot", _V + "scoring:ScoringAttention", {"score": "scaled_dot"}),
    ("bilinear", _V + "scoring:ScoringAttention", {"score": "bilinear"}),
    ("additive", _V + "scoring:ScoringAttention", {"score": "additive"}),
    ("compiled_batched", _V + "compiled:CompiledVariant", {"base": "batched"}),
    ("compiled_chunked", _V + "compiled:CompiledVariant", {"base": "chunked"}),
    ("flex", _V + "compiled:FlexAttention", {"compiled": True}),
)

for _name, _path, _defaults in BUILTINS:
    _add(_name, _path, _defaults)
