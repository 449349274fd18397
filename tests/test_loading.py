"""Report loading under attack: a battery of corrupt inputs, each named, the good sources kept.

Every case plants one fault in a copy of a good run directory or a good asv results directory,
then loads it beside an untouched good run: the fault must be named (path and reason) in the
problems, the good run's rows must all still load, no exception may escape, and no ``ok`` row may
hold a missing or zero value. The CLI then has to exit 0 when a report with data was built and 1
when nothing could be loaded, with the reasons on stderr.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import attnbench
from attnbench.analysis.frame import load, load_asv
from attnbench.analysis.rundir import load_run
from attnbench.cli import main
from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import Environment, Measurement
from attnbench.rundir_format import (
    LOG,
    LOG_SCHEMA,
    MANIFEST,
    MANIFEST_SCHEMA,
    MEASUREMENTS,
    case_key,
)
from attnbench.runs import RunDirectory, RunDirError, write_run
from attnbench.spec import AttnSpec

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"
BASE = AttnSpec(batch=1, heads=2, head_dim=16)


def _env(host: str) -> Environment:
    return Environment(
        hostname=host,
        python="3.11",
        torch="2.x",
        threads=1,
        cpu_model="test cpu",
        cpu_count=2,
        device_name="test cpu",
    )


def measurements(host: str = "bad-box") -> list[Measurement]:
    """Five cases that never ran anything: batched at four lengths (one chunked among them) and a skip."""
    out = []
    for n in (64, 128, 256, 512):
        t = 1e-6 * n * n / 64
        out.append(
            Measurement(
                variant="batched",
                spec=BASE.replace(seq_len=n),
                status="ok",
                samples=(t, t * 1.01, t * 0.99),
                runs=3,
                timing_method="wall",
                peak_tensor_bytes=float(8 * n * n),
                memory_method="profiler",
                predicted_peak_bytes=float(8 * n * n),
                max_error=1e-7,
                tolerance=1e-5,
                env=_env(host),
            )
        )
    out.append(
        Measurement(
            variant="sdpa_cudnn",
            spec=BASE.replace(seq_len=64),
            status="skipped",
            reason="cuda only",
            env=_env(host),
        )
    )
    return out


def write_good_run(path: Path, host: str = "bad-box", **manifest_fields) -> Path:
    """A run of :func:`measurements`; ``planned`` also makes its log's header plan that many cases (as a stopped sweep's)."""
    run = write_run(
        path,
        measurements(host),
        MeasureConfig(),
        seconds=1.0,
        command=["test"],
        peak_gflops={"float32": 10.0},
    )
    if "planned" in manifest_fields:
        lines = (run / LOG).read_text().splitlines(keepends=True)
        header = json.loads(lines[0])
        more = [
            case_key("batched", BASE.replace(seq_len=4096 + i))
            for i in range(manifest_fields["planned"] - len(header["cases"]))
        ]
        header.update(planned=manifest_fields["planned"], cases=header["cases"] + more)
        (run / LOG).write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    if manifest_fields:
        manifest = json.loads((run / MANIFEST).read_text())
        (run / MANIFEST).write_text(json.dumps({**manifest, **manifest_fields}))
    return run


# ---- the faults ---------------------------------------------------------------------------------
# The loader reads the typed case log (cases.jsonl); measurements.csv is an export for people and is not read.
def _log_lines(run: Path) -> list[str]:
    return (run / LOG).read_text().splitlines(keepends=True)


def case_edit(edit: Callable[[dict], None], number: int = 1) -> Callable[[Path], None]:
    """Edit the ``number``-th case of the log (its measurement's JSON) in place."""

    def fault(run: Path) -> None:
        lines = _log_lines(run)
        item = json.loads(lines[number])
        edit(item["measurement"])
        lines[number] = json.dumps(item) + "\n"
        (run / LOG).write_text("".join(lines))

    return fault


def field(name: str, value: object, number: int = 1) -> Callable[[Path], None]:
    return case_edit(lambda m: m.__setitem__(name, value), number)


def spec_field(name: str, value: object) -> Callable[[Path], None]:
    return case_edit(lambda m: m["spec"].__setitem__(name, value))


def torn_last_line(run: Path) -> None:
    """A kill mid-write: the log ends inside its last case's line."""
    text = (run / LOG).read_text()
    (run / LOG).write_text(text[: len(text) - len(_log_lines(run)[-1]) // 2])


def truncated_at_line_boundary(run: Path) -> None:
    (run / LOG).write_text("".join(_log_lines(run)[:3]))


def garbled_line(run: Path) -> None:
    lines = _log_lines(run)
    lines[2] = '{"kind": "case", "measurement": {"variant": "batch\n'
    (run / LOG).write_text("".join(lines))


def write(name: str, content: str | bytes) -> Callable[[Path], None]:
    def fault(run: Path) -> None:
        target = run / name
        target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)

    return fault


def manifest_edit(**fields) -> Callable[[Path], None]:
    def fault(run: Path) -> None:
        manifest = json.loads((run / MANIFEST).read_text())
        for key, value in fields.items():
            if value is None:
                manifest.pop(key, None)
            else:
                manifest[key] = value
        (run / MANIFEST).write_text(json.dumps(manifest))

    return fault


def remove(name: str) -> Callable[[Path], None]:
    return lambda run: (run / name).unlink()


def asv_fault(fault: Callable[[Path], None]) -> Callable[[Path], Path]:
    """Wrap a fault on an asv results directory (the run dir argument is replaced by a fixture copy)."""

    def make(tmp: Path) -> Path:
        out = tmp / "results"
        shutil.copytree(FIXTURE, out)
        fault(out)
        return out

    return make


def _result_file(results: Path) -> Path:
    return next(p for p in (results / "fixture-box").glob("*.json") if p.name != "machine.json")


def asv_edit_result(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def fault(results: Path) -> None:
        path = _result_file(results)
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return fault


def _garble_params(data: dict) -> None:
    data["results"]["bench_attention.Attention.time_attention"][1][1] = ["'sixty-four'", "128"]


def _wrong_count(data: dict) -> None:
    data["results"]["bench_attention.AttentionMetrics.track_gflops"][0] = [1.0, 2.0]


def _negative_time(data: dict) -> None:
    data["results"]["bench_attention.Attention.time_attention"][0][0] = -1.0


def _infinite_bytes(data: dict) -> None:
    data["results"]["bench_attention.AttentionMetrics.track_peak_tensor_bytes"][0][0] = float("inf")


def _not_a_list(data: dict) -> None:
    data["results"]["bench_attention.AttentionMetrics.track_flops"][1] = "garbled"


def _stale(results: Path) -> None:
    bench = json.loads((results / "benchmarks.json").read_text())
    bench["bench_attention.Attention.time_attention"]["version"] = "0" * 64
    bench["bench_attention.AttentionMetrics.track_gflops"]["version"] = "1" * 64
    (results / "benchmarks.json").write_text(json.dumps(bench))


def _no_results(results: Path) -> None:
    _result_file(results).unlink()


def _truncate_result(results: Path) -> None:
    path = _result_file(results)
    path.write_text(path.read_text()[:300])


# name -> (make the bad source from a fresh good run dir (or tmp dir for asv), text the problem must hold)
RUN_FAULTS: dict[str, tuple[Callable[[Path], object], str]] = {
    "log torn in its last line": (torn_last_line, "holds 4 case(s) but"),
    "log truncated at a line boundary": (truncated_at_line_boundary, "holds 2 case(s) but"),
    "log a garbled line": (garbled_line, "line 3 unreadable (JSONDecodeError"),
    "log empty": (write(LOG, ""), "holds 0 case(s) but"),
    "log header only": (
        lambda run: (run / LOG).write_text(_log_lines(run)[0]),
        "holds 0 case(s) but",
    ),
    "log a case without variant": (case_edit(lambda m: m.pop("variant")), "no 'variant' field"),
    "log a case without status": (case_edit(lambda m: m.pop("status")), "no 'status' field"),
    "log non-numeric length": (
        spec_field("seq_len", "sixty-four"),
        "seq_len must be an int, got str",
    ),
    "log fractional length": (spec_field("seq_len", 64.5), "seq_len must be an int, got float"),
    "log non-numeric time": (field("samples", ["fast", 0.1]), "is not a list of numbers"),
    "log ok case without a time": (field("samples", []), "status ok but its time is nan"),
    "log ok case with time 0": (field("samples", [0.0, 0.0, 0.0]), "status ok but its time is 0.0"),
    "log non-numeric memory": (
        field("peak_tensor_bytes", "lots"),
        "peak_tensor_bytes 'lots' is not a number",
    ),
    "log unknown status": (field("status", "great"), "status must be one of"),
    "log unknown workload": (field("workload", "training"), "workload must be one of"),
    "log kv_heads not dividing heads": (spec_field("kv_heads", 3), "kv_heads must divide heads"),
    "log non-numeric kv_heads": (spec_field("kv_heads", "few"), "kv_heads must be an int, got str"),
    "log empty variant": (field("variant", ""), "variant is empty"),
    "log a case that is not an object": (
        lambda run: (run / LOG).write_text(_log_lines(run)[0] + "[1, 2]\n"),
        "not an object",
    ),
    "log not UTF-8": (write(LOG, b"\xff\xfe\x00garbage\x80\x81\n"), "UnicodeDecodeError"),
    "log missing": (remove(LOG), "cases.jsonl: missing"),
    "log negative peak bytes": (
        field("peak_tensor_bytes", -5.0),
        "peak_tensor_bytes -5.0 is not a finite value >= 0",
    ),
    "log infinite time": (
        field("samples", [float("inf")] * 3),
        "samples hold inf (a time is a finite number of seconds >= 0)",
    ),
    "log infinite memory": (
        field("peak_tensor_bytes", float("inf")),
        "peak_tensor_bytes inf is not a finite value >= 0",
    ),
    "log ok case far beyond its tolerance": (
        field("max_error", 2.93),
        "status ok but its error is 293,000x the tolerance",
    ),
    "log implausible length": (
        lambda run: (spec_field("seq_len", 10**18)(run), spec_field("seq_len_k", None)(run)),
        "no machine ran it",
    ),
    "log a case twice": (
        lambda run: (run / LOG).write_text((run / LOG).read_text() + _log_lines(run)[1]),
        "the same case as case 1",
    ),
    "manifest plans fewer cases than the log holds": (
        manifest_edit(planned=3),
        "says 3 case(s) were planned, the header",
    ),
    "manifest says complete with cases missing": (
        lambda run: (
            (run / LOG).write_text("".join(_log_lines(run)[:3])),
            manifest_edit(cases=2, complete=True)(run),
        ),
        "says complete, but",
    ),
    "manifest not JSON": (write(MANIFEST, "{not json"), "not readable JSON"),
    "manifest a list": (write(MANIFEST, "[1, 2, 3]"), "expected a JSON object, got list"),
    "manifest without cases": (manifest_edit(cases=None), "no 'cases' count"),
    "manifest cases not a count": (manifest_edit(cases="five"), "should be a count"),
    "manifest disagrees with the log": (manifest_edit(cases=15), "says 15 case(s)"),
    "manifest empty": (write(MANIFEST, ""), "not readable JSON"),
}
ASV_FAULTS: dict[str, tuple[Callable[[Path], object], str]] = {
    "asv benchmarks.json missing": (
        asv_fault(lambda r: (r / "benchmarks.json").unlink()),
        "has no benchmarks.json",
    ),
    "asv benchmarks.json garbled": (
        asv_fault(lambda r: (r / "benchmarks.json").write_text('{"version": 2, ')),
        "cannot read the benchmark list",
    ),
    "asv benchmarks.json a list": (
        asv_fault(lambda r: (r / "benchmarks.json").write_text("[1, 2]")),
        "cannot read the benchmark list",
    ),
    "asv result file truncated": (asv_fault(_truncate_result), "not a readable asv result file"),
    "asv garbled params": (asv_fault(asv_edit_result(_garble_params)), "garbled parameter set"),
    "asv values do not match params": (
        asv_fault(asv_edit_result(_wrong_count)),
        "values for 12 parameter sets",
    ),
    "asv params not a list": (asv_fault(asv_edit_result(_not_a_list)), "garbled result"),
    "asv negative time": (
        asv_fault(asv_edit_result(_negative_time)),
        "time -1.0 is not a time > 0",
    ),
    "asv infinite bytes": (
        asv_fault(asv_edit_result(_infinite_bytes)),
        "is not a finite value >= 0",
    ),
    "asv stale version": (
        asv_fault(_stale),
        "2 result(s) from another version of the suite left out",
    ),
    "asv machine.json missing": (
        asv_fault(lambda r: (r / "fixture-box" / "machine.json").unlink()),
        "machine name taken from the directory",
    ),
    "asv no result files": (asv_fault(_no_results), "no result files"),
}
PATH_FAULTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "source missing": (lambda tmp: tmp / "nowhere", "does not exist"),
    "source empty directory": (
        lambda tmp: (tmp / "empty").mkdir() or tmp / "empty",
        "is an empty directory",
    ),
    "source is a file": (
        lambda tmp: (tmp / "file.csv").write_text("a,b\n") and tmp / "file.csv",
        "is a file",
    ),
    "source unrelated directory": (
        lambda tmp: (tmp / "d").mkdir() or (tmp / "d" / "x.txt").write_text("x") and tmp / "d",
        "neither an asv results directory",
    ),
}
ALL_FAULTS = sorted(RUN_FAULTS) + sorted(ASV_FAULTS) + sorted(PATH_FAULTS)


def make_bad(name: str, tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    if name in RUN_FAULTS:
        run = write_good_run(tmp / "bad-run")
        RUN_FAULTS[name][0](run)
        return run
    if name in ASV_FAULTS:
        return ASV_FAULTS[name][0](tmp)
    return PATH_FAULTS[name][0](tmp)


def expected(name: str) -> str:
    return {**RUN_FAULTS, **ASV_FAULTS, **PATH_FAULTS}[name][1]


@pytest.fixture
def good(tmp_path) -> tuple[Path, int]:
    run = write_good_run(tmp_path / "good-run", host="good-box")
    frame_read = load_run(run)
    frame = frame_read.frame
    assert frame_read.problems == () and len(frame)
    return run, len(frame)


def test_a_run_killed_before_its_first_manifest_reports_what_its_log_holds(tmp_path):
    """kill -9 after the first case reached cases.jsonl, before manifest.json and measurements.csv existed."""
    run = write_good_run(tmp_path / "run")
    (run / MANIFEST).unlink()
    (run / MEASUREMENTS).unlink()
    (run / LOG).write_text("".join(_log_lines(run)[:2]))
    frame_read = load([run])
    frame = frame_read.frame
    assert frame_read.problems == () and any(
        "missing (the sweep stopped before writing it)" in n for n in frame_read.notes
    )
    assert any("incomplete (1 of 5 cases)" in n for n in frame_read.notes)
    assert list(frame.loc[frame["metric"] == "time", "seq_len"]) == [64]
    assert main(["report", "--out", str(tmp_path / "out"), "--from", str(run)]) == 0


def test_the_export_is_not_the_record(tmp_path):
    """measurements.csv is for people: garbling it changes nothing the loader reads."""
    run = write_good_run(tmp_path / "run")
    before = load_run(run).frame
    (run / MEASUREMENTS).write_text("garbage,\n1,2,3\n")
    after_read = load_run(run)
    after = after_read.frame
    assert after_read.problems == () and after.drop(columns="origin", errors="ignore").equals(
        before.drop(columns="origin", errors="ignore")
    )


def test_the_battery_is_large_enough():
    assert len(ALL_FAULTS) >= 20


@pytest.mark.parametrize("name", ALL_FAULTS)
def test_every_fault_is_named_and_the_good_source_still_loads(name, tmp_path, good):
    good_run, good_rows = good
    bad = make_bad(name, tmp_path)
    frame_read = load([bad, good_run])
    frame = frame_read.frame
    problems = frame_read.problems
    hits = [p for p in problems if expected(name) in p]
    assert hits, f"{name}: expected {expected(name)!r} in {problems}"
    assert any(str(bad) in p for p in hits), f"{name}: the problem does not name {bad}: {hits}"
    assert (frame["machine"] == "good-box").sum() == good_rows, name
    ok = frame[frame["status"] == "ok"]
    assert ok["value"].notna().all() and (ok.loc[ok["metric"] == "time", "value"] > 0).all(), name


def test_a_log_cut_mid_value_never_gives_an_ok_zero(tmp_path):
    """The old report: a file cut inside an ok case's time gave time 0.000000, status ok, no problem listed."""
    run = write_good_run(tmp_path / "run")
    lines = _log_lines(run)
    cut = lines[4].index('"samples": [') + len('"samples": [0.0')  # inside L=512's first sample
    (run / LOG).write_text("".join(lines[:4]) + lines[4][:cut])
    frame_read = load_run(run)
    frame = frame_read.frame
    time = frame[frame["metric"] == "time"]
    assert len(time) == 3 and set(time["seq_len"]) == {
        64,
        128,
        256,
    }  # the cut case (L=512) is gone ...
    assert (time.loc[time["status"] == "ok", "value"] > 1e-6).all()  # ... never an ok 0
    problems = " | ".join(frame_read.problems)
    assert "torn last line" in " | ".join(frame_read.notes) and "says 5 case(s)" in problems


def test_an_interrupted_run_is_incomplete_not_corrupt(tmp_path):
    run = write_good_run(tmp_path / "run", planned=20, complete=False)
    read = load_run(run)
    assert read.problems == ()
    assert list(read.notes) == [
        f"{run}: incomplete (5 of 20 cases): the sweep was stopped before the end"
    ]
    done = write_good_run(tmp_path / "done", planned=5, complete=True)
    assert load_run(done).notes == ()


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root: chmod 000 does not stop reads",
)
@pytest.mark.parametrize("target", [LOG, MANIFEST, "."])
def test_unreadable_files_are_named(tmp_path, good, target):
    run = write_good_run(tmp_path / "locked")
    path = run / target
    path.chmod(0)
    try:
        frame_read = load([run, good[0]])
        frame = frame_read.frame
    finally:
        path.chmod(0o755)
    assert any(
        str(run) in p and ("Permission" in p or "permission" in p) for p in frame_read.problems
    ), frame_read.problems
    assert (frame["machine"] == "good-box").sum() == good[1]


def test_asv_stale_results_are_counted_by_benchmark(tmp_path):
    results = ASV_FAULTS["asv stale version"][0](tmp_path)
    frame_read = load_asv(results)
    frame = frame_read.frame
    (stale,) = [p for p in frame_read.problems if "another version" in p]
    assert "time_attention" in stale and "track_gflops" in stale
    assert not (frame["metric"] == "time").any() and (frame["metric"] == "peak_rss").any()


def test_asv_machine_json_missing_keeps_the_results(tmp_path):
    results = ASV_FAULTS["asv machine.json missing"][0](tmp_path)
    frame_read = load_asv(results)
    frame = frame_read.frame
    assert len(frame) == len(load_asv(FIXTURE).frame) and set(frame["machine"]) == {"fixture-box"}


def test_asv_garbled_params_keep_the_rest_of_the_benchmark(tmp_path):
    results = ASV_FAULTS["asv garbled params"][0](tmp_path)
    frame_read = load_asv(results)
    frame = frame_read.frame
    time = frame[frame["metric"] == "time"]
    assert set(time["seq_len"]) == {128}  # the 'sixty-four' parameter sets are left out, L=128 kept
    assert (frame["metric"] == "peak_rss").sum() == (
        load_asv(FIXTURE).frame["metric"] == "peak_rss"
    ).sum()


# ---- the CLI: exit codes and reasons on the terminal -------------------------------------------
def test_report_with_bad_and_good_sources_exits_0_and_names_every_bad_one(tmp_path, good, capsys):
    bads = [make_bad(name, tmp_path / f"case{i}") for i, name in enumerate(ALL_FAULTS)]
    args = ["report", "--out", str(tmp_path / "out"), "--from", str(good[0])]
    for bad in bads:
        args += ["--from", str(bad)]
    assert main(args) == 0
    err = capsys.readouterr().err
    for name, bad in zip(ALL_FAULTS, bads, strict=True):
        assert str(bad) in err and expected(name) in err, name
    page = (tmp_path / "out" / "report.html").read_text()
    assert "could not be read" in page and "good-box" in page


def test_report_with_nothing_loadable_exits_1_with_reasons_on_stderr(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = make_bad("manifest a list", tmp_path / "x")
    (broken / LOG).write_text("")
    assert (
        main(
            [
                "report",
                "--out",
                str(tmp_path / "out"),
                "--from",
                str(tmp_path / "missing"),
                "--from",
                str(empty),
                "--from",
                str(broken),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        "does not exist" in err
        and "empty directory" in err
        and "got list" in err
        and "nothing could be loaded" in err
    )
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'class="good"' not in page and "Nothing could be loaded" in page


def test_report_of_an_asv_dir_without_results_exits_1(tmp_path, capsys):
    results = ASV_FAULTS["asv no result files"][0](tmp_path)
    assert main(["report", "--out", str(tmp_path / "out"), "--from", str(results)]) == 1
    assert "no result files" in capsys.readouterr().err


def test_problems_are_written_beside_the_report(tmp_path, good):
    from attnbench.reporting import make_report

    outcome = make_report([good[0], tmp_path / "missing"], tmp_path / "out")
    assert outcome.rows > 0 and len(outcome.problems) == 1
    saved = json.loads((tmp_path / "out" / "problems.json").read_text())
    assert saved["problems"] == list(outcome.problems) and not math.isnan(outcome.rows)


@pytest.mark.parametrize("target", [LOG, MANIFEST, "."])
def test_unreadable_files_are_named_even_as_root(tmp_path, good, target, monkeypatch):
    """The same fault planted by making the read itself fail (root can read a chmod 000 file)."""
    run = write_good_run(tmp_path / "locked")
    path = run / target
    real_access = os.access

    def refusing(real):
        def read(self, *args, **kwargs):
            if self == path or self.parent == path.resolve() and target == ".":
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        return read

    monkeypatch.setattr(Path, "read_text", refusing(Path.read_text))
    monkeypatch.setattr(Path, "read_bytes", refusing(Path.read_bytes))
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == path.resolve() else real_access(p, mode)
    )
    frame_read = load([run, good[0]])
    frame = frame_read.frame
    assert any(str(run) in p and "ermission denied" in p for p in frame_read.problems), (
        frame_read.problems
    )
    assert (frame["machine"] == "good-box").sum() == good[1]
    assert not (frame["machine"] == "bad-box").any() or target != "."


def test_rows_know_their_source_and_when_they_ran(tmp_path):
    """Two runs of one machine and commit stay apart (``origin``); ``run_date`` is the manifest's time."""
    a = write_good_run(tmp_path / "a", created="2026-01-02T03:04:05+00:00")
    b = write_good_run(tmp_path / "b", created="2026-02-03T04:05:06+00:00")
    frame_read = load([a, b])
    frame = frame_read.frame
    assert set(frame["origin"]) == {str(a), str(b)}
    dates = frame.groupby("origin")["run_date"].first()
    assert (
        f"{dates[str(a)]:%Y-%m-%d %H:%M}" == "2026-01-02 03:04"
        and f"{dates[str(b)]:%Y-%m-%d %H:%M}" == "2026-02-03 04:05"
    )


def test_a_noisy_case_keeps_its_value_but_is_not_ok(tmp_path, monkeypatch):
    """Status ``noisy`` (a disturbed measurement): its time is kept for drawing, its status is not ok."""
    run = write_good_run(tmp_path / "run")
    field("status", "noisy", number=2)(run)
    frame_read = load_run(run)
    frame = frame_read.frame
    noisy = frame[(frame["status"] == "noisy") & (frame["metric"] == "time")]
    assert len(noisy) == 1 and noisy["value"].iloc[0] > 0
    from attnbench.analysis import complexity

    fits = complexity.fit_table(frame)
    assert fits.loc[fits["metric"] == "time", "n"].iloc[0] <= 3  # the noisy length is not fitted


def test_a_manifest_one_write_behind_the_log_is_a_note_not_corruption(tmp_path):
    """kill -9 between writing the rows and the manifest: the log and the rows agree, the manifest lags."""
    run = write_good_run(tmp_path / "run")
    cases = json.loads((run / MANIFEST).read_text())["cases"]
    lagging = write_good_run(tmp_path / "lag", cases=cases - 1, complete=False)
    read = load_run(lagging)
    assert read.problems == () and any("stopped between writing its files" in n for n in read.notes)
    truncated = write_good_run(tmp_path / "cut")
    (truncated / LOG).write_text(
        "".join(_log_lines(truncated)[:-1])
    )  # the log lost a case the manifest counted
    assert any("truncated or replaced" in p for p in load_run(truncated).problems)


def test_a_noisy_case_keeps_its_memory_and_counts_as_facts(tmp_path):
    """A neighbour disturbs time, not bytes: the noisy case's memory is fitted, its time is not."""
    run = write_good_run(tmp_path / "run")
    field("status", "noisy", number=2)(run)
    frame_read = load_run(run)
    frame = frame_read.frame
    at = frame[frame["seq_len"] == 128].set_index("metric")
    assert at.loc["time", "status"] == "noisy" and at.loc["gflops", "status"] == "noisy"
    assert (
        at.loc["peak_tensor_bytes", "status"] == "ok"
        and at.loc["peak_tensor_bytes", "value"] == 8 * 128 * 128
    )
    from attnbench.analysis import complexity

    fits = complexity.fit_table(frame).set_index("metric")
    assert (
        fits.loc["peak_tensor_bytes", "n"] == 4 and fits.loc["time", "n"] <= 3
    )  # 128 is fitted for memory only


def test_a_logged_count_of_unknown_status_is_refused():
    """Planted: a count line whose status is no Status was attached as if its word were one."""
    from attnbench.contract import Status
    from attnbench.rundir_format import count_from_json

    with pytest.raises(ValueError, match="count status must be one of .* got 'great'"):
        count_from_json({"status": "great", "instructions": 5.0})
    assert count_from_json({"status": "ok", "instructions": 5.0}).status is Status.OK


MEASURED = [
    Measurement(
        variant="batched",
        spec=attnbench.AttnSpec(batch=1, heads=2, head_dim=16, seq_len=n),
        status="ok",
        samples=(1e-3, 1.1e-3, 0.9e-3),
        runs=3,
        timing_method="wall",
    )
    for n in (16, 32, 64)
]


@pytest.mark.parametrize("file", [LOG, MANIFEST])
def test_a_run_written_in_another_format_is_refused_not_mixed(tmp_path, file):
    run = write_run(tmp_path / "run", MEASURED[:2], MeasureConfig(), seconds=1.0, command=["test"])
    text = (run / file).read_text()
    (run / file).write_text(
        text.replace(LOG_SCHEMA, "attnbench.log/2").replace(MANIFEST_SCHEMA, "attnbench.run/2")
    )
    problems = load_run(run).problems
    assert any("format 'attnbench." in p and "/2'" in p for p in problems), problems
    if file == LOG:
        with (
            pytest.raises(RunDirError, match="format 'attnbench.log/2'"),
            RunDirectory(run, resume=True) as directory,
        ):
            directory.start(MeasureConfig(), [(m.variant, m.spec) for m in MEASURED])
        assert len(load_run(run).frame) == 0


def test_the_same_run_given_twice_is_read_once(tmp_path):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    (tmp_path / "link").symlink_to(run)
    once = load([run]).frame
    frame_read = load([run, f"{run}/", tmp_path / "link", os.path.relpath(run)])
    frame = frame_read.frame
    assert len(frame) == len(once) > 0
    assert sum("given twice: read once" in n for n in frame_read.notes) == 3


@pytest.mark.parametrize(
    ("sample", "why"),
    [("1" + "0" * 400, "too large for a float"), ("1e999", "inf"), ("-1e-3", "-0.001")],
)
def test_a_sample_no_float_holds_rejects_its_case_by_name(tmp_path, sample, why):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    lines = (run / LOG).read_text().splitlines()
    item = json.loads(lines[1])
    first = json.dumps(item["measurement"]["samples"][0])
    lines[1] = lines[1].replace(f'"samples": [{first}', f'"samples": [{sample}', 1)
    (run / LOG).write_text("\n".join(lines) + "\n")
    frame_read = load_run(run)
    frame = frame_read.frame
    assert any("line 2" in p and why in p for p in frame_read.problems), frame_read.problems
    assert len(set(frame["seq_len"])) == len(MEASURED) - 1  # the others load


def test_a_symlink_loop_is_a_problem_not_a_traceback(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["export", str(loop), "--format", "bmf"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Symlink loop" in err
    assert main(["report", "--from", str(loop), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Symlink loop" in err
