"""`attnbench regress` on a throwaway repository: planted regressions fail, an unchanged commit passes."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench import contract
from attnbench.analysis.frame import load_asv
from attnbench.gate import compare, regress, regress_many
from tests.conftest import ASV_ENV_DIR
from tests.neighbour import spinning_on_this_core

ROOT = Path(__file__).resolve().parents[1]
SUBSET = {
    "ATTNBENCH_ASV_VARIANTS": "batched,chunked",
    "ATTNBENCH_ASV_LENGTHS": "256,512",
    "ATTNBENCH_ASV_MODES": "forward",
    "ATTNBENCH_ASV_DEVICES": "cpu",
}
README_SUBSET = {**SUBSET, "ATTNBENCH_ASV_LENGTHS": "128,256"}
"""The README command's grid: the gate tests' small grid a length shorter (the counts under valgrind cost as the work
does; the doubling shows at any length)."""
BATCHED = "attnbench/variants/batched.py"
TWICE = (
    "    def forward(self, q, k, v, mask):\n",
    "    def forward(self, q, k, v, mask):\n        self._once(q, k, v, mask)\n        return self._once(q, k, v, mask)\n\n"
    "    def _once(self, q, k, v, mask):\n",
)
"""A deliberate 2x slowdown: batched does all of its work twice."""
SLOWER = (
    "    def forward(self, q, k, v, mask):\n",
    "    def forward(self, q, k, v, mask):\n        import time as _time\n\n        t0 = _time.perf_counter()\n"
    "        out = self._once(q, k, v, mask)\n        _time.sleep(0.5 * (_time.perf_counter() - t0))\n        return out\n\n"
    "    def _once(self, q, k, v, mask):\n",
)
"""A deliberate 1.5x slowdown (the size the gate must always catch): sleep half of each call's time."""
FAT = (
    "        probs = masked_softmax_(",
    "        keep = scores.clone()  # noqa: F841\n        probs = masked_softmax_(",
)
"""A deliberate extra full-size copy of the scores, alive until the output exists."""
CHUNKED = "attnbench/variants/chunked.py"
SQUARE = (
    "\n    bh = b * h\n",  # the first, in _stream (the forward's tile loop), not the backward's
    "\n    bh = b * h\n    square = torch.ones(lq, lk, dtype=torch.bool, device=q.device)  # noqa: F841\n",
)
"""A deliberate boolean L x L buffer in chunked's forward, alive until it returns: L² bytes, 1 MiB at
L=1024 beside about 12 MB of chunked's own (x1.08, within the x1.1 memory factor), x11.7 at 131072."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def _plant(repo: Path, name: str, path: str, *plants: str) -> None:
    """Replace, in ``path``, each ``old`` of the ``old, new, ...`` pairs (the first occurrence)."""
    text = (repo / path).read_text()
    for old, new in zip(plants[::2], plants[1::2], strict=True):
        assert old in text, f"planting {name}: pattern not found in {path}"
        text = text.replace(old, new, 1)
    (repo / path).write_text(text)


def _branch(
    repo: Path, name: str, path: str, *plants: str, also: tuple[tuple[str, ...], ...] = ()
) -> None:
    """A commit ``name`` on top of ``base`` that replaces, in ``path``, each ``old`` of the ``old, new, ...`` pairs,
    and likewise in each ``(path, old, new, ...)`` of ``also``."""
    _git(repo, "checkout", "-q", "-b", name, "base")
    for where, *pairs in ((path, *plants), *also):
        _plant(repo, name, where, *pairs)
    _git(repo, "commit", "-qam", name)


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    files = _git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard").splitlines()
    repo = tmp_path_factory.mktemp("throwaway") / "attnbench"
    for rel in files:
        if (ROOT / rel).is_file() and not rel.startswith("tests/fixtures/"):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    _git(repo, "init", "-q", "-b", "main")
    _git(
        repo,
        "-c",
        "user.email=ci@attnbench",
        "-c",
        "user.name=ci",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "root",
    )
    _git(repo, "config", "user.email", "ci@attnbench")
    _git(repo, "config", "user.name", "ci")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "branch", "base")
    # One commit for every plant, each in the variant it is judged on (the gate judges every variant's rows on their
    # own), one commit fewer timed in every round and measured by the exact gate than a commit per plant: batched does
    # its work twice (a 2x slowdown) and keeps an extra full-size copy of the scores alive until the output exists
    # (peak tensor bytes); chunked sleeps half of each call's time (a 1.5x slowdown) and keeps an L x L buffer (how
    # its bytes grow; its boolean fill is under 1% of chunked's call at L=256 and 512).
    _branch(repo, "slow", BATCHED, *TWICE, *FAT, also=((CHUNKED, *SLOWER, *SQUARE),))
    # An unchanged commit (documentation only).
    _branch(repo, "same", "README.md", "# attnbench", "# attnbench (docs touched)")
    return repo


HEADS = ["slow", "same"]
PLANTED = {"slow": ("batched", "chunked")}
"""The planted HEAD and its slowed variants: batched 2x, chunked 1.5x."""
NOISE_RETRIES = 2
"""Gate runs again, at most, for a planted HEAD the gate refused to judge because its rounds were disturbed."""


def _refused_for_noise(outcome, variants: tuple[str, ...]) -> bool:
    """A variant of ``variants`` with no time case regressed and one ``undecided`` because its rounds were disturbed
    ("noisy: ...")."""
    for variant in variants:
        rows = outcome.table[
            (outcome.table["metric"] == "time") & (outcome.table["variant"] == variant)
        ]
        if (
            not (rows["verdict"] == "regressed").any()
            and rows["reason"].str.startswith("noisy").any()
        ):
            return True
    return False


@pytest.fixture(scope="module")
def gate(throwaway, tmp_path_factory):
    """The planted HEAD and the unchanged one judged against BASE by the time gate in one asv run: BASE measured once,
    the rounds of the three commits interleaved, asv's one environment (the tests below read their HEAD's outcome, and
    on ``slow`` the variant they planted in: batched 2x, chunked 1.5x, a commit each before). One round, then the
    gate's own confirmation round for what it could not decide: the fewest samples the gate decides on. Time only
    (``deterministic=False``): the exact measures are the ``exact_gate`` tests', in the parallel part.

    The gate rightly refuses to judge samples another process kept off the core (``undecided``, "noisy"). These
    tests ask what it says when it can judge, so a planted HEAD it refused is measured again (with BASE), at most
    :data:`NOISE_RETRIES` times; one still refused fails its test. ``test_disturbed_rounds_are_never_decided``
    covers the refusal itself."""

    def judged(heads: list[str]) -> dict:
        return regress_many(
            "base",
            heads,
            repo=throwaway,
            subset=SUBSET,
            rounds=1,
            work_dir=tmp_path_factory.mktemp("gate"),
            deterministic=False,
        )

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(contract.ENV_ENV_DIR, str(ASV_ENV_DIR))
        outcomes = judged(HEADS)
        for _ in range(NOISE_RETRIES):
            again = [
                head
                for head, slowed in PLANTED.items()
                if _refused_for_noise(outcomes[head], slowed)
            ]
            if not again:
                break
            outcomes.update(judged(again))
        return outcomes


@pytest.mark.slow
@pytest.mark.serial
def test_planted_slowdown_is_flagged(gate):
    """batched's 2x is regressed, its ratio shown beyond x1.5. Its commit also slows chunked 1.5x (the next test's):
    that nothing is flagged where nothing changed is ``test_unchanged_commit_passes``'s, and that a verdict is named
    on the variant that changed is ``test_planted_extra_scores_copy_is_flagged``'s (batched's bytes alone regress)."""
    outcome = gate["slow"]
    flagged = outcome.regressions
    assert not outcome.passed
    assert ((flagged["metric"] == "time") & (flagged["variant"] == "batched")).any(), (
        outcome.table.to_string()
    )
    assert set(flagged["variant"]) <= {"batched", "chunked"}, flagged.to_string()
    ratios = outcome.table[
        (outcome.table["metric"] == "time") & (outcome.table["variant"] == "batched")
    ]["ratio"]
    assert ratios.max() > 1.5, (
        ratios.tolist()
    )  # visible; per-length ratios are timings, noisy on a shared box


@pytest.mark.slow
@pytest.mark.serial
def test_planted_1_5x_slowdown_never_passes(gate):
    """A 1.5x slowdown (chunked's, on the planted commit) is regressed on at least one length, and no length of it
    passes silently."""
    outcome = gate["slow"]
    time_rows = outcome.table[
        (outcome.table["metric"] == "time") & (outcome.table["variant"] == "chunked")
    ]
    assert not outcome.passed
    assert (time_rows["verdict"] == "regressed").any(), time_rows.to_string()
    assert set(time_rows["verdict"]) <= {"regressed", "undecided"}, time_rows.to_string()


@pytest.mark.slow
@pytest.mark.serial
def test_unchanged_commit_passes(gate):
    """No false regression; a time case too noisy to decide is reported undecided (exit 4), never passed."""
    outcome = gate["same"]
    assert outcome.regressions.empty, outcome.regressions.to_string()
    assert set(outcome.table["metric"]) == {"time"}, outcome.table.to_string()
    assert (outcome.table["verdict"] == "ok").sum() >= 2, outcome.table.to_string()


def test_regress_many_refuses_a_head_that_is_base_or_repeated():
    head = _git(ROOT, "rev-parse", "HEAD")
    with pytest.raises(ValueError, match="same commit"):
        regress_many("HEAD~1", ["HEAD", head[:12], "HEAD~1"], repo=ROOT)
    with pytest.raises(ValueError, match="different commits"):
        regress_many("HEAD~1", ["HEAD", head[:12]], repo=ROOT)
    with pytest.raises(ValueError, match="heads"):
        regress_many("HEAD~1", [], repo=ROOT)


@pytest.mark.slow
def test_cli_exit_codes(throwaway, tmp_path, capsys, monkeypatch):
    from attnbench.cli import main

    for key, value in SUBSET.items():
        monkeypatch.setenv(key, value)
    assert (
        main(
            [
                "regress",
                "no-such-rev",
                "HEAD",
                "--repo",
                str(throwaway),
                "--work-dir",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
    assert "no-such-rev" in capsys.readouterr().err


def _frame(rows):
    base = {
        "benchmark": "b",
        "variant": "batched",
        "seq_len": 256,
        "device": "cpu",
        "mode": "forward",
        "spread": math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
    }
    return pd.DataFrame([{**base, **r} for r in rows])


def test_compare_rules_without_asv():
    rows = [
        {"commit": "A", "metric": "time", "value": 1.0, "status": "ok"},
        {"commit": "B", "metric": "time", "value": 1.0, "status": "ok"},
        {"commit": "A", "metric": "peak_tensor_bytes", "value": 100.0, "status": "ok"},
        {"commit": "B", "metric": "peak_tensor_bytes", "value": 112.0, "status": "ok"},
        {"commit": "A", "metric": "flops", "value": 10.0, "status": "ok", "variant": "chunked"},
        {"commit": "B", "metric": "flops", "value": 10.0, "status": "failed", "variant": "chunked"},
    ]
    key = ("batched", 256, "cpu", "forward", "none")
    rng = np.random.default_rng(7)
    base = list(np.exp(rng.normal(0, 0.05, 20)))  # about 7% IQR
    same = list(np.exp(rng.normal(0, 0.05, 20)))
    table = compare(
        _frame(rows), "A", "B", samples={("A", *key): base, ("B", *key): same}
    ).set_index("metric")
    assert table.loc["time", "verdict"] == "ok", table.loc["time", "reason"]
    assert table.loc["peak_tensor_bytes", "verdict"] == "regressed"
    assert table.loc["flops", "verdict"] == "regressed"  # ran on BASE, fails on HEAD
    # Planted: HEAD 1.5x slower in its samples (the medians in the frame are not what decides).
    slow = [1.5 * x for x in same]
    table = compare(
        _frame(rows), "A", "B", samples={("A", *key): base, ("B", *key): slow}
    ).set_index("metric")
    assert table.loc["time", "verdict"] == "regressed" and table.loc[
        "time", "ratio"
    ] == pytest.approx(1.5, rel=0.1)
    # Planted: no recorded samples -> undecided, never a pass.
    table = compare(_frame(rows), "A", "B").set_index("metric")
    assert (
        table.loc["time", "verdict"] == "undecided"
        and "too few samples" in table.loc["time", "reason"]
    )
    # Planted: wide samples (40% IQR) with a 1.3x shift: neither a significant regression nor a pass.
    wide_b = list(np.exp(rng.normal(0, 0.3, 6)))
    wide_h = list(1.3 * np.exp(rng.normal(0, 0.3, 6)))
    table = compare(
        _frame(rows), "A", "B", samples={("A", *key): wide_b, ("B", *key): wide_h}
    ).set_index("metric")
    assert table.loc["time", "verdict"] == "undecided", table.loc["time", "reason"]


def test_disturbed_rounds_are_never_decided():
    """Planted: a 1.5x slowdown that the samples alone would call a regression (p far below 0.01), measured while
    a neighbour slowed the calibration probe; and an unchanged pair measured in a fast moment on one side."""
    rows = [{"commit": c, "metric": "time", "value": 1.0, "status": "ok"} for c in ("A", "B")]
    key = ("batched", 256, "cpu", "forward", "none")
    rng = np.random.default_rng(3)
    base, head = list(np.exp(rng.normal(0, 0.05, 20))), list(1.5 * np.exp(rng.normal(0, 0.05, 20)))
    quiet = [1e-3 * (1 + 0.02 * x) for x in rng.normal(0, 1, 20)]
    busy = [2e-3] * 12 + quiet[:8]  # the neighbour came during most of HEAD's rounds
    samples = {("A", *key): base, ("B", *key): head}
    decided = compare(
        _frame(rows), "A", "B", samples=samples, probes={("A", *key): quiet, ("B", *key): quiet}
    )
    assert (
        decided.set_index("metric").loc["time", "verdict"] == "regressed"
    )  # quiet rounds: the samples decide
    noisy = compare(
        _frame(rows), "A", "B", samples=samples, probes={("A", *key): quiet, ("B", *key): busy}
    )
    row = noisy.set_index("metric").loc["time"]
    assert row["verdict"] == "undecided" and row["reason"].startswith(
        "noisy: HEAD: 12 of 20 calibration probes"
    ), row["reason"]
    # Planted: the probes stayed typical, but most of HEAD's samples waited a third of their time for a core
    # (two spinning neighbours on 2 cores: a 1 ms probe slips between the scheduler's slices, an 8 ms call not).
    shares = {("A", *key): [0.0] * 20, ("B", *key): [0.34] * 12 + [0.01] * 8}
    crowded = (
        compare(
            _frame(rows),
            "A",
            "B",
            samples=samples,
            probes={("A", *key): quiet, ("B", *key): quiet},
            runqueue_shares=shares,
        )
        .set_index("metric")
        .loc["time"]
    )
    assert (
        crowded["verdict"] == "undecided"
        and "HEAD: 12 of 20 samples waited for a core" in crowded["reason"]
    ), crowded
    fast = [0.6e-3] * 10 + quiet[:10]
    same = compare(
        _frame(rows),
        "A",
        "B",
        samples={("A", *key): base, ("B", *key): list(base)},
        probes={("A", *key): fast, ("B", *key): quiet + quiet},
    )
    assert (
        same.set_index("metric").loc["time", "verdict"] == "undecided"
    )  # a fast moment is a disturbance too


def test_a_step_of_the_machine_speed_is_never_a_verdict():
    """The shared machine's speed steps by about 1.36x for tens of seconds (measured: probes 1.1 -> 1.5 ms, an
    unchanged commit's samples 6.2 -> 8.5 ms). Planted: an unchanged HEAD measured in the slow moment. Its samples
    as measured read as a confident x1.36 regression; divided by the probe beside each they read x1.0, and the
    two disagreeing is ``undecided``. Measured in the same moment it is ``ok``; a real 1.5x slowdown in the slow
    moment is ``regressed`` both ways; a side a neighbour descheduled stays refused."""
    rows = [{"commit": c, "metric": "time", "value": 1.0, "status": "ok"} for c in ("A", "B")]
    key = ("batched", 256, "cpu", "forward", "none")
    rng = np.random.default_rng(5)

    def moment(speed: float, work: float, n: int = 20) -> tuple[list[float], list[float]]:
        """(samples, probes) of ``n`` samples of ``work`` x the case's time taken while the machine runs ``speed`` x slower."""
        probes = [1.1e-3 * speed * (1 + 0.02 * x) for x in rng.normal(0, 1, n)]
        return [
            p / 1.1e-3 * work * 6.2e-3 * (1 + 0.02 * x)
            for p, x in zip(probes, rng.normal(0, 1, n), strict=True)
        ], probes

    base = moment(1.0, 1.0)

    def verdict(
        head: tuple[list[float], list[float]], corrected: bool = True, shares=None
    ) -> pd.Series:
        sides = {("A", *key): base, ("B", *key): head}
        fixed = (
            {k: [s / p for s, p in zip(*v, strict=True)] for k, v in sides.items()}
            if corrected
            else None
        )
        return (
            compare(
                _frame(rows),
                "A",
                "B",
                samples={k: v[0] for k, v in sides.items()},
                corrected=fixed,
                runqueue_shares=shares,
            )
            .set_index("metric")
            .loc["time"]
        )

    stepped = moment(1.36, 1.0)
    raw = verdict(stepped, corrected=False)
    assert raw["verdict"] == "regressed" and 1.3 < raw["ratio"] < 1.45, (
        raw
    )  # the false alarm, without the probes
    moved = verdict(stepped)
    assert moved["verdict"] == "undecided" and "the machine's speed moved" in moved["reason"], moved
    assert abs(moved["ratio"] - 1) < 0.05, moved  # the ratio shown is the speed-corrected one
    same = verdict(moment(1.0, 1.0))
    assert same["verdict"] == "ok" and same["reason"].startswith("speed-corrected"), same
    slow = moment(1.36, 1.5)
    regressed = verdict(slow)
    assert regressed["verdict"] == "regressed" and 1.4 < regressed["ratio"] < 1.6, regressed
    crowded = verdict(slow, shares={("A", *key): [0.0] * 20, ("B", *key): [0.34] * 12 + [0.01] * 8})
    assert (
        crowded["verdict"] == "undecided"
        and "HEAD: 12 of 20 samples waited for a core" in crowded["reason"]
    ), crowded


def test_notes_speak_only_where_both_verdicts_do():
    """Counts and time disagree only through their own verdicts. Planted: a time regression measured beside a
    neighbour (noisy) and one beside counts that regressed themselves (x1.0047, the output pass seen beside two
    spinning neighbours) must make no "counts flat" note; a clean 1.6x slowdown with flat counts, and counts up
    with time within its allowance, must."""
    rng = np.random.default_rng(11)
    quiet = [1e-3 * (1 + 0.02 * x) for x in rng.normal(0, 1, 20)]
    busy = [2e-3] * 12 + quiet[:8]
    base = list(np.exp(rng.normal(0, 0.05, 20)))
    plan = {  # variant: (time factor, HEAD's probes, count ratio, expected note)
        "batched": (1.6, quiet, 1.0, "time x1.6"),
        "sdpa": (1.6, busy, 1.0, ""),
        "chunked": (2.0, quiet, 1.0047, ""),
        "local": (1.0, quiet, 1.05, "counts x1.0500 with time within its allowance"),
    }
    rows, samples, probes = [], {}, {}
    for variant, (slower, head_probes, counts, _) in plan.items():
        key = (variant, 256, "cpu", "forward", "none")
        samples |= {("A", *key): base, ("B", *key): [slower * x for x in base]}
        probes |= {("A", *key): quiet, ("B", *key): head_probes}
        rows += [
            {"commit": c, "variant": variant, "metric": "time", "value": v, "status": "ok"}
            for c, v in (("A", 1.0), ("B", slower))
        ]
        rows += [
            {"commit": c, "variant": variant, "metric": "instructions", "value": v, "status": "ok"}
            for c, v in (("A", 1e8), ("B", 1e8 * counts))
        ]
    table = compare(_frame(rows), "A", "B", samples=samples, probes=probes, metric="both")
    for variant, (*_, note) in plan.items():
        notes = set(table.loc[table["variant"] == variant, "note"])
        assert (
            (notes == {""}) if not note else (len(notes) == 1 and notes.pop().startswith(note))
        ), (variant, notes)


def test_time_rounds_record_their_probe(tmp_path, monkeypatch):
    """The time benchmark's setup times a probe (asv runs it before every sample) and its teardown logs it with the
    sample's wall time, read back per case as probes and as speed-corrected samples (sample / probe)."""
    from attnbench import asv_bench, contract
    from attnbench.gate import read_corrected, read_probes

    log = tmp_path / "probes.jsonl"
    monkeypatch.setenv(contract.ENV_PROBE_LOG, str(log))
    monkeypatch.setenv("ASV_COMMIT", "c0ffee")
    monkeypatch.setattr(asv_bench, "TIMER", asv_bench.WaitWatch())
    key = ("c0ffee", "batched", 64, "cpu", "forward", "none")
    for _ in range(3):
        call, _spec = asv_bench.timed_case("batched", 64, "cpu", "forward", "none")
        start = asv_bench.TIMER()
        call()
        asv_bench.TIMER()
        asv_bench.timed_teardown()
    asv_bench.timed_case("batched", 64, "cpu", "forward", "none")
    asv_bench.timed_teardown()  # peakmem's samples: nothing timed, nothing logged
    log.write_text(
        log.read_text() + '{"commit": "c0ffee", "variant": "batch'
    )  # a writer killed mid-line
    lines = [json.loads(line) for line in log.read_text().splitlines()[:-1]]
    assert len(lines) == 3 and all(
        line["sample_s"] > 0 and line["probe_s"] > 0 for line in lines
    ), lines
    assert start > 0 and read_probes(log) == {key: [line["probe_s"] for line in lines]}
    assert read_corrected(log) == {key: [line["sample_s"] / line["probe_s"] for line in lines]}
    (tmp_path / "old.jsonl").write_text(
        "".join(
            json.dumps({k: v for k, v in line.items() if k != "sample_s"}) + "\n" for line in lines
        )
    )
    assert (
        read_corrected(tmp_path / "old.jsonl") == {}
    )  # probes only (an older commit's log): nothing to correct


def test_the_timer_sees_a_neighbour_take_the_core_and_not_a_sleep(tmp_path, monkeypatch):
    """asv reads the time benchmark's timer in pairs around the timed calls; the teardown logs the share of their
    wall time the thread waited for a core. Planted: a spinning process pinned to this process's core (a neighbour:
    counted), then a call that sleeps (a slowdown of its own: not counted)."""
    import time

    from attnbench import asv_bench, contract
    from attnbench.gate import read_probes
    from attnbench.measure import schedstat

    if not schedstat.available():
        pytest.skip(f"needs Linux's per-thread scheduler figures ({schedstat.SCHEDSTAT})")
    log = tmp_path / "probes.jsonl"
    monkeypatch.setenv(contract.ENV_PROBE_LOG, str(log))
    monkeypatch.setenv("ASV_COMMIT", "c0ffee")
    watch = asv_bench.WaitWatch()
    monkeypatch.setattr(asv_bench, "TIMER", watch)
    key = ("c0ffee", "batched", 64, "cpu", "forward", "none")

    def timed(call) -> None:
        start = watch()
        call()
        assert watch() > start  # the wall clock asv times with

    def spin() -> None:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass

    asv_bench.timed_case("batched", 64, "cpu")
    with spinning_on_this_core(30.0):
        timed(spin)
    asv_bench.timed_teardown()
    asv_bench.timed_case("batched", 64, "cpu")
    # one sample of two calls: two pairs of readings. Each wake-up may wait for a core beside the
    # parallel tests (a few ms): 0.3 s sleeps keep that under 0.1 of the wall time at up to 30 ms
    for _ in range(2):
        timed(lambda: time.sleep(0.3))
    asv_bench.timed_teardown()
    crowded, slept = read_probes(log, "runqueue_share")[key]
    assert crowded > 0.25, crowded  # about half: two runnable processes on one core
    assert slept < 0.1, slept
    assert watch.take() == (0.0, None)  # taken by the teardown: the next sample starts afresh


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1.0, 0.5, -2.0])
def test_bad_factors_are_usage_errors(bad):
    frame = _frame([{"commit": "A", "metric": "time", "value": 1.0, "status": "ok"}])
    with pytest.raises(ValueError, match="time_factor"):
        compare(frame, "A", "B", time_factor=bad)
    with pytest.raises(ValueError, match="memory_factor"):
        compare(frame, "A", "B", memory_factor=bad)
    with pytest.raises(ValueError, match="time_factor"):
        regress("base", "HEAD", repo=ROOT, time_factor=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_rounds_are_a_count_of_zero_or_more(bad):
    """Refused before any git or asv work; 0 (no time rounds) is taken, except where nothing else is measured."""
    with pytest.raises(ValueError, match="rounds must be an int >= 0"):
        regress_many("HEAD~1", ["HEAD"], repo=ROOT, rounds=bad)
    with pytest.raises(ValueError, match="measures nothing"):
        regress_many("HEAD~1", ["HEAD"], repo=ROOT, rounds=0, deterministic=False)


@pytest.mark.parametrize("flag", ["--time-factor", "--memory-factor"])
@pytest.mark.parametrize("bad", ["nan", "inf", "1", "0.9"])
def test_cli_bad_factors_exit_2(flag, bad, capsys):
    from attnbench.cli import main

    try:
        code = main(["regress", "HEAD~1", flag, bad])
    except SystemExit as exc:  # argparse's own usage error
        code = exc.code
    assert code == 2 and flag in capsys.readouterr().err


def _outcome(verdicts):
    from attnbench.gate import Outcome

    table = pd.DataFrame(
        [
            {
                "benchmark": "b",
                "metric": "time",
                "variant": "batched",
                "seq_len": 256,
                "mode": "forward",
                "base_value": 1.0,
                "head_value": 1.0,
                "ratio": 1.0,
                "verdict": v,
                "reason": "r",
                "note": "",
            }
            for v in verdicts
        ]
    )
    return Outcome(
        table=table,
        regressions=table[table["verdict"].isin(["regressed", "wrong"])],
        undecided=table[table["verdict"] == "undecided"],
        base="a" * 40,
        head="b" * 40,
        results_dir=Path("."),
    )


@pytest.mark.parametrize(
    ("verdicts", "code", "word"),
    [
        (["ok", "ok"], 0, "PASS"),
        (["ok", "undecided"], 4, "UNDECIDED"),  # planted: an undecided case must not pass silently
        (["regressed", "undecided"], 1, "FAIL"),
    ],
)
def test_cli_exit_code_per_outcome(monkeypatch, capsys, verdicts, code, word):
    import attnbench.gate
    from attnbench.cli import main

    monkeypatch.setattr(attnbench.gate, "regress", lambda *a, **k: _outcome(verdicts))
    assert main(["regress", "HEAD~1"]) == code
    assert word in capsys.readouterr().out


def test_relative_work_dir_is_taken_once_from_the_invocation_directory(tmp_path, monkeypatch):
    """Planted: asv runs with cwd=work; a relative work dir there became '.asv/regress/.asv/regress'."""
    import attnbench.gate.session as session_module
    from attnbench.gate import RegressError

    seen = []
    trace = "\n".join(
        ["Traceback (most recent call last):"]
        + [f'  File "x{i}.py", line {i}, in f' for i in range(40)]
        + [
            "FileNotFoundError: [Errno 2] No such file or directory: 'somewhere/really/long/path.json'"
        ]
    )

    def fake_asv(args, *, cwd, env, log, **_):
        seen.append(cwd)
        return subprocess.CompletedProcess(args, 1, stdout="", stderr=trace)

    monkeypatch.setattr(session_module, "_asv", fake_asv)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RegressError) as info:
        regress("HEAD~1", "HEAD", repo=ROOT, work_dir=".asv/regress")
    work = tmp_path / ".asv" / "regress"
    assert seen == [work]  # absolute, resolved against the invocation directory
    conf = json.loads((work / "asv.conf.json").read_text())
    assert conf["results_dir"] == str(work / "results")
    message = str(info.value)
    assert (
        message.splitlines()[-2]
        .strip()
        .startswith(
            "FileNotFoundError: [Errno 2] No such file or directory: "
            "'somewhere/really/long/path.json'"
        )
    )  # whole lines, the last one kept
    assert all(line.startswith("  ") for line in message.splitlines()[1:-1])  # no line cut mid-word
    assert "exit 1" in message and str(work / "asv.log") in message


