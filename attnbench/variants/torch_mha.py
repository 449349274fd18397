"""``torch.nn.MultiheadAttention`` driven with identity projections (identity projections).

With ``in_proj`` and ``out_proj`` set to the identity and no bias, the module computes plain
multi-head scaled dot-product attention of the given per-head inputs, so it can be checked against
the same reference as every other core. Its projections are still executed (4 E x E matmuls, E =
H*D) and counted in the executed FLOPs. ``need_weights=False`` lets the module take PyTorch's
fused SDPA path, which is what a performance-minded user would call.
"""

from __future__ import annotations

import torch
from torch import nn

from attnbench.variants._ops import merge_heads, split_heads, zero_empty_rows
from attnbench.variants.base import CONSTANT_OPERAND_BACKWARD, Contraction, Variant
from attnbench.variants.sdpa import CPU_FLASH_OPS

__all__ = ["TorchMHA"]


class TorchMHA(Variant):
    """``nn.MultiheadAttention(E=H*D, H, bias=False, batch_first=True)`` with identity weights."""

    memory_exponent = 1.0  # the fused path does not materialise scores without a mask
    source = "torch.nn.MultiheadAttention; Vaswani et al. 2017"
    SCORE_BUFFERS = 0.0
    PROVENANCE = True
    RECOMPUTES_SCORES = True  # its core is F.scaled_dot_product_attention's fused kernel
    OPAQUE_KERNELS = CPU_FLASH_OPS

    def __init__(self, scale: float | None = None) -> None:
        if scale is not None:
            raise ValueError("torch_mha always scales by 1/sqrt(D); scale must be None")
        super().__init__(scale)
        self._modules: dict[tuple, nn.MultiheadAttention] = {}

    def extra_reasons(self, call):
        if call.dv != call.d:
            return [
                "nn.MultiheadAttention needs Dv == D for identity projections "
                f"(D={call.d}, Dv={call.dv})"
            ]
        return []

    def scores_visible(self, spec):
        return spec.device_type != "cpu"  # CPU flash SDPA has no FlopCounterMode formula

    def contractions(self, spec):
        """The fused core, plus 4 E x E projections (q and out on Lq, k and v on Lk), E = H*D.

        The weights are constants (no gradient), so each projection's backward is one matmul.
        """
        e = spec.heads * spec.head_dim
        proj = 2 * spec.batch * e * e * (2 * spec.lq + 2 * spec.lk)
        return [
            *super().contractions(spec),
            Contraction("projections", proj, proj, CONSTANT_OPERAND_BACKWARD),
        ]

    def parameter_bytes(self, spec):
        """``in_proj_weight (3E, E)`` and ``out_proj.weight (E, E)``, E = H*D."""
        e = spec.heads * spec.head_dim
        return 4 * e * e * spec.elem_bytes

    def scratch_elements(self, spec):  # noqa: D102 - projected copies of q, k, v (fused core)
        return spec.batch * spec.heads * (2 * spec.lq * spec.head_dim + 2 * spec.lk * spec.head_dim)

    def module(
        self, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> nn.MultiheadAttention:
        key = (heads, head_dim, dtype, device)
        if key not in self._modules:
            e = heads * head_dim
            mha = nn.MultiheadAttention(
                e, heads, bias=False, batch_first=True, device=device, dtype=dtype
            )
            with torch.no_grad():  # identity in place: no transient E x E copies
                for block in (*mha.in_proj_weight.chunk(3), mha.out_proj.weight):  # 4 x (E, E)
                    nn.init.eye_(block)
            mha.eval().requires_grad_(False)
            self._modules[key] = mha
        return self._modules[key]

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        mha = self.module(h, d, q.dtype, q.device)
        attn_mask = key_padding = None
        if mask is not None:
            if mask.shape[-2] == 1 and mask.shape[1] == 1:
                key_padding = ~mask[:, 0, 0, :].expand(b, k.shape[2])  # (B, Lk), True = ignore
            elif mask.shape[0] == 1 and mask.shape[1] == 1:
                attn_mask = ~mask[0, 0]  # (Lq, Lk), True = not allowed
            else:
                attn_mask = (~mask).expand(b, h, lq, k.shape[2]).reshape(b * h, lq, k.shape[2])
        out, _ = mha(
            merge_heads(q),
            merge_heads(k),
            merge_heads(v),
            key_padding_mask=key_padding,
            attn_mask=attn_mask,
            need_weights=False,
        )  # (B, Lq, H*D)
        # nn.MultiheadAttention returns NaN for rows with no allowed key; the contract says zeros.
        return zero_empty_rows(split_heads(out, h), mask)  # (B, H, Lq, D)
