"""A variant of your own, as a plugin: ``attnbench --plugin my_variants run --variants textbook``.

Importing this module registers it; ``--plugin`` (or ``ATTNBENCH_PLUGINS=my_variants`` for asv)
imports it in every measuring process.
"""

import torch

import attnbench


class TextbookAttention(attnbench.Variant):
    """``softmax(Q K^T / sqrt(D)) V`` written out, unmasked: the formula as printed."""

    source = "the formula as printed; Vaswani et al. 2017"
    SUPPORTED_MASKS = frozenset({"none"})
    IN_DEFAULT_SWEEP = False  # measured when named with --variants

    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-2, -1) * self.scale_for(q.shape[-1])  # (B, H, Lq, Lk)
        return torch.softmax(scores, dim=-1) @ v  # (B, H, Lq, Dv)


attnbench.register("textbook", TextbookAttention)