def test_a_subset_narrows_the_ci_grid(tmp_path, monkeypatch):
    """Planted: a subset naming variants and lengths only ran asv's whole mask axis (none and causal: twice the CI
    grid's cases); what a subset leaves unset is the CI grid's, as for the grid variables of the environment."""
    import attnbench.gate.session as session_module
    from attnbench.gate import RegressError

    seen = []

    def fake_asv(args, *, cwd, env, log, **_):
        seen.append(env)
        return subprocess.CompletedProcess(args, 1, stdout="", stderr="stopped here by the test")

    monkeypatch.setattr(session_module, "_asv", fake_asv)
    monkeypatch.delenv(contract.ENV_MASKS, raising=False)
    with pytest.raises(RegressError):
        regress(
            "HEAD~1",
            "HEAD",
            repo=ROOT,
            work_dir=tmp_path,
            subset={contract.ENV_VARIANTS: "batched"},
        )
    ci = contract.grid_environment(contract.GRIDS["ci"])
    assert seen[0][contract.ENV_VARIANTS] == "batched"
    assert seen[0][contract.ENV_MASKS] == ci[contract.ENV_MASKS] == "none"
    assert seen[0][contract.ENV_LENGTHS] == ci[contract.ENV_LENGTHS]


def test_base_equal_to_head_is_a_usage_error(capsys):
    from attnbench.cli import main

    head = _git(ROOT, "rev-parse", "HEAD")
    with pytest.raises(ValueError, match="same commit"):
        regress(head, "HEAD", repo=ROOT)
    assert main(["regress", "HEAD", "HEAD", "--repo", str(ROOT)]) == 2
    assert "same commit" in capsys.readouterr().err


