"""``attnbench bisect``: the search on a fake measure (fast), and once end to end on a planted history (slow)."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from attnbench import contract
from attnbench.gate.bisect import (
    BisectError,
    Bisection,
    Probe,
    answer,
    case_subset,
    judge_table,
    search,
)

COMMITS = [f"{i:02d}" + "c" * 38 for i in range(1, 17)]
"""Sixteen candidates after GOOD, oldest first: commit k (1-based) is ``COMMITS[k - 1]``."""


def _state(commits=COMMITS) -> Bisection:
    return Bisection(
        good="g" * 40,
        bad=commits[-1],
        candidates=list(commits),
        subjects={c: f"subject {c[:2]}" for c in commits},
        metric="instructions",
    )


def _fake(
    first_bad: int | None,
    skip: set[int] = frozenset(),
    undecided: set[int] = frozenset(),
    ratio: float = 2.0,
):
    """A measure: commits from ``first_bad`` (1-based) on are ``ratio`` x GOOD, the others 1.0; ``skip`` do not build."""
    seen: list[int] = []

    def judge(commit: str) -> Probe:
        k = COMMITS.index(commit) + 1
        seen.append(k)
        if k in skip:
            return Probe(commit, "", "skip", math.nan, "", "does not build", 1.0)
        if k in undecided:
            return Probe(
                commit, "", "undecided", 1.3, "batched L=256", "interval reaches x1.5", 1.0
            )
        bad = first_bad is not None and k >= first_bad
        return Probe(
            commit, "", "bad" if bad else "good", ratio if bad else 1.0, "batched L=256", "", 1.0
        )

    judge.seen = seen  # type: ignore[attr-defined]
    return judge


@pytest.mark.parametrize("first_bad", range(1, 17))
def test_every_first_bad_commit_is_named_in_at_most_five_probes(first_bad):
    """GOOD is measured apart; 16 candidates take 4 probes, a fifth only where the search ends on BAD unmeasured."""
    judge = _fake(first_bad)
    state = search(_state(), judge)
    assert state.first_bad == COMMITS[first_bad - 1], judge.seen
    assert len(state.probes) <= 5 and (len(state.probes) == 4 or first_bad == 16), judge.seen
    code, lines = answer(state)
    assert code == 1 and lines[0].startswith(
        f"first bad commit: {COMMITS[first_bad - 1]} x2.0000"
    ), lines


def test_commit_11_of_16_is_found_in_four_probes():
    judge = _fake(11)
    state = search(_state(), judge)
    assert judge.seen == [8, 12, 10, 11] and state.first_bad == COMMITS[10]


def test_nothing_to_find_measures_bad_and_says_so():
    """Planted: no regression at all. The search goes all the way up, measures BAD, and names nothing."""
    judge = _fake(None)
    state = search(_state(), judge)
    assert state.first_bad is None and state.nothing and judge.seen[-1] == 16
    code, lines = answer(state)
    assert code == 0 and lines[0].startswith("nothing exceeds GOOD"), lines


def test_skipped_commits_are_stepped_round():
    """Planted: the first bad commit is 11; commits 8 (the first probe) and 10 do not build. The search goes round
    them, and still names 11 (its neighbours 9 and 11 decided)."""
    judge = _fake(11, skip={8, 10})
    state = search(_state(), judge)
    assert state.first_bad is None and state.unresolved == [COMMITS[9], COMMITS[10]], (
        judge.seen
    )  # 10 could be it
    judge = _fake(11, skip={8})
    state = search(_state(), judge)
    assert state.first_bad == COMMITS[10] and judge.seen[0] == 8 and judge.seen[1] in (7, 9), (
        judge.seen
    )
    assert [p.verdict for p in state.probes].count("skip") == 1


def test_an_undecided_neighbour_leaves_a_range():
    """Planted (time): the first bad commit is 11 and commit 10 cannot be decided: the answer is 10 or 11."""
    judge = _fake(11, undecided={10})
    state = search(_state(), judge)
    assert state.first_bad is None and state.unresolved == [COMMITS[9], COMMITS[10]], judge.seen
    code, lines = answer(state)
    assert (
        code == 4 and "one of 2" in lines[0] and "undecided: interval reaches x1.5" in lines[1]
    ), lines


def test_bad_that_is_not_bad_is_said():
    judge = _fake(None, undecided={16})
    state = search(_state(), judge)
    code, lines = answer(state)
    assert code == 4 and lines[0].startswith(
        f"BAD {COMMITS[-1][:10]} could not be shown to exceed GOOD: undecided"
    ), lines


def _table(rows):
    base = {
        "benchmark": "Instructions.track_instructions",
        "variant": "batched",
        "seq_len": 256,
        "device": "cpu",
        "mode": "forward",
        "mask": "none",
        "metric": "instructions",
        "base_status": "ok",
        "head_status": "ok",
        "base_value": 1e8,
        "head_value": 1e8,
        "ratio": 1.0,
        "verdict": "ok",
        "reason": "",
    }
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a_probe_is_judged_by_the_gate_table():
    good = judge_table(
        _table([{}, {"variant": "chunked", "ratio": 1.001}]), "instructions", "c", "s", 3.0
    )
    assert (
        good.verdict == "good"
        and good.ratio == pytest.approx(1.001)
        and good.case == "chunked L=256"
    )
    bad = judge_table(
        _table(
            [
                {},
                {
                    "variant": "chunked",
                    "ratio": 1.01,
                    "verdict": "regressed",
                    "reason": "counts x1.0100 (beyond x1.002)",
                },
            ]
        ),
        "instructions",
        "c",
        "s",
        3.0,
    )
    assert bad.verdict == "bad" and bad.ratio == pytest.approx(1.01) and "x1.0100" in bad.reason
    failed = judge_table(
        _table([{"head_status": "failed", "ratio": math.nan, "verdict": "regressed"}] * 2),
        "instructions",
        "c",
        "s",
        3.0,
    )
    assert (
        failed.verdict == "skip" and "no case could be measured" in failed.reason
    )  # a commit that does not run at all
    one = judge_table(
        _table(
            [
                {"head_status": "failed", "ratio": math.nan, "verdict": "regressed"},
                {"variant": "chunked"},
            ]
        ),
        "instructions",
        "c",
        "s",
        3.0,
    )
    assert (
        one.verdict == "bad" and "failed on this commit" in one.reason
    )  # one case broke: the gate's regression


def test_cases_narrow_the_grid():
    assert case_subset(["batched:256"]) == {
        contract.ENV_VARIANTS: "batched",
        contract.ENV_LENGTHS: "256",
    }
    for bad in ("batched", "batched:L", "nosuch:256"):
        with pytest.raises(BisectError):
            case_subset([bad])


def test_usage_errors_exit_2(capsys):
    from attnbench.cli import main

    assert main(["bisect", "HEAD", "HEAD"]) == 2 and "same commit" in capsys.readouterr().err
    assert main(["bisect", "HEAD", "HEAD~1"]) == 2 and "not an ancestor" in capsys.readouterr().err
    assert (
        main(["bisect", "HEAD~1", "HEAD", "--case", "batched"]) == 2
        and "VARIANT:L" in capsys.readouterr().err
    )


# ---- a planted history (the end-to-end run is in tests/test_regress.py, with the other users of .asv/test-env) -----
ROOT = Path(__file__).resolve().parents[1]
BATCHED = "attnbench/variants/batched.py"
TWICE = (
    "    def forward(self, q, k, v, mask):\n",
    "    def forward(self, q, k, v, mask):\n        self._once(q, k, v, mask)\n        return self._once(q, k, v, mask)\n\n"
    "    def _once(self, q, k, v, mask):\n",
)


def _git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def planted_history(
    root: Path, n: int = 16, culprit: int = 11, plant=(BATCHED, *TWICE)
) -> tuple[Path, list[str]]:
    """A clone of this checkout with ``n`` commits on a throwaway branch: README edits, commit ``culprit`` (1-based)
    also replacing, in the file ``plant[0]``, ``plant[1]`` by ``plant[2]``. Returns (clone, the commits oldest first)."""
    clone = root / "history"
    branch = _git(ROOT, "rev-parse", "--abbrev-ref", "HEAD")
    subprocess.run(["git", "clone", "-q", "--branch", branch, str(ROOT), str(clone)], check=True)
    _git(clone, "checkout", "-q", "-b", "throwaway")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    commits = []
    for k in range(1, n + 1):
        readme = clone / "README.md"
        readme.write_text(readme.read_text() + f"\n<!-- planted history, commit {k} -->\n")
        subject = f"README edit {k}"
        if k == culprit:
            path, old, new = plant
            text = (clone / path).read_text()
            assert old in text, f"planting commit {k}: pattern not found in {path}"
            (clone / path).write_text(text.replace(old, new, 1))
            subject += " (and the plant)"
        stamp = f"2026-01-01T00:{k:02d}:00"
        _git(
            clone,
            "commit",
            "-qam",
            subject,
            env={**env, "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp},
        )
        commits.append(_git(clone, "rev-parse", "HEAD"))
    return clone, commits


def test_bisect_refuses_a_case_at_length_0():
    from attnbench.gate.bisect import BisectError, case_subset

    with pytest.raises(BisectError, match="L an int >= 1"):
        case_subset(["sdpa:0"])
    with pytest.raises(BisectError, match="L an int >= 1"):
        case_subset(["sdpa:007x"])
    assert case_subset(["sdpa:16"])["ATTNBENCH_ASV_LENGTHS"] == "16"
