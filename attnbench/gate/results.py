"""The gate's results: asv's result files and samples, the time rounds' probe log, its verdicts.

Reading only (asv's own reader, :func:`attnbench.analysis.frame.load_asv`), and the one file the
gate writes beside asv's results (:func:`write_verdicts`); no process is started here.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis.frame import decode_param, load_asv
from attnbench.errors import CouldNotMeasure
from attnbench.gate.decision import CASE_KEY_DEFAULTS, Outcome, SampleKey
from attnbench.io import atomic_write
from attnbench.plugins import PLUGINS_ENV

__all__ = [
    "RegressError",
    "SESSION_MARK",
    "load_results",
    "read_corrected",
    "read_probes",
    "read_time_samples",
    "suite_failure",
    "write_verdicts",
]


class RegressError(RuntimeError, CouldNotMeasure):
    """The comparison could not be made (exit code 3)."""


def read_time_samples(results_dir: str | Path, machine: str) -> dict[SampleKey, list[float]]:
    """Recorded timing samples of ``time_attention`` per (commit, variant, seq_len, device, mode).

    Read with :meth:`asv.results.Results.get_result_samples` (asv keeps them with
    ``--record-samples``; ``--append-samples`` adds a later round's to the same list). Parameter
    sets without samples are absent.
    """
    from asv import util
    from asv.results import Results

    results_dir = Path(results_dir)
    benchmarks = util.load_json(str(results_dir / "benchmarks.json"), api_version=2)
    out: dict[SampleKey, list[float]] = {}
    for path in sorted((results_dir / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        res = Results.load(str(path))
        for key in res.get_result_keys(benchmarks):
            if not key.endswith(contract.TIME_BENCHMARK):
                continue
            names = benchmarks[key].get("param_names", [])
            params = res.get_result_params(key)
            samples = res.get_result_samples(key, params)
            for combo, got in zip(itertools.product(*params), samples, strict=True):
                case = dict(zip(names, (decode_param(p) for p in combo), strict=True))
                if got:
                    key = SampleKey(
                        res.commit_hash, *(case.get(c, d) for c, d in CASE_KEY_DEFAULTS.items())
                    )
                    out.setdefault(key, []).extend(float(x) for x in got if x is not None)
    return out


def _log_lines(path: str | Path) -> Iterator[tuple[SampleKey, dict]]:
    """The lines of the gate's probe log with their case; garbled ones (a killed writer) skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        try:
            rec = json.loads(line)
            yield SampleKey(*(rec[name] for name in SampleKey._fields)), rec
        except (ValueError, KeyError, TypeError):
            continue


def _value(rec: dict, field: str) -> float:
    """``rec[field]`` as a finite number >= 0, else NaN."""
    try:
        value = float(rec[field])
    except (KeyError, TypeError, ValueError):
        return math.nan
    return value if value >= 0 and math.isfinite(value) else math.nan


def read_probes(path: str | Path, field: str = "probe_s") -> dict[SampleKey, list[float]]:
    """The calibration probes the time benchmarks recorded, per case (or another ``field``).

    The log is :func:`attnbench.asv_bench.timed_teardown`'s; ``field="runqueue_share"`` gives the
    samples' run-queue shares. A garbled line or a missing value is skipped; a missing file gives
    none.
    """
    out: dict[SampleKey, list[float]] = {}
    for key, rec in _log_lines(path):
        if not math.isnan(value := _value(rec, field)):
            out.setdefault(key, []).append(value)
    return out


def read_corrected(path: str | Path) -> dict[SampleKey, list[float]]:
    """Per case, each time sample divided by the probe timed just before it: ``sample_s / probe_s``.

    The lines are :func:`attnbench.asv_bench.timed_teardown`'s; each quotient is the sample at the
    machine's speed of that moment.
    A shared machine's speed can step for seconds to minutes at a time (a host neighbour: every
    probe and sample of those moments move together, and nothing waits in the run queue), so rounds
    of BASE and HEAD measured in different moments differ with nothing changed. Divided by its probe
    a compute-bound sample does not; a memory-bound one follows the probe less, so a verdict needs
    these and the samples as measured to agree. Lines without a sample (a commit that logged probes
    only) are skipped.
    """
    out: dict[SampleKey, list[float]] = {}
    for key, rec in _log_lines(path):
        sample, probe_s = _value(rec, "sample_s"), _value(rec, "probe_s")
        if sample > 0 and probe_s > 0:
            out.setdefault(key, []).append(sample / probe_s)
    return out


def write_verdicts(outcome: Outcome) -> Path:
    """Write the gate's table beside asv's results (:data:`contract.GATE_VERDICTS`).

    A report of the same results then knows what the gate knew: a time case it could not decide
    (noisy, waiting for a core, the machine's speed moved) is drawn hollow and never compared there.
    Not a ``.json``: asv reads those as results.
    """
    path = Path(outcome.results_dir) / contract.GATE_VERDICTS
    table = outcome.table.assign(base=outcome.base, head=outcome.head)
    atomic_write(path, lambda tmp: table.to_csv(tmp, index=False))
    return path


def load_results(
    work: Path, machine: str, commits: list[str], log: Path
) -> tuple[pd.DataFrame, ...]:
    """``(frame, samples)`` of this gate run, for :func:`compare`; each commit must have some."""
    frame = load_asv(work / "results").frame
    frame = frame[frame["machine"] == machine]
    missing = [c for c in commits if c not in set(frame["commit"])]
    if missing:
        named = ", ".join(m[:10] for m in missing)
        try:
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = ["(log unreadable)"]
        why = suite_failure(lines)
        if why is not None:
            raise RegressError(
                f"asv could not build {named} or import the benchmark suite with it: {why}\n"
                "(asv imports benchmarks/ from the working tree, and the modules named in "
                f"{PLUGINS_ENV} from the commit it built and installed; full log: {log})"
            )
        tail = "\n".join(f"  {line}" for line in lines[-25:])
        raise RegressError(f"asv produced no results for {named}; the end of {log}:\n{tail}")
    return frame, read_time_samples(work / "results", machine)


_SUITE_FAILED = "Failed to build the project and import the benchmark suite"
"""asv's line (0.6.6) where building a commit, installing it or discovering its suite failed."""
SESSION_MARK = "# attnbench: an asv session starts"
"""Written to asv's log as a session opens: the log is kept across runs, a failure is this run's."""
_STAMP = re.compile(r"^\[\s*\d+(?:\.\d+)? s\]\s?")
"""The seconds the gate stamps on each line of asv's log."""


def suite_failure(log_lines: list[str]) -> str | None:
    """Why asv could not build the project or import the suite, as one line (None: it could).

    The last line asv printed of the failed command before its "Last error" line: for an import,
    the exception (``ValueError: plugin module 'x' could not be imported: ...``), not its
    traceback; for a build, the build tool's last word.
    """
    starts = [i for i, line in enumerate(log_lines) if line.startswith(SESSION_MARK)]
    log_lines = log_lines[starts[-1] :] if starts else log_lines
    ends = [i for i, line in enumerate(log_lines) if _SUITE_FAILED in line]
    if not ends:
        return None
    end = ends[-1]
    last = next(
        (i for i in range(end, -1, -1) if "Last error:" in log_lines[i]),
        end,
    )
    for line in reversed(log_lines[:last]):
        text = _STAMP.sub("", line).strip()
        if text and not text.startswith(("STDOUT", "STDERR", "File ", "^")):
            return text
    return "see the log"
