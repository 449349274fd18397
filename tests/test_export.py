"""``attnbench export``: one run's results in Bencher's BMF and github-action-benchmark's customSmallerIsBetter JSON,
each checked against the shape its documentation gives."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis.frame import load, load_asv
from attnbench.cli import main
from attnbench.contract import Status
from attnbench.gate.export import EXPORTED, FORMATS, ExportError, export
from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import Measurement
from attnbench.runs import write_run
from attnbench.spec import AttnSpec
from tests.asv_history import commit_hashes, write_history
from tests.box import BOX

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"
"""A real asv run of one commit (time, peak tensor bytes, FLOPs, peak RSS, ...)."""


def check_bmf(document: object) -> None:
    """Bencher Metric Format, as https://bencher.dev/docs/reference/bencher-metric-format gives its JSON Schema: an
    object whose every property (a benchmark, named by a non-empty string of at most 1024 characters) is an object
    whose every property (a measure: a slug or name of at most 64) is an object with a number ``value`` (required) and
    optionally numbers ``lower_value`` and ``upper_value``; nothing else."""
    assert isinstance(document, dict) and document
    for benchmark, measures in document.items():
        assert isinstance(benchmark, str) and 0 < len(benchmark) <= 1024, benchmark
        assert isinstance(measures, dict) and measures, benchmark
        for measure, metric in measures.items():
            assert isinstance(measure, str) and 0 < len(measure) <= 64, measure
            assert isinstance(metric, dict) and "value" in metric, (benchmark, measure)
            assert set(metric) <= {"value", "lower_value", "upper_value"}, metric
            for key, value in metric.items():
                assert (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                ), (key, value)
            if "lower_value" in metric:
                assert metric["lower_value"] <= metric["value"] <= metric["upper_value"], metric


def check_custom_smaller_is_better(document: object) -> None:
    """github-action-benchmark's ``customSmallerIsBetter`` input, as its README and ``extractCustomBenchmarkResult``
    read it: a JSON array of objects with ``name`` (string), ``unit`` (string) and ``value`` (number), and optionally
    ``range`` and ``extra`` (strings); the extractor keeps those five fields only."""
    assert isinstance(document, list) and document
    names = [entry["name"] for entry in document]
    assert len(names) == len(set(names)), "one entry per case and metric"
    for entry in document:
        assert isinstance(entry, dict) and {"name", "unit", "value"} <= set(entry) <= {
            "name",
            "unit",
            "value",
            "range",
            "extra",
        }
        assert isinstance(entry["name"], str) and entry["name"]
        assert isinstance(entry["unit"], str) and entry["unit"], entry
        assert isinstance(entry["value"], (int, float)) and math.isfinite(entry["value"]), entry
        for key in ("range", "extra"):
            assert key not in entry or isinstance(entry[key], str), entry


def _one_run(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    series = {}
    for variant in ("batched", "chunked"):
        for length in (256, 512):
            series[("time", variant, length)] = [0.01 * length / 256 * float(rng.uniform(0.9, 1.1))]
            series[("instructions", variant, length)] = [1.3e8 * (length / 256) ** 2]
            series[("peak_tensor_bytes", variant, length)] = [4.7e6 * (length / 256) ** 2]
    return write_history(tmp_path / "results", series, commit_hashes(1))


@pytest.mark.parametrize("source", ["synthetic", "fixture"])
def test_bmf_has_the_documented_shape_and_one_measure_per_case_and_metric(tmp_path, source):
    results = _one_run(tmp_path) if source == "synthetic" else FIXTURE
    frame = load_asv(results).frame
    exported = export(frame, "bmf")
    check_bmf(exported.document)
    ok = frame[frame["metric"].isin(list(EXPORTED)) & (frame["status"] == "ok")]
    assert exported.entries == len(ok.drop_duplicates(["variant", "seq_len", "mode", "metric"]))
    assert sum(len(m) for m in exported.document.values()) == exported.entries
    if source == "synthetic":
        doc = exported.document
        assert set(doc) == {
            f"attention/{v}/L={n}" for v in ("batched", "chunked") for n in (256, 512)
        }
        batched = doc["attention/batched/L=256"]
        assert set(batched) == {
            "latency",
            "instructions",
            "peak-tensor-bytes",
        }  # latency: Bencher's own, in ns
        assert batched["instructions"] == {"value": 1.3e8} and batched["peak-tensor-bytes"] == {
            "value": 4.7e6
        }
        seconds = frame[
            (frame["metric"] == "time")
            & (frame["variant"] == "batched")
            & (frame["seq_len"] == 256)
        ]["value"].iloc[0]
        assert batched["latency"]["value"] == pytest.approx(seconds * 1e9)


@pytest.mark.parametrize("source", ["synthetic", "fixture"])
def test_github_action_benchmark_has_the_documented_shape_with_units(tmp_path, source):
    results = _one_run(tmp_path) if source == "synthetic" else FIXTURE
    exported = export(load_asv(results).frame, "github-action-benchmark")
    check_custom_smaller_is_better(exported.document)
    if source == "synthetic":
        entries = {e["name"]: e for e in exported.document}
        assert entries["attention/batched/L=256 instructions"]["unit"] == "instructions"
        assert entries["attention/batched/L=256 peak_tensor_bytes"]["unit"] == "bytes"
        assert entries["attention/chunked/L=512 time"]["unit"] == "ns" and entries[
            "attention/chunked/L=512 time"
        ]["range"].startswith("± ")


def test_the_checks_can_fail():
    """The shape checks themselves: a document off the documented shape is refused."""
    for bad in (
        {"b": {"latency": {"value": "88"}}},
        {"b": {"latency": {"lower_value": 1.0}}},
        {"b": {"latency": {"value": 1.0, "units": "ns"}}},
        {"b": {"x" * 65: {"value": 1.0}}},
        [],
    ):
        with pytest.raises(AssertionError):
            check_bmf(bad)
    for bad in (
        [{"name": "a", "value": 1.0}],
        [{"name": "a", "unit": "ns", "value": "1"}],
        [{"name": "a", "unit": "ns", "value": 1.0, "stddev": 2}],
        {"name": "a"},
    ):
        with pytest.raises(AssertionError):
            check_custom_smaller_is_better(bad)


def test_cli_writes_one_commit_of_a_history(tmp_path, capsys):
    commits = commit_hashes(3)
    results = write_history(
        tmp_path / "h", {("instructions", "batched", 256): [1e8, 1.1e8, 1.2e8]}, commits
    )
    out = tmp_path / "bmf.json"
    assert main(["export", "--format", "bmf", str(results), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    check_bmf(doc)
    assert doc == {
        "attention/batched/L=256": {"instructions": {"value": 1.2e8}}
    }  # the newest commit by default
    assert (
        main(
            [
                "export",
                "--format",
                "github-action-benchmark",
                str(results),
                "--commit",
                commits[0][:8],
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    check_custom_smaller_is_better(printed)
    assert printed[0]["value"] == 1e8 and commits[0][:10] in printed[0]["extra"]
    assert main(["export", "--format", "bmf", str(results), "--commit", "ffff"]) == 2
    assert "--commit 'ffff'" in capsys.readouterr().err
    with pytest.raises(ExportError):
        export(load_asv(results).frame, "csv")


def test_the_exponent_of_each_case_is_a_measure_of_its_own(tmp_path):
    """Three lengths: each case's exact metrics get their fitted exponent of L, its bounds the fit's
    range (the local slopes), valid in both formats; a series at two lengths gets none."""
    series = {}
    for length in (256, 512, 1024):
        series[("instructions", "batched", length)] = [3.0e3 * length**2 + 1.0e6 * length]
        series[("peak_tensor_bytes", "chunked", length)] = [12288.0 * length + 65536]
        series[("peak_tensor_bytes", "batched", length)] = [40.0 * length**2]
    series[("instructions", "chunked", 256)] = [1e8]
    series[("instructions", "chunked", 512)] = [4e8]
    frame = load_asv(write_history(tmp_path / "results", series, commit_hashes(1))).frame
    doc = export(frame, "bmf").document
    check_bmf(doc)
    assert set(doc["attention/batched/peak-tensor-bytes"]) == {"exponent"}
    assert doc["attention/batched/peak-tensor-bytes"]["exponent"] == {
        "value": pytest.approx(2.0),
        "lower_value": pytest.approx(2.0),
        "upper_value": pytest.approx(2.0),
    }
    bent = doc["attention/batched/instructions"]["exponent"]  # an L term beneath the L² one
    assert bent["lower_value"] < bent["value"] < bent["upper_value"] < 2.0
    assert doc["attention/chunked/peak-tensor-bytes"]["exponent"]["value"] == pytest.approx(
        0.99, abs=0.005
    )
    assert "attention/chunked/instructions" not in doc  # two lengths: no fit
    gab = export(frame, "github-action-benchmark").document
    check_custom_smaller_is_better(gab)
    entry = {e["name"]: e for e in gab}["attention/batched/peak-tensor-bytes exponent"]
    assert entry["unit"] == "exponent of L" and entry["value"] == pytest.approx(2.0)
    assert "fitted over L=256..1024" in entry["extra"]


# ---- one name per case: the whole identity, wherever it differs --------------------------------
def _hand_run(tmp_path: Path, specs: list[AttnSpec], name: str = "run") -> Path:
    """A run directory of ``sdpa`` at ``specs``, each with its own time (no measuring)."""
    results = [
        Measurement(
            variant="sdpa",
            spec=spec,
            status=Status.OK,
            samples=(1e-3 * (i + 1),) * 3,
            runs=3,
            timing_method="wall",
            env=BOX,
        )
        for i, spec in enumerate(specs)
    ]
    return write_run(tmp_path / name, results, MeasureConfig(), seconds=1.0, command=["x"])


BASE = AttnSpec(seq_len=16, head_dim=8)
IDENTITY_CASES = {
    "dtype": [BASE, BASE.replace(dtype="bfloat16")],
    "head_dim": [BASE, BASE.replace(head_dim=16)],
    "batch": [BASE, BASE.replace(batch=2)],
    "mask": [BASE, BASE.replace(mask="causal")],
    "mode": [BASE, BASE.replace(mode="backward")],
    "kv_heads": [BASE, BASE.replace(kv_heads=2)],
    "heads": [BASE, BASE.replace(heads=4)],
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("column", sorted(IDENTITY_CASES))
def test_cases_that_differ_in_one_column_get_two_names(tmp_path, column, fmt):
    """Two cases of one variant and length that differ in ``column``: two names, two values (a
    name without ``column`` gave both one name, and the last value silently won)."""
    frame = load([_hand_run(tmp_path, IDENTITY_CASES[column])]).frame
    document = export(frame[frame["metric"] == "time"], fmt).document
    if fmt == "bmf":
        values = sorted(m["latency"]["value"] for m in document.values())
    else:
        values = sorted(e["value"] for e in document)
    assert values == pytest.approx([1e6, 2e6]), (column, document)


def test_the_columns_added_are_those_that_tell_cases_apart(tmp_path):
    frame = load([_hand_run(tmp_path, IDENTITY_CASES["dtype"] + [BASE.replace(seq_len=32)])]).frame
    names = set(export(frame[frame["metric"] == "time"], "bmf").document)
    assert names == {
        "attention/sdpa/L=16/float32/(attnbench)",
        "attention/sdpa/L=16/bfloat16/(attnbench)",
        "attention/sdpa/L=32/float32/(attnbench)",
    }


def test_two_machines_at_one_commit_keep_both(tmp_path):
    """asv results of two machines at one commit: each case once per machine."""
    root = _one_run(tmp_path)
    (first,) = [p for p in root.iterdir() if p.is_dir()]
    second = root / "box2"
    second.mkdir()
    for path in first.iterdir():
        second.joinpath(path.name).write_text(path.read_text().replace('"box"', '"box2"'))
    frame = load_asv(root).frame
    assert set(frame["machine"]) == {"box", "box2"}
    one = export(load_asv(_one_run(tmp_path / "one")).frame, "bmf").document
    both = export(frame, "github-action-benchmark").document
    check_custom_smaller_is_better(both)
    assert len(both) == 2 * sum(len(m) for m in one.values())
    assert {e["name"].split(" ")[0].rsplit("/", 1)[-1] for e in both} == {
        "machine=box",
        "machine=box2",
    }


def test_two_benchmarks_of_one_case_and_metric_are_refused(tmp_path):
    """The last guard: two rows of one case and metric that would still share a name are refused
    (here two benchmarks of one grid measuring the same thing)."""
    rows = load([_hand_run(tmp_path, [BASE])]).frame.query("metric == 'time'")
    twin = rows.assign(benchmark="x.attnbench.run")  # the same grid, "attnbench"
    with pytest.raises(ExportError, match="share the name"):
        export(pd.concat([rows, twin], ignore_index=True), "bmf")


def test_exponents_of_two_dtypes_are_two_series_with_two_names(tmp_path):
    """The exponent of L is fitted per case: two dtypes of one variant are never pooled into one
    fit (pooled, the two series' points would fit one slope between theirs), and they export under
    two names."""
    series = {("peak_tensor_bytes", "batched", n): [40.0 * n**2] for n in (256, 512, 1024)}
    frame = load_asv(write_history(tmp_path / "results", series, commit_hashes(1))).frame
    other = frame.assign(dtype="bfloat16", value=frame["value"] ** 0.5 * 1e3)  # an L^1 series
    doc = export(pd.concat([frame, other], ignore_index=True), "bmf").document
    check_bmf(doc)
    exponents = {name: m["exponent"]["value"] for name, m in doc.items() if "exponent" in m}
    assert sorted(round(v, 3) for v in exponents.values()) == [1.0, 2.0], exponents
