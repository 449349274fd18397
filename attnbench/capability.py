"""One description of an attention call, from a spec or from tensors, for one capability check.

Following xFormers' ``Inputs``/``not_supported_reasons`` design: whatever a variant can or cannot
run is decided by one function of a small frozen :class:`CallInfo`, so a planned case (an
:class:`~attnbench.spec.AttnSpec`) and a concrete call (tensors) can never be judged by two
different rule sets.

Letters: B batch, H query heads, Hkv key/value heads, Lq queries, Lk keys, D query/key head dim,
Dv value head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from attnbench import mask_mods, masks

__all__ = ["CallInfo"]

if TYPE_CHECKING:
    from attnbench.spec import AttnSpec


@dataclass(frozen=True)
class CallInfo:
    """What a variant needs to know to say whether it can run a call."""

    device: str  # device type: "cpu", "cuda", "meta", ...
    dtype: str  # "float32", "float64", "bfloat16", "float16", ...
    batch: int  # B
    heads: int  # H
    lq: int  # number of queries
    lk: int  # number of keys
    d: int  # query/key head dim
    dv: int  # value head dim
    mask_kinds: frozenset[str]  # mask kinds the call needs (masks.MASK_KINDS names)
    backward: bool  # a backward pass is wanted (spec mode "backward", or inputs requiring grad)
    last_dim_contiguous: bool = True  # q, k and v all have stride 1 along the head dim
    # Hkv, key/value heads (grouped-query attention); None means Hkv = H
    kv_heads: int | None = None

    @property
    def hkv(self) -> int:
        """Key/value heads (H when :attr:`kv_heads` is unset)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @classmethod
    def from_spec(cls, spec: AttnSpec) -> CallInfo:
        """The call a spec describes (its inputs are contiguous, as ``make_inputs`` builds them)."""
        return cls(
            device=spec.device_type,
            dtype=spec.dtype,
            batch=spec.batch,
            heads=spec.heads,
            lq=spec.lq,
            lk=spec.lk,
            d=spec.head_dim,
            dv=spec.dv,
            mask_kinds=frozenset({spec.mask}),
            backward=spec.mode == "backward",
            kv_heads=spec.hkv,
        )

    @classmethod
    def from_tensors(
        cls,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | mask_mods.MaskMod | None = None,
    ) -> CallInfo:
        """The call these (already shape-checked) tensors make.

        A predicate (:class:`~attnbench.mask_mods.MaskMod`) needs support for its own kind (a
        composition of predicates needs general support). A query-independent bool mask (size 1
        along Lq) needs ``valid_lengths`` support; any other bool mask may encode anything, so it
        needs general (``causal`` and ``sliding_window``) support.
        """
        if isinstance(mask, mask_mods.MaskMod):
            kind = masks.kind_of(mask)
            kinds = frozenset({kind} if kind is not None else {"causal", "sliding_window"})
        elif mask is None:
            kinds = frozenset({"none"})
        elif masks.is_key_padding(mask):
            kinds = frozenset({"valid_lengths"})
        else:
            kinds = frozenset({"causal", "sliding_window"})
        return cls(
            device=q.device.type,
            dtype=str(q.dtype).removeprefix("torch."),
            batch=q.shape[0],
            heads=q.shape[1],
            lq=q.shape[2],
            lk=k.shape[2],
            d=q.shape[-1],
            dv=v.shape[-1],
            mask_kinds=kinds,
            backward=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
            last_dim_contiguous=all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (q, k, v)),
            kv_heads=k.shape[1],
        )
