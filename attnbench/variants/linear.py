"""Kernelised (linear) attention: O(L) time and memory by reassociating the attention product.

``(phi(Q) phi(K)^T) V`` is computed as ``phi(Q) (phi(K)^T V)``. Letters: B batch, H heads, Lq
queries, Lk keys, D head dim, Dv value head dim, F features.

* ``linear_elu``: ``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020, "Transformers are RNNs"):
  exact on its own kernel, a different model from softmax attention, not an approximation of it.
* ``performer``: FAVOR+ positive orthogonal random features (Choromanski et al. 2021) whose
  kernel is an unbiased estimate of ``exp(q . k / sqrt(D))``: it approximates softmax attention,
  and the error shrinks as ``num_features`` grows.

Masks: only key-padding masks (query-independent, e.g. valid lengths) are supported, by zeroing
the features of masked keys. Causal linear attention needs prefix sums over ``(L, F, Dv)`` state
and is not implemented; such cases are reported as not supported.
"""

from __future__ import annotations

import math

import psutil
import torch
import torch.nn.functional as F

from attnbench._checks import check_float_dtype, check_positive_int, check_seed
from attnbench.reference import kernel_attend, repeat_kv
from attnbench.variants.base import (
    CONSTANT_OPERAND_BACKWARD,
    EAGER_BACKWARD,
    FLOAT_DTYPES,
    KEY_PADDING_MASKS,
    Contraction,
    GqaMode,
    Variant,
    dense_mask,
)

__all__ = ["KernelAttention", "LinearElu", "Performer"]


