"""asv smoke: the benchmark module passes `asv check` and a quick run of a small grid has no failures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.analysis.frame import load_asv

ROOT = Path(__file__).resolve().parents[1]
SMALL_GRID = {
    "ATTNBENCH_ASV_VARIANTS": "batched,chunked,sdpa_efficient",
    "ATTNBENCH_ASV_LENGTHS": "128",  # one length runs every benchmark's code; the counts are compared at 128
    "ATTNBENCH_ASV_MODES": "forward,backward",
    # one valgrind process: a second costs torch's start again (half a minute of a core); the split into processes is
    # tests/test_counting.py's
    "ATTNBENCH_ASV_COUNT_PROCESSES": "1",
}


def _asv(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "asv", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        # a bound against a hang, not a budget: 187 s alone on a quiet machine (190 CPU-s); beside three
        # other workers and cold compile caches a third of a core is its share
        timeout=1200,
    )


@pytest.fixture(scope="module")
def asv_env(tmp_path_factory):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: asv needs a commit hash to record results")
    tmp = tmp_path_factory.mktemp("asv")
    conf = {
        "version": 1,
        "project": "attnbench",
        "repo": str(ROOT),
        "branches": ["main"],
        "environment_type": "virtualenv",
        "benchmark_dir": str(ROOT / "benchmarks"),
        "results_dir": str(tmp / "results"),
        "html_dir": str(tmp / "html"),
        "env_dir": str(tmp / "env"),
        "launch_method": "forkserver",
    }
    (tmp / "asv.conf.json").write_text(json.dumps(conf))
    # asv drops PYTHONPATH in benchmark processes; ASV_PYTHONPATH puts this checkout (not an installed attnbench) first.
    env = {**os.environ, "HOME": str(tmp), "ASV_PYTHONPATH": str(ROOT), **SMALL_GRID}
    machine = _asv(["machine", "--yes", "--machine", "smoke"], env, tmp)
    assert machine.returncode == 0, machine.stderr
    return tmp, env, head.stdout.strip()


@pytest.mark.slow
def test_asv_check(asv_env):
    tmp, env, _ = asv_env
    out = _asv(["check", "--python=same"], env, tmp)
    assert out.returncode == 0 and "No problems found" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
def test_asv_quick_run_has_no_failures(asv_env, tmp_path_factory):
    tmp, env, head = asv_env
    out = _asv(
        ["run", "--python=same", "--quick", "--set-commit-hash", head, "--machine", "smoke"],
        env,
        tmp,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    frame_read = load_asv(tmp / "results")
    frame = frame_read.frame
    assert frame_read.problems == ()
    failed = frame[frame["status"] == "failed"]
    assert failed.empty, failed[["benchmark", "variant", "seq_len", "device", "mode"]].to_string()
    ok = frame[frame["status"] == "ok"]
    assert {"batched", "chunked"} <= set(ok["variant"])
    assert {"time", "peak_rss", "peak_tensor_bytes", "gflops", "max_error"} <= set(ok["metric"])
    assert set(frame.loc[frame["variant"] == "sdpa_efficient", "status"]) == {"skipped"}
    assert frame.loc[frame["metric"] == "max_error", "value"].max() < 1e-4
    decode = ok[ok["workload"] == "decode"]  # the Decode class: one query over 4K and 16K keys
    assert set(decode["seq_len"]) == {1} and set(decode["seq_len_k"]) == {4096, 16384}
    assert {"time", "gbps"} <= set(decode["metric"]) and "batched" in set(decode["variant"])
    assert (decode.loc[decode["metric"] == "gbps", "value"] > 0).all()
    gqa = ok[ok["benchmark"].str.contains("GroupedQuery")]
    assert (
        set(gqa["kv_heads"]) == {2}
        and set(gqa["heads"]) == {8}
        and set(gqa["workload"]) == {"prefill"}
    )
    assert {"time", "peak_tensor_bytes"} <= set(gqa["metric"])
    assert set(ok.loc[~ok["benchmark"].str.contains("GroupedQuery"), "kv_heads"]) == {8}
    from attnbench.measure.instructions import valgrind_version

    if (
        valgrind_version() is not None
    ):  # the Instructions class: every case counted in one valgrind process
        counted = ok[ok["metric"] == "instructions"].set_index(
            ["variant", "seq_len", "mode", "mask"]
        )["value"]
        assert {"batched", "chunked"} <= set(counted.index.get_level_values(0)) and (
            counted > 0
        ).all()
        from tests.test_instructions import (
            shared_counts,
        )  # the same case counted directly (count_instructions)

        direct = shared_counts(tmp_path_factory)["asv"]
        assert counted[("batched", 128, "forward", "none")] == pytest.approx(
            direct.instructions, rel=1e-3
        )


def test_benchmark_params_are_generated_from_one_table():
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import bench_attention as b
    finally:
        sys.path.pop(0)
    from attnbench import asv_bench

    assert b.Attention.param_names == list(asv_bench.PARAMS)
    assert b.AttentionAccuracy.param_names == list(asv_bench.PARAMS)
    assert b.Decode.param_names == list(asv_bench.DECODE_PARAMS)
    assert b.GroupedQuery.param_names == list(asv_bench.GQA_PARAMS)


def test_asv_cases_name_their_workload_and_heads():
    """One rule (contract.asv_case) turns a parameter set into a case, for the suite and for the loader."""
    from attnbench import contract

    spec, workload = contract.asv_case(
        "bench_attention.Decode.time_decode", {"seq_len_k": 4096, "device": "cpu"}
    )
    assert (workload, spec.lq, spec.lk, spec.hkv) == ("decode", 1, 4096, 8)
    spec, workload = contract.asv_case("bench_attention.GroupedQuery.time_gqa", {"seq_len": 1024})
    assert (workload, spec.lq, spec.lk, spec.heads, spec.hkv) == ("prefill", 1024, 1024, 8, 2)
    spec, workload = contract.asv_case(
        "bench_attention.Attention.time_attention", {"seq_len": 64, "mode": "backward"}
    )
    assert (workload, spec.lq, spec.hkv, spec.mode) == ("prefill", 64, 8, "backward")
    with pytest.raises((ValueError, TypeError)):
        contract.asv_case("bench_attention.Decode.time_decode", {"seq_len_k": "long"})


# ---- measuring each case once: asv's setup_cache carries the gate's verdicts ---------------------------------------
ONE_CASE = {
    "ATTNBENCH_ASV_VARIANTS": "batched",
    "ATTNBENCH_ASV_LENGTHS": "128",
    "ATTNBENCH_ASV_MODES": "forward",
    "ATTNBENCH_ASV_MASKS": "none",
    "ATTNBENCH_ASV_DEVICES": "cpu",
}
CASE = ("batched", 128, "cpu", "forward", "none")
SLICES = 8  # B1 H8 at L=128: the gate checks every (batch, head) slice


def _suite():
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import bench_attention
    finally:
        sys.path.pop(0)
    return bench_attention


def _main_grid_methods(suite) -> list[tuple[type, str]]:
    """Every benchmark method of the main grid's classes (those sharing its setup_cache), as asv finds them."""
    import inspect

    from attnbench.shards import BENCHMARK_PREFIXES

    classes = [suite.Attention, suite.AttentionMetrics, suite.AttentionAccuracy]
    return [
        (cls, name)
        for cls in classes
        for name, _ in inspect.getmembers(cls, inspect.isfunction)
        if name.startswith(BENCHMARK_PREFIXES)
    ]


