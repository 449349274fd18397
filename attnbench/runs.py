"""Sweeps without asv: the default grid, and run directories written atomically.

A run directory holds ``measurements.csv`` (one row per :class:`Measurement`, see
``Measurement.to_row``) and ``manifest.json`` (environment, configuration, command, timings). Both
files are written to temporaries and renamed into place, manifest last, so a directory with a
manifest is always complete.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from attnbench.io import atomic_write, atomic_write_text
from attnbench.measure.record import Measurement
from attnbench.measure.runner import MeasureConfig, default_lengths
from attnbench.registry import get_variant, variant_names
from attnbench.spec import AttnSpec

DEFAULT_LENGTHS: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
MEASUREMENTS = "measurements.csv"
MANIFEST = "manifest.json"


def grid(
    variants: Sequence[str] | None = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    base: AttnSpec | None = None,
    modes: Sequence[str] = ("forward",),
    masks: Sequence[str] = ("none",),
    dtypes: Sequence[str] | None = None,
    devices: Sequence[str] | None = None,
    limit_slow: bool = True,
) -> list[tuple[str, AttnSpec]]:
    """Cases for every variant x length x mode x mask x dtype x device.

    ``variants=None`` means every registered variant in the default sweep (compiled variants, which
    recompile per shape, are opt-in by name).

    ``limit_slow`` keeps interpreter-bound variants (``loop``) to the lengths they can finish in
    seconds; pass False to sweep them everywhere (the time guard still applies).
    """
    base = base or AttnSpec()
    names = list(variants) if variants else [n for n in variant_names() if get_variant(n).IN_DEFAULT_SWEEP]
    cases = []
    for name in names:
        variant = get_variant(name)
        lens = default_lengths(variant, lengths) if limit_slow else list(lengths)
        for device in devices or [base.device]:
            for dtype in dtypes or [base.dtype]:
                for mode in modes:
                    for mask in masks:
                        for n in lens:
                            spec = base.replace(seq_len=n, mode=mode, mask=mask, dtype=dtype, device=device)
                            cases.append((name, spec))
    return cases


def to_frame(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """One row per measurement (the wide "run" schema)."""
    return pd.DataFrame([m.to_row() for m in measurements])


def new_run_dir(root: str | Path = "reports/runs") -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{stamp}-{socket.gethostname()}"


def write_run(
    run_dir: str | Path,
    measurements: Sequence[Measurement],
    config: MeasureConfig,
    *,
    seconds: float,
    command: Sequence[str] | None = None,
    peak_gflops: dict[str, float] | None = None,
) -> Path:
    """Atomically write ``measurements.csv`` then ``manifest.json`` under ``run_dir``.

    ``peak_gflops`` maps dtype -> this machine's matmul GFLOP/s (the roof for % of peak).
    """
    run_dir = Path(run_dir)
    frame = to_frame(measurements)
    atomic_write(run_dir / MEASUREMENTS, lambda tmp: frame.to_csv(tmp, index=False))
    env = next((m.env for m in measurements if m.env is not None), None)
    manifest = {
        "schema": "attnbench.run/1",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command if command is not None else sys.argv),
        "seconds": round(seconds, 2),
        "peak_gflops": peak_gflops,
        "cases": len(measurements),
        "statuses": frame["status"].value_counts().to_dict() if len(frame) else {},
        "environment": dataclasses.asdict(env) if env else {},
        "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
    }
    atomic_write_text(run_dir / MANIFEST, json.dumps(manifest, indent=2))
    return run_dir


def summary_table(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """Compact variant x length table of median milliseconds (status where not ok).

    Rows are variants, split by dtype / pass / mask when the sweep varies them.
    """
    rows = []
    for m in measurements:
        cell = f"{m.median * 1e3:.3g}" if m.status == "ok" else m.status
        rows.append({"variant": m.variant, "dtype": m.spec.dtype, "pass": m.spec.mode, "mask": m.spec.mask,
                     "L": m.spec.lq, "cell": cell})
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    index = ["variant"] + [c for c in ("dtype", "pass", "mask") if frame[c].nunique() > 1]
    table = frame.pivot_table(index=index, columns="L", values="cell", aggfunc="first", sort=False)
    table.columns.name = "median ms at L="
    return table.fillna("")
