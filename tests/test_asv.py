"""asv smoke: the benchmark module passes `asv check` and a quick run of a small grid has no failures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.analysis.frame import load_asv

ROOT = Path(__file__).resolve().parents[1]
SMALL_GRID = {
    "ATTNBENCH_ASV_VARIANTS": "batched,chunked,sdpa_efficient",
    "ATTNBENCH_ASV_LENGTHS": "128",  # one length runs every benchmark's code; the counts are compared at 128
    "ATTNBENCH_ASV_MODES": "forward,backward",
}


def _asv(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def asv_env(tmp_path_factory):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: asv needs a commit hash to record results")
    tmp = tmp_path_factory.mktemp("asv")
    conf = {
        "version": 1, "project": "attnbench", "repo": str(ROOT), "branches": ["main"], "environment_type": "virtualenv",
        "benchmark_dir": str(ROOT / "benchmarks"), "results_dir": str(tmp / "results"),
        "html_dir": str(tmp / "html"), "env_dir": str(tmp / "env"), "launch_method": "forkserver",
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
    out = _asv(["run", "--python=same", "--quick", "--set-commit-hash", head, "--machine", "smoke"], env, tmp)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    frame = load_asv(tmp / "results")
    assert frame.attrs["problems"] == []
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
    assert set(gqa["kv_heads"]) == {2} and set(gqa["heads"]) == {8} and set(gqa["workload"]) == {"prefill"}
    assert {"time", "peak_tensor_bytes"} <= set(gqa["metric"])
    assert set(ok.loc[~ok["benchmark"].str.contains("GroupedQuery"), "kv_heads"]) == {8}
    from attnbench.measure.instructions import valgrind_version

    if valgrind_version() is not None:  # the Instructions class: every case counted in one valgrind process
        counted = ok[ok["metric"] == "instructions"].set_index(["variant", "seq_len", "mode", "mask"])["value"]
        assert {"batched", "chunked"} <= set(counted.index.get_level_values(0)) and (counted > 0).all()
        from tests.test_instructions import shared_counts  # the same case counted directly (count_instructions)

        direct = shared_counts(tmp_path_factory)["asv"]
        assert counted[("batched", 128, "forward", "none")] == pytest.approx(direct.instructions, rel=1e-3)


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

    spec, workload = contract.asv_case("bench_attention.Decode.time_decode", {"seq_len_k": 4096, "device": "cpu"})
    assert (workload, spec.lq, spec.lk, spec.hkv) == ("decode", 1, 4096, 8)
    spec, workload = contract.asv_case("bench_attention.GroupedQuery.time_gqa", {"seq_len": 1024})
    assert (workload, spec.lq, spec.lk, spec.heads, spec.hkv) == ("prefill", 1024, 1024, 8, 2)
    spec, workload = contract.asv_case("bench_attention.Attention.time_attention", {"seq_len": 64, "mode": "backward"})
    assert (workload, spec.lq, spec.hkv, spec.mode) == ("prefill", 64, 8, "backward")
    with pytest.raises((ValueError, TypeError)):
        contract.asv_case("bench_attention.Decode.time_decode", {"seq_len_k": "long"})


def test_instruction_counts_keep_to_the_budget_and_print_progress(monkeypatch, capsys):
    """The Instructions class counts the cheapest cases within its budget; the rest are n/a saying so. Its setup_cache
    prints its plan and a line per counted case (case i of n, the seconds elapsed) to asv's log."""
    import attnbench.measure.instructions as instructions
    from attnbench import asv_bench as ab

    sent = []

    def fake_count(cases, config=None, *, progress=None):
        sent.extend(cases)
        counts = [instructions.Count(n, s, "ok", instructions=1e6, calls=2, valgrind="fake") for n, s in cases]
        for i, count in enumerate(counts, 1):
            progress(i, len(cases), count)
        return counts

    monkeypatch.setattr(instructions, "valgrind_version", lambda: "valgrind-fake")
    monkeypatch.setattr(instructions, "count_instructions", fake_count)
    monkeypatch.setattr(ab, "INSTRUCTION_PARAMS", {"variant": ["batched", "sdpa_efficient"], "seq_len": [128, 1024],
                                                   "device": ["cpu"], "mode": ["forward"], "mask": ["none"]})
    monkeypatch.setattr(ab, "COUNT_BUDGET_S", 10.0)  # L=128 is predicted about 1 s under valgrind, L=1024 about 50 s
    counts = ab.instruction_counts()
    # batched at L=1024 is left out; sdpa_efficient (CUDA only) goes to the counter, which skips it with its reason
    assert [(n, s.seq_len) for n, s in sent] == [("batched", 128), ("sdpa_efficient", 128), ("sdpa_efficient", 1024)]
    assert ab.instruction_case(counts, "batched", 128, "cpu", "forward", "none") == 1e6
    with pytest.raises(NotImplementedError, match="beyond the grid's counting budget of 10 s"):
        ab.instruction_case(counts, "batched", 1024, "cpu", "forward", "none")
    out = capsys.readouterr().out
    assert "3 of 4 CPU cases go to the counter (1 beyond a budget of 10 s predicted under valgrind)" in out
    assert re.search(r"attnbench: case 1 of 3, batched .*: ok \(\d+ s elapsed\)", out), out


def test_the_budget_takes_the_cheapest_cases_and_none_takes_all():
    from attnbench import asv_bench as ab
    from attnbench.measure.instructions import CountConfig, _peak, predicted_seconds, within_budget

    cases = [(v, ab.spec_for(v, n, "cpu", "forward")) for v in ("batched", "chunked") for n in (128, 256, 512, 1024)]
    config = CountConfig()
    left_out = within_budget(cases, 30.0, config)
    costs = [predicted_seconds(*c, config, _peak(config)) for c in cases]
    kept = [i for i in range(len(cases)) if i not in left_out]
    assert sum(costs[i] for i in kept) <= 30.0 and left_out
    assert max(costs[i] for i in kept) <= min(costs[i] for i in left_out)  # the cheapest first
    assert within_budget(cases, None, config) == {}
