"""Does the CUDA disturbance rule fire beside a real GPU neighbour, and stay quiet without one?

Measures a few CUDA cases (``sdpa_flash`` and ``batched``, bfloat16, B1 H8 D64) twice: on an idle
card, then while a second process loops bfloat16 matmuls on the same GPU. For each it prints the
status, the reason, the GPU probe's slowdown, the CUDA event samples' spread (IQR / median) and
the other processes NVML or ``torch.cuda.list_gpu_processes`` listed. Expected: every idle case
``ok``; beside the neighbour, every case ``noisy`` (its process listed, where the driver lists
processes; else by the GPU probe or the spread).

Usage (from the repository root, on a machine with CUDA; about a minute)::

    python -m studies.gpu_neighbour
    python -m studies.gpu_neighbour --lengths 2048,8192

Without CUDA it says so and exits 0. Not an asv benchmark: importing it does nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

NEIGHBOUR = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
while True:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""


@contextlib.contextmanager
def gpu_neighbour() -> Iterator[subprocess.Popen]:
    """A second process looping 8192^3 bfloat16 matmuls on the GPU for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
    try:
        time.sleep(8.0)  # CUDA context and first kernels
        yield proc
    finally:
        proc.kill()
        proc.wait()


def measure_all(lengths: list[int], label: str) -> list[str]:
    """Measure each case; one printed line per case; returns the statuses."""
    from attnbench.measure.config import MeasureConfig
    from attnbench.measure.runner import measure
    from attnbench.spec import AttnSpec

    statuses = []
    for variant in ("sdpa_flash", "batched"):
        for n in lengths:
            spec = AttnSpec(device="cuda", dtype="bfloat16", batch=1, heads=8, seq_len=n)
            m = measure(variant, spec, MeasureConfig(check_accuracy=False, retries=1))
            statuses.append(str(m.status))
            print(
                f"{label:9s} {variant:10s} L={n:<6d} {m.status:6s} probe x{m.probe_slowdown:.2f} "
                f"spread {m.extra.get('event_spread', float('nan')):.3f} "
                f"neighbours {m.extra.get('gpu_neighbours', '?')}  {m.reason[:90]}"
            )
    return statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192", help="comma-separated lengths")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_neighbour: CUDA is not available here: not run")
        return 0
    from attnbench.measure import probe

    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"{torch.cuda.get_device_name()}: neighbours before {probe.gpu_neighbours('cuda')}")
    idle = measure_all(lengths, "idle")
    with gpu_neighbour() as proc:
        print(f"neighbour pid {proc.pid}; listed: {probe.gpu_neighbours('cuda')}")
        busy = measure_all(lengths, "neighbour")
    print(
        f"idle: {idle.count('noisy')} of {len(idle)} noisy; beside the neighbour: "
        f"{busy.count('noisy')} of {len(busy)} noisy"
    )
    return 0 if idle.count("noisy") == 0 and busy.count("noisy") == len(busy) else 1


if __name__ == "__main__":
    sys.exit(main())
