"""The classic attention scoring functions, with their parameters.

``a(q, k)`` then softmax over keys, then a weighted sum of values:

* ``dot``:        ``q . k``                                (Luong et al. 2015)
* ``scaled_dot``: ``q . k / sqrt(D)``                       (Vaswani et al. 2017)
* ``bilinear``:   ``q^T W k``, ``W (D, D)``                (Luong et al. 2015, "general")
* ``additive``:   ``w_v^T tanh(W_q q + W_k k)``, hidden size h (Bahdanau et al. 2015)

Parameters are drawn once from a seeded generator in float64 and cast to the inputs' dtype and
device (cached), so every run and the float64 reference use the same weights. Additive attention
broadcasts a ``(Lq, Lk, h)`` hidden tensor, built ``q_chunk`` query rows at a time: its peak stays
at ``q_chunk * Lk * h`` per (B, H) on top of the (Lq, Lk) scores. Letters: B batch, H heads,
Lq queries, Lk keys, D head dim, Dv value head dim, h hidden size.
"""

from __future__ import annotations

import math

import torch

from attnbench._checks import check_positive_int, check_seed
from attnbench.reference import attend, repeat_kv
from attnbench.variants._ops import masked_softmax_, zero_empty_rows
from attnbench.variants.base import (
    CONSTANT_OPERAND_BACKWARD,
    EAGER_BACKWARD,
    Contraction,
    GqaMode,
    Variant,
    dense_mask,
)

__all__ = ["ScoringAttention"]

_SCORES = ("dot", "scaled_dot", "bilinear", "additive")


