"""Explicit, guarded registration of attention variants.

A registered name maps to a class and the keyword defaults that make it that variant
(``sdpa_math`` is ``SDPA(backend="math")``). Registering a name twice is an error; the built-in
variants are registered at the bottom of this module from one explicit table (order = display
order).
"""

from __future__ import annotations

from typing import Any

from attnbench.variants.base import Variant
from attnbench.variants.batched import BatchedAttention
from attnbench.variants.block_sparse import BlockSparseAttention
from attnbench.variants.chunked import ChunkedAttention
from attnbench.variants.compiled import CompiledVariant, FlexAttention
from attnbench.variants.linear import LinearElu, Performer
from attnbench.variants.local import LocalAttention
from attnbench.variants.loop import LoopAttention
from attnbench.variants.multihead import MultiheadAttentionCore
from attnbench.variants.scoring import ScoringAttention
from attnbench.variants.sdpa import SDPA
from attnbench.variants.torch_mha import TorchMHA
from attnbench.variants.vectorized import VectorizedAttention

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


BUILTINS: tuple[tuple[str, type[Variant], dict[str, Any]], ...] = (
    ("loop", LoopAttention, {}),
    ("vectorized", VectorizedAttention, {}),
    ("batched", BatchedAttention, {}),
    ("multihead", MultiheadAttentionCore, {}),
    ("torch_mha", TorchMHA, {}),
    ("sdpa", SDPA, {"backend": "auto"}),
    ("sdpa_math", SDPA, {"backend": "math"}),
    ("sdpa_flash", SDPA, {"backend": "flash"}),
    ("sdpa_efficient", SDPA, {"backend": "efficient"}),
    ("sdpa_cudnn", SDPA, {"backend": "cudnn"}),
    ("chunked", ChunkedAttention, {}),
    ("local", LocalAttention, {}),
    ("block_sparse", BlockSparseAttention, {}),
    ("linear_elu", LinearElu, {}),
    ("performer", Performer, {}),
    ("dot", ScoringAttention, {"score": "dot"}),
    ("scaled_dot", ScoringAttention, {"score": "scaled_dot"}),
    ("bilinear", ScoringAttention, {"score": "bilinear"}),
    ("additive", ScoringAttention, {"score": "additive"}),
    ("compiled_batched", CompiledVariant, {"base": "batched"}),
    ("compiled_chunked", CompiledVariant, {"base": "chunked"}),
    ("flex", FlexAttention, {"compiled": True}),
)

for _name, _cls, _defaults in BUILTINS:
    register(_name, _cls, **_defaults)
