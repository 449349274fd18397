"""Sweeps without asv: the default grid, and crash-safe run directories.

A run directory holds:
  * ``cases.jsonl``: the truth, append-only. Line 1 is a header (the configuration and the planned
    grid); every later line is one finished case (a :class:`Measurement` as JSON), flushed and
    fsynced before the sweep moves on, so a kill at any moment loses at most the case in hand. A
    torn last line (a kill mid-write) is ignored with a note.
  * ``measurements.csv`` (one row per case, see ``Measurement.to_row``) and ``manifest.json``
    (environment, configuration, command, ``cases`` = rows written, ``planned``, ``complete``):
    derived from the log after every case, each written to a temporary file and renamed into place,
    manifest last.
  * ``.lock``: held (``flock``) while a sweep writes the directory, so two runs cannot mix.
  * ``report/``: the HTML report, rebuilt from the data at the end; removed when a run starts so it
    never describes other data.

The files' names and formats, and reading the log back, are :mod:`attnbench.rundir_format`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import itertools
import json
import math
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.contract import RUN_LENGTHS, SWEPT_LENGTH, WORKLOADS
from attnbench.errors import AttnbenchError, UsageError
from attnbench.io import atomic_write, atomic_write_text, check_path
from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import Count, Measurement, attach
from attnbench.measure.runner import default_lengths
from attnbench.registry import default_variants, get_variant
from attnbench.rundir_format import (
    LOG,
    LOG_SCHEMA,
    MANIFEST,
    MANIFEST_SCHEMA,
    MEASUREMENTS,
    RunLog,
    case_key,
    count_to_json,
    jsonable,
    measurement_to_json,
    read_log,
)
from attnbench.spec import AttnSpec

__all__ = [
    "DEFAULT_LENGTHS",
    "DECODE_LENGTHS",
    "device_only_defaults",
    "grid",
    "swept_length",
    "COUNT_SHARE",
    "COUNT_FLOOR_S",
    "count_wait_s",
    "counted_cases",
    "new_run_dir",
    "empty_grid_reason",
    "RunDirError",
    "RunWriteError",
    "RunDirectory",
    "write_run",
]

DEFAULT_LENGTHS: tuple[int, ...] = RUN_LENGTHS["prefill"]
DECODE_LENGTHS: tuple[int, ...] = RUN_LENGTHS["decode"]
"""The decode workload's default key/value cache lengths Lk: 1K .. 128K (the guard skips what does
not fit)."""
_LOCK = ".lock"
_REPORT = "report"
_RUN_FILES = (LOG, MEASUREMENTS, MANIFEST)
"""Files a run writes (``--force`` removes these and ``report/``; other files are left alone)."""


def _repeated(values: Sequence) -> str:
    """The values that occur more than once in ``values``, comma-separated ("" when none)."""
    return ", ".join(str(v) for v in dict.fromkeys(v for v in values if list(values).count(v) > 1))


def _runnable_defaults(devices: Sequence[str]) -> list[str]:
    """The default sweep's variants that run on one of ``devices`` at all.

    CUDA-only kernels drop out on a CPU.
    """
    kinds = {d.split(":", 1)[0] for d in devices}  # "cuda:1" runs what "cuda" runs
    return [n for n in default_variants() if kinds & set(get_variant(n).SUPPORTED_DEVICES)]


def device_only_defaults(devices: Sequence[str]) -> list[str]:
    """The default sweep's variants left out because they run on none of ``devices``.

    ``run`` says so once.
    """
    runnable = set(_runnable_defaults(devices))
    return [n for n in default_variants() if n not in runnable]


def grid(
    variants: Sequence[str] | None = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    base: AttnSpec | None = None,
    modes: Sequence[str] = ("forward",),
    masks: Sequence[str] = ("none",),
    dtypes: Sequence[str] | None = None,
    devices: Sequence[str] | None = None,
    limit_slow: bool = True,
    *,
    workload: str = "prefill",
    q_len: int = 1,
    head_dims: Sequence[int] | None = None,
    batches: Sequence[int] | None = None,
    kv_heads: Sequence[int | None] | None = None,
) -> list[tuple[str, AttnSpec]]:
    """Cases: every variant x head dim x batch x kv heads x device x dtype x mode x mask x length.

    Args:
        variants: None for every variant of the default sweep that runs on one of the devices
            (compiled variants, which recompile per shape, are opt-in by name).
        limit_slow: keep interpreter-bound variants (``loop``) to lengths they finish in seconds.
        workload: ``"prefill"`` (``lengths`` are L = Lq = Lk) or ``"decode"`` (``lengths`` are
            the cache length Lk, with ``q_len`` queries: 1 per generated token).
        head_dims, batches, kv_heads: D, B and Hkv to cross (None: the base spec's; Hkv None: H).

    Raises:
        ValueError: an unknown variant or workload, a value given twice, or a shape the spec
            rejects (e.g. kv_heads not dividing heads).
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
    _refuse_repeats(
        {
            "variants": variants,
            "lengths": lengths,
            "modes": modes,
            "masks": masks,
            "dtypes": dtypes,
            "devices": devices,
            "head_dims": head_dims,
            "batches": batches,
            "kv_heads": kv_heads,
        }
    )
    base = base or AttnSpec()
    devices = devices or [base.device]
    shapes = _shapes(base, head_dims, batches, kv_heads)
    cases = []
    for name in list(variants) if variants else _runnable_defaults(devices):
        variant = get_variant(name)  # an unknown name raises here, whatever limit_slow says
        lens = default_lengths(variant, lengths) if limit_slow else list(lengths)
        for shape, device, dtype, mode, mask, length in itertools.product(
            shapes, devices, dtypes or [base.dtype], modes, masks, lens
        ):
            lengths_of = _lengths_of(workload, length, q_len)
            spec = shape.replace(**lengths_of, mode=mode, mask=mask, dtype=dtype, device=device)
            cases.append((name, spec))
    return cases


def _refuse_repeats(axes: dict[str, Sequence | None]) -> None:
    """Raise a ValueError naming the first axis of the grid that holds a value twice."""
    for name, values in axes.items():
        if values and (repeated := _repeated(values)):
            raise ValueError(
                f"{name}: {repeated} given more than once (each case is measured once)"
            )


def _shapes(
    base: AttnSpec,
    head_dims: Sequence[int] | None,
    batches: Sequence[int] | None,
    kv_heads: Sequence[int | None] | None,
) -> list[AttnSpec]:
    """``base`` at every head dim x batch x kv heads (None: the base spec's own)."""
    return [
        base.replace(head_dim=d, batch=b, kv_heads=h)
        for d in head_dims or [base.head_dim]
        for b in batches or [base.batch]
        for h in kv_heads or [base.kv_heads]
    ]


def _lengths_of(workload: str, length: int, q_len: int) -> dict[str, int]:
    """The spec fields a swept ``length`` sets.

    L = Lq = Lk for prefill; for decode, Lk (and Lq = ``q_len``).
    """
    return {"seq_len": length} if workload == "prefill" else {"seq_len": q_len, "seq_len_k": length}


def swept_length(spec: AttnSpec, workload: str) -> int:
    """The length a workload sweeps: L for prefill, the cache length Lk for decode.

    ``contract.SWEPT_LENGTH`` names the spec field it is.
    """
    return spec.lk if SWEPT_LENGTH[workload] == "seq_len_k" else spec.lq


_COUNT_BUDGET_S = 360.0
"""Predicted seconds under valgrind that ``attnbench run`` spends counting by default. The
prediction is cautious (a counted case takes less than predicted), so the counting, beside the
timed sweep, ends about when the sweep does."""


COUNT_SHARE = 0.5
"""After the timed sweep, counting may go on for this share of the sweep's wall time (at least
:data:`COUNT_FLOOR_S`): a run with counts takes about 1.5x its sweep, and what is not counted by
then is left for ``--resume --instructions``. Predicted valgrind seconds can be far off, so the
wall clock bounds the run, not the predictions."""
COUNT_FLOOR_S = 60.0
"""Seconds counting may always go on after the sweep: valgrind's start (torch imported
uninstrumented) takes tens of seconds, and a short sweep's counts are worth that."""


def count_wait_s(sweep_s: float) -> float:
    """Seconds the counts may take after a sweep of ``sweep_s`` (see :data:`COUNT_SHARE`)."""
    return max(COUNT_SHARE * sweep_s, COUNT_FLOOR_S)


def counted_cases(
    cases: Sequence[tuple[str, AttnSpec]], every: bool = False, budget_s: float = _COUNT_BUDGET_S
) -> list[tuple[str, AttnSpec]]:
    """The CPU cases ``attnbench run`` counts instructions for.

    With ``every``, all of them (``--instructions``); by default those of the headline figure's
    variants and one per family (:data:`~attnbench.contract.PROGRESSION`,
    :data:`~attnbench.contract.REPRESENTATIVES`), cheapest first while their predicted valgrind time
    fits ``budget_s``: every counted variant gets its short lengths, the long ones as the budget
    allows. They are returned cheapest first, the order they are counted in.
    """
    from attnbench.contract import DETERMINISTIC_POINTS, PROGRESSION, REPRESENTATIVES
    from attnbench.measure.instructions import (
        CountConfig,
        countable,
        peak_for,
        predicted_seconds,
        within_budget,
    )

    cpu = [(n, s) for n, s in cases if s.device_type == "cpu"]
    if every:
        return cpu
    wanted = [(n, s) for n, s in cpu if n in set(PROGRESSION) | set(REPRESENTATIVES.values())]
    left_out = within_budget(wanted, budget_s, first_per_variant=DETERMINISTIC_POINTS)
    chosen = [wanted[i] for i in countable(wanted) if i not in left_out]
    config = CountConfig()
    peak = peak_for(config)
    # cheapest first: a run that stops counting at its time limit has the most counts
    return sorted(chosen, key=lambda case: predicted_seconds(*case, config, peak))


def _to_frame(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """One row per measurement (the wide "run" schema)."""
    return pd.DataFrame([m.to_row() for m in measurements])


def new_run_dir(root: str | Path = "reports/runs") -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{stamp}-{socket.gethostname()}"


def empty_grid_reason(
    variants: Sequence[str] | None, lengths: Sequence[int], limit_slow: bool = True
) -> str:
    """Why :func:`grid` returned no cases (for the error message)."""
    names = list(variants) if variants else default_variants()
    if not names:
        return "no variants selected"
    if not lengths:
        return "no lengths selected"
    limited = [n for n in names if limit_slow and not default_lengths(get_variant(n), lengths)]
    if limited:
        verb = "runs" if len(limited) == 1 else "run"
        return (
            f"{', '.join(limited)} {verb} only at lengths <= 128 by default and none of "
            f"{list(lengths)} qualifies (add a length <= 128, or pass --no-limit)"
        )
    return "the grid is empty"


def _config_json(config: MeasureConfig) -> dict[str, Any]:
    return jsonable(dataclasses.asdict(config))


class RunDirError(ValueError, UsageError):
    """The run directory cannot be used as asked (a usage error: exit 2 on the command line)."""


def _named(path: str | Path) -> Path:
    """``path``, or a RunDirError for a name no system call takes (too long, a symlink loop)."""
    try:
        check_path(path, "--out")
    except ValueError as exc:
        raise RunDirError(str(exc)) from None
    return Path(path)


class RunWriteError(OSError, AttnbenchError):
    """Writing into the run directory failed (a full disk, a quota, a file size limit).

    What was logged before stays.
    """

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(exc.errno, f"cannot write {path}: {exc.strerror or exc}")
        self.path = path

    def line(self) -> str:
        return f"error: {self.strerror}"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _drop_torn_tail(path: Path) -> None:
    """Cut a torn last line (a kill or a power cut while it was written) off the log.

    Appending then continues the log after the last whole line instead of leaving the fragment
    inside.
    """
    if not path.exists():
        return
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        os.truncate(path, keep)


def _diff_config(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(_diff_config(a, b, f"{prefix}{key}."))
        elif a != b and not (
            isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
        ):
            out.append(f"{prefix}{key}: {a!r} in the log, {b!r} now")
    return out


def _case_label(key: str) -> str:
    name, spec = json.loads(key)
    lens = (
        f"L={spec['seq_len']}"
        if spec.get("seq_len_k") is None
        else f"Lq={spec['seq_len']} Lk={spec['seq_len_k']}"
    )
    return f"{name} {lens} {spec['dtype']} {spec['mode']} {spec['mask']} {spec['device']}"


def _new_header(
    conf: dict[str, Any],
    keys: list[str],
    command: Sequence[str] | None,
    peak_gflops: dict[str, float] | None,
    peak_gbps: dict[str, float] | None,
) -> dict[str, Any]:
    """A log's first line: the configuration, the planned cases' keys and the machine's roofs."""
    return {
        "kind": "header",
        "schema": LOG_SCHEMA,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": list(command if command is not None else sys.argv),
        "config": conf,
        "cases": keys,
        "planned": len(keys),
        "peak_gflops": peak_gflops,
        "peak_gbps": peak_gbps,
    }


def _check_resumable(
    old: dict[str, Any], conf: dict[str, Any], keys: list[str], run_dir: Path
) -> None:
    """Raise a RunDirError naming each difference between a logged header and the run asked for."""
    log_path = run_dir / LOG
    if old.get("schema", LOG_SCHEMA) != LOG_SCHEMA:
        raise RunDirError(
            f"--resume: {log_path} is in format {old.get('schema')!r}; this attnbench writes "
            f"{LOG_SCHEMA!r} and would mix the two (use the attnbench that wrote it, or --force)"
        )
    # a setting added since the log was written had its default then (e.g. workload "prefill")
    defaults = _config_json(MeasureConfig())
    old_conf = {
        **{k: v for k, v in defaults.items() if k not in old.get("config", {})},
        **old.get("config", {}),
    }
    problems = _diff_config(old_conf, conf)
    old_keys = old.get("cases", [])
    if sorted(old_keys) != sorted(keys):
        added = [k for k in keys if k not in set(old_keys)]
        removed = [k for k in old_keys if k not in set(keys)]
        detail = "; ".join(
            f"{what} {len(ks)}: {_case_labels(ks)}"
            for what, ks in (("not in the log", added), ("only in the log", removed))
            if ks
        )
        problems.insert(0, f"grid: {len(old_keys)} cases in the log, {len(keys)} now ({detail})")
    if problems:
        raise RunDirError(
            f"--resume: {run_dir} was measured with a different configuration: "
            + "; ".join(problems)
        )


def _case_labels(keys: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` cases of ``keys`` as labels, then ``...`` when there are more."""
    return ", ".join(_case_label(k) for k in keys[:shown]) + (", ..." if len(keys) > shown else "")


class RunDirectory:
    """A run directory opened for writing: checked, locked, and appended to case by case.

    Opening checks everything before any measurement: ``path`` is not a file, can be created and
    written, is not locked by another run, and is empty unless ``resume`` (continue its log) or
    ``force`` (remove the previous run's files) is given.

    Raises:
        RunDirError: naming the problem and the option that resolves it.
    """

    def __init__(self, path: str | Path, *, resume: bool = False, force: bool = False) -> None:
        self.path = _named(path)
        if resume and force:
            raise RunDirError(
                "--resume and --force exclude each other (continue the run, or replace it)"
            )
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"--out {self.path} is an existing file, not a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(
                f"--out {self.path} cannot be created: {exc.strerror or exc}"
            ) from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise RunDirError(f"--out {self.path} is not writable")
        try:
            # held until close()
            self._lock = open(self.path / _LOCK, "a+", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise RunDirError(f"--out {self.path} is not writable: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "unknown"
            self._lock.close()
            raise RunDirError(
                f"--out {self.path} is in use by another attnbench run (pid {holder})"
            ) from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"{os.getpid()}\n")
        self._lock.flush()
        try:
            others = sorted(p.name for p in self.path.iterdir() if p.name != _LOCK)
            if others and not (resume or force):
                shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
                raise RunDirError(
                    f"--out {self.path} is not empty ({shown}); pass --resume to continue that run "
                    "or --force to replace it"
                )
            if resume and others and not (self.path / LOG).exists():
                raise RunDirError(
                    f"--out {self.path} has no {LOG} to resume from (written by an older "
                    "attnbench, or not a run directory); use --force to replace it"
                )
            if force:
                for name in _RUN_FILES:
                    (self.path / name).unlink(missing_ok=True)
            self._remove_report()
        except BaseException:
            self.close()
            raise
        self.log = RunLog(None, (), ())
        self._counts: dict[str, Count] = {}
        self.notes: list[str] = []
        self.header: dict[str, Any] = {}
        self.measurements: list[Measurement] = []
        self._file = None

    def _remove_report(self) -> None:
        report = self.path / _REPORT
        if report.is_dir() and not report.is_symlink():
            shutil.rmtree(report)
        elif report.exists() or report.is_symlink():
            report.unlink()

    def start(
        self,
        config: MeasureConfig,
        cases: Sequence[tuple[str, AttnSpec]],
        *,
        command: Sequence[str] | None = None,
        peak_gflops: dict[str, float] | None = None,
        peak_gbps: dict[str, float] | None = None,
    ) -> list[tuple[str, AttnSpec]]:
        """Write (or, resuming, check) the header; return the cases still to measure, in order.

        Raises:
            RunDirError: resuming with a different grid or measurement configuration (each
                difference named).
        """
        keys = [case_key(n, s) for n, s in cases]
        conf = _config_json(config)
        log_path = self.path / LOG
        if log_path.exists():
            self.log = read_log(log_path)
            self.notes.extend(self.log.notes)
        if self.log.header is not None:
            _check_resumable(self.log.header, conf, keys, self.path)
            self.header = dict(self.log.header)
        else:
            self.header = _new_header(conf, keys, command, peak_gflops, peak_gbps)
            self._append_line(
                self.header, fresh=not log_path.exists() or log_path.stat().st_size == 0
            )
        self.header["seconds_before"] = self._seconds_before() if self.log.measurements else 0.0
        done: dict[str, Measurement] = {}
        wanted = set(keys)
        for m in self.log.measurements:
            key = case_key(m.variant, m.spec)
            if key in wanted:
                done[key] = m  # a case logged twice (never by this code) keeps its last row
        self.measurements = list(done.values())
        self._counts = dict(self.log.counts)
        self._peak = peak_gflops if peak_gflops is not None else self.header.get("peak_gflops")
        self._peak_gbps = peak_gbps if peak_gbps is not None else self.header.get("peak_gbps")
        return [(n, s) for (n, s), k in zip(cases, keys, strict=True) if k not in done]

    @property
    def peak_gflops(self) -> dict[str, float]:
        """The matmul roofs this run records, dtype -> GFLOP/s (empty when none was measured)."""
        return dict(self._peak or {})

    def remeasured_roof(self, peak_gflops: dict[str, float], reason: str) -> None:
        """Log a roof measured again after the sweep; it replaces the header's for these dtypes."""
        self._append_line({"kind": "roof", "peak_gflops": peak_gflops, "reason": reason})
        self._peak = {**(self._peak or {}), **peak_gflops}
        self.header["peak_gflops"] = self._peak

    def _seconds_before(self) -> float:
        """Seconds earlier sessions measured for, from the manifest (0 when it cannot be read)."""
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            return float(json.loads((self.path / MANIFEST).read_text()).get("seconds", 0.0))
        return 0.0

    def _append_line(self, item: dict[str, Any], fresh: bool = False) -> None:
        path = self.path / LOG
        try:
            if self._file is None:
                _drop_torn_tail(path)
                self._file = open(path, "ab")  # noqa: SIM115 - kept open for the sweep
                if fresh:
                    _fsync_dir(self.path)
            line = json.dumps(item).encode("utf-8") + b"\n"
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            self._drop_partial_line(path)
            raise RunWriteError(path, exc) from exc

    def _drop_partial_line(self, path: Path) -> None:
        """After a failed append, close the log and cut what part of the line reached it.

        The next session then appends after the last whole line.
        """
        with contextlib.suppress(OSError):
            if self._file is not None:
                self._file.close()
        self._file = None
        with contextlib.suppress(OSError):
            _drop_torn_tail(path)

    def add(self, measurement: Measurement, *, seconds: float | None = None) -> None:
        """Append one finished case durably, then refresh the derived files."""
        self._append_line({"kind": "case", "measurement": measurement_to_json(measurement)})
        self.measurements.append(
            attach(measurement, self._counts.get(case_key(measurement.variant, measurement.spec)))
        )
        self.write_derived(seconds=seconds)

    def add_count(self, count: Count, *, seconds: float | None = None) -> None:
        """Append one case's instruction count durably, attach it and refresh the derived files.

        Counts come beside the timed sweep, in any order; the count is attached to the case's
        measurement if that is logged.
        """
        key = case_key(count.variant, count.spec)
        self._append_line({"kind": "count", "case": key, "count": count_to_json(count)})
        self._counts[key] = count
        self.measurements = [
            attach(m, count) if case_key(m.variant, m.spec) == key else m for m in self.measurements
        ]
        self.write_derived(seconds=seconds)

    @property
    def counted(self) -> frozenset[str]:
        """Case keys whose instruction count is logged."""
        return frozenset(self._counts)

    @property
    def planned(self) -> int:
        return int(self.header.get("planned", len(self.measurements)))

    @property
    def complete(self) -> bool:
        return len(self.measurements) >= self.planned

    def write_derived(self, *, seconds: float | None = None) -> Path:
        """Rewrite ``measurements.csv`` and ``manifest.json`` from the cases logged so far.

        Each is written atomically.
        """
        total = self.header.get("seconds_before", 0.0) + (seconds or 0.0)
        try:
            _write_derived(
                self.path,
                self.measurements,
                self.header,
                seconds=total,
                peak_gflops=self._peak,
                peak_gbps=self._peak_gbps,
            )
        except OSError as exc:
            raise RunWriteError(self.path, exc) from exc
        return self.path

    def finish(self, seconds: float) -> None:
        """Record this session's duration (for a later --resume) and write the derived files."""
        self.write_derived(seconds=seconds)

    def close(self) -> None:
        """Close the log and release the lock."""
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None
        lock = getattr(self, "_lock", None)
        if lock is not None and not lock.closed:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_derived(
    run_dir: Path,
    measurements: Sequence[Measurement],
    header: dict[str, Any],
    *,
    seconds: float,
    peak_gflops: dict[str, float] | None,
    peak_gbps: dict[str, float] | None = None,
) -> None:
    frame = _to_frame(measurements)
    atomic_write(run_dir / MEASUREMENTS, lambda tmp: frame.to_csv(tmp, index=False))
    env = next((m.env for m in measurements if m.env is not None), None)
    planned = int(header.get("planned", len(measurements)))
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "created": header.get("created") or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": header.get("command", list(sys.argv)),
        "seconds": round(seconds, 2),
        "peak_gflops": peak_gflops,
        "peak_gbps": peak_gbps,
        "cases": len(measurements),
        "planned": planned,
        "complete": len(measurements) >= planned,
        "log": LOG,
        "statuses": frame["status"].value_counts().to_dict() if len(frame) else {},
        "environment": dataclasses.asdict(env) if env else {},
        "config": header.get("config", {}),
    }
    atomic_write_text(run_dir / MANIFEST, json.dumps(manifest, indent=2))


def write_run(
    run_dir: str | Path,
    measurements: Sequence[Measurement],
    config: MeasureConfig,
    *,
    seconds: float,
    command: Sequence[str] | None = None,
    peak_gflops: dict[str, float] | None = None,
    peak_gbps: dict[str, float] | None = None,
) -> Path:
    """Write a complete run directory for finished ``measurements``.

    For library use; the CLI logs as it goes. Writes ``cases.jsonl``, then ``measurements.csv`` and
    ``manifest.json`` atomically. ``peak_gflops`` maps dtype -> this machine's matmul GFLOP/s (the
    roof for % of peak); ``peak_gbps`` its measured memory bandwidth in GB/s,
    ``{"copy": ..., "triad": ...}`` (triad is the roofline's roof).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    keys = [case_key(m.variant, m.spec) for m in measurements]
    header = _new_header(_config_json(config), keys, command, peak_gflops, peak_gbps)
    lines = [json.dumps(header)] + [
        json.dumps({"kind": "case", "measurement": measurement_to_json(m)}) for m in measurements
    ]
    atomic_write_text(run_dir / LOG, "\n".join(lines) + "\n")
    _write_derived(
        run_dir, measurements, header, seconds=seconds, peak_gflops=peak_gflops, peak_gbps=peak_gbps
    )
    return run_dir
