"""`attnbench regress` on a throwaway repository: planted regressions fail, an unchanged commit passes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnbench.regress import compare, regress

ROOT = Path(__file__).resolve().parents[1]
SUBSET = {
    "ATTNBENCH_ASV_VARIANTS": "batched,chunked",
    "ATTNBENCH_ASV_LENGTHS": "256,512",
    "ATTNBENCH_ASV_MODES": "forward",
    "ATTNBENCH_ASV_DEVICES": "cpu",
}
BATCHED = "attnbench/variants/batched.py"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _branch(repo: Path, name: str, path: str, old: str, new: str) -> None:
    _git(repo, "checkout", "-q", "-b", name, "base")
    text = (repo / path).read_text()
    assert old in text, f"planting {name}: pattern not found in {path}"
    (repo / path).write_text(text.replace(old, new, 1))
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
    _git(repo, "-c", "user.email=ci@attnbench", "-c", "user.name=ci", "commit", "-q", "--allow-empty", "-m", "root")
    _git(repo, "config", "user.email", "ci@attnbench")
    _git(repo, "config", "user.name", "ci")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "branch", "base")
    # A deliberate 2x slowdown: batched does all of its work twice.
    _branch(repo, "slow", BATCHED, "    def forward(self, q, k, v, mask):\n",
            "    def forward(self, q, k, v, mask):\n        self._once(q, k, v, mask)\n        return self._once(q, k, v, mask)\n\n"
            "    def _once(self, q, k, v, mask):\n")
    # A deliberate extra full-size copy of the scores, alive until the output exists.
    _branch(repo, "fat", BATCHED, "        probs = masked_softmax_(", "        keep = scores.clone()  # noqa: F841\n        probs = masked_softmax_(")
    # An unchanged commit (documentation only).
    _branch(repo, "same", "README.md", "# attnbench", "# attnbench (docs touched)")
    return repo


def _run(repo: Path, head: str, tmp_path: Path):
    return regress("base", head, repo=repo, subset=SUBSET, rounds=2, work_dir=tmp_path / head)


@pytest.mark.slow
def test_planted_slowdown_is_flagged(throwaway, tmp_path):
    outcome = _run(throwaway, "slow", tmp_path)
    flagged = outcome.regressions
    assert not outcome.passed
    assert ((flagged["metric"] == "time") & (flagged["variant"] == "batched")).any(), outcome.table.to_string()
    assert (flagged["variant"] == "batched").all(), flagged.to_string()
    ratios = outcome.table[(outcome.table["metric"] == "time") & (outcome.table["variant"] == "batched")]["ratio"]
    assert ratios.max() > 1.5, ratios.tolist()  # visible; per-length ratios are timings, noisy on a shared box


@pytest.mark.slow
def test_planted_extra_scores_copy_is_flagged(throwaway, tmp_path):
    outcome = _run(throwaway, "fat", tmp_path)
    mem = outcome.regressions[outcome.regressions["metric"] == "peak_tensor_bytes"]
    assert set(mem["variant"]) == {"batched"} and set(mem["seq_len"]) == {256, 512}, outcome.table.to_string()
    assert mem["ratio"].min() > 1.4  # 3 score-sized buffers instead of 2 (+ the small output)


@pytest.mark.slow
def test_unchanged_commit_passes(throwaway, tmp_path):
    outcome = _run(throwaway, "same", tmp_path)
    assert outcome.passed, outcome.regressions.to_string()
    assert (outcome.table["verdict"] == "ok").sum() >= 8


@pytest.mark.slow
def test_cli_exit_codes(throwaway, tmp_path, capsys, monkeypatch):
    from attnbench.cli import main

    for key, value in SUBSET.items():
        monkeypatch.setenv(key, value)
    assert main(["regress", "no-such-rev", "HEAD", "--repo", str(throwaway), "--work-dir", str(tmp_path / "bad")]) == 2
    assert "no-such-rev" in capsys.readouterr().err


def _frame(rows):
    base = {"benchmark": "b", "variant": "batched", "seq_len": 256, "device": "cpu", "mode": "forward", "spread": math.nan,
            "ci_low": math.nan, "ci_high": math.nan}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_compare_rules_without_asv():
    rows = [
        {"commit": "A", "metric": "time", "value": 1.0, "status": "ok", "ci_low": 0.9, "ci_high": 1.1},
        {"commit": "B", "metric": "time", "value": 1.3, "status": "ok", "ci_low": 1.0, "ci_high": 1.6},  # overlaps: noise
        {"commit": "A", "metric": "peak_tensor_bytes", "value": 100.0, "status": "ok"},
        {"commit": "B", "metric": "peak_tensor_bytes", "value": 112.0, "status": "ok"},
        {"commit": "A", "metric": "flops", "value": 10.0, "status": "ok", "variant": "chunked"},
        {"commit": "B", "metric": "flops", "value": 10.0, "status": "failed", "variant": "chunked"},
    ]
    table = compare(_frame(rows), "A", "B").set_index("metric")
    assert table.loc["time", "verdict"] == "ok"
    noisy = [  # separated intervals, x1.5, but BASE's own IQR is 50% of its median: within its noise
        {"commit": "A", "metric": "time", "value": 1.0, "status": "ok", "spread": 0.5, "ci_low": 0.95, "ci_high": 1.05},
        {"commit": "B", "metric": "time", "value": 1.5, "status": "ok", "spread": 0.1, "ci_low": 1.4, "ci_high": 1.6},
    ]
    assert compare(_frame(noisy), "A", "B").iloc[0]["verdict"] == "ok"
    noisy[1].update(value=2.0, ci_low=1.9, ci_high=2.1)  # x2.0 > 1.2 x 1.5: a regression even for a noisy benchmark
    assert compare(_frame(noisy), "A", "B").iloc[0]["verdict"] == "regressed"
    assert table.loc["peak_tensor_bytes", "verdict"] == "regressed"
    assert table.loc["flops", "verdict"] == "regressed"  # ran on BASE, fails on HEAD


def test_relative_work_dir_is_taken_once_from_the_invocation_directory(tmp_path, monkeypatch):
    """Planted: asv runs with cwd=work; a relative work dir there became '.asv/regress/.asv/regress'."""
    import attnbench.regress as regress_module
    from attnbench.regress import RegressError

    seen = []
    trace = "\n".join(["Traceback (most recent call last):"] + [f'  File "x{i}.py", line {i}, in f' for i in range(40)]
                      + ["FileNotFoundError: [Errno 2] No such file or directory: 'somewhere/really/long/path.json'"])

    def fake_asv(args, *, cwd, env, log):
        seen.append(cwd)
        return subprocess.CompletedProcess(args, 1, stdout="", stderr=trace)

    monkeypatch.setattr(regress_module, "_asv", fake_asv)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RegressError) as info:
        regress("HEAD~1", "HEAD", repo=ROOT, work_dir=".asv/regress")
    work = tmp_path / ".asv" / "regress"
    assert seen == [work]  # absolute, resolved against the invocation directory
    conf = json.loads((work / "asv.conf.json").read_text())
    assert conf["results_dir"] == str(work / "results")
    message = str(info.value)
    assert message.splitlines()[-2].strip().startswith("FileNotFoundError: [Errno 2] No such file or directory: "
                                                      "'somewhere/really/long/path.json'")  # whole lines, the last one kept
    assert all(line.startswith("  ") for line in message.splitlines()[1:-1])  # no line cut mid-word
    assert "exit 1" in message and str(work / "asv.log") in message


def test_base_equal_to_head_is_a_usage_error(capsys):
    from attnbench.cli import main

    head = _git(ROOT, "rev-parse", "HEAD")
    with pytest.raises(ValueError, match="same commit"):
        regress(head, "HEAD", repo=ROOT)
    assert main(["regress", "HEAD", "HEAD", "--repo", str(ROOT)]) == 2
    assert "same commit" in capsys.readouterr().err


@pytest.mark.slow
def test_readme_command_works_in_a_fresh_clone(tmp_path):
    """`attnbench regress HEAD~1 HEAD`, default options, in a fresh clone (builds asv's pinned env: minutes)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    branch = _git(ROOT, "rev-parse", "--abbrev-ref", "HEAD")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--branch", branch, str(ROOT), str(clone)], check=True)
    env = {**os.environ, "PYTHONPATH": str(clone)}
    out = subprocess.run([sys.executable, "-m", "attnbench.cli", "regress", "HEAD~1", "HEAD"],
                         cwd=clone, env=env, capture_output=True, text=True, timeout=3600)
    text = out.stdout + out.stderr
    assert out.returncode in (0, 1), text  # a verdict (pass, or a regression the table names), not a failure to run
    assert ".asv/regress/.asv/regress" not in text and "Traceback" not in text
    assert any((clone / ".asv" / "regress" / "results").rglob("*.json")), text
    assert f"results: {clone / '.asv' / 'regress' / 'results'}" in text
