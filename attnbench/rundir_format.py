"""A run directory's format on disk: its file names and schemas, and reading its case log.

``attnbench run`` writes (:mod:`attnbench.runs`) and the analysis reads
(:mod:`attnbench.analysis.rundir`) what is defined here:
  * ``cases.jsonl`` (:data:`LOG`, format :data:`LOG_SCHEMA`): a header line, then one line per
    finished case (``{"kind": "case", "measurement": ...}``) or instruction count
    (``{"kind": "count", "case": <case key>, "count": ...}``), and a roof measured again after
    the sweep (``{"kind": "roof", "peak_gflops": {dtype: GFLOP/s}, "reason": ...}``: it replaces
    the header's); :func:`read_log` reads it back.
  * ``measurements.csv`` (:data:`MEASUREMENTS`) and ``manifest.json`` (:data:`MANIFEST`, format
    :data:`MANIFEST_SCHEMA`), derived from the log.

Nothing here measures or starts a process.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from attnbench.contract import Status
from attnbench.io import error_line
from attnbench.measure.record import STATUSES, Count, Environment, Measurement, attach
from attnbench.spec import AttnSpec

__all__ = [
    "MEASUREMENTS",
    "MANIFEST",
    "LOG",
    "LOG_SCHEMA",
    "MANIFEST_SCHEMA",
    "RunLog",
    "case_key",
    "jsonable",
    "measurement_to_json",
    "read_log",
    "count_to_json",
    "count_from_json",
]

MEASUREMENTS = "measurements.csv"
MANIFEST = "manifest.json"
LOG = "cases.jsonl"
LOG_SCHEMA = "attnbench.log/1"
MANIFEST_SCHEMA = "attnbench.run/1"


_LATER_FIELDS = {"kv_heads": None}
"""Spec fields added after run logs existed, and their defaults: left out of a key at that default,
so a log written before them keeps its case keys (and can be resumed)."""


def case_key(variant: str, spec: AttnSpec) -> str:
    """Stable identity of a case across processes and sessions (sorted JSON of name and spec)."""
    fields = {
        k: v
        for k, v in dataclasses.asdict(spec).items()
        if k not in _LATER_FIELDS or v != _LATER_FIELDS[k]
    }
    return json.dumps([variant, fields], sort_keys=True)


def jsonable(value: Any) -> Any:
    """``value`` as JSON gives it back (what JSON cannot hold, as its ``str``)."""
    return json.loads(json.dumps(value, default=str))


def measurement_to_json(m: Measurement) -> dict[str, Any]:
    """A Measurement as a JSON-able dict (inverse: :func:`_measurement_from_json`)."""
    return jsonable(dataclasses.asdict(m))


def _measurement_from_json(data: dict[str, Any]) -> Measurement:
    """Rebuild a Measurement from :func:`measurement_to_json`; unknown keys are ignored.

    Raises:
        ValueError, TypeError, KeyError: a record that is not one (a field of the wrong type, a
            spec or status the classes reject), with the field named.
    """
    known = {f.name: f.type for f in dataclasses.fields(Measurement)}
    missing = [
        f.name
        for f in dataclasses.fields(Measurement)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in data
    ]
    if missing:
        raise ValueError(f"no {', '.join(repr(m) for m in missing)} field")
    fields = {k: v for k, v in data.items() if k in known}
    for name, kind in known.items():  # JSON gives any type: a number field must hold a number
        value = fields.get(name)
        if kind in ("int", "float") and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} {str(value)[:40]!r} is not a number")
            if kind == "float":
                fields[name] = _float(name, value)
    if not isinstance(data.get("spec"), dict):
        raise ValueError(f"spec {data.get('spec')!r} is not a mapping")
    fields["spec"] = AttnSpec(**data["spec"])
    env = data.get("env")
    if env:
        env_known = {f.name for f in dataclasses.fields(Environment)}
        fields["env"] = Environment(**{k: v for k, v in env.items() if k in env_known})
    samples = data.get("samples", ())
    if not isinstance(samples, list) or any(
        isinstance(s, bool) or not isinstance(s, (int, float)) for s in samples
    ):
        raise ValueError(f"samples {str(samples)[:60]} is not a list of numbers")
    fields["samples"] = tuple(_float("samples", s) for s in samples)
    if not all(math.isfinite(s) and s >= 0 for s in fields["samples"]):
        bad = next(s for s in fields["samples"] if not (math.isfinite(s) and s >= 0))
        raise ValueError(f"samples hold {bad!r} (a time is a finite number of seconds >= 0)")
    fields["extra"] = dict(data.get("extra") or {})
    return Measurement(**fields)


def _float(name: str, value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ValueError(
            f"{name} {str(value)[:20]}... ({len(str(value))} digits) is too large for a float"
        ) from None


@dataclasses.dataclass(frozen=True)
class RunLog:
    """What a ``cases.jsonl`` holds."""

    # configuration and planned grid; None for an empty or header-less log
    header: dict[str, Any] | None
    measurements: tuple[Measurement, ...]  # finished cases in the order they finished
    # every line ignored, and why (a torn last line from a kill, a garbled line)
    notes: tuple[str, ...]
    # those of the notes that are not a torn last line: garbled, or a record the classes refuse
    rejected: tuple[str, ...] = ()
    # case key -> its logged instruction count (already attached to the case's measurement)
    counts: dict[str, Count] = dataclasses.field(default_factory=dict)


def read_log(path: str | Path) -> RunLog:
    """Read a run log; unreadable lines are skipped with the reason, never an exception.

    Raises:
        OSError: the file cannot be read at all.
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    header, found, notes, rejected, counts, roof = None, [], [], [], {}, {}
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    torn = lines[-1].strip() != b""  # a complete log ends with a line end
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw.decode("utf-8"))
            if not isinstance(item, dict):
                raise ValueError(f"a JSON {type(item).__name__}, not an object")
            if item.get("kind") == "header":
                header = header or item
            elif item.get("kind") == "case":
                found.append(_measurement_from_json(item["measurement"]))
            elif item.get("kind") == "count":
                counts[str(item["case"])] = count_from_json(item["count"])
            elif item.get("kind") == "roof":
                roof.update(_roof_from_json(item))
            else:
                raise ValueError(f"unknown kind {item.get('kind')!r}")
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            if i == last and torn:
                notes.append(
                    f"{path}: torn last line (the run was killed while writing it), "
                    f"ignored ({len(raw)} bytes)"
                )
            else:
                rejected.append(f"{path}: line {i + 1} unreadable ({error_line(exc)}), ignored")
                notes.append(rejected[-1])
    # a count may be logged before its case
    found = [attach(m, counts.get(case_key(m.variant, m.spec))) for m in found]
    if header is not None and roof:
        header = {**header, "peak_gflops": {**(header.get("peak_gflops") or {}), **roof}}
    return RunLog(
        header=header,
        measurements=tuple(found),
        notes=tuple(notes),
        rejected=tuple(rejected),
        counts=counts,
    )


