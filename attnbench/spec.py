"""One benchmark case's shape, as a frozen value, plus the seeded inputs it describes.

Letters: B batch, H query heads, Hkv key/value heads (grouped-query attention: H is a multiple of
Hkv, query head h reads key/value head ``h // (H // Hkv)``), G = H // Hkv query heads per group,
Lq queries, Lk keys, D query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import torch

from attnbench import mask_mods, masks
from attnbench._checks import check_bool, check_device_available, check_positive_int, check_seed

__all__ = ["DTYPES", "MODES", "MaskForm", "AttnSpec"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_DEVICES: tuple[str, ...] = ("cpu", "cuda")
MODES: tuple[str, ...] = ("forward", "backward")
"""``backward`` means one forward and one backward pass (a training step's attention work)."""


class MaskForm(enum.StrEnum):
    """How a case's mask reaches a variant (:meth:`AttnSpec.make_inputs`)."""

    DENSE = "dense"  # a bool tensor (:meth:`AttnSpec.make_mask`)
    MOD = "mod"  # the predicate itself (:meth:`AttnSpec.mask_mod`): nothing L^2 is built


def _valid_device(device: object) -> bool:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` with N a non-negative decimal int (no "cpu:7")."""
    if not isinstance(device, str):
        return False
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return device == "cpu"
    return kind == "cuda" and (device == "cuda" or (index.isdigit() and index.isascii()))


@dataclass(frozen=True)
class AttnSpec:
    """Shape, precision, placement and mask of one attention case.

    Example:
        >>> AttnSpec(seq_len=2048).label
        'B1 H8 L2048 D64 float32 cpu forward'
    """

    batch: int = 1  # B
    heads: int = 8  # H
    seq_len: int = 1024  # Lq, number of queries
    seq_len_k: int | None = None  # Lk, number of keys; None means self-attention (Lk = Lq)
    head_dim: int = 64  # D, query/key dimension per head
    head_dim_v: int | None = None  # Dv, value dimension per head; None means Dv = D
    dtype: str = "float32"  # one of DTYPES
    device: str = "cpu"  # "cpu" or "cuda" (an index such as "cuda:1" is allowed)
    mask: str = "none"  # one of masks.MASK_KINDS
    mode: str = "forward"  # "forward", or "backward" for forward + backward
    window: int = 128  # half-width of the "sliding_window" mask kind
    prefix: int | None = None  # bidirectional prefix of the "prefix_lm" kind; None means Lk // 4
    kv_heads: int | None = None  # Hkv, key/value heads (GQA; 1 is MQA); None means Hkv = H

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len", "head_dim", "window"):
            check_positive_int(name, getattr(self, name))
        if self.prefix is not None and (
            not isinstance(self.prefix, int) or isinstance(self.prefix, bool) or self.prefix < 0
        ):
            raise ValueError(f"prefix must be None or a non-negative int, got {self.prefix!r}")
        for name in ("seq_len_k", "head_dim_v", "kv_heads"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(
                "kv_heads must divide heads (grouped-query attention), "
                f"got kv_heads={self.kv_heads} for heads={self.heads}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if not _valid_device(self.device):
            raise ValueError(
                f"device must be 'cpu', 'cuda' or 'cuda:N' (N >= 0), got {self.device!r}"
            )
        if self.mask not in masks.MASK_KINDS:
            raise ValueError(f"mask must be one of {masks.MASK_KINDS}, got {self.mask!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    @property
    def lq(self) -> int:
        return self.seq_len

    @property
    def lk(self) -> int:
        return self.seq_len if self.seq_len_k is None else self.seq_len_k

    @property
    def hkv(self) -> int:
        """Key/value heads Hkv (H when :attr:`kv_heads` is unset)."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def group(self) -> int:
        """G = H // Hkv, query heads sharing one key/value head (1: multi-head attention)."""
        return self.heads // self.hkv

    @property
    def dv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def elem_bytes(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def input_bytes(self) -> int:
        """Bytes of q, k and v at their shapes (the mask's are :attr:`mask_bytes`)."""
        b = self.batch
        elems = b * (
            self.heads * self.lq * self.head_dim + self.hkv * self.lk * (self.head_dim + self.dv)
        )
        return elems * self.elem_bytes

    @property
    def bytes_moved(self) -> int:
        """The fewest bytes an ideal kernel moves to or from memory: the roofline's denominator.

        ``forward``: q, k and v read once and the output written once (:attr:`input_bytes` +
        :attr:`output_bytes`). ``backward`` (one forward and one backward pass): the forward's
        traffic, plus reading q, k, v, the output and the output's gradient, plus writing dq, dk
        and dv (shaped as q, k, v): ``3 * (input_bytes + output_bytes)``. The mask is excluded (a
        predicate costs no traffic; a dense mask is a choice of the variant), and so is any
        intermediate a real kernel spills (scores, softmax statistics).

        Example:
            >>> # one decode step
            >>> AttnSpec(heads=8, kv_heads=1, seq_len=1, seq_len_k=4096).bytes_moved
            2101248
        """
        once = self.input_bytes + self.output_bytes
        return once if self.mode == "forward" else 3 * once

    @property
    def mask_bytes(self) -> int:
        """Bytes of the dense bool mask :meth:`make_mask` builds: its broadcastable shape's entries.

        ``causal``, ``sliding_window``, ``prefix_lm`` and ``document`` are ``(1, 1, Lq, Lk)``;
        ``valid_lengths`` is ``(B, 1, 1, Lk)``; ``none`` builds nothing. A variant that takes the
        predicate itself builds no dense mask (see :meth:`Variant.mask_bytes`).
        """
        if self.mask == "none":
            return 0
        if self.mask == "valid_lengths":
            return self.batch * self.lk
        return self.lq * self.lk

    @property
    def output_bytes(self) -> int:
        return self.batch * self.heads * self.lq * self.dv * self.elem_bytes

    @property
    def label(self) -> str:
        lens = f"L{self.lq}" if self.seq_len_k is None else f"Lq{self.lq} Lk{self.lk}"
        dims = f"D{self.head_dim}" if self.head_dim_v is None else f"D{self.head_dim} Dv{self.dv}"
        heads = f"H{self.heads}" if self.hkv == self.heads else f"H{self.heads} Hkv{self.hkv}"
        parts = [f"B{self.batch}", heads, lens, dims, self.dtype, self.device, self.mode]
        if self.mask != "none":
            parts.insert(-1, f"mask={self.mask}")
            if self.mask == "prefix_lm" and self.prefix is not None:
                parts.insert(-1, f"prefix={self.prefix}")
        return " ".join(parts)

    def replace(self, **changes: object) -> AttnSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def prefix_len(self) -> int:
        """The ``prefix_lm`` kind's prefix: :attr:`prefix`, or ``Lk // 4`` when unset."""
        return masks.default_prefix(self.lk) if self.prefix is None else self.prefix

    def mask_mod(self, device: torch.device | str | None = None) -> mask_mods.MaskMod | None:
        """The spec's mask as a predicate (None for ``"none"``): what every consumer uses."""
        return masks.mod_for_kind(
            self.mask,
            self.batch,
            self.lq,
            self.lk,
            window=self.window,
            prefix=self.prefix_len,
            device=self.device if device is None else device,
        )

    def allowed_pairs(self) -> int:
        """(query, key) pairs per (batch, head) that the mask allows, averaged over the batch.

        From the predicate (:func:`attnbench.mask_mods.allowed_pairs`): no O(L^2) work.
        """
        return mask_mods.allowed_pairs(self.mask_mod(device="cpu"), self.batch, self.lq, self.lk)

    def make_mask(self) -> torch.Tensor | None:
        """The dense bool mask, smallest broadcastable shape (see :attr:`mask_bytes`), or None.

        Raises:
            ValueError: for a CUDA spec on a machine without CUDA.
        """
        check_device_available("device", self.device)
        mod = self.mask_mod()
        return (
            None
            if mod is None
            else mask_mods.dense(mod, self.batch, self.heads, self.lq, self.lk, self.device)
        )

    def make_inputs(
        self, seed: int = 0, requires_grad: bool = False, mask_form: str = MaskForm.DENSE
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | mask_mods.MaskMod | None]:
        """Seeded standard-normal q, k, v (never zeros) and the spec's mask.

        Args:
            seed: input seed.
            requires_grad: inputs require grad (backward cases).
            mask_form: ``"dense"`` (a bool tensor, :meth:`make_mask`) or ``"mod"`` (the predicate,
                :meth:`mask_mod`: nothing L^2 is built).

        Returns:
            ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``, ``v (B, Hkv, Lk, Dv)``, mask or None.

        Raises:
            TypeError, ValueError: for a seed that is not an int >= 0 (a generator seed), a
                ``requires_grad`` that is not a bool, an unknown ``mask_form``, or a CUDA spec on a
                machine without CUDA; before anything is allocated.
        """
        check_seed(seed)
        check_bool("requires_grad", requires_grad)
        if mask_form not in tuple(MaskForm):
            raise ValueError(f"mask_form must be 'dense' or 'mod', got {mask_form!r}")
        check_device_available("device", self.device)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        b, h, hkv = self.batch, self.heads, self.hkv
        shapes = (
            (b, h, self.lq, self.head_dim),
            (b, hkv, self.lk, self.head_dim),
            (b, hkv, self.lk, self.dv),
        )
        tensors = [
            torch.randn(s, generator=gen, dtype=torch.float32)
            .to(device=self.device, dtype=self.torch_dtype)
            .requires_grad_(requires_grad)
            for s in shapes
        ]
        q, k, v = tensors
        return q, k, v, self.make_mask() if mask_form == MaskForm.DENSE else self.mask_mod()
