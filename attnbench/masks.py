"""Boolean attention masks as composable factories (dense views of :mod:`attnbench.mask_mods`).

A mask is a boolean tensor broadcastable to ``(B, H, Lq, Lk)``, True meaning *the query may attend
to this key* (the SDPA convention), of the smallest broadcastable shape, so that the float64
reference and the fast paths materialise no more than needed. Each mask has one definition, its
predicate in :mod:`attnbench.mask_mods`, which the factories here evaluate densely. A query row with
no allowed key gives an all-zero output row in every exact variant: it contributes nothing.

Example:
    >>> m = combine(causal(4, 4), sliding_window(4, 4, window=1))
    >>> m.shape
    torch.Size([1, 1, 4, 4])
    >>> m[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnbench import mask_mods as mm

__all__ = [
    "MASK_KINDS",
    "causal",
    "sliding_window",
    "prefix_lm",
    "document",
    "valid_lengths",
    "combine",
    "is_key_padding",
    "default_valid_lens",
    "default_document_lengths",
    "default_prefix",
    "mod_for_kind",
    "for_kind",
    "kind_of",
]

MASK_KINDS: tuple[str, ...] = (
    "none",
    "causal",
    "valid_lengths",
    "sliding_window",
    "prefix_lm",
    "document",
)
"""Named mask kinds a benchmark spec can ask for (see :func:`mod_for_kind` and :func:`for_kind`)."""

_DOCUMENT_FRACTIONS: tuple[tuple[int, int], ...] = ((3, 8), (1, 8), (1, 4), (1, 16), (3, 16))
"""The ``document`` kind's packing: document lengths cycle through these fractions of the length."""


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
    return mm.dense(mm.causal(), 1, 1, lq, lk, device)


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
    return mm.dense(mm.sliding_window(window), 1, 1, lq, lk, device)


def prefix_lm(lq: int, lk: int, prefix: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bidirectional over the first ``prefix`` keys, causal (top-left) after.

    Returns:
        Bool tensor of shape ``(1, 1, lq, lk)``.
    """
    _check_lengths(lq, lk)
    return mm.dense(mm.prefix_lm(prefix), 1, 1, lq, lk, device)


def document(
    lq: int, lk: int, lengths: Sequence[int], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Block-diagonal mask of packed documents (positions past their lengths see nothing).

    Returns:
        Bool tensor of shape ``(1, 1, lq, lk)``.
    """
    _check_lengths(lq, lk)
    return mm.dense(mm.document(lengths, device), 1, 1, lq, lk, device)


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
    mod = mm.valid_lengths(valid_lens)  # type and rank checks
    if valid_lens.dim() == 2 and valid_lens.shape[1] != lq:
        raise ValueError(
            f"valid_lens of shape (B, Lq) must have Lq={lq} columns, got {tuple(valid_lens.shape)}"
        )
    return mm.dense(mod, valid_lens.shape[0], 1, lq, lk, valid_lens.device)


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
    """The ``valid_lengths`` kind's key counts, ``ceil(lk * (b + 1) / (batch + 1))`` for entry b."""
    return [max(1, -(-lk * (b + 1) // (batch + 1))) for b in range(batch)]


def default_document_lengths(length: int) -> list[int]:
    """The ``document`` kind's packing of ``length`` positions into documents of mixed lengths.

    Lengths cycle through :data:`_DOCUMENT_FRACTIONS` of ``length`` (at least 1 each); the last
    document is cut so the lengths sum to ``length`` exactly (every position is in a document).

    Example:
        >>> default_document_lengths(32)
        [12, 4, 8, 2, 6]
    """
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    out: list[int] = []
    used, i = 0, 0
    while used < length:
        num, den = _DOCUMENT_FRACTIONS[i % len(_DOCUMENT_FRACTIONS)]
        n = min(max(1, length * num // den), length - used)
        out.append(n)
        used += n
        i += 1
    return out


def default_prefix(lk: int) -> int:
    """The ``prefix_lm`` kind's default prefix: a quarter of the keys."""
    return lk // 4


def mod_for_kind(
    kind: str,
    batch: int,
    lq: int,
    lk: int,
    *,
    window: int = 128,
    prefix: int | None = None,
    device: torch.device | str = "cpu",
) -> mm.MaskMod | None:
    """The predicate a benchmark spec names (None for ``"none"``); the one definition of each kind.

    ``valid_lengths`` uses the deterministic 1-D key-padding pattern of :func:`default_valid_lens`;
    ``document`` packs ``max(lq, lk)`` positions as :func:`default_document_lengths`;
    ``prefix_lm`` uses ``prefix`` (default :func:`default_prefix`).
    """
    if kind == "none":
        return None
    if kind == "causal":
        return mm.causal()
    if kind == "sliding_window":
        return mm.sliding_window(window)
    if kind == "valid_lengths":
        return mm.valid_lengths(torch.tensor(default_valid_lens(batch, lk), device=device))
    if kind == "prefix_lm":
        return mm.prefix_lm(default_prefix(lk) if prefix is None else prefix)
    if kind == "document":
        return mm.document(default_document_lengths(max(lq, lk)), device)
    raise ValueError(f"mask kind must be one of {MASK_KINDS}, got {kind!r}")


def for_kind(
    kind: str,
    batch: int,
    lq: int,
    lk: int,
    *,
    window: int = 128,
    prefix: int | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor | None:
    """The dense boolean mask a benchmark spec names (see :func:`mod_for_kind`), or None."""
    mod = mod_for_kind(kind, batch, lq, lk, window=window, prefix=prefix, device=device)
    return None if mod is None else mm.dense(mod, batch, 1, lq, lk, device)


def kind_of(mod: mm.MaskMod | None) -> str | None:
    """The :data:`MASK_KINDS` name of a built-in predicate ("none" for None; None if composed).

    Also None for ``valid_lengths`` with per-query lengths (2-D): the ``valid_lengths`` kind is key
    padding, the same keys for every query, and a variant that supports only key padding (the
    linear variants zero masked keys' features once for all queries) cannot run a per-query mask.
    """
    if mod is None:
        return "none"
    kind = mm.builtin_kind(mod)  # by identity: a predicate named "causal" is not therefore causal
    if kind == "valid_lengths" and mod.uses_query:
        return None
    return kind if kind in MASK_KINDS else None
