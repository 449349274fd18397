"""A deterministic battery of malformed API inputs, run against every cheap registered variant.

Run: ``python -m studies.api_battery``. Each (variant, case) call is classified:

* ``clear error``: ValueError/TypeError whose message names the argument (q, k, v, mask, scale,
  ...) or the variant's declared reason;
* ``correct``: an output equal to the variant's float64 reference within the tests' tolerance rule
  (3 x the plain same-precision error + a floor), NaN only where the reference is NaN;
* ``obscure error``: any other exception, or a ValueError/TypeError naming nothing;
* ``wrong``: an output that differs from the reference (including NaN where it is finite).

The last two must be zero.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable

import torch

import attnbench
from attnbench.registry import default_variants

NAMES = re.compile(
    r"\b(q|k|v|mask|scale|seed|device|dtype|head_dim|key length|batch and heads|rank|cannot run)\b"
)
FLOORS = {torch.float64: 1e-10, torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def classify(variant_name: str, q, k, v, mask=None, scale: object = "default") -> tuple[str, str]:
    """Call a variant on possibly malformed input; return (category, detail)."""
    try:
        variant = (
            attnbench.get_variant(variant_name)
            if scale == "default"
            else attnbench.get_variant(variant_name, scale=scale)
        )
        out = variant(q, k, v, mask)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        return (
            ("clear error", msg)
            if NAMES.search(msg)
            else ("obscure error", f"{type(exc).__name__}: {msg}")
        )
    except Exception as exc:  # noqa: BLE001 - anything else is what this battery hunts for
        return "obscure error", f"{type(exc).__name__}: {str(exc)[:200]}"
    truth = variant.reference(q, k, v, mask)
    plain = variant.reference(q, k, v, mask, dtype=q.dtype)
    if out.shape != truth.shape:
        return "wrong", f"shape {tuple(out.shape)} != {tuple(truth.shape)}"
    got = out.detach().double()
    if (torch.isnan(got) != torch.isnan(truth)).any():
        return "wrong", "NaN pattern differs from the reference"
    finite = torch.isfinite(truth)
    err = (got[finite] - truth[finite]).abs().max().item() if finite.any() else 0.0
    plain_err = (plain.double()[finite] - truth[finite]).abs().max().item() if finite.any() else 0.0
    tol = 3 * plain_err + FLOORS.get(q.dtype, 1e-2)
    return (
        ("correct", f"err {err:.2g}")
        if err <= tol
        else ("wrong", f"error {err:.3g} > tolerance {tol:.3g}")
    )


def _base(dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 2, 6, 4, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(2, 2, 6, 3, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _with(index: int, value: float, which: str):
    q, k, v = _base()
    t = dict(q=q, k=k, v=v)[which]
    t.view(-1)[index] = value
    return q, k, v


def cases() -> list[tuple[str, Callable[[], tuple]]]:
    """(label, builder) pairs; a builder returns ``(q, k, v, mask, scale)``."""
    q, k, v = _base()
    pad = torch.tensor([True, True, True, True, True, False])
    out: list[tuple[str, Callable[[], tuple]]] = [
        ("q rank 3", lambda: (q[0], k, v, None, "default")),
        ("q rank 5", lambda: (q[None], k, v, None, "default")),
        ("q rank 0", lambda: (torch.tensor(1.0), k, v, None, "default")),
        ("k rank 2", lambda: (q, k[0, 0], v, None, "default")),
        ("v rank 1", lambda: (q, k, v[0, 0, 0], None, "default")),
        ("batch mismatch", lambda: (q, k[:1], v[:1], None, "default")),
        ("heads mismatch", lambda: (q, k[:, :1], v[:, :1], None, "default")),
        ("head_dim mismatch", lambda: (q, k[..., :3], v, None, "default")),
        ("key length mismatch", lambda: (q, k, v[:, :, :5], None, "default")),
        ("zero queries", lambda: (q[:, :, :0], k, v, None, "default")),
        ("zero keys", lambda: (q, k[:, :, :0], v[:, :, :0], None, "default")),
        ("zero head dim", lambda: (q[..., :0], k[..., :0], v, None, "default")),
        ("int q", lambda: (q.long(), k, v, None, "default")),
        ("bool k", lambda: (q, k > 0, v, None, "default")),
        ("complex v", lambda: (q, k, v.to(torch.complex64), None, "default")),
        ("mixed dtypes", lambda: (q, k.double(), v, None, "default")),
        ("float16 all", lambda: (q.half(), k.half(), v.half(), None, "default")),
        ("bfloat16 all", lambda: (q.bfloat16(), k.bfloat16(), v.bfloat16(), None, "default")),
        ("float64 all", lambda: (q.double(), k.double(), v.double(), None, "default")),
        ("q is a list", lambda: (q.tolist(), k, v, None, "default")),
        ("k is None", lambda: (q, None, v, None, "default")),
        ("v is a float", lambda: (q, k, 1.0, None, "default")),
        ("mask is a str", lambda: (q, k, v, "causal", "default")),
        ("mask is an int", lambda: (q, k, v, 1, "default")),
        ("float mask", lambda: (q, k, v, torch.ones(5, 6), "default")),
        ("uint8 mask", lambda: (q, k, v, torch.ones(5, 6, dtype=torch.uint8), "default")),
        ("mask rank 5", lambda: (q, k, v, torch.ones(1, 1, 1, 5, 6, dtype=torch.bool), "default")),
        ("mask wrong Lq", lambda: (q, k, v, torch.ones(4, 6, dtype=torch.bool), "default")),
        ("mask wrong Lk", lambda: (q, k, v, torch.ones(5, 7, dtype=torch.bool), "default")),
        (
            "mask wrong batch",
            lambda: (q, k, v, torch.ones(3, 1, 1, 6, dtype=torch.bool), "default"),
        ),
        ("mask 1-D key padding", lambda: (q, k, v, pad, "default")),
        ("mask 1-D wrong length", lambda: (q, k, v, pad[:4], "default")),
        ("mask 0-D True", lambda: (q, k, v, torch.tensor(True), "default")),
        ("mask all False", lambda: (q, k, v, torch.zeros(2, 1, 1, 6, dtype=torch.bool), "default")),
        (
            "mask query-dependent",
            lambda: (
                q,
                k,
                v,
                torch.rand(5, 6, generator=torch.Generator().manual_seed(1)) > 0.3,
                "default",
            ),
        ),
        ("mask non-contiguous", lambda: (q, k, v, torch.ones(6, 5, dtype=torch.bool).T, "default")),
        (
            "mask on meta",
            lambda: (q, k, v, torch.ones(5, 6, dtype=torch.bool, device="meta"), "default"),
        ),
        ("all on meta", lambda: (q.to("meta"), k.to("meta"), v.to("meta"), None, "default")),
        ("NaN in q", lambda: (*_with(3, math.nan, "q"), None, "default")),
        ("NaN in k", lambda: (*_with(5, math.nan, "k"), None, "default")),
        ("inf in q", lambda: (*_with(0, math.inf, "q"), None, "default")),
        ("-inf in v", lambda: (*_with(7, -math.inf, "v"), None, "default")),
        ("NaN in masked-out key", lambda: (*_with(5 * 4, math.nan, "k"), pad, "default")),
        ("NaN in masked-out value", lambda: (*_with(5 * 3, math.nan, "v"), pad, "default")),
        ("scale nan", lambda: (q, k, v, None, math.nan)),
        ("scale inf", lambda: (q, k, v, None, math.inf)),
        ("scale -1", lambda: (q, k, v, None, -1.0)),
        ("scale 0", lambda: (q, k, v, None, 0.0)),
        ("scale True", lambda: (q, k, v, None, True)),
        ("scale str", lambda: (q, k, v, None, "2")),
        ("scale huge", lambda: (q * 100, k * 100, v, None, 1e35)),
        ("scale tiny", lambda: (q, k, v, None, 1e-30)),
        ("scale int 2", lambda: (q, k, v, None, 2)),
        (
            "q transposed last dims",
            lambda: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v, None, "default"),
        ),
        ("k strided", lambda: (q, torch.randn(2, 2, 6, 8)[..., ::2], v, None, "default")),
        ("v expanded", lambda: (q, k, v[..., :1].expand(2, 2, 6, 3), None, "default")),
        (
            "q (B,L,H,D) view",
            lambda: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v, None, "default"),
        ),
        (
            "all non-contiguous",
            lambda: (
                tuple(t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v))
                + (None, "default")
            ),
        ),
        ("q requires grad", lambda: (q.clone().requires_grad_(), k, v, None, "default")),
    ]
    return out


def run(variants: list[str] | None = None) -> tuple[Counter, list[tuple[str, str, str, str]]]:
    """Run every case on every variant; returns the counts and the (variant, case, category, detail) rows."""
    names = variants or default_variants()
    counts: Counter = Counter()
    rows = []
    for label, build in cases():
        for name in names:
            category, detail = classify(name, *build())
            counts[category] += 1
            rows.append((name, label, category, detail))
    return counts, rows


def main() -> None:
    torch.set_num_threads(1)
    counts, rows = run()
    for row in rows:
        if row[2] in ("obscure error", "wrong"):
            print(" | ".join(row))
    print(
        f"{len(cases())} malformed inputs x variants = {sum(counts.values())} calls: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )


if __name__ == "__main__":
    main()
