"""Teaching demos computed by the variants themselves: the weights behind the notes' figures.

Each demo returns :class:`Heatmaps` (matrices and their titles, no drawing): the report draws them
(``attnbench.report.plots.heatmaps``) when built with ``--demos``. Nothing here is measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from attnbench import masks
from attnbench.registry import get_variant
from attnbench.variants.base import Variant

__all__ = ["Heatmaps", "nadaraya_watson", "masked_weights"]


@dataclass(frozen=True)
class Heatmaps:
    """Weight matrices to show side by side, sharing axes and one colour bar."""

    matrices: tuple[np.ndarray, ...]  # each (Lq, Lk)
    titles: tuple[str, ...]  # one per matrix
    xlabel: str
    ylabel: str
    title: str  # the figure's title
    cmap: str = "Reds"


def _attention_weights(
    variant: str | Variant, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None
) -> np.ndarray:
    """The ``(Lq, Lk)`` attention weights a variant computes (called with ``v = I``, its output).

    Args:
        variant: registered name or instance.
        q: ``(Lq, D)`` queries; k: ``(Lk, D)`` keys.
        mask: optional bool mask broadcastable to ``(1, 1, Lq, Lk)``.
    """
    variant = get_variant(variant) if isinstance(variant, str) else variant
    lk = k.shape[-2]
    eye = torch.eye(lk, dtype=q.dtype).expand(1, 1, lk, lk)  # (1, 1, Lk, Dv=Lk)
    with torch.no_grad():
        return variant(q.view(1, 1, *q.shape[-2:]), k.view(1, 1, *k.shape[-2:]), eye, mask)[
            0, 0
        ].numpy()


def nadaraya_watson(
    seed: int = 0, n: int = 50, epochs: int = 5
) -> tuple[Heatmaps, dict[str, float]]:
    """Nadaraya-Watson kernel regression, as in Dive into Deep Learning: weights and test errors.

    The weights and test errors are those of the non-parametric and the trained parametric model
    (Nadaraya 1964; Watson 1964). Data: ``y = 2 sin(x) + x^0.8 + eps``, eps ~ N(0, 0.5), 50 training
    and 50 test points. The non-parametric model is softmax attention with scores
    ``-(x - x_i)^2 / 2``; the parametric one learns ``w`` in ``-((x - x_i) w)^2 / 2`` by SGD
    (lr 0.5, 5 epochs), each training point attending to all the others. Scores go through the
    ``dot`` variant: ``q . k`` with ``q = [x, -x^2/2, -1/2]`` scaled and ``k = [x_i, 1, x_i^2]``
    reproduces ``-(x - x_i)^2 / 2`` up to a per-query constant.

    Returns:
        The two weight matrices, and a dict of ``nonparametric_test_mse``,
        ``parametric_test_mse`` and ``learned_w``.
    """
    gen = torch.Generator().manual_seed(seed)
    x_train = torch.sort(torch.rand(n, generator=gen, dtype=torch.float64) * 5).values
    f = lambda x: 2 * torch.sin(x) + x**0.8  # noqa: E731 - the regression target
    y_train = f(x_train) + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64)
    x_test = torch.arange(0, 5, 5 / n, dtype=torch.float64)

    def weights(
        queries: torch.Tensor, keys: torch.Tensor, w: float, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        w2 = w * w
        # (Lq, 3) queries and (Lk, 3) keys whose q . k is the score -((x - x_i) w)^2 / 2
        q = torch.stack(
            [w2 * queries, -0.5 * w2 * queries**2, torch.full_like(queries, -0.5 * w2)], -1
        )
        k = torch.stack([keys, torch.ones_like(keys), keys**2], -1)
        return torch.from_numpy(_attention_weights("dot", q, k, mask))

    plain = weights(x_test, x_train, 1.0)
    w = torch.rand(1, generator=gen, dtype=torch.float64).requires_grad_(True)
    not_self = ~torch.eye(n, dtype=torch.bool)
    for _ in range(epochs):
        scores = -(((x_train[:, None] - x_train[None, :]) * w) ** 2) / 2
        probs = torch.softmax(scores.masked_fill(~not_self, float("-inf")), -1)
        loss = ((probs @ y_train - y_train) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w -= 0.5 * grad
    learned = w.item()
    trained = weights(x_test, x_train, learned)
    mse = {
        "nonparametric_test_mse": float(((plain @ y_train - f(x_test)) ** 2).mean()),
        "parametric_test_mse": float(((trained @ y_train - f(x_test)) ** 2).mean()),
        "learned_w": learned,
    }
    panels = Heatmaps(
        (plain.numpy(), trained.numpy()),
        ("non-parametric (w = 1)", f"parametric (learned w = {learned:.2f})"),
        "sorted training inputs",
        "sorted testing inputs",
        "Nadaraya-Watson kernel regression: attention weights",
    )
    return panels, mse


def masked_weights(length: int = 40, window: int = 4) -> Heatmaps:
    """Attention weights of sinusoidal position encodings (a real, structured input) under masks.

    Computed by the actual variants: ``batched`` with no mask and a causal mask, ``local`` (its own
    band), and ``block_sparse`` (its own BigBird pattern).
    """
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(100.0) * torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    enc = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], -1) * 2.0  # (L, 16)
    panels = [
        ("batched, no mask", _attention_weights("batched", enc, enc)),
        ("batched, causal", _attention_weights("batched", enc, enc, masks.causal(length, length))),
        (
            f"local, window {window}",
            _attention_weights(get_variant("local", window=window), enc, enc),
        ),
        (
            "block_sparse, block 5",
            _attention_weights(get_variant("block_sparse", block=5, random_blocks=1), enc, enc),
        ),
    ]
    return Heatmaps(
        tuple(p[1] for p in panels),
        tuple(p[0] for p in panels),
        "keys",
        "queries",
        "attention weights under masks and sparse patterns (sinusoidal position encodings)",
        cmap="Blues",
    )