class ScoringAttention(Variant):
    """Attention with a named scoring function; see the module docstring."""

    SUPPORTS_GQA = GqaMode.REPEAT  # k and v repeated to H heads at entry (counted in the peak)

    source = (
        "Luong et al. 2015; Vaswani et al. 2017; Bahdanau et al. 2015 "
        "(AdditiveAttention, DotProductAttention)"
    )

    def __init__(
        self, score: str = "scaled_dot", hidden: int = 32, q_chunk: int = 64, seed: int = 0
    ) -> None:
        super().__init__(None)
        if score not in _SCORES:
            raise ValueError(f"score must be one of {_SCORES}, got {score!r}")
        self.score = score
        if score == "additive":
            self.EFFICIENCY = 0.02  # elementwise tanh over (Lq, Lk, h) dominates, not matmuls
        self.hidden = check_positive_int("hidden", hidden)
        self.q_chunk = check_positive_int("q_chunk", q_chunk)
        self.seed = check_seed(seed)
        self._params: dict[tuple, dict[str, torch.Tensor]] = {}

    def _same_qk_dim(self) -> bool:
        return self.score != "additive"

    def params(
        self, dq: int, dk: int, dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Seeded parameters for query dim ``dq`` and key dim ``dk`` (float64 master copy, cast)."""
        key = (dq, dk, dtype, device)
        if key not in self._params:
            gen = torch.Generator().manual_seed(self.seed)
            if self.score == "bilinear":
                master = {
                    "W": torch.randn(dq, dk, generator=gen, dtype=torch.float64)
                    / math.sqrt(dq * dk)
                }
            elif self.score == "additive":
                h = self.hidden
                master = {
                    "W_q": torch.randn(h, dq, generator=gen, dtype=torch.float64) / math.sqrt(dq),
                    "W_k": torch.randn(h, dk, generator=gen, dtype=torch.float64) / math.sqrt(dk),
                    "w_v": torch.randn(h, generator=gen, dtype=torch.float64) / math.sqrt(h),
                }
            else:
                master = {}
            self._params[key] = {n: t.to(device=device, dtype=dtype) for n, t in master.items()}
        return self._params[key]

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``(B, H, Lq, Lk)`` logits in the inputs' dtype."""
        p = self.params(q.shape[-1], k.shape[-1], q.dtype, q.device)
        if self.score == "dot":
            return q @ k.transpose(-2, -1)
        if self.score == "scaled_dot":
            return (q @ k.transpose(-2, -1)).mul_(1.0 / math.sqrt(q.shape[-1]))
        if self.score == "bilinear":
            return (q @ p["W"]) @ k.transpose(-2, -1)  # (B, H, Lq, Dk) @ (B, H, Dk, Lk)
        q_h = q @ p["W_q"].T  # (B, H, Lq, h)
        k_h = (k @ p["W_k"].T).unsqueeze(-3)  # (B, H, 1, Lk, h)
        rows = []
        for s in range(0, q.shape[2], self.q_chunk):
            # (B, H, Cq, Lk, h)
            hidden = torch.tanh(q_h[:, :, s : s + self.q_chunk].unsqueeze(-2) + k_h)
            # (B, H, Cq, Lk, h) @ (h, 1) -> (B, H, Cq, Lk)
            rows.append((hidden @ p["w_v"][:, None]).squeeze(-1))
        return torch.cat(rows, dim=2)

    def reference(self, q, k, v, mask=None, dtype=torch.float64):
        """The same score function and weights evaluated densely with einsum in ``dtype``."""
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        mask = dense_mask(mask, q, k)
        qc, kc = q.to(dtype), k.to(dtype)
        p = self.params(q.shape[-1], k.shape[-1], dtype, q.device)
        if self.score == "additive":
            hidden = torch.tanh(
                torch.einsum("bhqd,nd->bhqn", qc, p["W_q"])[:, :, :, None]
                + torch.einsum("bhkd,nd->bhkn", kc, p["W_k"])[:, :, None]
            )  # (B, H, Lq, Lk, h)
            logits = torch.einsum("bhqkn,n->bhqk", hidden, p["w_v"])
        elif self.score == "bilinear":
            logits = torch.einsum("bhqd,de,bhke->bhqk", qc, p["W"], kc)
        else:
            logits = torch.einsum("bhqd,bhkd->bhqk", qc, kc)
            if self.score == "scaled_dot":
                logits = logits / math.sqrt(q.shape[-1])
        return attend(logits, v, mask, dtype)

    def contractions(self, spec):
        """Forward contractions, by score function.

        dot/scaled_dot: the default two. bilinear adds ``q W``. additive has no ``Q K^T``:
        ``q W_q^T``, ``k W_k^T``, ``tanh(.) w_v`` (h per pair) and ``P V``. Weights are constants
        (backward 1.0).
        """
        if self.score in ("dot", "scaled_dot"):
            return super().contractions(spec)
        bh, lq, lk, d, dv = spec.batch * spec.heads, spec.lq, spec.lk, spec.head_dim, spec.dv
        if self.score == "bilinear":
            qw = 2 * bh * lq * d * d
            return [
                *super().contractions(spec),
                Contraction("q W", qw, qw, CONSTANT_OPERAND_BACKWARD),
            ]
        h, pairs = self.hidden, lq * lk
        useful = min(self.useful_pairs(spec), pairs)
        proj = 2 * bh * (lq + lk) * h * d
        return [
            Contraction("q W_q^T, k W_k^T", proj, proj, CONSTANT_OPERAND_BACKWARD),
            Contraction(
                "tanh(.) w_v", 2 * bh * pairs * h, 2 * bh * useful * h, CONSTANT_OPERAND_BACKWARD
            ),
            Contraction("P V", 2 * bh * pairs * dv, 2 * bh * useful * dv, EAGER_BACKWARD),
        ]

    def parameter_bytes(self, spec):
        """The cast weights plus their float64 masters (bilinear D x D; additive 2 h x D + h)."""
        d = spec.head_dim
        elems = {"bilinear": d * d, "additive": 2 * self.hidden * d + self.hidden}.get(
            self.score, 0
        )
        return elems * (spec.elem_bytes + 8)

    def scratch_elements(self, spec):  # noqa: D102
        base = super().scratch_elements(spec)
        if self.score == "additive":
            base += (
                spec.batch
                * spec.heads
                * (2 * min(self.q_chunk, spec.lq) * spec.lk * self.hidden + spec.lq * spec.lk)
            )
        return base

    def forward(self, q, k, v, mask):
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        probs = masked_softmax_(self.scores(q, k), mask)  # (B, H, Lq, Lk)
        return zero_empty_rows(probs @ v, mask)  # (B, H, Lq, Dv)