@pytest.mark.slow
def test_readme_command_works_in_a_fresh_clone(tmp_path):
    """`attnbench regress HEAD~1 HEAD`, default options, in a fresh clone whose HEAD is the planted 2x (batched does its
    work twice): on a small grid (:data:`README_SUBSET`) and in the gate tests' asv environment (both set through the
    environment, as a user or a CI cache would). With valgrind the default decides on instruction counts too: batched's double at
    every length (x2.00), chunked's do not move."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    branch = _git(ROOT, "rev-parse", "--abbrev-ref", "HEAD")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--branch", branch, str(ROOT), str(clone)], check=True)
    _git(clone, "config", "user.email", "ci@attnbench")
    _git(clone, "config", "user.name", "ci")
    _git(clone, "branch", "base")
    _branch(clone, "slow", BATCHED, *TWICE)
    env = {
        **os.environ,
        "PYTHONPATH": str(clone),
        **README_SUBSET,
        contract.ENV_ENV_DIR: str(ASV_ENV_DIR),
    }
    out = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "regress", "HEAD~1", "HEAD"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    text = out.stdout + out.stderr
    assert ".asv/regress/.asv/regress" not in text and "Traceback" not in text
    assert any((clone / ".asv" / "regress" / "results").rglob("*.json")), text
    assert f"results: {clone / '.asv' / 'regress' / 'results'}" in text
    ran = load_asv(clone / ".asv" / "regress" / "results").frame
    assert set(ran["variant"]) == {"batched", "chunked"}, set(
        ran["variant"]
    )  # the grid variables were honoured
    assert out.returncode == 1 and "FAIL" in out.stdout, text
    if shutil.which("valgrind") is None:
        assert "falls back to time" in out.stderr, text
        return
    lengths = [int(n) for n in README_SUBSET["ATTNBENCH_ASV_LENGTHS"].split(",")]
    for n in lengths:
        printed = re.search(rf"^  batched L={n} fwd instructions x([0-9.]+)", out.stdout, re.M)
        assert printed and float(printed.group(1)) == pytest.approx(2.0, abs=0.01), text
    counts = ran[ran["metric"] == "instructions"].pivot_table(
        index=["variant", "seq_len"], columns="commit", values="value"
    )
    ratios = (
        counts.iloc[:, 0] / counts.iloc[:, 1]
    ).to_dict()  # either order: the commits' columns sort by hash
    for n in lengths:
        assert max(ratios[("batched", n)], 1 / ratios[("batched", n)]) == pytest.approx(
            2.0, abs=0.01
        ), ratios
        assert abs(ratios[("chunked", n)] - 1) < 1e-3, ratios


def test_a_long_asv_step_reports_where_it_is(tmp_path):
    """Planted: an asv stand-in that starts a benchmark's line (asv ends it when the benchmark is done), then says
    nothing for 0.7 s. With a 0.2 s heartbeat the caller hears that benchmark named, item i of n, several times
    (a reader that waited for the newline named the line before it for the whole benchmark); its
    output is all kept, each line stamped with the seconds into the step."""
    from attnbench.gate.session import _streamed

    script = (
        "import sys, time\nprint('· Running 2 total benchmarks (2 commits * 1 environments * 1 benchmarks)')\n"
        "print('[ 0.00%] · For attnbench commit 1a2b3c4d (round 1/1):')\n"
        "print('[ 0.00%] ·· Benchmarking virtualenv-py3.11-build-matplotlib3.11.2-numpy2.4.6')\n"
        "sys.stdout.write('[50.00%] ··· bench_attention.Attention.time_attention')\nsys.stdout.flush()\n"
        "time.sleep(0.7)\nprint('   ok')\nprint('done')"
    )
    heard = []
    out = _streamed(
        [sys.executable, "-c", script], tmp_path, dict(os.environ), heard.append, heartbeat_s=0.2
    )
    assert out.returncode == 0 and out.stdout.splitlines()[-1].endswith("] done"), out.stdout
    assert re.match(r"^\[\s+\d+\.\d s\] · Running 2 total", out.stdout), out.stdout
    named = [h for h in heard if "bench_attention.Attention.time_attention" in h]
    assert len(named) >= 2, heard  # whole seconds: tests/test_gate_terminal.py checks they move
    assert all("asv item 1 of 2: commit 1a2b3c4d, round 1 of 1" in h for h in named), heard


def test_where_counts_decide_time_is_taken_at_the_longest_length_only():
    """The --bench pattern selects asv's parameter sets by name('variant', length, ...): the longest length only."""
    from attnbench.gate.decision import NOT_TIMED, mark_not_timed
    from attnbench.gate.session import time_selection

    pattern, length = time_selection({contract.ENV_LENGTHS: "256,512,1024"})
    assert length == 1024
    names = [
        f"bench_attention.Attention.time_attention('{v}', {n}, 'cpu', 'forward', 'none')"
        for v in ("batched", "chunked")
        for n in (256, 512, 1024)
    ]
    assert [n for n in names if re.search(pattern, n)] == [n for n in names if ", 1024, " in n]
    assert not re.search(
        pattern,
        "bench_attention.AttentionMetrics.track_flops('batched', 1024, 'cpu', 'forward', 'none')",
    )
    table = pd.DataFrame(
        {
            "metric": ["time", "time", "instructions"],
            "seq_len": [256, 1024, 256],
            "verdict": ["n/a", "ok", "ok"],
            "reason": ["", "", ""],
        }
    )
    assert mark_not_timed(table, 1024)["verdict"].tolist() == [NOT_TIMED, "ok", "ok"]


