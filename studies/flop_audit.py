"""Declared executed FLOPs vs ``torch.utils.flop_counter.FlopCounterMode`` on the same call.

Run: ``python -m studies.flop_audit`` (B1 H2 L512 D64 float32 CPU, forward and forward+backward).
Columns: declared executed FLOPs, the part FlopCounterMode can see (``counter_visible_flops``),
what it counted, and their ratio. Variants whose contractions sit in kernels the counter has no
formula for are marked ``opaque`` (hand-counted in tests/test_flops.py).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

import attnbench
from attnbench import AttnSpec


def counted_flops(variant: attnbench.Variant, spec: AttnSpec, seed: int = 0) -> int:
    """FlopCounterMode's total for one call: forward under no_grad, or forward + autograd.grad."""
    backward = spec.mode == "backward"
    q, k, v, mask = spec.make_inputs(
        seed=seed, requires_grad=backward, mask_form=variant.mask_form(spec)
    )
    mask4 = variant.validate(q, k, v, mask)
    gen = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(*q.shape[:3], v.shape[-1], generator=gen).to(q.dtype)
    with FlopCounterMode(display=False) as counter:
        if backward:
            out = variant.forward(q, k, v, mask4)
            torch.autograd.grad(out, (q, k, v), grad_out)
        else:
            with torch.no_grad():
                variant.forward(q, k, v, mask4)
    return counter.get_total_flops()


def main() -> None:
    torch.set_num_threads(1)
    print(
        f"{'variant':18s} {'pass':8s} {'declared':>12s} {'visible':>12s} {'counted':>12s} {'ratio':>6s}"
    )
    for name in attnbench.variant_names():
        variant = attnbench.get_variant(name)
        for mode in ("forward", "backward"):
            spec = AttnSpec(
                batch=1, heads=2, seq_len=512 if name != "loop" else 16, head_dim=64, mode=mode
            )
            reasons = variant.not_supported_reasons(spec)
            if reasons:
                print(f"{name:18s} {mode:8s} skipped: {'; '.join(reasons)}")
                continue
            declared = variant.flops(spec).executed
            visible = variant.counter_visible_flops(spec)
            if name == "flex" or (name == "loop"):
                counted = "opaque"
                ratio = ""
            else:
                c = counted_flops(variant, spec)
                counted, ratio = str(c), (f"{visible / c:.3f}" if c else "opaque")
            note = " (L=16)" if name == "loop" else ""
            print(
                f"{name:18s} {mode:8s} {declared:>12d} {visible:>12d} {counted:>12s} {ratio:>6s}{note}"
            )


if __name__ == "__main__":
    main()