def _roof_from_json(item: dict[str, Any]) -> dict[str, float]:
    """The dtype -> GFLOP/s of a ``roof`` line.

    Raises:
        ValueError, TypeError: not a mapping of dtype names to positive numbers.
    """
    peaks = item["peak_gflops"]
    if not isinstance(peaks, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in peaks.items()
    ):
        raise ValueError(f"a roof line's peak_gflops must map dtypes to GFLOP/s, got {peaks!r:.80}")
    return {k: float(v) for k, v in peaks.items()}


def count_to_json(count: Count) -> dict[str, Any]:
    """An instruction count as a log line's ``count`` (its case is named by the line's key)."""
    return {
        "status": count.status,
        "instructions": count.instructions,
        "calls": count.calls,
        "reason": count.reason,
        "valgrind": count.valgrind,
    }


def count_from_json(data: dict[str, Any]) -> Count:
    """The :class:`Count` of a log line (its case's name and spec are not needed to attach it).

    Raises:
        ValueError: a field of the wrong type.
    """
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        raise ValueError(f"count {str(data)[:60]} has no status")
    if data["status"] not in STATUSES:
        raise ValueError(
            f"count status must be one of {tuple(map(str, STATUSES))}, got {data['status']!r}"
        )
    instructions = data.get("instructions", math.nan)
    if instructions is None:
        instructions = math.nan
    if isinstance(instructions, bool) or not isinstance(instructions, (int, float)):
        raise ValueError(f"count instructions {instructions!r} is not a number")
    return Count(
        "",
        AttnSpec(),
        Status(data["status"]),
        instructions=_float("instructions", instructions),
        calls=int(data.get("calls", 0)),
        reason=str(data.get("reason", "")),
        valgrind=str(data.get("valgrind", "")),
    )