def test_the_twin_environment_shares_the_packages_and_nothing_asv_writes(tmp_path):
    """The twin's packages are hard links of the original's (made in a second, no second gigabyte); what asv writes
    per commit (its project checkout, its install record) is copied, so a write in one is not seen in the other;
    a twin whose pins differ is made again."""
    from attnbench.gate.session import twin_environments

    env = tmp_path / "env" / "abc123"
    (env / "lib" / "site-packages" / "torch").mkdir(parents=True)
    (env / "lib" / "site-packages" / "torch" / "__init__.py").write_text("big")
    (env / "project").mkdir()
    (env / "project" / "setup.py").write_text("commit A")
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / "asv-env-info.json").write_text('{"requirements": {"torch": "2.13.0"}}')
    (env / "asv-install-status.json").write_text('{"commit": "A"}')
    twin = twin_environments(tmp_path / "env") / "abc123"
    assert twin.parent == tmp_path / "env-twin"
    package = "lib/site-packages/torch/__init__.py"
    assert (twin / package).stat().st_ino == (env / package).stat().st_ino  # a link
    assert (twin / "bin" / "python").is_symlink()
    (twin / "project" / "setup.py").write_text("commit B")
    (twin / "asv-install-status.json").write_text('{"commit": "B"}')
    assert (env / "project" / "setup.py").read_text() == "commit A"
    assert (env / "asv-install-status.json").read_text() == '{"commit": "A"}'
    assert (
        twin_environments(tmp_path / "env") / "abc123" == twin
        and (twin / "project" / "setup.py").read_text() == "commit B"
    )
    (env / "asv-env-info.json").write_text(
        '{"requirements": {"torch": "2.14.0"}}'
    )  # new pins: made again
    twin_environments(tmp_path / "env")
    assert (twin / "project" / "setup.py").read_text() == "commit A"