def _fresh_process(ab) -> None:
    """What a new asv benchmark process starts without: this module's per-process state."""
    ab.prepare_spec.cache_clear()
    ab._VERDICTS.clear()


def test_each_case_is_gated_once_in_setup_cache_and_never_in_a_benchmark_process(
    monkeypatch, tmp_path
):
    """asv's process model, emulated in one interpreter: the shared ``setup_cache`` once, then each benchmark method of
    the main grid in a process of its own (per-process state cleared), handed the pickled cache. The float64 reference
    of the case is evaluated once, in setup_cache; the eight benchmark processes evaluate it zero times. Without a
    cache (outside asv) one process running every method evaluates it once too (its checks of the warm-up call and of
    later calls share one reference). Before: once in every benchmark process that set the case up (the test below
    counts 8 in a real asv run of this case before this change)."""
    import pickle

    import tests.reference_counter as counter
    from attnbench import asv_bench as ab

    log = tmp_path / "references.log"
    monkeypatch.setenv(counter.ENV, str(log))
    suite = _suite()
    table = {
        "variant": [CASE[0]],
        "seq_len": [CASE[1]],
        "device": [CASE[2]],
        "mode": [CASE[3]],
        "mask": [CASE[4]],
    }
    monkeypatch.setattr(ab, "PARAMS", table)
    _fresh_process(ab)
    cache = pickle.loads(
        pickle.dumps(suite.Attention().setup_cache())
    )  # what asv hands every process
    assert sum(counter.evaluations(log, SLICES).values()) == 1
    methods = _main_grid_methods(suite)
    assert len(methods) == 8, methods
    for cls, name in methods:
        _fresh_process(ab)
        bench = cls()
        bench.setup(cache, *CASE)
        value = getattr(bench, name)(cache, *CASE)
        if hasattr(bench, "teardown"):
            bench.teardown(cache, *CASE)
        assert value is None or value >= 0, (
            name,
            value,
        )  # page faults: 0 in a process with a grown heap
    assert sum(counter.evaluations(log, SLICES).values()) == 1, (
        "a benchmark process evaluated the reference"
    )

    log.unlink()
    _fresh_process(ab)  # outside asv: no cache; one process measures every metric of the case
    for metric in (
        "peak_tensor_bytes",
        "flops",
        "gflops",
        "page_faults",
        "error_ratio",
        "max_error",
    ):
        owner = "AttentionAccuracy" if "error" in metric else "AttentionMetrics"
        assert ab.track(metric, owner, *CASE) >= 0
    assert counter.evaluations(log, SLICES) == {os.getpid(): 1.0}
    _fresh_process(ab)


