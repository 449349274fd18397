"""Performer (FAVOR+) error vs exact softmax attention, against the number of random features.

Run: ``python -m studies.performer_error [input_scale]`` (default 1.0: standard-normal q, k, v).
Shape B1 H8 L1024 D64 float32, inputs from ``AttnSpec.make_inputs(seed=0)``, q and k multiplied
by ``input_scale``; then the default 256 features at L = 256 .. 4096. Errors are |out - exact|
over every output element, exact = float64 softmax attention.
"""

from __future__ import annotations

import sys

import torch

import attnbench
from attnbench import AttnSpec


def errors(length: int, features: int, scale: float) -> tuple[float, float, float]:
    """(mean |error|, max |error|, mean |exact output|)."""
    q, k, v, _ = AttnSpec(batch=1, heads=8, seq_len=length, head_dim=64).make_inputs(seed=0)
    q, k = q * scale, k * scale
    exact = attnbench.reference_attention(q, k, v)
    err = (
        attnbench.get_variant("performer", num_features=features)(q, k, v).double() - exact
    ).abs()
    return err.mean().item(), err.max().item(), exact.abs().mean().item()


def main() -> None:
    torch.set_num_threads(1)
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(f"input scale {scale}: L=1024, error vs features")
    for f in (16, 64, 256, 1024, 4096):
        mean, worst, ref = errors(1024, f, scale)
        print(f"  F={f:5d}  mean {mean:.4f}  max {worst:.4f}  (mean |exact| {ref:.4f})")
    print("default 256 features, error vs length")
    for length in (256, 512, 1024, 2048, 4096):
        mean, worst, ref = errors(length, 256, scale)
        print(f"  L={length:5d}  mean {mean:.4f}  max {worst:.4f}  (mean |exact| {ref:.4f})")


if __name__ == "__main__":
    main()
