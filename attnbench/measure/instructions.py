"""Instruction counts under valgrind: a deterministic measure of work, beside wall time.

Wall time moves with whatever else the machine does; the number of instructions a call executes does
not. :func:`count_instructions` counts many cases in ONE ``valgrind --tool=callgrind`` process
(starting torch under valgrind takes one to three minutes): the process is started with collection
off, and for each case it builds the very closure the runner times (:func:`attnbench.measure.runner.make_call`),
makes the warm-up call, puts its result through the correctness gate, warms up again, then switches
collection on for ``calls`` calls and dumps (``torch._C._valgrind_toggle`` /
``_valgrind_toggle_and_dump_stats``). Instructions per call = the dump's total / ``calls``.

What counts do not see: cache misses, page faults, memory bandwidth, and time spent waiting (for
memory, for other threads: counts are summed over threads). A change that only moves data worse is
flat in counts and slower in time; the two are shown side by side, never one instead of the other.

Counts are taken with portable kernels (:data:`COUNT_ENV`): MKL's SSE4.2 code and ATen's default
(unvectorised-dispatch) kernels. Valgrind runs FMA instructions through slow helpers: a batched
attention call at B1 H8 L512 took 15.9 s under callgrind with the host's AVX2/FMA kernels and 1.27 s
with these (0.02 s natively), and one fixed instruction set makes a count the same on every x86 runner,
whatever its vector units. The count is the work the code does on that portable path; the host's
fastest kernels are what the timings measure.

Measured on this project's 2-core machine (valgrind 3.19, torch 2.13 CPU, one thread): torch starts
under callgrind in about a minute (quiet) to three (busy), and a counted call runs about
:data:`SLOWDOWN` times slower than natively, which the budget check uses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.measure.record import Measurement
from attnbench.spec import AttnSpec

PACKAGE = "valgrind"
"""The Debian package (and the command) a count needs."""
METHOD = "callgrind"
SLOWDOWN = 80.0
"""Seconds under callgrind per native second of a counted call, portable kernels (measured about 60x at L=512)."""
COUNT_ENV = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
"""The counting process's kernels: one portable instruction set (see the module docstring)."""
KERNELS = "portable kernels: MKL SSE4.2, ATen default"
"""How the counts' kernels are recorded beside valgrind's version."""
STARTUP_S = 240.0
"""Allowed for torch to start under valgrind (measured 80-180 s) before the cases' own time."""
GATE_SLICES = 3
"""(batch, head) slices the gate checks under valgrind (the first, the last and a seeded one): the float64
reference is the slowest part of a case there, and the timing run checks every slice of the same closure."""
_SUMMARY = re.compile(rb"^summary:\s+(\d+)", re.MULTILINE)


def valgrind_version() -> str | None:
    """``"valgrind-3.19.0"``, or None when valgrind is not on PATH (or does not answer)."""
    exe = shutil.which("valgrind")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def missing_message() -> str:
    """What to tell a user without valgrind."""
    return f"instruction counts need valgrind on PATH: install the {PACKAGE} package (apt-get install {PACKAGE})"


@dataclass(frozen=True)
class CountConfig:
    """How cases are counted."""

    calls: int = 2  # counted calls per case (their total / calls is the count per call; counts are deterministic)
    warmup_calls: int = 1  # calls after the gate and before counting (the first case of a process counts 0.8% more cold)
    budget_s: float = 300.0  # predicted seconds under valgrind per case above which it is skipped
    timeout_s: float | None = None  # the whole valgrind process (None: STARTUP_S + the cases' predicted seconds x 3)
    threads: int = 1  # torch intra-op threads (the runner's default regime)
    seed: int = 0  # input seed (the runner's)
    check_accuracy: bool = True  # put each case's warm-up result through the correctness gate

    def __post_init__(self) -> None:
        for name in ("calls", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.warmup_calls, bool) or not isinstance(self.warmup_calls, int) or self.warmup_calls < 0:
            raise ValueError(f"warmup_calls must be an int >= 0, got {self.warmup_calls!r}")
        if not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise ValueError(f"budget_s must be a finite number of seconds > 0, got {self.budget_s!r}")
        if self.timeout_s is not None and not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s must be a finite number of seconds > 0 or None, got {self.timeout_s!r}")


@dataclass(frozen=True)
class Count:
    """One case's count: instructions per call, or why there is none."""

    variant: str
    spec: AttnSpec
    status: str  # "ok", "skipped" (unsupported, over budget, not on CPU), "wrong" (failed the gate), "error"
    instructions: float = math.nan  # per call
    calls: int = 0  # calls counted
    reason: str = ""
    valgrind: str = ""  # valgrind's version