def test_each_metric_of_a_case_is_measured_once_and_every_track_reads_it(monkeypatch):
    """asv's process model as above, counting the measurements themselves: the GFLOP/s timing and the profiler's peak
    tensor bytes happen once, in setup_cache, and the benchmark processes read them from the verdict (planted: a
    ``track_gflops`` that times its case again in its own process, as every track_ did before). Page faults are the one
    metric counted in a benchmark process, by design (see ``asv_bench._ONCE``): once, in ``track_page_faults``'."""
    import pickle

    from attnbench import asv_bench as ab
    from attnbench.measure import memory, runner

    counted: dict[str, int] = {}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            counted[name] = counted.get(name, 0) + 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(ab, "time_call", counting("timed", ab.time_call))
    monkeypatch.setattr(runner, "peak_tensor_bytes", counting("profiled", runner.peak_tensor_bytes))
    monkeypatch.setattr(memory, "page_faults", counting("page faults", memory.page_faults))
    monkeypatch.setattr(ab, "PARAMS", {k: [v] for k, v in zip(ab.PARAMS, CASE, strict=True)})
    suite = _suite()
    _fresh_process(ab)
    cache = pickle.loads(pickle.dumps(suite.Attention().setup_cache()))
    assert counted == {"timed": 1, "profiled": 1}, counted
    counted.clear()
    for cls, name in _main_grid_methods(suite):
        _fresh_process(ab)
        bench = cls()
        bench.setup(cache, *CASE)
        getattr(bench, name)(cache, *CASE)
        if hasattr(bench, "teardown"):
            bench.teardown(cache, *CASE)
    assert counted == {"page faults": 1}, f"measured again in a benchmark process: {counted}"
    _fresh_process(ab)