class KernelAttention(Variant):
    """Shared O(L) evaluation for any positive feature map ``phi``."""

    SUPPORTS_GQA = GqaMode.REPEAT  # k and v repeated to H heads at entry (counted in the peak)

    time_exponent = 1.0
    memory_exponent = 1.0
    SOFTMAX_ATTENTION = False  # a feature-map kernel in place of softmax
    SUPPORTED_MASKS = KEY_PADDING_MASKS

    def features(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        """``(B, H, L, D) -> (B, H, L, F)`` non-negative features."""
        raise NotImplementedError

    def num_features(self, head_dim: int) -> int:
        return head_dim

    def reference(self, q, k, v, mask=None, dtype=torch.float64):
        """Dense, quadratic evaluation of the same kernel (features computed in ``dtype``)."""
        check_float_dtype("dtype", dtype)
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        mask = dense_mask(mask, q, k)
        q_feat, k_feat = self.features(q.to(dtype), True), self.features(k.to(dtype), False)
        return kernel_attend(q_feat, k_feat, v, mask, dtype)

    def executed_pairs(self, spec):
        return 0

    def useful_pairs(self, spec):
        return 0

    def feature_contractions(self, spec) -> list[Contraction]:
        """Contractions inside :meth:`features` (none for an elementwise feature map)."""
        return []

    def contractions(self, spec):
        """Contractions ``phi(K)^T V``, ``phi(Q) sum phi(K)`` and ``phi(Q) (phi(K)^T V)``.

        Multiply-adds: F x Dv per key, F per query (the normaliser), F x Dv per query (the output).
        """
        f = self.num_features(spec.head_dim)
        bh, lq, lk, dv = spec.batch * spec.heads, spec.lq, spec.lk, spec.dv
        parts = [
            ("phi(K)^T V", 2 * bh * lk * f * dv),
            ("phi(Q) k_sum", 2 * bh * lq * f),
            ("phi(Q) KV", 2 * bh * lq * f * dv),
        ]
        return [
            *self.feature_contractions(spec),
            *(Contraction(n, x, x, EAGER_BACKWARD) for n, x in parts),
        ]

    # live (L, F) buffers per side at the peak (feature-map temporaries)
    FEATURE_BUFFERS: float = 2.0

    def scratch_elements(self, spec):  # noqa: D102 - features of q and k, plus the (F, Dv) state
        f = self.num_features(spec.head_dim)
        features = self.FEATURE_BUFFERS * (spec.lq + spec.lk) * f
        return spec.batch * spec.heads * (features + f * (spec.dv + 1) + spec.lq)

    def forward(self, q, k, v, mask):
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        q_feat = self.features(q, True)  # (B, H, Lq, F)
        k_feat = self.features(k, False)  # (B, H, Lk, F)
        if mask is not None:
            k_feat = k_feat * mask[..., 0, :, None]  # zero the features of masked keys
        kv = k_feat.transpose(-2, -1) @ v  # (B, H, F, Dv)
        k_sum = k_feat.sum(dim=-2)  # (B, H, F)
        norm = q_feat @ k_sum.unsqueeze(-1)  # (B, H, Lq, 1)
        out = q_feat @ kv  # (B, H, Lq, Dv)
        return torch.where(norm > 0, out / torch.where(norm > 0, norm, 1.0), 0.0)


class LinearElu(KernelAttention):
    """Linear transformer attention with ``phi(x) = elu(x) + 1`` (no scale: the kernel has none)."""

    source = "Katharopoulos et al. 2020 (Transformers are RNNs)"
    exact = True

    def __init__(self, scale: None = None) -> None:
        """Raises ``TypeError`` for any ``scale``: the kernel uses none, so one would be ignored."""
        if scale is not None:
            raise TypeError(
                f"linear_elu takes no scale (got scale={scale!r}): its kernel "
                "(elu(q) + 1) . (elu(k) + 1) has no temperature, so a scale would be ignored; "
                "leave it unset"
            )
        super().__init__(None)

    def features(self, x, is_query):
        return F.elu(x) + 1.0


class Performer(KernelAttention):
    """FAVOR+ with ``num_features`` positive orthogonal random features, redrawn per ``seed``."""

    exact = False
    source = "Choromanski et al. 2021 (Performer, FAVOR+)"
    SUPPORTED_DTYPES = FLOAT_DTYPES | {"bfloat16"}
    # Mean |out - softmax attention| on the suite's N(0, 1) inputs with 256 features, B1 H8 D64
    # (2026-11-22, python -m studies.performer_error): 0.33 (L=16), 0.26 (64), 0.20 (256),
    # 0.14 (1024). FAVOR+'s variance grows as exp(|q|^2/sqrt(D)), so at these logit scales it is a
    # coarse approximation; the bound catches a blow-up, while the exact check against its own
    # kernel catches a wrong implementation.
    APPROX_ERROR_BOUND = 0.5

    def __init__(self, num_features: int = 256, seed: int = 0) -> None:
        super().__init__(None)
        self.n_features = check_positive_int("num_features", num_features)
        self.seed = check_seed(seed)
        self._projections: dict[tuple, torch.Tensor] = {}

    def num_features(self, head_dim):
        return self.n_features

    def check_values(self, q, k, v):
        """Refuse, before drawing anything, a feature count whose buffers cannot fit in free memory.

        ``num_features=10**9`` would spend minutes drawing 15 million orthogonal blocks before the
        allocation of its (F, D) projection failed; the bytes are known from the shapes alone.
        """
        super().check_values(q, k, v)
        b, h, lq, d = q.shape
        f, item = self.n_features, q.element_size()
        # float64 master and draws, then the cast copy
        projection = 8 * (2 * f * d + d * d) + f * d * item
        features = self.FEATURE_BUFFERS * b * h * (lq + k.shape[2]) * f * item
        free = (
            torch.cuda.mem_get_info(q.device)[0]
            if q.device.type == "cuda"
            else psutil.virtual_memory().available
        )
        if projection + features > free:
            raise ValueError(
                f"num_features={f} needs about {(projection + features) / 2**30:,.1f} GiB "
                "for its projection and features at these shapes, "
                f"more than the {free / 2**30:,.1f} GiB free; use fewer features"
            )

    def projection(self, head_dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``(F, D)`` orthogonal Gaussian rows: D-row orthonormal blocks, chi-distributed norms."""
        key = (head_dim, dtype, device)
        if key not in self._projections:
            gen = torch.Generator().manual_seed(self.seed)
            blocks = []
            for _ in range(-(-self.n_features // head_dim)):
                gaussian = torch.randn(head_dim, head_dim, generator=gen, dtype=torch.float64)
                ortho, _ = torch.linalg.qr(gaussian)  # (D, D) orthonormal columns
                blocks.append(ortho.T)
            w = torch.cat(blocks)[: self.n_features]  # (F, D)
            norms = torch.randn(self.n_features, head_dim, generator=gen, dtype=torch.float64).norm(
                dim=1
            )
            self._projections[key] = (w * norms[:, None]).to(device=device, dtype=dtype)
        return self._projections[key]

    def feature_contractions(self, spec):
        """The random projection ``x W^T`` of queries and keys; W is a constant (backward 1.0)."""
        x = 2 * spec.batch * spec.heads * (spec.lq + spec.lk) * self.n_features * spec.head_dim
        return [Contraction("x W^T", x, x, CONSTANT_OPERAND_BACKWARD)]

    def parameter_bytes(self, spec):
        """The cached ``(F, D)`` projection, with its float64 master and draws while built."""
        f, d = self.n_features, spec.head_dim
        return f * d * spec.elem_bytes + 8 * (2 * f * d + d * d)

    def features(self, x, is_query):
        """Positive random features ``exp(w . x - |x|^2 / 2 - c) / sqrt(F)``, computed in log space.

        ``c`` is a stabiliser that cancels in the normalisation: the row maximum of the exponent for
        a query, one maximum over all keys and features per (B, H) for keys (a per-key constant
        would not cancel). The largest feature is therefore exactly ``1 / sqrt(F)`` and nothing can
        overflow; no epsilon is added to the features, so the estimator stays unbiased (an
        additive ``+eps`` dominated most key features and stopped the error from falling with F).
        Rows whose features all underflow get a zero normaliser, which :meth:`forward` turns into a
        zero output row rather than NaN.
        """
        d = x.shape[-1]
        x = x * d**-0.25  # so that x_q . x_k = q . k / sqrt(D)
        proj = x @ self.projection(d, x.dtype, x.device).T  # (B, H, L, F)
        log_feat = proj - 0.5 * (x * x).sum(dim=-1, keepdim=True)  # (B, H, L, F)
        dims = (-1,) if is_query else (-2, -1)
        stab = log_feat.amax(dim=dims, keepdim=True).detach()  # (B, H, L, 1) or (B, H, 1, 1)
        return torch.exp(log_feat - stab - 0.5 * math.log(self.n_features))