def attach(measurement: Measurement, count: Count | None) -> Measurement:
    """``measurement`` with ``count``'s instructions per call (and valgrind's version in ``extra``); without an ok
    count, the reason there is none in ``extra["instructions_note"]``."""
    if count is None:
        return measurement
    if count.status == "ok":
        return dataclasses.replace(measurement, instructions=count.instructions,
                                   extra={**measurement.extra, "valgrind": count.valgrind})
    return dataclasses.replace(measurement, extra={**measurement.extra, "instructions_note": f"{count.status}: {count.reason}"})


class CountError(RuntimeError):
    """The valgrind process could not be started or gave nothing (the message carries the end of its output)."""


def predicted_seconds(variant: str, spec: AttnSpec, config: CountConfig, peak_flops: float) -> float:
    """Seconds a case is predicted to take under valgrind: its calls (warm-up, counted) and the correctness gate on
    :data:`GATE_SLICES` slices, x :data:`SLOWDOWN`."""
    from attnbench.measure import guard
    from attnbench.registry import get_variant

    impl = get_variant(variant)
    per_call = guard.predicted_seconds(impl, spec, peak_flops)
    gate = guard.reference_seconds(impl, spec, min(GATE_SLICES, spec.batch * spec.heads), peak_flops) if config.check_accuracy else 0.0
    return (per_call * (1 + config.warmup_calls + config.calls) + gate) * SLOWDOWN


def _plan(cases: Sequence[tuple[str, AttnSpec]], config: CountConfig, version: str) -> tuple[list[int], list[Count | None]]:
    """Which cases go to valgrind (their indices), and the decided counts of the others (skipped, with the reason)."""
    from attnbench.measure.peak import matmul_peak
    from attnbench.registry import get_variant

    peak = matmul_peak("cpu", "float32")
    todo, decided = [], []
    for i, (name, spec) in enumerate(cases):
        reasons = []
        if spec.device_type != "cpu":
            reasons.append(f"instruction counts are taken on the CPU only (this case is on {spec.device})")
        else:
            reasons += get_variant(name).not_supported_reasons(spec)
            if not reasons:
                seconds = predicted_seconds(name, spec, config, peak)
                if seconds > config.budget_s:
                    reasons.append(f"predicted {seconds:,.0f} s under valgrind > budget {config.budget_s:g} s")
        if reasons:
            decided.append(Count(name, spec, "skipped", reason="; ".join(reasons), valgrind=version))
        else:
            decided.append(None)
            todo.append(i)
    return todo, decided


def count_instructions(
    cases: Sequence[tuple[str, AttnSpec]],
    config: CountConfig | None = None,
    *,
    progress: Callable[[int, int, Count], None] | None = None,
) -> list[Count]:
    """Instructions per call of every case, counted in one valgrind process (see the module docstring).

    Args:
        cases: ``(variant name, spec)`` pairs (names are checked before anything runs).
        config: calls, warm-up, budget, timeout, regime.
        progress: called as ``progress(done, total, count)`` as each case finishes (from this process).

    Returns:
        One :class:`Count` per case, in order. A case the process did not reach (a crash, the timeout)
        has status "error" with the reason; the counts it dumped before are kept.

    Raises:
        CountError: valgrind is missing, or the process gave no count at all (its output's end named).
        ValueError: an unknown variant name.
    """
    from attnbench.registry import get_variant

    config = config or CountConfig()
    cases = list(cases)
    for name, _ in cases:
        get_variant(name)
    version = valgrind_version()
    if version is None:
        raise CountError(missing_message())
    version = f"{version} ({KERNELS})"
    todo, counts = _plan(cases, config, version)
    if todo:
        for i, count in _run_valgrind([cases[i] for i in todo], config, version, todo, progress, len(cases)):
            counts[i] = count
    return [c if c is not None else Count(*cases[i], "error", reason="not reached", valgrind=version)
            for i, c in enumerate(counts)]


def _timeout(cases: Sequence[tuple[str, AttnSpec]], config: CountConfig) -> float:
    if config.timeout_s is not None:
        return config.timeout_s
    from attnbench.measure.peak import matmul_peak

    peak = matmul_peak("cpu", "float32")
    return STARTUP_S + 10 * sum(predicted_seconds(n, s, config, peak) for n, s in cases) + 120 * len(cases)


