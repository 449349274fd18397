"""``torch.nn.MultiheadAttention`` driven with identity projections (seed 004's usage).

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
from attnbench.variants.base import Flops, Variant


class TorchMHA(Variant):
    """``nn.MultiheadAttention(E=H*D, H, bias=False, batch_first=True)`` with identity weights."""

    memory_exponent = 1.0  # the fused path does not materialise scores without a mask
    source = "torch.nn.MultiheadAttention (seed 004); Vaswani et al. 2017"
    SCORE_BUFFERS = 0.0
    PROVENANCE = True

    def __init__(self, scale: float | None = None) -> None:
        if scale is not None:
            raise ValueError("torch_mha always scales by 1/sqrt(D); scale must be None")
        super().__init__(scale)
        self._modules: dict[tuple, nn.MultiheadAttention] = {}

    def extra_reasons(self, *, device, dtype, lq, lk, d, dv):
        if dv != d:
            return [f"nn.MultiheadAttention needs Dv == D for identity projections (D={d}, Dv={dv})"]
        return []

    def flops(self, spec):
        base = super().flops(spec)
        e = spec.heads * spec.head_dim
        proj = 2 * spec.batch * e * e * (2 * spec.lq + 2 * spec.lk)  # q and out on Lq, k and v on Lk
        proj = int(proj * (3.5 if spec.mode == "backward" else 1.0))
        return Flops(useful=base.useful, executed=base.executed + proj)

    def scratch_elements(self, spec):  # noqa: D102 - projected copies of q, k, v (fused core)
        return spec.batch * spec.heads * (2 * spec.lq * spec.head_dim + 2 * spec.lk * spec.head_dim)

    def module(self, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> nn.MultiheadAttention:
        key = (heads, head_dim, dtype, device)
        if key not in self._modules:
            e = heads * head_dim
            mha = nn.MultiheadAttention(e, heads, bias=False, batch_first=True, device=device, dtype=dtype)
            with torch.no_grad():
                eye = torch.eye(e, dtype=dtype, device=device)
                mha.in_proj_weight.copy_(torch.cat([eye, eye, eye]))  # (3E, E)
                mha.out_proj.weight.copy_(eye)
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
            merge_heads(q), merge_heads(k), merge_heads(v),
            key_padding_mask=key_padding, attn_mask=attn_mask, need_weights=False,
        )  # (B, Lq, H*D)
        # nn.MultiheadAttention returns NaN for rows with no allowed key; the contract says zeros.
        return zero_empty_rows(split_heads(out, h), mask)  # (B, H, Lq, D)
