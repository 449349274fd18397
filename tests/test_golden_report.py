"""The report of a fixed set of run directories says what it said before (see ``tests/golden.py``)."""

from __future__ import annotations

import copy
import html
import json
import re

import pytest

from tests import golden

PARTS = ["tidy", "fits", "findings", "problems", "notes", "figures"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    return golden.build_all(tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="module")
def want() -> dict:
    return json.loads(golden.GOLDEN.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS))
@pytest.mark.parametrize("part", PARTS)
def test_the_report_of_todays_run_directories_is_unchanged(built, want, scenario, part):
    found = golden.mismatches(want[scenario][part], built[scenario][part], f"{scenario}/{part}")
    assert not found, f"{len(found)} differences, e.g. {found[:3]}"


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS))
def test_no_figure_prints_text_over_text(built, scenario):
    """Panel titles sat on the row above's tick labels, the speedup heatmap's labels on each other and its colour
    bar's, the accuracy axis crowded its minor labels: every figure of a run, two runs and a roofline report (the
    asv and CI reports: tests/test_report.py)."""
    overlaps = built[scenario][golden.OVERLAPS]
    assert len(overlaps) >= 8
    assert {name: pairs for name, pairs in overlaps.items() if pairs} == {}


_BREAKDOWN = re.compile(
    r"(\d+) big-O claims? checked: (\d+) match(?:es)?, (\d+) grows? slower, "
    r"(\d+) grows? faster, (\d+) inconclusive \(([^)]*)\)"
)
"""complexity.breakdown's sentence: the total, its four parts and the same four per metric."""


def _breakdown(text: str) -> tuple[str, tuple[int, ...]]:
    """The breakdown sentence in ``text`` and its numbers, checked to add up: the parts to the
    total, and each part over the metrics to the part (a mismatch is an AssertionError)."""
    found = _BREAKDOWN.search(text)
    assert found, f"no breakdown of the fits in {text[:200]!r}"
    total, *parts = (int(g) for g in found.groups()[:5])
    assert sum(parts) == total, f"the parts do not add up to {total}: {found.group(0)!r}"
    words = ("match", "slower", "faster", "inconclusive")
    per = [0, 0, 0, 0]
    for metric in found.group(6).split("; "):
        for n, what in re.findall(
            r"(\d+) (matches|match|grows? slower|grows? faster|incon)", metric
        ):
            per[next(i for i, w in enumerate(words) if w[:5] in what)] += int(n)
    assert per == parts, f"per metric {per}, in all {parts}: {found.group(0)!r}"
    return found.group(0), (total, *parts)


@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS))
def test_every_count_of_fits_on_a_page_comes_from_one_tally(built, scenario):
    """The roofline report's finding said "No complexity fit is conclusive" beside a finding quoting a conclusive
    fit and a section counting 3 conclusive; then the two counted differently (per metric against conclusive ones)
    and agreed only after adding up. Both now state complexity.breakdown: the same sentence, whose parts add up.
    Planted (seen failing): the section's count of inconclusive fits one higher."""
    page = html.unescape(built[scenario][golden.PAGE])
    section = re.search(r"<h2>Fitted exponents[^<]*</h2><p class=\"\w+\">([^<]*)", page)
    finding = next((t for t, _ in built[scenario]["findings"] if "big-O claim" in t), None)
    assert section and finding, "the tally is missing from the section or the findings"
    assert _breakdown(section.group(1)) == _breakdown(finding), (section.group(1), finding)
    assert "No complexity fit is conclusive" not in page


@pytest.mark.parametrize("scenario", sorted(golden.SCENARIOS))
def test_no_sentence_of_a_page_contradicts_its_tables(built, scenario):
    """A finding said "12 of 12 cases are not measurements to rely on (11 noisy, 1 skipped): they are never
    fitted or ranked" beside fits of those noisy cases' peak bytes, and "1 are inconclusive"
    (golden.contradictions; tests/test_report.py plants both)."""
    assert golden.contradictions(built[scenario]) == []


@pytest.mark.slow
def test_one_ulp_in_every_measured_float_changes_no_golden(built, want, tmp_path):
    """Another CPU's arithmetic, or another numpy/scipy/torch, moves the last bits of the samples and of
    everything fitted from them: the goldens hold on any machine, not only on the one that wrote them."""
    scenarios = ("two runs", "prefill and decode")  # every fixture run, at two thirds of the cost
    shifted = golden.build_all(
        tmp_path / "out", golden.perturbed_runs(tmp_path / "runs"), scenarios
    )
    moved = [f"{s}/{p}" for s in scenarios for p in PARTS if shifted[s][p] != built[s][p]]
    assert "two runs/tidy" in moved and "prefill and decode/fits" in moved, (
        f"the perturbation never reached the report (parts that moved: {moved})"
    )
    found = [
        m
        for s in scenarios
        for p in PARTS
        for m in golden.mismatches(want[s][p], shifted[s][p], f"{s}/{p}")
    ]
    assert not found, f"{len(found)} differences after one ulp, e.g. {found[:3]}"


def _exponent_moved(d: dict) -> None:
    fit = next(f for f in d["one run"]["fits"] if isinstance(f.get("exponent"), float))
    fit["exponent"] *= 1.001


def _finding_reworded(d: dict) -> None:
    findings = d["one run"]["findings"]
    i = next(i for i, (text, _) in enumerate(findings) if "needs" in text)
    findings[i] = [findings[i][0].replace("needs", "takes", 1), findings[i][1]]


def _row_dropped(d: dict) -> None:
    d["two runs"]["tidy"].pop(len(d["two runs"]["tidy"]) // 2)


def _figure_point_moved(d: dict) -> None:
    line = next(
        ln for f in d["one run"]["figures"] for ax in f["axes"] for ln in ax["lines"] if ln[1]
    )
    line[1][0] = line[1][0] * 1.001 if line[1][0] else 1e-3


@pytest.mark.slow
@pytest.mark.parametrize(
    "plant",
    [_exponent_moved, _finding_reworded, _row_dropped, _figure_point_moved],
    ids=lambda f: f.__name__[1:],
)
def test_the_goldens_still_see_a_real_change(want, plant):
    """The tolerances leave no room for a change a reader would notice: each planted change is a difference."""
    changed = copy.deepcopy(want)
    plant(changed)
    found = [
        m
        for s in golden.SCENARIOS
        for p in PARTS
        for m in golden.mismatches(want[s][p], changed[s][p])
    ]
    assert found, f"{plant.__name__} went unseen"


@pytest.mark.parametrize(
    ("want", "got", "same"),
    [
        (1.79832513e-06, 1.79832512e-06, True),  # the residual an AVX-512 machine rounded otherwise
        (2.0, 2.002, False),  # an exponent moved by 0.1%
        ([1e6, 1e-12], [1e6, 3e-12], True),  # near zero beside a large peer: rounding, not a change
        ([1e-3, 1e-12], [1e-3, 3e-9], False),
        ({"seq_len": 128.0}, {"seq_len": 128.00001}, False),  # lengths and counts exactly
        ("L^1.99", "L^1.98", False),
        (1, 1.0, True),
        (None, 0.0, False),
    ],
)
def test_tolerances_fit_each_quantity(want, got, same):
    assert (not golden.mismatches(want, got)) is same