@pytest.mark.slow
def test_bisect_names_the_planted_extra_buffer_end_to_end(tmp_path):
    """Planted: 4 commits of README edits, the 3rd also keeping an extra copy of batched's scores. ``attnbench bisect``
    on batched L=256's peak tensor bytes names commit 3 with the copy's growth after GOOD and 2 probes (2 good, 3 bad),
    through asv in the tests' shared environment (here, in this module, so that no other worker's asv installs into it
    at the same time). How few probes a longer history takes is the search's own property, tested on scripted
    measurements (tests/test_bisect.py: every first bad commit of 16 in at most 5 probes); each probe here is an
    install and an asv run, so the history is as short as still needs a search. Bytes, not instruction counts: a
    probe is then seconds, not a valgrind process (20 s of CPU; asv's counts are the README command's test above)."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    from tests.test_bisect import planted_history

    clone, commits = planted_history(tmp_path, n=4, culprit=3, plant=(BATCHED, *FAT))
    good = _git(clone, "rev-parse", f"{commits[0]}~1")
    env = {**os.environ, "PYTHONPATH": str(clone), contract.ENV_ENV_DIR: str(ASV_ENV_DIR)}
    started = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnbench.cli",
            "bisect",
            good,
            commits[-1],
            "--case",
            "batched:256",
            "--metric",
            "peak_tensor_bytes",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    named = re.search(
        r"^first bad commit: ([0-9a-f]{40}) x([0-9.]+) peak_tensor_bytes \(batched L=256\)",
        out.stdout,
        re.M,
    )
    # one more (B, H, L, L) float32 buffer (2 MiB) on GOOD's peak (4.7 MB: two score buffers, the output, ...)
    assert named and named[1] == commits[2] and 1.3 < float(named[2]) < 1.6, text
    probes = re.findall(r"^probe \d+: ([0-9a-f]{10}) (good|bad)", out.stdout, re.M)
    assert probes == [(commits[1][:10], "good"), (commits[2][:10], "bad")], text
    assert re.search(r"^bisect \[\s*\d+ s\] measuring GOOD", out.stderr, re.M), (
        text
    )  # progress, with elapsed time
    print(f"bisect end to end: {time.monotonic() - started:.0f} s\n{out.stdout}")


def test_a_gate_run_decides_on_its_own_measurements_only(tmp_path, monkeypatch):
    """Planted (seen): a work directory kept from a run with counts held BASE's counts of that run; a second run
    that took no counts then read "ran on BASE, not on HEAD" and failed every count. A session starts empty."""
    import attnbench.gate.session as session_module
    from attnbench.gate import AsvSession

    monkeypatch.setattr(
        session_module, "_asv", lambda args, **_: subprocess.CompletedProcess(args, 0, "", "")
    )
    stale = tmp_path / "work" / "results" / "attnbench-ci" / "0123abcd-env.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    AsvSession.open(ROOT, tmp_path / "work", None, "attnbench-ci", None)
    assert not stale.exists()


def test_asv_is_run_again_when_it_read_the_machine_file_mid_rewrite(tmp_path, monkeypatch):
    """Planted (seen, the home directory shared with other users' asv runs): asv read ~/.asv-machine.json while another
    asv rewrote it, stopped, and BASE had no results. The call is run again; another failure is not."""
    import attnbench.gate.session as session_module
    from attnbench.gate import AsvSession

    calls = []
    race = "· Error parsing JSON in file '/root/.asv-machine.json': Expecting value: line 1 column 1 (char 0)"

    def fake_asv(args, **_):
        calls.append(args[0])
        if args[0] == "run" and calls.count("run") < 3:
            return subprocess.CompletedProcess(args, 1, race, "")
        return subprocess.CompletedProcess(args, 1 if args[0] == "publish" else 0, "", "")

    monkeypatch.setattr(session_module, "_asv", fake_asv)
    monkeypatch.setattr(session_module.time, "sleep", lambda s: None)
    session = AsvSession.open(ROOT, tmp_path / "work", None, "attnbench-ci", None)
    assert session.run(["a" * 40], "x").returncode == 0 and calls.count("run") == 3
    assert (
        session.asv(["publish"]).returncode == 1 and calls.count("publish") == 1
    )  # not that race: not again


def test_the_gate_table_fits_a_hundred_columns_with_units(monkeypatch, capsys):
    """Its lines were 325 characters wide and its time columns carried no unit."""
    import attnbench.gate
    from attnbench.cli import main

    outcome = _outcome(["ok", "undecided"])
    outcome.table.loc[1, ["metric", "base_value", "head_value", "ratio", "reason"]] = [
        "time",
        0.0123,
        0.0251,
        2.04,
        "noisy: " + "a neighbour took the core " * 12,
    ]
    monkeypatch.setattr(attnbench.gate, "regress", lambda *a, **k: outcome)
    main(["regress", "HEAD~1"])
    lines = capsys.readouterr().out.splitlines()
    table = lines[: lines.index("")]
    assert max(len(line) for line in table) <= 100, table
    # the undecided row first, its long reason wrapped below it, then the ok row
    assert "12.3 ms" in table[1] and "x2.04" in table[1] and table[-1].startswith("ok "), table


@pytest.fixture(scope="module")
def exact_gate(throwaway, tmp_path_factory) -> dict:
    """The planted extra scores copy (batched) and square buffer (chunked), both on ``slow``, and the README-only
    commit judged against BASE in one asv session on the exact measures alone (``rounds=0``: no time rounds, so not
    serial): batched and chunked at three lengths, the fewest asv runs that fit a growth. Three commits: the two
    plants were two HEADs, and each test reads the variant it planted in (its rows are judged per variant). In one asv
    process (``parallel=False``): a twin beside it would discover the suite and set itself up again (about 7 s of a
    core) to save wall time this worker shares anyway; the README command's test runs the twin."""
    subset = {**SUBSET, "ATTNBENCH_ASV_LENGTHS": "256,512,1024"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(contract.ENV_ENV_DIR, str(ASV_ENV_DIR))
        return regress_many(
            "base",
            ["slow", "same"],
            repo=throwaway,
            subset=subset,
            rounds=0,
            work_dir=tmp_path_factory.mktemp("exact-gate"),
            parallel=False,
        )


@pytest.mark.slow
def test_planted_extra_scores_copy_is_flagged(exact_gate):
    outcome = exact_gate["slow"]  # planted beside the double work and chunked's square buffer
    assert "time" not in set(outcome.table["metric"]), outcome.table.to_string()  # no round timed
    regressed = outcome.regressions
    mem = regressed[
        (regressed["metric"] == "peak_tensor_bytes") & (regressed["basis"] == "measured")
    ]
    assert set(mem["variant"]) == {"batched"} and set(mem["seq_len"]) == {256, 512, 1024}, (
        outcome.table.to_string()
    )
    # One more (B, H, L, L) buffer on top of BASE's peak: the growth is that buffer's size, whatever
    # else BASE holds (two score buffers, the output, the checked result).
    for rec in mem.to_dict("records"):
        score_bytes = 8 * rec["seq_len"] ** 2 * 4  # H=8, float32
        assert rec["head_value"] - rec["base_value"] >= 0.95 * score_bytes, (
            outcome.table.to_string()
        )


@pytest.mark.slow
def test_a_planted_square_buffer_fails_on_how_its_cost_grows(exact_gate, tmp_path):
    """The planted L x L buffer in chunked stays within x1.1 of peak bytes at every measured length;
    the gate fails it on the ratio its fits predict at L=131072 and names the exponent change, the
    report draws it; the README-only commit, gated in the same asv session, reports no exponent
    change. (The buffer shares its commit with batched's extra scores copy: chunked's rows are
    this test's.)"""
    from attnbench.gate import write_verdicts
    from attnbench.gate.markdown import gate_summary
    from attnbench.gate_table import growth_lines
    from attnbench.reporting import make_report

    square, same = exact_gate["slow"], exact_gate["same"]
    table = square.table
    measured = table[
        (table["basis"] == "measured")
        & (table["metric"] == "peak_tensor_bytes")
        & (table["variant"] == "chunked")
    ]
    assert len(measured) == 3 and (measured["verdict"] == "ok").all(), table.to_string()
    regressed = square.regressions
    flagged = regressed[(regressed["basis"] == "predicted") & (regressed["variant"] == "chunked")]
    assert list(flagged["metric"]) == ["peak_tensor_bytes"], table.to_string()
    reason = flagged["reason"].iloc[0]
    assert re.match(r"predicted x\d+\.\d\d at L=131072 beyond x1\.1", reason), reason
    assert re.search(r"\(L\^\d\.\d\d -> L\^\d\.\d\d;", reason), reason
    assert flagged["ratio"].iloc[0] > 5, reason
    assert any("chunked fwd peak bytes" in line for line in growth_lines(table))
    factors = {"time": 1.2, "memory": 1.1, "instructions": 1.002}
    assert "| chunked L=131072 (predicted) | peak_tensor_bytes |" in gate_summary(
        square, "time", factors
    )
    write_verdicts(square)
    page = make_report([square.results_dir], tmp_path / "report").page.read_text()
    assert 'id="fig-growth_chunked_peak_tensor_bytes"' in page
    predicted = same.table[same.table["basis"] == "predicted"]
    assert len(predicted) >= 2 and (predicted["verdict"] == "ok").all(), same.table.to_string()
    assert "no exponent change" in growth_lines(same.table)[0]
