"""A plugin (``ATTNBENCH_PLUGINS=reference_counter``) that counts float64 reference evaluations, process by process.

The correctness gate evaluates a case's float64 reference one (batch, head) slice at a time
(``attnbench.measure.gate._reference``); this wraps that function so that each float64 slice appends a line
``PID LENGTH PASS MASKED`` to the file ``ATTNBENCH_TEST_REFERENCE_LOG`` names. asv imports the suite (and with it
the plugins) in every process it starts, so the lines say which process evaluated what. It changes no result, and
reads only what every version of the gate passes, so the same count runs on the code before and after a change.
"""

from __future__ import annotations

import os

import torch

from attnbench.io import append_line
from attnbench.measure import gate

ENV = "ATTNBENCH_TEST_REFERENCE_LOG"

if not getattr(gate._reference, "counted", False):
    _reference = gate._reference

    def _counted(variant, q, k, v, mask, grad_out, dtype, exact_softmax=False):
        path = os.environ.get(ENV)
        if path and dtype == torch.float64 and not exact_softmax:
            passes = "backward" if grad_out is not None else "forward"
            append_line(
                path,
                f"{os.getpid()} {q.shape[-2]} {passes} {'masked' if mask is not None else 'none'}",
            )
        return _reference(variant, q, k, v, mask, grad_out, dtype, exact_softmax=exact_softmax)

    _counted.counted = True
    gate._reference = _counted


def evaluations(path: str | os.PathLike, slices: int) -> dict[int, float]:
    """Float64 reference evaluations of a case per process id: slices evaluated / the case's checked slices."""
    per_pid: dict[int, int] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    pid = int(line.split()[0])
                    per_pid[pid] = per_pid.get(pid, 0) + 1
    return {pid: n / slices for pid, n in per_pid.items()}
