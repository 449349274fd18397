"""Boolean attention masks as small composable factories.

Convention (the same as ``F.scaled_dot_product_attention``): a mask is a boolean tensor
broadcastable to ``(B, H, Lq, Lk)`` where ``True`` means *the query may attend to this key*.
Every factory returns the smallest broadcastable shape, so one definition feeds both the
float64 reference and the fast paths without materialising more than needed.

A query row with no allowed key produces an all-zero output row in every exact variant
(never NaN): "attend to nothing" means "contribute nothing".

Example:
    >>> m = combine(causal(4, 4), sliding_window(4, 4, window=1))
    >>> m.shape
    torch.Size([1, 1, 4, 4])
    >>> m[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
"""

from __future__ import annotations

import torch

MASK_KINDS: tuple[str, ...] = ("none", "causal", "valid_lengths", "sliding_window")
"""Named mask kinds a benchmark spec can ask for (see :func:`for_kind`)."""


def _check_lengths(lq: int, lk: int) -> None:
    for name, value in (("lq", lq), ("lk", lk)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def causal(lq: int, lk: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Lower-triangular mask aligned to the top-left corner: query i sees keys j <= i.

    Returns:
        Bool tensor of shape ``(1, 1, lq, lk)``.
    """
    _check_lengths(lq, lk)
    i = torch.arange(lq, device=device)[:, None]  # (Lq, 1)
    j = torch.arange(lk, device=device)[None, :]  # (1, Lk)
    return (j <= i)[None, None]


def sliding_window(
    lq: int, lk: int, window: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Symmetric band: query i sees keys j with ``|i - j| <= window``.

    Combine with :func:`causal` for a look-back-only window (Mistral/Longformer style).

    Returns:
        Bool tensor of shape ``(1, 1, lq, lk)``.
    """
    _check_lengths(lq, lk)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    i = torch.arange(lq, device=device)[:, None]  # (Lq, 1)
    j = torch.arange(lk, device=device)[None, :]  # (1, Lk)
    return ((i - j).abs() <= window)[None, None]


def valid_lengths(valid_lens: torch.Tensor, lq: int, lk: int) -> torch.Tensor:
    """Key-padding mask with the semantics of the d2l ``masked_softmax(X, valid_lens)``.

    Args:
        valid_lens: integer tensor. 1-D ``(B,)``: every query of batch element b sees keys
            ``j < valid_lens[b]``. 2-D ``(B, Lq)``: query i of batch b sees
            ``j < valid_lens[b, i]``.
        lq: number of queries.
        lk: number of keys.

    Returns:
        Bool tensor of shape ``(B, 1, 1, lk)`` for 1-D input, ``(B, 1, lq, lk)`` for 2-D.
    """
    _check_lengths(lq, lk)
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be a torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must be an integer tensor, got {valid_lens.dtype}")
    j = torch.arange(lk, device=valid_lens.device)
    if valid_lens.dim() == 1:
        return (j[None, :] < valid_lens[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    if valid_lens.dim() == 2:
        if valid_lens.shape[1] != lq:
            raise ValueError(
                f"valid_lens of shape (B, Lq) must have Lq={lq} columns, got {tuple(valid_lens.shape)}"
            )
        return (j[None, None, :] < valid_lens[:, :, None])[:, None]  # (B, 1, Lq, Lk)
    raise ValueError(f"valid_lens must be 1-D (B,) or 2-D (B, Lq), got {valid_lens.dim()}-D")


def combine(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of masks (``None`` entries mean "no restriction").

    Returns:
        The broadcast AND of the given masks, or ``None`` when all are ``None``.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    for m in present:
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            raise TypeError("combine expects boolean mask tensors")
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def is_key_padding(mask: torch.Tensor | None) -> bool:
    """True when the mask does not depend on the query (size 1 along the Lq axis, or rank < 2)."""
    return mask is None or mask.dim() < 2 or mask.shape[-2] == 1


def default_valid_lens(batch: int, lk: int) -> list[int]:
    """The ``valid_lengths`` kind's key counts: batch b keeps ``ceil(lk * (b + 1) / (batch + 1))``."""
    return [max(1, -(-lk * (b + 1) // (batch + 1))) for b in range(batch)]


def for_kind(
    kind: str,
    batch: int,
    lq: int,
    lk: int,
    *,
    window: int = 128,
    device: torch.device | str = "cpu",
) -> torch.Tensor | None:
    """Build the mask a benchmark spec names.

    ``valid_lengths`` uses the deterministic 1-D key-padding pattern of :func:`default_valid_lens`,
    so every batch element has a different valid length and at least one key.
    """
    if kind == "none":
        return None
    if kind == "causal":
        return causal(lq, lk, device)
    if kind == "sliding_window":
        return sliding_window(lq, lk, window, device)
    if kind == "valid_lengths":
        return valid_lengths(torch.tensor(default_valid_lens(batch, lk), device=device), lq, lk)
    raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {kind!r}")
