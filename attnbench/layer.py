"""``AttentionLayer``: input/output projections around any registered attention core.

Its parameters carry the names and shapes of ``torch.nn.MultiheadAttention``'s, so a
``state_dict`` loads from one into the other in either direction:

* ``kdim == vdim == embed_dim``: ``in_proj_weight (3E, E)``;
* otherwise: ``q_proj_weight (E, E)``, ``k_proj_weight (E, kdim)``, ``v_proj_weight (E, vdim)``;
* with ``bias``: ``in_proj_bias (3E,)`` and ``out_proj.bias``; always ``out_proj.weight (E, E)``.

Grouped-query attention (``kv_heads`` Hkv < H) projects keys and values to Hkv*Dh features
(``k_proj_weight (Hkv*Dh, kdim)``, ``in_proj_bias (E + 2*Hkv*Dh,)``, ...): shapes
``nn.MultiheadAttention`` lacks, so such a state_dict does not load across (a size mismatch).
Letters: B batch, H query heads, Hkv key/value heads, L length, E embed_dim, Dh = E / H.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnbench._checks import (
    check_bool,
    check_device_available,
    check_float_dtype,
    check_positive_int,
)
from attnbench.registry import get_variant
from attnbench.variants._ops import merge_heads, split_heads
from attnbench.variants.base import Variant

__all__ = ["AttentionLayer"]


class AttentionLayer(nn.Module):
    """Multi-head attention layer with a pluggable core.

    Args:
        embed_dim: model width E; must be divisible by ``num_heads``.
        num_heads: number of heads H.
        variant: a registered variant name or a :class:`Variant` instance.
        bias: learnable biases on the projections (as in ``nn.MultiheadAttention``).
        batch_first: inputs are ``(B, L, E)`` when True, ``(L, B, E)`` otherwise.
        kdim: key feature size (default E).
        vdim: value feature size (default E).
        kv_heads: key/value heads Hkv (grouped-query attention; must divide ``num_heads``; default
            H). The core must declare grouped-query support, else its first call raises the reason.
        device: where the parameters live (default: torch's default device).
        dtype: the parameters' floating-point dtype (default: torch's default dtype); inputs must
            match it.

    Raises:
        TypeError, ValueError: for a bad size, flag, variant, device (CUDA on a machine without it)
            or dtype, before any parameter is allocated.

    Example:
        >>> layer = AttentionLayer(64, 4, variant="chunked")
        >>> layer(torch.randn(2, 10, 64)).shape
        torch.Size([2, 10, 64])
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        variant: str | Variant = "sdpa",
        bias: bool = True,
        batch_first: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        kv_heads: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("embed_dim", embed_dim)
        check_bool("bias", bias)
        check_bool("batch_first", batch_first)
        device = _checked_device(device)
        if dtype is not None:
            check_float_dtype("dtype", dtype)
        check_positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        self.kv_heads = num_heads if kv_heads is None else check_positive_int("kv_heads", kv_heads)
        if num_heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide num_heads ({num_heads})")
        self.kdim = embed_dim if kdim is None else check_positive_int("kdim", kdim)
        self.vdim = embed_dim if vdim is None else check_positive_int("vdim", vdim)
        if isinstance(variant, str):
            variant = get_variant(variant)
        elif not isinstance(variant, Variant):
            raise TypeError(
                f"variant must be a registered name or a Variant, got {type(variant).__name__}"
            )
        self.core = variant
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self._qkv_same_embed_dim = (
            self.kdim == embed_dim and self.vdim == embed_dim and self.kv_heads == num_heads
        )
        self._make_parameters(bias, {"device": device, "dtype": dtype})
        self.reset_parameters()

    def _make_parameters(self, bias: bool, factory: dict) -> None:
        """Allocate the projections under ``nn.MultiheadAttention``'s names (module docstring)."""
        e = self.embed_dim
        e_kv = self.kv_heads * (e // self.num_heads)  # Hkv * Dh: key/value projection width
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * e, e, **factory))
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(e, e, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(e_kv, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(e_kv, self.vdim, **factory))
        self.in_proj_bias = nn.Parameter(torch.empty(e + 2 * e_kv, **factory)) if bias else None
        self.out_proj = nn.Linear(e, e, bias=bias, **factory)

    def reset_parameters(self) -> None:
        """The initialisation ``nn.MultiheadAttention`` uses (xavier-uniform, zero biases)."""
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
            if hasattr(self, name):
                nn.init.xavier_uniform_(getattr(self, name))
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._qkv_same_embed_dim:
            return self.in_proj_weight.chunk(3)
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend ``query`` over ``key``/``value`` (self-attention when they are omitted).

        Args:
            query: ``(B, Lq, E)`` (or ``(Lq, B, E)`` when not batch_first).
            key: ``(B, Lk, kdim)``; defaults to ``query``.
            value: ``(B, Lk, vdim)``; defaults to ``key``.
            mask: bool, broadcastable to ``(B, H, Lq, Lk)``; True = may attend. Note this is the
                opposite of ``nn.MultiheadAttention``'s boolean ``attn_mask``.

        Returns:
            ``(B, Lq, E)`` (or ``(Lq, B, E)``).
        """
        key = query if key is None else key
        value = key if value is None else value
        for name, t, width in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            self._check_input(name, t, width)
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        w_q, w_k, w_v = self._weights()
        sizes = [w_q.shape[0], w_k.shape[0], w_v.shape[0]]  # E, Hkv*Dh, Hkv*Dh
        b_q, b_k, b_v = (
            (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.split(sizes)
        )
        h, hkv = self.num_heads, self.kv_heads
        q = split_heads(F.linear(query, w_q, b_q), h)  # (B, H, Lq, Dh)
        k = split_heads(F.linear(key, w_k, b_k), hkv)  # (B, Hkv, Lk, Dh)
        v = split_heads(F.linear(value, w_v, b_v), hkv)  # (B, Hkv, Lk, Dh)
        out = self.out_proj(merge_heads(self.core(q, k, v, mask)))  # (B, Lq, E)
        return out if self.batch_first else out.transpose(0, 1)

    def _check_input(self, name: str, t: object, width: int) -> None:
        """Raise a TypeError or ValueError naming what is wrong with input ``name``."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3 or t.shape[-1] != width:
            raise ValueError(
                f"{name} must have shape (batch, length, {width}), got {tuple(t.shape)}"
            )
        weight = self.out_proj.weight  # every parameter shares its dtype and device
        if t.dtype != weight.dtype:  # F.linear would say "mat1 and mat2 must have the same dtype"
            hint = (
                f"convert it, or build the layer with dtype={t.dtype}"
                if t.is_floating_point()
                else "convert it"
            )
            raise TypeError(
                f"{name} must have the layer's dtype {weight.dtype}, got {t.dtype} ({hint})"
            )
        if t.device != weight.device:
            raise ValueError(
                f"{name} must be on the layer's device {weight.device}, got {t.device}"
            )


def _checked_device(device: object) -> torch.device | None:
    """``device`` as a torch.device (None stays None).

    Raises a TypeError or ValueError when it names none or names CUDA on a machine without it.
    """
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be a str, a torch.device or None, got {type(device).__name__} {device!r}"
        )
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(
            f"device must name a torch device such as 'cpu' or 'cuda', got {device!r}"
        ) from exc
    check_device_available("device", device)
    return device
