"""Loading (asv and run), complexity fits, crossovers and the memory model."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import complexity
from attnbench.analysis.frame import COLUMNS, load, load_asv, load_run
from attnbench.measure import MeasureConfig, sweep
from attnbench.measure.timer import TimerConfig
from attnbench.runs import grid, write_run
from attnbench.spec import AttnSpec

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"


@pytest.fixture
def asv_dir(tmp_path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(FIXTURE, out)
    return out


def _result_files(results: Path) -> list[Path]:
    return [p for p in results.glob("*/*.json") if p.name != "machine.json"]


def test_load_asv_decodes_parameters_and_statuses(asv_dir):
    frame = load_asv(asv_dir)
    assert list(frame.columns) == COLUMNS
    assert frame.attrs["problems"] == []
    assert set(frame["variant"]) == {"batched", "chunked", "sdpa_efficient"}
    assert frame["seq_len"].dtype.name == "Int64" and set(frame["seq_len"]) == {64, 128}
    assert {"time", "peak_rss", "peak_tensor_bytes", "gflops", "max_error"} <= set(frame["metric"])
    # sdpa_efficient is n/a on CPU: kept as "skipped", never as a zero
    eff = frame[frame["variant"] == "sdpa_efficient"]
    assert set(eff["status"]) == {"skipped"} and eff["value"].isna().all()
    ok_time = frame[(frame["metric"] == "time") & (frame["status"] == "ok")]
    assert (ok_time["value"] > 0).all() and ok_time["spread"].notna().any()
    assert frame["commit"].str.len().min() >= 8 and frame["date"].notna().all()
    assert frame["peak_gflops"].notna().all()


def test_stale_rows_are_dropped(asv_dir):
    bench = json.loads((asv_dir / "benchmarks.json").read_text())
    key = next(k for k in bench if k.endswith("time_attention"))
    bench[key]["version"] = "0" * 64
    (asv_dir / "benchmarks.json").write_text(json.dumps(bench))
    frame = load_asv(asv_dir)
    assert not (frame["benchmark"] == key).any()
    assert (frame["metric"] == "peak_rss").any()


def test_malformed_results_file_is_reported_by_name_and_skipped(asv_dir):
    files = _result_files(asv_dir)
    good = load_asv(asv_dir)
    broken = files[0].parent / "deadbeef-broken.json"
    broken.write_text(files[0].read_text()[:200])  # truncated JSON
    frame = load_asv(asv_dir)
    assert any("deadbeef-broken.json" in p for p in frame.attrs["problems"])
    assert len(frame) == len(good)


def test_load_run_has_the_same_schema(tmp_path):
    base = AttnSpec(batch=1, heads=2, head_dim=16)
    cases = grid(["batched", "performer", "sdpa_cudnn"], [32, 64], base)
    config = MeasureConfig(timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.2), measure_rss=False)
    run = write_run(tmp_path / "run", sweep(cases, config), config, seconds=1.0, command=["x"], peak_gflops={"float32": 100.0})
    frame = load_run(run)
    assert list(frame.columns) == COLUMNS
    assert set(frame["status"]) == {"ok", "skipped"}
    assert frame.loc[frame["variant"] == "sdpa_cudnn", "value"].isna().all()
    assert (frame.loc[frame["metric"] == "softmax_error", "variant"] == "performer").all()
    both = load([run, FIXTURE])
    assert set(both["source"]) == {"run", "asv"}


def test_load_reports_unknown_directories(tmp_path):
    frame = load([tmp_path])
    assert frame.empty and "neither an asv results directory" in frame.attrs["problems"][0]


def test_fit_recovers_known_exponents():
    lengths = np.array([64, 128, 256, 512, 1024, 2048, 4096], float)
    rng = np.random.default_rng(0)
    quadratic = 1e-4 + 3e-9 * lengths**2 * rng.lognormal(0, 0.03, len(lengths))  # overhead + n^2
    fit = complexity.fit_exponent(lengths, quadratic)
    assert fit["ci_low"] <= 2.0 <= fit["ci_high"] and abs(fit["exponent"] - 2) < 0.1
    assert fit["L_min"] == 1024 and fit["range"].startswith("value >=")  # overhead-dominated lengths excluded
    heavy = 1e-3 + 3e-9 * lengths**2  # only 2 lengths clear 10x: the documented fallback takes the longest 3
    assert complexity.fit_exponent(lengths, heavy)["range"] == "longest 3 lengths"
    linear = 5e-6 * lengths * rng.lognormal(0, 0.03, len(lengths))
    assert abs(complexity.fit_exponent(lengths, linear)["exponent"] - 1) < 0.1


def test_fit_with_two_points_has_an_unbounded_interval():
    fit = complexity.fit_exponent(np.array([64.0, 128.0]), np.array([1.0, 4.0]))
    assert fit["exponent"] == pytest.approx(2.0) and math.isinf(fit["ci_high"])


def test_verdicts():
    fit = {"exponent": 2.6, "ci_low": 2.5, "ci_high": 2.7}
    assert complexity.verdict(fit, 2.0) == "steeper"
    assert complexity.verdict({"exponent": 0.4, "ci_low": 0.2, "ci_high": 0.6}, 1.0) == "shallower"
    assert complexity.verdict({"exponent": 1.9, "ci_low": 1.7, "ci_high": 2.1}, 2.0) == "matches"


def _synthetic(values: dict[str, list[float]], lengths=(256, 512, 1024, 2048), metric="time") -> pd.DataFrame:
    rows = []
    for variant, vals in values.items():
        for n, v in zip(lengths, vals, strict=True):
            rows.append({c: "" for c in COLUMNS} | {
                "source": "run", "variant": variant, "seq_len": n, "seq_len_k": n, "device": "cpu", "mode": "forward",
                "dtype": "float32", "mask": "none", "metric": metric, "value": v, "status": "ok", "batch": 1, "heads": 8,
                "head_dim": 64, "date": pd.NaT, "threads": 2, "peak_gflops": 100.0, "spread": math.nan,
            })
    return pd.DataFrame(rows)


def test_crossovers():
    frame = _synthetic({"batched": [1, 4, 16, 64], "chunked": [2, 5, 12, 40], "linear_elu": [3, 6, 20, 80]})
    table = complexity.crossovers(frame, baselines=("batched",)).set_index("variant")
    assert table.loc["chunked", "crossover_L"] == "1024"
    assert table.loc["linear_elu", "crossover_L"] == "never"
    assert table.loc["chunked", "ratio_at_longest"] == pytest.approx(64 / 40)


def test_fit_table_and_memory_model_from_a_frame():
    frame = _synthetic({"batched": [2**18 * 4 * 2 * x for x in (1, 4, 16, 64)]}, metric="peak_tensor_bytes")
    fits = complexity.fit_table(frame)
    assert fits.iloc[0]["exponent"] == pytest.approx(2.0) and fits.iloc[0]["verdict"] == "matches"
    model = complexity.memory_model(frame)
    assert len(model) == 4 and model["measured/predicted"].notna().all()
