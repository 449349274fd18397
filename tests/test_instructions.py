"""Instruction counts under valgrind: deterministic, doubled by doubled work, never taken of a wrong result.

One valgrind process (two: one case kills it) serves the module and tests/test_asv.py, once a session (torch starts
under valgrind in about half a minute).
"""

from __future__ import annotations

import math
import shutil

import pytest

from attnbench.measure.instructions import (
    CountConfig,
    CountError,
    count_instructions,
    valgrind_version,
)
from attnbench.measure.record import Count
from attnbench.spec import AttnSpec
from tests.conftest import once_per_session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        valgrind_version() is None, reason="valgrind not installed (apt-get install valgrind)"
    ),
]
SMALL = AttnSpec(
    batch=1, heads=2, seq_len=256, head_dim=64
)  # big enough that call overhead is noise
PLUGIN = "tests.planted_variants"


def shared_counts(factory: pytest.TempPathFactory) -> dict[str, Count]:
    """batched twice (same case), the planted 2x, a wrong one, an unsupported one, one that kills the process (a
    second process counts the case after it), and the case asv's Instructions class counts for batched at L=128
    (``asv``, read by tests/test_asv.py). Counted once per session, whichever parallel worker asks first."""
    from attnbench import asv_bench

    def count() -> dict[str, Count]:
        import tests.planted_variants  # noqa: F401 - registers them here too (names are checked before counting)

        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(
                "ATTNBENCH_PLUGINS", PLUGIN
            )  # the child loads the planted variants as a plugin
            found = count_instructions(
                CASES + [("batched", asv_bench.spec_for("batched", 128, "cpu", "forward"))],
                CountConfig(calls=2, warmup_calls=1),  # asv counts 1 call: the same per call
            )
        return dict(zip([*NAMES, "asv"], found, strict=True))

    return once_per_session(factory, "instruction-counts", count)


CASES = [
    ("batched", SMALL),
    ("batched", SMALL),
    ("planted_twice", SMALL),
    ("planted_off", SMALL),
    ("sdpa_cudnn", SMALL),
    ("batched", SMALL.replace(seq_len=512)),
    ("planted_abort", SMALL),
    ("sdpa", SMALL),
]
NAMES = ["first", "again", "twice", "wrong", "unsupported", "longer", "dead", "after"]


@pytest.fixture(scope="module")
def counts(tmp_path_factory) -> dict[str, Count]:
    return shared_counts(tmp_path_factory)


def test_the_same_case_counts_the_same_in_one_process(counts):
    first, again = counts["first"], counts["again"]
    assert first.status == again.status == "ok" and first.valgrind.startswith("valgrind")
    assert abs(again.instructions / first.instructions - 1) < 1e-3, (
        first.instructions,
        again.instructions,
    )


def test_a_planted_second_forward_counts_twice(counts):
    ratio = counts["twice"].instructions / counts["first"].instructions
    assert ratio == pytest.approx(2.0, abs=0.01), ratio


def test_a_wrong_result_gets_no_count(counts):
    wrong = counts["wrong"]
    assert (
        wrong.status == "wrong" and math.isnan(wrong.instructions) and "tolerance" in wrong.reason
    )


def test_an_unsupported_case_is_skipped_with_its_reason(counts):
    assert counts["unsupported"].status == "skipped" and "CUDA" in counts["unsupported"].reason


def test_counts_grow_with_the_work(counts):
    """L 256 -> 512 at head dim 64: the work quadruples, the whole count nearly (projection-free attention)."""
    assert 3.5 < counts["longer"].instructions / counts["first"].instructions < 4.2


def test_an_over_budget_case_is_skipped_before_valgrind_starts():
    (count,) = count_instructions(
        [("batched", AttnSpec(seq_len=16384, heads=8))], CountConfig(budget_s=1.0)
    )
    assert count.status == "skipped" and "under valgrind > budget 1 s" in count.reason