def test_setup_cache_judges_in_processes_of_its_own_and_times_alone_afterwards(
    monkeypatch, tmp_path
):
    """The gate (the float64 reference, most of a setup_cache's work) runs in JUDGE_PROCESSES forked processes at
    once; the GFLOP/s timing only afterwards, in the setup_cache's own process, once every case is judged (planted:
    JUDGE_PROCESSES = 1 judges in that process; timing in the judging processes times beside the gate)."""
    from attnbench import asv_bench as ab

    log = tmp_path / "events.log"
    real_judge, real_time = ab.judge, ab.time_call

    def logged(event, real):
        def wrapper(*args, **kwargs):
            result = real(*args, **kwargs)
            with open(log, "a") as out:
                out.write(f"{event} {os.getpid()} {time.monotonic()}\n")
            return result

        return wrapper

    monkeypatch.setattr(ab, "judge", logged("judged", real_judge))
    monkeypatch.setattr(ab, "time_call", logged("timed", real_time))
    monkeypatch.setattr(ab, "JUDGE_PROCESSES", 2)
    table = {
        "variant": ["batched", "vectorized"],
        "seq_len": [64],
        "device": ["cpu"],
        "mode": ["forward"],
        "mask": ["none", "causal"],
    }
    verdicts = ab.grid_verdicts(table)
    assert all(dict(v.values).keys() == {"gflops", "peak_tensor_bytes"} for v in verdicts.values())
    events = [line.split() for line in log.read_text().splitlines()]
    judged = [(int(pid), float(t)) for what, pid, t in events if what == "judged"]
    timed = [(int(pid), float(t)) for what, pid, t in events if what == "timed"]
    assert len(judged) == len(timed) == 4, events
    assert os.getpid() not in {pid for pid, _ in judged}, "judged in the setup_cache's own process"
    assert {pid for pid, _ in timed} == {os.getpid()}, "timed outside the setup_cache's own process"
    assert max(t for _, t in judged) < min(t for _, t in timed), (
        "timed while cases were being judged"
    )


FORKED_JUDGES = """
import sys
from attnbench import asv_bench as ab
from attnbench.spec import AttnSpec

def _judged(variant, spec, untimed):
    return "torch._inductor" in sys.modules

ab._judged, ab._roof, ab.JUDGE_PROCESSES = _judged, lambda device: None, 2
spec = AttnSpec(batch=1, heads=1, seq_len=16, head_dim=8, dtype="float32")
print(list(ab._judge_all([("batched", spec), ("vectorized", spec)], ["peak_tensor_bytes"])))
"""


def test_forked_judges_inherit_the_profilers_imports():
    """The profiler imports Inductor on its first use (two to three seconds of a core): the setup_cache imports it
    before it forks its judges, which then find it imported instead of each paying for it (planted: the import taken
    out of ``_judge_all``, each judge found it missing). In a fresh interpreter: this one may have imported it."""
    out = subprocess.run(
        [sys.executable, "-c", FORKED_JUDGES], capture_output=True, text=True, timeout=300
    )
    assert out.stdout.strip() == "[True, True]", out.stdout + out.stderr


def test_the_main_grid_classes_share_one_setup_cache():
    """asv keys a setup_cache by its function's module and line and runs it once per key: the classes of the main grid
    inherit one (planted: a class defining its own gets a key of its own, and a second gate over the whole grid)."""
    from asv_runner.benchmarks._base import get_setup_cache_key

    suite = _suite()
    keys = {
        cls.__name__: get_setup_cache_key(cls.setup_cache)
        for cls in (suite.Attention, suite.AttentionMetrics, suite.AttentionAccuracy)
    }
    assert len(set(keys.values())) == 1, keys
    assert suite.Attention.params == suite.AttentionMetrics.params == suite.AttentionAccuracy.params