def _run_valgrind(cases, config: CountConfig, version: str, indices: list[int], progress, total: int):
    """Yield ``(index in the caller's list, Count)`` as the child reports them, then the rest at its end."""
    with tempfile.TemporaryDirectory(prefix="attnbench-callgrind-") as tmp:
        tmp = Path(tmp)
        jobs, results, out = tmp / "jobs.json", tmp / "results.jsonl", tmp / "callgrind.out"
        jobs.write_text(json.dumps({"config": dataclasses.asdict(config), "sys_path": sys.path,
                                    "cases": [[n, dataclasses.asdict(s)] for n, s in cases]}))
        command = [shutil.which("valgrind") or PACKAGE, "--tool=callgrind", "--collect-atstart=no",
                   f"--callgrind-out-file={out}", sys.executable, "-m", "attnbench.measure.instructions",
                   str(jobs), str(results)]
        log = open(tmp / "valgrind.log", "wb")  # noqa: SIM115 - closed below, after the process ends
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONHASHSEED": "0", **COUNT_ENV})
        deadline = time.monotonic() + _timeout(cases, config)
        seen, reported = 0, {}
        try:
            while True:
                finished = proc.poll() is not None
                for rec in _read_results(results)[seen:]:
                    seen += 1
                    count = _count_of(rec, cases, out, version, config)
                    reported[rec["index"]] = count
                    if progress is not None:
                        progress(len(reported), total, count)
                if finished:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        tail = (tmp / "valgrind.log").read_bytes().decode("utf-8", "replace").strip().splitlines()[-15:]
        ended = "timed out" if proc.returncode in (-9, 137) and time.monotonic() > deadline else f"exited {proc.returncode}"
        if not reported and proc.returncode != 0:
            raise CountError(f"the valgrind process {ended} before counting anything:\n  " + "\n  ".join(tail))
        for k, (name, spec) in enumerate(cases):
            count = reported.get(k) or Count(name, spec, "error", valgrind=version,
                                             reason=f"not counted: the valgrind process {ended} before this case")
            yield indices[k], count


def _read_results(path: Path) -> list[dict]:
    """The child's finished cases so far (a torn last line is left for the next read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _count_of(rec: dict, cases, out: Path, version: str, config: CountConfig) -> Count:
    name, spec = cases[rec["index"]]
    if rec["status"] != "ok":
        return Count(name, spec, rec["status"], reason=rec.get("reason", ""), valgrind=version)
    dump = Path(f"{out}.{rec['dump']}")
    try:
        match = _SUMMARY.search(dump.read_bytes())
    except OSError as exc:
        return Count(name, spec, "error", reason=f"callgrind dump {dump.name} unreadable ({exc})", valgrind=version)
    if match is None:
        return Count(name, spec, "error", reason=f"callgrind dump {dump.name} has no summary line", valgrind=version)
    return Count(name, spec, "ok", instructions=int(match[1]) / config.calls, calls=config.calls, valgrind=version)


# ---- the child: runs under valgrind ---------------------------------------------------------------
def _child(jobs_path: str, results_path: str) -> None:
    """Count every case of the job file; report each to the results file (one JSON line, flushed)."""
    jobs = json.loads(Path(jobs_path).read_text())
    sys.path[:] = jobs["sys_path"]
    import torch

    from attnbench.io import append_line, error_line
    from attnbench.measure import gate, regime, runner
    from attnbench.plugins import load_plugins
    from attnbench.registry import get_variant

    load_plugins()
    config = CountConfig(**jobs["config"])
    regime.apply(regime.Regime(threads=config.threads))
    dumps = 0
    for index, (name, spec_fields) in enumerate(jobs["cases"]):
        record: dict = {"index": index}
        counting = False
        try:
            t0 = time.perf_counter()
            spec = AttnSpec(**spec_fields)
            variant = get_variant(name)
            # the gate on GATE_SLICES slices: a reference budget of that many slices (checked_slices samples them)
            measure_config = runner.MeasureConfig(seed=config.seed, check_accuracy=config.check_accuracy,
                                                  reference_budget_bytes=GATE_SLICES * gate.slice_reference_bytes(variant, spec))
            call, inputs, mask = runner.make_call(variant, spec, config.seed)
            result, _ = variant.warm_up(call)
            checked = runner.run_gate(variant, spec, result, inputs, mask, runner.check_plan(variant, spec, measure_config),
                                      config.seed)
            del result
            record["gate_s"] = round(time.perf_counter() - t0, 1)
            if checked is not None and not checked.passed:
                record.update(status="wrong", reason=checked.reason())
            else:
                for _ in range(config.warmup_calls):
                    call()
                torch._C._valgrind_toggle()
                counting = True
                for _ in range(config.calls):
                    call()
                torch._C._valgrind_toggle_and_dump_stats()
                counting = False
                dumps += 1
                record.update(status="ok", dump=dumps, seconds=round(time.perf_counter() - t0, 1))
        except Exception as exc:  # noqa: BLE001 - one case's failure is its row, the others are still counted
            if counting:  # close this case's dump, so the next case's is its own
                torch._C._valgrind_toggle_and_dump_stats()
                dumps += 1
            record.update(status="error", reason=error_line(exc))
        append_line(results_path, json.dumps(record))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