def test_without_valgrind_the_message_names_the_package(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert valgrind_version() is None
    with pytest.raises(
        CountError, match=r"install the valgrind package \(apt-get install valgrind\)"
    ):
        count_instructions([("batched", SMALL)])


def test_regress_without_valgrind(monkeypatch, capsys):
    """--metric instructions cannot measure (exit 3, the package named); --metric both falls back to time, saying so;
    with no --metric the default is time. Planted: valgrind missing."""
    from attnbench import gate
    from attnbench.cli import main
    from attnbench.measure import instructions

    monkeypatch.setattr(instructions, "valgrind_version", lambda: None)
    asked = []

    def stub(*args, **kwargs):
        asked.append(kwargs["metric"])
        raise gate.RegressError("stopped here by the test")

    monkeypatch.setattr(gate, "regress", stub)
    assert main(["regress", "HEAD~1", "HEAD", "--metric", "instructions"]) == 3
    assert (
        "install the valgrind package (apt-get install valgrind)" in capsys.readouterr().err
        and asked == []
    )
    assert main(["regress", "HEAD~1", "HEAD", "--metric", "both"]) == 3
    assert "--metric both falls back to time" in capsys.readouterr().err and asked == ["time"]
    assert main(["regress", "HEAD~1", "HEAD"]) == 3 and asked == ["time", "time"]


def test_valgrind_is_found_where_the_project_says():
    assert shutil.which("valgrind") is not None  # the skip above would have hidden everything else


def _counting_at_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside a sweep the counter runs under SCHED_IDLE (tested above); beside CI's four parallel workers on two
    cores an idle process gets a core only between tests, and one CLI run's counts took 428 s there (37 s alone).
    The CLI tests ask what is counted and logged, not at which priority, so their counter competes as usual."""
    from attnbench.measure import instructions

    monkeypatch.setattr(instructions, "_idle_priority", lambda: None)


def test_a_case_that_kills_the_process_is_its_own_error_and_the_rest_are_counted(counts):
    """Planted: a variant that aborts (SIGABRT): its row says so, and the case after it is counted in a new process."""
    dead, after = counts["dead"], counts["after"]
    assert dead.status == "error" and "died from SIGABRT during this case" in dead.reason, (
        dead.reason
    )
    assert after.status == "ok" and after.instructions > 0


def test_compiled_variants_are_not_counted():
    (count,) = count_instructions([("compiled_batched", SMALL)], CountConfig())
    assert count.status == "skipped" and "compiles per shape" in count.reason


def test_run_counts_the_headline_variants_beside_the_sweep_by_default(tmp_path, monkeypatch):
    """No --instructions: the counts of the progression's variants and one per family arrive beside the timed sweep,
    one valgrind process for the run, each count a log line of its own attached to its case, and the report fits
    them (batched's L² at five lengths); a variant outside that set is not counted. (``--instructions``, every CPU
    case, picks its cases by the same function: ``test_instructions_picks_every_cpu_case``.)

    Which cases are counted is the question here, not when counting stops (a scripted clock tests that,
    tests/test_counting.py): valgrind's start may take longer than the short sweep's floor beside
    CI's parallel tests, so the floor is lifted."""
    from attnbench import runs
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.cli import main
    from attnbench.rundir_format import LOG, read_log

    monkeypatch.setattr(runs, "COUNT_FLOOR_S", 3600.0)
    _counting_at_normal_priority(monkeypatch)

    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--variants",
                "batched,local",
                "--lengths",
                "64,128,256,512,1024",
                "--heads",
                "1",
                "--out",
                str(out),
                "--quiet",
                "--no-report",
                "--min-runs",
                "2",
                "--min-time",
                "0.01",
            ]
        )
        == 0
    )
    log = read_log(out / LOG)
    assert len(log.counts) == 5 and (out / LOG).read_text().count('"kind": "count"') == 5
    counted = {
        m.spec.seq_len for m in log.measurements if m.variant == "batched" and m.instructions > 0
    }
    assert counted == {64, 128, 256, 512, 1024} and all(
        math.isnan(m.instructions) for m in log.measurements if m.variant == "local"
    )
    fit = (
        analyse(load_results([out]))
        .fits.set_index(["variant", "metric"])
        .loc[("batched", "instructions")]
    )
    assert fit["conclusive"] and fit["kind"] == "deterministic", fit.to_dict()
    assert fit["verdict"] == "matches" and abs(fit["exponent"] - 2.0) < 0.1, fit.to_dict()


def test_instructions_picks_every_cpu_case():
    """``--instructions`` counts every CPU case (a variant outside the headline set included, no budget); the
    default, the headline figure's variants and one per family."""
    from attnbench.cli import build_parser, run_options
    from attnbench.runs import counted_cases
    from attnbench.session import measure_config

    cases = [
        (name, AttnSpec(seq_len=n, heads=1)) for name in ("batched", "local") for n in (64, 128)
    ]
    every = counted_cases(cases, every=True)
    assert len(every) == 4 and {name for name, _ in every} == {"batched", "local"}
    assert {name for name, _ in counted_cases(cases)} == {"batched"}
    modes = {
        flag: measure_config(run_options(build_parser().parse_args(["run", *flag]))).instructions
        for flag in ((), ("--instructions",), ("--no-instructions",))
    }
    assert list(modes.values()) == ["default", "all", "off"]


def test_counting_beside_a_sweep_stops_when_asked_and_keeps_what_it_counted():
    """SIGTERM during a run stops the valgrind process beside it: the cases it did not reach say so."""
    import time

    from attnbench.measure.instructions import Beside

    beside = Beside(
        [("batched", SMALL), ("batched", SMALL.replace(seq_len=512)), ("sdpa", SMALL)],
        CountConfig(),
    )
    time.sleep(2.0)  # torch is still starting under valgrind
    start = time.monotonic()
    beside.stop()
    assert beside.done and time.monotonic() - start < 20
    counts = beside.take()
    assert len(counts) == 3 and all(
        c.status == "error" and c.reason == "not counted: cancelled" for c in counts
    )


def test_counting_beside_a_sweep_runs_only_on_a_core_nothing_else_wants():
    """Beside the timed sweep the valgrind process made every long case wait for a core (a 4096 sdpa case waited 31%
    of its blocks on a quiet machine). It now runs under SCHED_IDLE."""
    import os
    import subprocess
    import sys

    from attnbench.measure.instructions import Beside, _idle_priority

    policy = subprocess.run(
        [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
        capture_output=True,
        text=True,
        preexec_fn=_idle_priority,
        timeout=60,
    ).stdout.strip()
    assert policy == str(os.SCHED_IDLE)
    beside = Beside([], CountConfig())
    beside.stop()
    assert beside.config.idle
