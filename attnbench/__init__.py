"""attnbench: every attention variant under one contract, proven against a float64 reference.

Each is measured for time and memory against sequence length.

Public API::

    from attnbench import variant_names, get_variant, reference_attention, AttnSpec, AttentionLayer
"""

from attnbench import masks
from attnbench.layer import AttentionLayer
from attnbench.reference import reference_attention
from attnbench.registry import get_variant, register, unregister, variant_names
from attnbench.spec import AttnSpec
from attnbench.variants.base import Flops, Variant

__version__ = "0.1.0"

__all__ = [
    "AttnSpec",
    "AttentionLayer",
    "Flops",
    "Variant",
    "get_variant",
    "masks",
    "reference_attention",
    "register",
    "unregister",
    "variant_names",
]
