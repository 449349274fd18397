"""One benchmark case's shape, as a frozen value, plus the seeded inputs it describes.

Letters: B batch, H heads, Lq queries, Lk keys, D query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnbench import masks
from attnbench._checks import check_positive_int

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DEVICES: tuple[str, ...] = ("cpu", "cuda")
MODES: tuple[str, ...] = ("forward", "backward")
"""``backward`` means one forward and one backward pass (a training step's attention work)."""


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

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len", "head_dim", "window"):
            check_positive_int(name, getattr(self, name))
        for name in ("seq_len_k", "head_dim_v"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if not _valid_device(self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (N >= 0), got {self.device!r}")
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
        """Bytes of q, k, v (the mask is :attr:`mask_bytes`)."""
        b, h = self.batch, self.heads
        elems = b * h * (self.lq * self.head_dim + self.lk * (self.head_dim + self.dv))
        return elems * self.elem_bytes

    @property
    def mask_bytes(self) -> int:
        """Bytes of the bool mask :meth:`make_mask` builds (its broadcastable shape, one byte per entry).

        ``causal`` and ``sliding_window`` are dense ``(1, 1, Lq, Lk)``; ``valid_lengths`` is
        ``(B, 1, 1, Lk)``; ``none`` builds nothing.
        """
        if self.mask in ("causal", "sliding_window"):
            return self.lq * self.lk
        if self.mask == "valid_lengths":
            return self.batch * self.lk
        return 0

    @property
    def output_bytes(self) -> int:
        return self.batch * self.heads * self.lq * self.dv * self.elem_bytes

    @property
    def label(self) -> str:
        lens = f"L{self.lq}" if self.seq_len_k is None else f"Lq{self.lq} Lk{self.lk}"
        dims = f"D{self.head_dim}" if self.head_dim_v is None else f"D{self.head_dim} Dv{self.dv}"
        parts = [f"B{self.batch}", f"H{self.heads}", lens, dims, self.dtype, self.device, self.mode]
        if self.mask != "none":
            parts.insert(-1, f"mask={self.mask}")
        return " ".join(parts)

    def replace(self, **changes: object) -> AttnSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def allowed_pairs(self) -> int:
        """(query, key) pairs per (batch, head) that the mask allows, averaged over the batch."""
        lq, lk = self.lq, self.lk
        if self.mask == "none":
            return lq * lk
        if self.mask == "causal":
            return sum(min(i + 1, lk) for i in range(lq))
        if self.mask == "sliding_window":
            w = self.window
            return sum(min(lk - 1, i + w) - max(0, i - w) + 1 for i in range(min(lq, lk + w)))
        return lq * sum(masks.default_valid_lens(self.batch, lk)) // self.batch

    def make_mask(self) -> torch.Tensor | None:
        return masks.for_kind(
            self.mask, self.batch, self.lq, self.lk, window=self.window, device=self.device
        )

    def make_inputs(
        self, seed: int = 0, requires_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Seeded standard-normal q, k, v (never zeros) and the spec's mask.

        Returns:
            ``q (B, H, Lq, D)``, ``k (B, H, Lk, D)``, ``v (B, H, Lk, Dv)``, mask or None.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        b, h = self.batch, self.heads
        shapes = ((b, h, self.lq, self.head_dim), (b, h, self.lk, self.head_dim), (b, h, self.lk, self.dv))
        tensors = [
            torch.randn(s, generator=gen, dtype=torch.float32)
            .to(device=self.device, dtype=self.torch_dtype)
            .requires_grad_(requires_grad)
            for s in shapes
        ]
        q, k, v = tensors
        return q, k, v, self.make_mask()