def test_a_verdict_decides_before_anything_is_built(monkeypatch):
    """n/a, wrong and failed-in-setup_cache cases raise in ``setup`` from the verdict alone; the accuracy class reads
    a wrong case's error instead of failing; the FLOP and accuracy tracks never build the case."""
    from attnbench import asv_bench as ab
    from attnbench.measure.gate import GateResult

    spec = ab.spec_for(*CASE)
    built = []
    monkeypatch.setattr(ab, "_build", lambda *a: built.append(a))
    wrong = GateResult(max_error=1.0, tolerance=0.1)
    for status, error in (
        ("n/a", NotImplementedError),
        ("wrong", ab.WrongResult),
        ("error", RuntimeError),
    ):
        _fresh_process(ab)
        ab.use(
            {
                ("batched", spec): ab.Verdict(
                    status, f"planted {status}", wrong if status == "wrong" else None
                )
            }
        )
        with pytest.raises(error, match=f"planted {status}"):
            ab.check(*CASE)
        with pytest.raises(error, match=f"planted {status}"):
            ab.timed_case(*CASE)
        if status == "wrong":
            assert ab.track("error_ratio", "AttentionAccuracy", *CASE) == pytest.approx(
                10.0
            )  # how wrong: reported
    _fresh_process(ab)
    ab.use(
        {("batched", spec): ab.Verdict("ok", checked=GateResult(max_error=1e-7, tolerance=1e-6))}
    )
    assert ab.track("flops", "AttentionMetrics", *CASE) > 0
    assert ab.track("max_error", "AttentionAccuracy", *CASE) == pytest.approx(1e-7)
    assert built == []
    _fresh_process(ab)


def test_setup_cache_prints_its_progress_and_keeps_a_failing_case_to_itself(monkeypatch, capsys):
    from attnbench import asv_bench as ab

    real = ab.judge

    def judge(variant, spec):
        if spec.mask == "causal":
            raise ValueError("planted")
        return real(variant, spec)

    monkeypatch.setattr(ab, "judge", judge)
    verdicts = ab.grid_verdicts(
        {
            "variant": ["batched", "sdpa_efficient"],
            "seq_len": [64],
            "device": ["cpu"],
            "mode": ["forward"],
            "mask": ["none", "causal"],
        }
    )
    status = {(v, s.mask): found.status for (v, s), found in verdicts.items()}
    assert status == {
        ("batched", "none"): "ok",
        ("batched", "causal"): "error",
        ("sdpa_efficient", "none"): "n/a",
        ("sdpa_efficient", "causal"): "error",
    }
    assert (
        dict(verdicts[("batched", ab.spec_for("batched", 64, "cpu", "forward"))].values)[
            "peak_tensor_bytes"
        ]
        > 0
    )
    lines = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("attnbench: case ")
    ]
    assert [line.split(",")[0] for line in lines] == [
        f"attnbench: case {i} of 4" for i in range(1, 5)
    ]
    assert all(line.endswith("s elapsed)") for line in lines), lines


def test_instruction_counts_keep_to_the_budget_and_print_progress(monkeypatch, capsys):
    """The Instructions class counts the cheapest cases within its budget; the rest are n/a saying so. Its setup_cache
    prints its plan and a line per counted case (case i of n, the seconds elapsed) to asv's log."""
    import attnbench.measure.instructions as instructions
    from attnbench import asv_bench as ab
    from attnbench.measure.record import Count

    sent = []

    def fake_count(cases, config=None, *, progress=None):
        sent.extend(cases)
        counts = [Count(n, s, "ok", instructions=1e6, calls=2, valgrind="fake") for n, s in cases]
        for i, count in enumerate(counts, 1):
            progress(i, len(cases), count)
        return counts

    monkeypatch.setattr(instructions, "valgrind_version", lambda: "valgrind-fake")
    monkeypatch.setattr(instructions, "count_instructions", fake_count)
    monkeypatch.setattr(
        ab,
        "INSTRUCTION_PARAMS",
        {
            "variant": ["batched", "sdpa_efficient"],
            "seq_len": [128, 1024],
            "device": ["cpu"],
            "mode": ["forward"],
            "mask": ["none"],
        },
    )
    monkeypatch.setattr(
        ab, "COUNT_BUDGET_S", 10.0
    )  # L=128 is predicted about 1 s under valgrind, L=1024 about 50 s
    counts = ab.instruction_counts()
    # batched at L=1024 is left out; sdpa_efficient (CUDA only) goes to the counter, which skips it with its reason
    assert [(n, s.seq_len) for n, s in sent] == [
        ("batched", 128),
        ("sdpa_efficient", 128),
        ("sdpa_efficient", 1024),
    ]
    assert ab.instruction_case(counts, "batched", 128, "cpu", "forward", "none") == 1e6
    with pytest.raises(NotImplementedError, match="beyond the counting budget of 10 s"):
        ab.instruction_case(counts, "batched", 1024, "cpu", "forward", "none")
    out = capsys.readouterr().out
    assert (
        "3 of 4 CPU cases go to the counter (1 beyond a budget of 10 s predicted under valgrind)"
        in out
    )
    assert re.search(r"attnbench: case 1 of 3, batched .*: ok \(\d+ s elapsed\)", out), out


