"""``attnbench history``: steps and drifts in a results history, on synthetic asv result files (no asv runs)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from attnbench.analysis.changes import table
from attnbench.analysis.frame import load_asv
from attnbench.contract import INSTRUCTIONS_FACTOR
from attnbench.gate.gitlog import read_git_log
from attnbench.gate.markdown import history_summary
from attnbench.gate.steps import exact_changes, find_steps, history_commits, time_levels
from tests.asv_history import commit_hashes, write_history

N = 16
COMMITS = commit_hashes(N)
BASE = 1.37e8  # a chunked L=256 count
DRIFT = (1.0012, 1.0019, 1.0015, 1.0011, 1.0018)
"""Five commits (6 to 10, 1-based) each adding 0.11-0.19% to chunked's counts: each within the gate's 1.002."""


def _noise(rng: np.random.Generator, scale: float, n: int = N) -> np.ndarray:
    return 1 + rng.normal(0, scale, n)


def _readme_only(rng: np.random.Generator) -> dict:
    """Sixteen commits that touch README.md only: counts alike to 0.006% (the gate's A/A spread), time 5% noise."""
    series = {}
    for variant, count, seconds in (("batched", 2.9e8, 0.012), ("chunked", BASE, 0.006)):
        for length in (256, 512):
            scale = (length / 256) ** 2
            series[("instructions", variant, length)] = list(count * scale * _noise(rng, 6e-5))
            series[("time", variant, length)] = list(
                seconds * scale * np.exp(rng.normal(0, 0.05, N))
            )
            series[("peak_tensor_bytes", variant, length)] = [8.4e6 * scale] * N
    return series


def _drifted(rng: np.random.Generator) -> dict:
    series = _readme_only(rng)
    counts = np.array(series[("instructions", "chunked", 256)])
    for k, step in enumerate(DRIFT):
        counts[5 + k :] *= step  # commit 6 is index 5
    series[("instructions", "chunked", 256)] = list(counts)
    return series


@pytest.fixture
def history_dir(tmp_path):
    def write(series: dict, name: str = "results") -> Path:
        return write_history(tmp_path / name, series, COMMITS)

    return write


def test_a_drift_of_five_small_count_steps_is_named_with_its_range(history_dir):
    """Planted: commits 6-10 each add 0.11-0.19% to chunked L=256's counts. Every pairwise gate passes them (each
    within 1.002); the history names one drift from commit 6 to commit 10, x1.0075, and nothing else."""
    series = _drifted(np.random.default_rng(1))
    counts = series[("instructions", "chunked", 256)]
    assert (
        max(b / a for a, b in zip(counts, counts[1:], strict=False)) < INSTRUCTIONS_FACTOR
    )  # the plant is sub-factor
    history = find_steps(load_asv(history_dir(series)).frame)
    steps = history.steps
    assert len(steps) == 1, table(history).to_string()
    drift = steps.iloc[0]
    assert (
        drift["kind"],
        drift["direction"],
        drift["metric"],
        drift["variant"],
        drift["seq_len"],
    ) == ("drift", "regression", "instructions", "chunked", 256)
    assert (drift["first"], drift["last"], drift["commits"]) == (COMMITS[5], COMMITS[9], 5)
    assert drift["ratio"] == pytest.approx(
        np.prod(DRIFT), abs=4e-4
    )  # the A/A spread at both ends of the range
    printed = table(history).iloc[0]
    assert printed["commit"] == f"{COMMITS[5][:8]}..{COMMITS[9][:8]} (5 commits)" and printed[
        "ratio"
    ].startswith("x1.007")


def test_a_history_of_readme_only_commits_names_nothing(history_dir):
    """Counts that move by the A/A spread, constant bytes, and time medians with 5% noise: no step, no drift."""
    for seed in range(5):
        history = find_steps(
            load_asv(history_dir(_readme_only(np.random.default_rng(seed)), f"r{seed}")).frame
        )
        assert history.steps.empty, (seed, table(history).to_string())


def test_a_doubling_is_a_step_in_counts_and_time(history_dir):
    """Planted: commit 11 doubles batched's forward. A step at commit 11 in counts (x2.0000) and in time (the level of
    asv's step detection), at both lengths; the other variant names nothing."""
    series = _readme_only(np.random.default_rng(2))
    for metric in ("instructions", "time"):
        for length in (256, 512):
            values = np.array(series[(metric, "batched", length)])
            values[10:] *= 2
            series[(metric, "batched", length)] = list(values)
    history = find_steps(load_asv(history_dir(series)).frame)
    steps = history.steps
    assert set(steps["kind"]) == {"step"} and set(steps["first"]) == {COMMITS[10]}, table(
        history
    ).to_string()
    assert set(zip(steps["metric"], steps["seq_len"], strict=True)) == {
        (m, n) for m in ("instructions", "time") for n in (256, 512)
    }
    assert (steps["variant"] == "batched").all()
    assert steps[steps["metric"] == "instructions"]["ratio"].to_numpy() == pytest.approx(
        [2.0, 2.0], rel=1e-3
    )
    assert steps[steps["metric"] == "time"]["ratio"].to_numpy() == pytest.approx(
        [2.0, 2.0], rel=0.1
    )


def test_improvements_and_failures_are_named(history_dir):
    """Planted: chunked's bytes halve at commit 4 (an improvement), batched L=512 is wrong from commit 9."""
    series = _readme_only(np.random.default_rng(3))
    series[("peak_tensor_bytes", "chunked", 256)] = [8.4e6] * 3 + [4.2e6] * 13
    series[("instructions", "batched", 512)] = (
        series[("instructions", "batched", 512)][:8] + ["wrong"] * 8
    )
    history = find_steps(load_asv(history_dir(series)).frame)
    improved = history.improvements
    assert (
        len(improved) == 1
        and improved.iloc[0]["first"] == COMMITS[3]
        and improved.iloc[0]["ratio"] == pytest.approx(0.5)
    )
    wrong = history.regressions
    assert set(wrong["kind"]) == {"wrong"} and set(wrong["first"]) == {COMMITS[8]}, table(
        history
    ).to_string()
    assert history.steps.iloc[0]["direction"] == "regression"  # regressions are listed first


def test_time_levels_step_over_an_outlier_and_follow_a_ramp():
    """One disturbed commit (1.6x) is not a step up and a step down; a ramp of 5% a commit over 5 commits under 3%
    noise is a drift (asv's own ``detect_steps`` takes such a ramp for correlated noise: one level)."""
    from asv.step_detect import detect_steps

    rng = np.random.default_rng(4)
    blip = 0.01 * np.exp(rng.normal(0, 0.03, 20))
    blip[9] *= 1.6
    assert exact_changes(time_levels(blip), 1.2) == []
    ramp = 0.01 * np.exp(rng.normal(0, 0.03, 20))
    for i in range(8, 13):
        ramp[i:] *= 1.05
    changes = exact_changes(
        time_levels(ramp), 1.2
    )  # a drift, or one step inside the ramp: levels are coarse
    assert (
        len(changes) == 1 and changes[0].direction == "regression" and 8 <= changes[0].first <= 12
    ), changes
    assert changes[0].last <= 13 and changes[0].ratio > 1.2
    assert (
        len(detect_steps(list(ramp))) == 1
    )  # why the penalty comes from the noise, not detect_steps' criterion


def test_the_cli_prints_the_table_and_writes_the_page_and_summary(history_dir, tmp_path, capsys):
    from attnbench.cli import main

    results = history_dir(_drifted(np.random.default_rng(5)))
    out, summary = tmp_path / "page", tmp_path / "steps.md"
    assert (
        main(
            [
                "history",
                "--from",
                str(results),
                "--out",
                str(out),
                "--summary",
                str(summary),
                "--repo",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "16 commits" in printed and "1 regression(s)" in printed, printed
    assert (
        f"{COMMITS[5][:8]}..{COMMITS[9][:8]} (5 commits)" in printed
        and "regression (drift)" in printed
    ), printed
    page = (out / "history.html").read_text()
    assert "Steps in the history" in page and re.search(r"x1\.007\d", page)
    assert len(list((out / "figures").glob("history_*.png"))) == 4  # one per case
    text = summary.read_text()
    assert text.startswith("### attnbench history"), text
    assert re.search(
        r"\| chunked L=256 \| instructions \| x1\.007\d \| regression \(drift\) \|", text
    ), text


def test_report_from_a_history_shows_the_same_steps(history_dir, tmp_path):
    from attnbench.reporting import make_report

    results = history_dir(_drifted(np.random.default_rng(5)))
    page = make_report([results], tmp_path / "report").page.read_text()
    section = page.split('<section id="history">', 1)[1]
    assert (
        "Steps in the history" in section
        and f"{COMMITS[5][:8]}..{COMMITS[9][:8]} (5 commits)" in section
    )


def test_commits_of_one_second_are_ordered_by_git_when_a_repository_knows_them(tmp_path):
    """Rebase merges give several commits one date; asv records it. Planted: four commits of one second whose hashes
    sort against their order, the count stepping up at the third. Without the repository the order is the hashes'
    (and says so); with it, git's."""
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00",
        "HOME": str(tmp_path),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    commits = []
    for k in range(4):
        subprocess.run(
            ["git", "commit", "-q", "--allow-empty", "-m", f"commit {k}"],
            cwd=repo,
            check=True,
            env=env,
        )
        commits.append(
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    results = write_history(
        tmp_path / "results",
        {("instructions", "chunked", 256): [BASE, BASE, 2 * BASE, 2 * BASE]},
        commits,
    )
    for path in (results / "box").glob(
        "*-env.json"
    ):  # one date for all, as asv records a rebase merge
        path.write_text(path.read_text().replace('"date": 17', '"date": 1790000000000, "_": 17'))
    frame = load_asv(results).frame
    ordered = find_steps(frame, git=read_git_log(repo, history_commits(frame)))
    assert (
        ordered.commits["commit"].tolist() == commits and "git topological order" in ordered.order
    )
    assert (
        ordered.steps["first"].tolist() == [commits[2]] and ordered.steps.iloc[0]["subject"]
        if "subject" in ordered.steps
        else True
    )
    assert table(ordered).iloc[0]["subject"] == "commit 2"
    unordered = find_steps(frame, git=None)
    assert (
        unordered.commits["commit"].tolist() == sorted(commits) and "hash order" in unordered.order
    )


def test_history_summary_markdown(history_dir):
    history = find_steps(load_asv(history_dir(_readme_only(np.random.default_rng(6)))).frame)
    assert history_summary(history).splitlines()[-1] == "No step and no drift in 16 commits."


def test_noise_alone_is_no_step():
    """Time medians with 8% noise over 50 commits, 20 seeded histories: nothing named. The penalty is what keeps it
    so (at a quarter of it, 3 of these 20 name a step: seen)."""
    for seed in range(20):
        y = 0.01 * np.exp(np.random.default_rng(seed).normal(0, 0.08, 50))
        assert exact_changes(time_levels(y, 1 / y), 1.2) == [], seed


def _growth_history(planted_at: int, n: int = 8) -> dict:
    """``n`` commits of chunked at three lengths: peak bytes linear in L, counts with the gate's A/A
    noise (0.006%); from commit ``planted_at`` (0-based) a boolean L x L buffer beside the bytes:
    x1.08 at L=1024, within the memory factor at every length and every commit."""
    rng = np.random.default_rng(11)
    series = {}
    for length in (256, 512, 1024):
        linear = 12288.0 * length + 65536
        series[("peak_tensor_bytes", "chunked", length)] = [
            linear + (length**2 if i >= planted_at else 0) for i in range(n)
        ]
        series[("instructions", "chunked", length)] = list(
            (3.0e3 * length**2 + 1.0e6 * length) * _noise(rng, 6e-5, n)
        )
    return series


def test_each_cases_exponent_is_a_series_with_its_steps(tmp_path):
    """The planted L x L buffer: no commit moves peak bytes beyond x1.1, but the exponent series
    steps at the planting commit (L^0.99 -> L^1.03); the noisy counts' exponents name nothing."""
    commits = commit_hashes(8)
    results = write_history(tmp_path / "results", _growth_history(planted_at=4), commits)
    history = find_steps(load_asv(results).frame)
    steps = history.steps
    assert len(steps) == 1, steps.to_string()
    step = steps.iloc[0].to_dict()
    assert step["metric"] == "peak_tensor_bytes_exponent" and step["variant"] == "chunked"
    assert step["first"] == commits[4] and step["direction"] == "regression"
    assert table(history)["ratio"].tolist() == ["L^0.99 -> L^1.03"]
    series = history.series[history.series["metric"] == "instructions_exponent"]
    assert len(series) == 8 and series["value"].between(1.6, 1.7).all()
    assert series["value"].max() - series["value"].min() < 2e-3  # A/A: far below the threshold
    from attnbench.report.html import render_history

    page = render_history(history, tmp_path / "page").read_text()
    assert "L^0.99 -&gt; L^1.03" in page or "L^0.99 -> L^1.03" in page
    assert (tmp_path / "page" / "figures" / "history_box_chunked.png").exists()