def test_the_budget_takes_the_cheapest_cases_and_none_takes_all():
    from attnbench import asv_bench as ab
    from attnbench.measure.instructions import (
        CountConfig,
        peak_for,
        predicted_seconds,
        within_budget,
    )

    cases = [
        (v, ab.spec_for(v, n, "cpu", "forward"))
        for v in ("batched", "chunked")
        for n in (128, 256, 512, 1024)
    ]
    config = CountConfig()
    left_out = within_budget(cases, 30.0, config)
    costs = [predicted_seconds(*c, config, peak_for(config)) for c in cases]
    kept = [i for i in range(len(cases)) if i not in left_out]
    assert sum(costs[i] for i in kept) <= 30.0 and left_out
    assert max(costs[i] for i in kept) <= min(costs[i] for i in left_out)  # the cheapest first
    assert within_budget(cases, None, config) == {}


@pytest.mark.slow
def test_a_quick_asv_run_evaluates_each_case_float64_reference_once(tmp_path):
    """A real ``asv run --quick`` of one case (the main grid's eight CPU benchmarks), float64 reference evaluations
    counted in every process asv starts (tests/reference_counter.py, loaded as a plugin). The same test on the code
    before this change: 8 evaluations in 8 processes (each benchmark's process set the case up and gated it; on the
    older gate, which evaluated the reference for each check, 16). Now: 1, in the setup_cache process."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: asv needs a commit hash to record results")
    conf = {
        "version": 1,
        "project": "attnbench",
        "repo": str(ROOT),
        "branches": ["main"],
        "environment_type": "virtualenv",
        "benchmark_dir": str(ROOT / "benchmarks"),
        "results_dir": str(tmp_path / "results"),
        "html_dir": str(tmp_path / "html"),
        "env_dir": str(tmp_path / "env"),
        "launch_method": "forkserver",
    }
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    log = tmp_path / "references.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNBENCH_")}
    env.update(
        {
            "HOME": str(tmp_path),
            "ASV_PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
            "ATTNBENCH_PLUGINS": "reference_counter",
            "ATTNBENCH_TEST_REFERENCE_LOG": str(log),
            **ONE_CASE,
        }
    )
    assert _asv(["machine", "--yes", "--machine", "count"], env, tmp_path).returncode == 0
    out = _asv(
        [
            "run",
            "--python=same",
            "--quick",
            "--set-commit-hash",
            head.stdout.strip(),
            "--machine",
            "count",
            "--bench",
            r"^bench_attention\.Attention",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    frame_read = load_asv(tmp_path / "results")
    frame = frame_read.frame
    ok = frame[frame["status"] == "ok"]
    assert len(ok) == 8 and ok["benchmark"].nunique() == 8, frame[
        ["benchmark", "status"]
    ].to_string()
    from tests.reference_counter import evaluations

    per_process = evaluations(log, SLICES)
    assert sum(per_process.values()) == 1 and len(per_process) == 1, per_process
