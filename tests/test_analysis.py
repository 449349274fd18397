"""Loading (asv and run), complexity fits, crossovers and the memory model."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from attnbench.analysis import complexity
from attnbench.analysis.frame import load, load_asv
from attnbench.analysis.rundir import load_run
from attnbench.analysis.tidy import COLUMNS
from attnbench.measure import MeasureConfig, sweep
from attnbench.measure.timer import TimerConfig
from attnbench.runs import grid, write_run
from attnbench.spec import AttnSpec
from tests.box import BOX

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"


@pytest.fixture
def asv_dir(tmp_path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(FIXTURE, out)
    return out


def _result_files(results: Path) -> list[Path]:
    return [p for p in results.glob("*/*.json") if p.name != "machine.json"]


def test_load_asv_decodes_parameters_and_statuses(asv_dir):
    frame_read = load_asv(asv_dir)
    frame = frame_read.frame
    assert list(frame.columns) == COLUMNS
    assert frame_read.problems == ()
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
    frame_read = load_asv(asv_dir)
    frame = frame_read.frame
    assert not (frame["benchmark"] == key).any()
    assert (frame["metric"] == "peak_rss").any()


def test_malformed_results_file_is_reported_by_name_and_skipped(asv_dir):
    files = _result_files(asv_dir)
    good = load_asv(asv_dir).frame
    broken = files[0].parent / "deadbeef-broken.json"
    broken.write_text(files[0].read_text()[:200])  # truncated JSON
    frame_read = load_asv(asv_dir)
    frame = frame_read.frame
    assert any("deadbeef-broken.json" in p for p in frame_read.problems)
    assert len(frame) == len(good)


def test_load_run_has_the_same_schema(tmp_path):
    base = AttnSpec(batch=1, heads=2, head_dim=16)
    cases = grid(["batched", "performer", "sdpa_cudnn"], [32, 64], base)
    config = MeasureConfig(
        timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.2), measure_rss=False, probe=False
    )
    run = write_run(
        tmp_path / "run",
        sweep(cases, config),
        config,
        seconds=1.0,
        command=["x"],
        peak_gflops={"float32": 100.0},
    )
    frame_read = load_run(run)
    frame = frame_read.frame
    assert list(frame.columns) == COLUMNS
    assert set(frame["status"]) == {"ok", "skipped"}
    assert frame.loc[frame["variant"] == "sdpa_cudnn", "value"].isna().all()
    assert (frame.loc[frame["metric"] == "softmax_error", "variant"] == "performer").all()
    both = load([run, FIXTURE]).frame
    assert set(both["source"]) == {"run", "asv"}


def test_load_reports_unknown_directories(tmp_path):
    frame_read = load([tmp_path])
    frame = frame_read.frame
    assert frame.empty and "empty directory" in frame_read.problems[0]
    (tmp_path / "notes.txt").write_text("x")
    assert "neither an asv results directory" in load([tmp_path]).problems[0]


# ---- robust fits --------------------------------------------------------------------------------
LENGTHS = np.array([64, 128, 256, 512, 1024, 2048, 4096], float)


def _least_squares(lengths: np.ndarray, values: np.ndarray) -> dict:
    """The old estimator on the same points: ordinary least squares with a Student-t interval."""
    fit = stats.linregress(np.log(lengths), np.log(values))
    half = stats.t.ppf(0.975, len(lengths) - 2) * fit.stderr
    return {"exponent": fit.slope, "ci_low": fit.slope - half, "ci_high": fit.slope + half}


def test_clean_quadratic_matches_with_a_tight_interval():
    rng = np.random.default_rng(0)
    quadratic = 2e-9 * LENGTHS**2 * rng.lognormal(0, 0.03, len(LENGTHS))
    fit = complexity.fit_exponent(LENGTHS, quadratic)
    assert fit["conclusive"] and fit["n"] >= 5
    assert fit["ci_low"] <= 2.0 <= fit["ci_high"] and fit["ci_high"] - fit["ci_low"] < 0.15
    assert complexity.verdict(fit, 2.0) == "matches"
    linear = 5e-6 * LENGTHS * rng.lognormal(0, 0.03, len(LENGTHS))
    assert abs(complexity.fit_exponent(LENGTHS, linear)["exponent"] - 1) < 0.1


def test_the_interval_is_the_same_in_every_call_and_process():
    values = 2e-9 * LENGTHS**2 * np.random.default_rng(3).lognormal(0, 0.1, len(LENGTHS))
    fit = complexity.fit_exponent(LENGTHS, values)
    assert complexity.fit_exponent(LENGTHS, values) == fit
    code = (
        "import numpy as np; from attnbench.analysis.complexity import fit_exponent as f; "
        f"L=np.array({LENGTHS.tolist()}); v=np.array({values.tolist()}); r=f(L, v); print(repr((r['ci_low'], r['ci_high'])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == repr((fit["ci_low"], fit["ci_high"]))


def test_overhead_below_the_floor_is_not_fitted():
    with_overhead = 1e-4 + 3e-9 * LENGTHS**2  # the constant dominates the short lengths
    fit = complexity.fit_exponent(LENGTHS, with_overhead)
    assert fit["L_min"] >= 256 and "2x the constant (0.0001, the cost split's c0)" in fit["range"]
    assert complexity.verdict(fit, 2.0) == "matches"
    everything = _least_squares(LENGTHS, with_overhead)  # what fitting every point would have said
    assert everything["exponent"] < 1.6


@pytest.mark.parametrize("where", range(len(LENGTHS)))
def test_one_wild_point_does_not_flip_the_verdict(where):
    rng = np.random.default_rng(where)
    values = 2e-9 * LENGTHS**2 * rng.lognormal(0, 0.02, len(LENGTHS))
    clean = complexity.fit_exponent(LENGTHS, values)
    values[where] *= 3.0  # one call 3x too slow (a neighbour process woke up)
    fit = complexity.fit_exponent(LENGTHS, values)
    assert complexity.verdict(clean, 2.0) == complexity.verdict(fit, 2.0) == "matches", fit
    assert abs(fit["exponent"] - 2.0) < 0.1
    # Least squares on the same points is dragged by the one point: its interval is too wide to
    # conclude anything (it would not say "matches" under the same rule).
    keep = values >= complexity.FLOOR_FACTOR * values.min()
    if keep[where]:  # (3x at the shortest length only raises the floor: it is not fitted at all)
        ls = _least_squares(LENGTHS[keep], values[keep])
        assert complexity.verdict(ls, 2.0) != "matches", ls


def test_a_wild_point_is_named():
    values = 2e-9 * LENGTHS**2
    values[3] *= 3.0
    assert complexity.fit_exponent(LENGTHS, values)["outliers"] == "L=512"


def test_the_floor_is_twice_the_split_constant_so_noise_at_2x_the_smallest_cuts_nothing():
    """linear_elu beside a neighbour: 2.2 ms at L=256, 4.35 ms at 512, a hair under 2x the smallest. That bound cut
    the point and left three (inconclusive); the cost split's c0 is the constant itself, and keeps it."""
    lengths = np.array([256.0, 512, 1024, 2048, 4096])
    values = np.array([2.2e-3, 4.35e-3, 8.7e-3, 17.6e-3, 35.0e-3])
    constant, source = complexity.constant_cost(lengths, values)
    assert constant < values.min() / 2 and source == "the cost split's c0"
    fit = complexity.fit_exponent(lengths, values)
    assert fit["n"] == 5 and complexity.verdict(fit, 1.0) == "matches"
    smallest = values >= complexity.FLOOR_FACTOR * values.min()
    assert (
        smallest.sum() == 3
        and not complexity.fit_exponent(lengths[smallest], values[smallest])["conclusive"]
    )
    # a series the split does not describe (a step at 1024) falls back to a bound, and says so
    step = values * np.array([1, 1, 3, 3, 3])
    bound = (2.2e-3 - (4.35e-3 - 2.2e-3) / 3, "bounded by the growth from the shortest length")
    assert complexity.constant_cost(lengths, step) == pytest.approx(bound)
    # too few lengths to split: the bound
    assert complexity.constant_cost(lengths[:3], values[:3]) == pytest.approx(bound)
    # a flat start (the machine slower at the shortest length) bounds it by the smallest value
    flat = np.array([3e-3, 2.9e-3, 8.7e-3])
    assert complexity.constant_cost(lengths[:3], flat) == (2.9e-3, "at most the smallest value")


def test_the_shortest_point_is_fitted_when_the_cost_already_grows():
    """The floor was 2x the smallest value, so the shortest undisturbed point was never fitted (it is
    always below twice itself), even where it was all work. It is dropped only where the constant
    could dominate it. Planted (seen failing): the floor back at 2x the smallest value."""
    lengths = np.array([256.0, 512, 1024])
    work = 1e-9 * lengths**2  # no constant at all: every point is work
    fit = complexity.fit_exponent(lengths, work)
    assert fit["n"] == 3 and fit["L_min"] == 256, fit["range"]
    # noise of a busy machine on top (no split: 3 lengths): still fitted
    assert complexity.fit_exponent(lengths, work * np.array([1.1, 0.95, 1.0]))["n"] == 3
    # a constant that dominates the shortest point: dropped, as before
    dominated = complexity.fit_exponent(lengths, 1e-3 + work)
    assert dominated["n"] == 2 and dominated["L_min"] == 512, dominated["range"]


def test_fewer_than_four_points_is_inconclusive():
    lengths = np.array([256.0, 512, 1024, 2048])
    fit = complexity.fit_exponent(lengths, 1e-4 + 1e-9 * lengths**2)
    assert (
        fit["n"] == 3
        and not fit["conclusive"]
        and fit["note"] == "3 points, too few for a verdict (4 needed)"
    )  # the shortest is below 2x the constant; exact values: a zero-width interval
    assert complexity.verdict(fit, 2.0) == "inconclusive"
    two = complexity.fit_exponent(np.array([64.0, 128.0]), np.array([1.0, 4.0]))
    assert complexity.verdict(two, 2.0) == "inconclusive"
    one = complexity.fit_exponent(np.array([64.0]), np.array([1.0]))
    assert math.isnan(one["exponent"]) and complexity.verdict(one, 2.0) == "inconclusive"
    assert complexity.verdict(one, math.nan) == ""  # nothing declared: nothing to judge


def test_two_points_have_no_interval():
    """A fit through 2 points showed "[2.00, 2.00]": every bootstrap replicate is the one line
    through both. It says there is none. Planted (seen failing): the bootstrap run on 2 points."""
    lengths, values = np.array([256.0, 512, 1024]), np.array([1.0, 1.1, 4.4])
    fit = complexity.fit_exponent(lengths, values)
    assert fit["n"] == 2 and fit["note"] == "2 points, too few for a verdict (4 needed)", fit
    assert math.isnan(fit["ci_low"]) and math.isnan(fit["ci_high"])
    judged = {**fit, "declared": 2.0, "verdict": complexity.verdict(fit, 2.0)}
    phrase, detail = complexity.plain_verdict(judged)
    assert phrase == "inconclusive: 2 points, too few for a verdict (4 needed)", phrase
    assert "interval 2.00" not in detail and " to " not in detail, detail
    exact = complexity.fit_deterministic(np.array([256.0, 512]), np.array([1.0, 4.0]))
    assert exact["note"] == "2 points, one local slope" and math.isnan(exact["ci_low"]), exact


def test_a_tight_fit_on_too_few_points_shows_its_count_not_its_interval():
    """Every newcomer looked twice at "1.99 [1.93, 2.06] / 2, inconclusive": a tight interval on 3
    points, too few for a verdict. The cell shows the count where the interval would be, and the
    verdict one reason, the first rule missed. Planted (seen failing): the interval kept in the
    cell, and in the tooltip, and the interval's width appended to the count's reason."""
    import pandas as pd

    from attnbench.analysis.summary import VERDICT, VERDICT_DETAILS, exponent_summary, fit_column

    lengths = np.array([256.0, 512, 1024])
    fit = complexity.fit_exponent(lengths, 1e-9 * lengths**2 * np.array([1.0, 1.03, 0.98]))
    assert fit["n"] == 3 and fit["ci_high"] - fit["ci_low"] < 0.5, fit
    row = {"variant": "textbook", "metric": "time", "commit": "", "declared": 2.0, **fit}
    row["verdict"] = complexity.verdict(row, 2.0)
    summary = exponent_summary(pd.DataFrame([row])).iloc[0]
    assert (
        summary[fit_column("time", "time")] == f"{fit['exponent']:.2f} (3 points) / 2, inconclusive"
    )
    assert summary[VERDICT] == "time inconclusive: 3 points, too few for a verdict (4 needed)"
    # nor in the tooltip: a reader found it there, under a heading saying the cell has none
    assert "interval" not in summary[VERDICT_DETAILS], summary[VERDICT_DETAILS]
    wide = complexity.fit_exponent(lengths, lengths**2 * np.array([1.0, 3.0, 0.5]))
    assert wide["note"] == "3 points, too few for a verdict (4 needed)", wide["note"]


def test_wide_scatter_is_inconclusive():
    rng = np.random.default_rng(1)
    values = 2e-9 * LENGTHS**2 * rng.lognormal(0, 0.5, len(LENGTHS))
    fit = complexity.fit_exponent(LENGTHS, values)
    assert fit["ci_high"] - fit["ci_low"] > complexity.MAX_CI_WIDTH
    assert complexity.verdict(fit, 2.0) == "inconclusive"


def test_confident_wrong_verdicts_are_rare_under_scatter():
    """Over 200 seeded series with factor-1.6 scatter, a wrong confident verdict is a 95%-interval miss."""
    verdicts = []
    for seed in range(200):
        values = 2e-9 * LENGTHS**2 * np.random.default_rng(seed).lognormal(0, 0.5, len(LENGTHS))
        verdicts.append(complexity.verdict(complexity.fit_exponent(LENGTHS, values), 2.0))
    # (139 of them: the shortest point is fitted where the series already grows there, so a few
    # more fits have enough points for a narrow interval; the wrong ones stay as rare)
    assert verdicts.count("inconclusive") >= 130
    assert verdicts.count("steeper") + verdicts.count("shallower") <= 10


def test_verdicts():
    assert complexity.verdict({"exponent": 2.6, "ci_low": 2.5, "ci_high": 2.7}, 2.0) == "steeper"
    assert complexity.verdict({"exponent": 0.4, "ci_low": 0.2, "ci_high": 0.6}, 1.0) == "shallower"
    assert complexity.verdict({"exponent": 1.9, "ci_low": 1.7, "ci_high": 2.1}, 2.0) == "matches"
    # An interval wider than 0.5 never "matches" (nor claims anything else)
    assert (
        complexity.verdict({"exponent": 2.0, "ci_low": -2.23, "ci_high": 7.62}, 2.0)
        == "inconclusive"
    )
    assert (
        complexity.verdict(
            {"exponent": 2.0, "ci_low": 1.9, "ci_high": 2.1, "conclusive": False}, 2.0
        )
        == "inconclusive"
    )


def _synthetic(
    values: dict[str, list[float]], lengths=(256, 512, 1024, 2048), metric="time"
) -> pd.DataFrame:
    rows = []
    for variant, vals in values.items():
        for n, v in zip(lengths, vals, strict=True):
            rows.append(
                {c: "" for c in COLUMNS}
                | {
                    "source": "run",
                    "variant": variant,
                    "seq_len": n,
                    "seq_len_k": n,
                    "device": "cpu",
                    "mode": "forward",
                    "dtype": "float32",
                    "mask": "none",
                    "metric": metric,
                    "value": v,
                    "status": "ok",
                    "batch": 1,
                    "heads": 8,
                    "head_dim": 64,
                    "date": pd.NaT,
                    "threads": 2,
                    "peak_gflops": 100.0,
                    "spread": math.nan,
                }
            )
    return pd.DataFrame(rows)


def test_crossovers():
    frame = _synthetic(
        {"batched": [1, 4, 16, 64], "chunked": [2, 5, 12, 40], "linear_elu": [3, 6, 20, 80]}
    )
    table = complexity.crossovers(frame, baselines=("batched",)).set_index("variant")
    assert table.loc["chunked", "crossover_L"] == "1024"
    assert table.loc["linear_elu", "crossover_L"] == "never"
    assert table.loc["chunked", "ratio_at_longest"] == pytest.approx(64 / 40)
    # measured together at one length only: no trend to call "always" (nor "never")
    alone = frame[(frame["variant"] == "batched") | (frame["seq_len"] == frame["seq_len"].max())]
    table = complexity.crossovers(alone, baselines=("batched",)).set_index("variant")
    assert table.loc["chunked", "crossover_L"] == complexity.ONE_LENGTH
    assert table.loc["chunked", "lengths"] == 1  # the table says how many lengths both ran at


def test_fit_table_and_memory_model_from_a_frame():
    lengths = (256, 512, 1024, 2048, 4096)
    frame = _synthetic(
        {"batched": [2**18 * 4 * 2 * x for x in (1, 4, 16, 64, 256)]},
        lengths,
        metric="peak_tensor_bytes",
    )
    fits = complexity.fit_table(frame)
    assert fits.iloc[0]["exponent"] == pytest.approx(2.0) and fits.iloc[0]["verdict"] == "matches"
    model = complexity.memory_model(frame)
    assert len(model) == 5 and model["measured/predicted"].notna().all()


# ---- provenance: how every value was obtained, and what is left out ---------------------------
def _run_with(tmp_path: Path, cases: list) -> Path:
    from attnbench.measure.record import Measurement

    env = BOX
    base = AttnSpec(batch=1, heads=2, head_dim=16)
    rows = []
    for variant, n, status, memory_method in cases:
        t = 1e-6 * n * n / 16
        rows.append(
            Measurement(
                variant=variant,
                spec=base.replace(seq_len=n),
                status=status,
                samples=(t, t, t),
                runs=3,
                timing_method="wall",
                peak_tensor_bytes=float(4 * n * n),
                memory_method=memory_method,
                predicted_peak_bytes=float(4 * n * n),
                max_error=1e-3 if status == "wrong" else 1e-7,
                tolerance=1e-5,
                env=env,
                reason="max error 100x the tolerance" if status == "wrong" else "",
            )
        )
    return write_run(
        tmp_path / "run",
        rows,
        MeasureConfig(),
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 10.0},
    )


def test_method_travels_into_the_frame_and_model_values_are_never_fitted(tmp_path):
    lengths = (16, 32, 64, 128, 256)
    run = _run_with(
        tmp_path,
        [("loop", n, "ok", "model") for n in lengths]
        + [("batched", n, "ok", "profiler") for n in lengths],
    )
    frame_read = load_run(run)
    frame = frame_read.frame
    methods = frame.groupby(["variant", "metric"])["method"].agg(set).to_dict()
    assert methods[("loop", "peak_tensor_bytes")] == {"model"} and methods[
        ("batched", "peak_tensor_bytes")
    ] == {"profiler"}
    assert methods[("loop", "time")] == {"wall"} and methods[("batched", "error_ratio")] == {
        "reference"
    }
    fits = complexity.fit_table(frame).set_index(["variant", "metric"])
    loop_mem = fits.loc[("loop", "peak_tensor_bytes")]
    assert (
        loop_mem["method"] == "model"
        and math.isnan(loop_mem["exponent"])
        and loop_mem["verdict"] == ""
    )
    assert (
        fits.loc[("batched", "peak_tensor_bytes"), "verdict"] == "matches"
    )  # the measured one is fitted
    assert fits.loc[("loop", "time"), "verdict"] == "matches"
    model = complexity.memory_model(frame)
    assert set(model["variant"]) == {"batched"} and set(model["method"]) == {
        "profiler"
    }  # never a model vs itself
    assert "loop" not in set(complexity.crossovers(frame, metric="peak_tensor_bytes")["variant"])


def test_older_files_saying_analytic_are_read_as_model(tmp_path):
    run = _run_with(tmp_path, [("loop", n, "ok", "analytic") for n in (16, 32, 64, 128)])
    frame_read = load_run(run)
    frame = frame_read.frame
    assert set(frame.loc[frame["metric"] == "peak_tensor_bytes", "method"]) == {"model"}
    assert complexity.fit_table(frame).set_index("metric").loc["peak_tensor_bytes", "verdict"] == ""


def test_wrong_cases_keep_their_values_but_leave_fits_crossovers_and_speedups(tmp_path):
    from attnbench.report import style

    lengths = (64, 128, 256, 512, 1024)
    cases = [("batched", n, "ok", "profiler") for n in lengths]
    cases += [("chunked", n, "wrong" if n == 1024 else "ok", "profiler") for n in lengths]
    frame_read = load_run(_run_with(tmp_path, cases))
    frame = frame_read.frame
    wrong = frame[frame["status"] == "wrong"]
    assert (
        set(wrong["seq_len"]) == {1024}
        and wrong.loc[wrong["metric"] == "time", "value"].notna().all()
    )
    assert wrong.loc[wrong["metric"] == "error_ratio", "value"].iloc[0] == pytest.approx(100)
    fits = complexity.fit_table(frame).set_index(["variant", "metric"])
    assert fits.loc[("chunked", "time"), "L_max"] == 512
    cross = complexity.crossovers(frame, baselines=("batched",)).set_index("variant")
    assert cross.loc["chunked", "longest_L"] == 512
    speed = style.measured_rows(frame, "time")
    assert not ((speed["variant"] == "chunked") & (speed["seq_len"] == 1024)).any()
    assert (
        complexity.largest_length(frame).set_index("variant").loc["chunked", "next_status"]
        == "wrong"
    )


def _add_error_ratio(results: Path, ratios: dict[tuple[str, str, str], float]) -> None:
    """The gate helper's AttentionAccuracy.track_error_ratio, with the given (variant, L, mode) ratios."""
    key = "bench_attention.AttentionAccuracy.track_error_ratio"
    bench = json.loads((results / "benchmarks.json").read_text())
    src = bench["bench_attention.Attention.time_attention"]
    bench[key] = dict(src, name=key, type="track", unit="x tolerance", version="e" * 64)
    (results / "benchmarks.json").write_text(json.dumps(bench))
    path = _result_files(results)[0]
    data = json.loads(path.read_text())
    row = list(data["results"]["bench_attention.Attention.time_attention"])
    params = row[1]
    values = [
        ratios.get((v.strip("'"), n, m.strip("'")), 0.5) if v != "'sdpa_efficient'" else math.nan
        for v, n, _, m in itertools.product(*params)
    ]
    data["results"][key] = [values, params, "e" * 64] + row[3:5]
    path.write_text(json.dumps(data))


def test_asv_error_ratio_above_one_makes_the_whole_case_wrong(asv_dir):
    _add_error_ratio(asv_dir, {("chunked", "128", "forward"): 3.1})
    frame_read = load_asv(asv_dir)
    frame = frame_read.frame
    assert frame_read.problems == ()
    case = (
        (frame["variant"] == "chunked") & (frame["seq_len"] == 128) & (frame["mode"] == "forward")
    )
    assert set(frame.loc[case, "status"]) == {"wrong"}
    assert set(frame.loc[case & (frame["metric"] == "time"), "reason"]) == {
        "max error 3.1x the tolerance"
    }
    assert set(frame.loc[~case & (frame["variant"] != "sdpa_efficient"), "status"]) == {"ok"}
    assert set(frame.loc[frame["metric"] == "error_ratio", "unit"]) == {"x tolerance"}
    methods = frame.groupby("metric")["method"].agg(set).to_dict()
    assert (
        methods["time"] == {"asv"}
        and methods["flops"] == {"model"}
        and methods["peak_tensor_bytes"] == {"profiler"}
    )


def test_loop_is_swept_at_four_lengths_by_default():
    """With a grid starting at 64, loop used to get 64 and 128 only: two points, a fit that means nothing."""
    from attnbench.measure.runner import default_lengths
    from attnbench.registry import get_variant
    from attnbench.runs import DEFAULT_LENGTHS

    loop = get_variant("loop")
    assert min(DEFAULT_LENGTHS) == 64
    lengths = default_lengths(loop, DEFAULT_LENGTHS)
    assert (
        lengths == [8, 16, 32, 64, 128] and len(lengths) - 1 >= complexity.MIN_POINTS
    )  # even if the shortest is the floor
    assert [spec.seq_len for _, spec in grid(["loop"])] == [8, 16, 32, 64, 128]
    t = (
        3e-4 + 4e-6 * np.array(lengths, float) ** 2
    )  # interpreter-bound: time ~ pairs, plus a constant above L=8
    fit = complexity.fit_exponent(np.array(lengths, float), t)
    assert fit["n"] == 4 and fit["L_min"] == 16 and complexity.verdict(fit, 2.0) == "matches"
    assert (
        default_lengths(loop, [512, 1024]) == []
    )  # nothing that short asked for: nothing invented
    assert default_lengths(get_variant("batched"), DEFAULT_LENGTHS) == list(DEFAULT_LENGTHS)


# ---- deterministic metrics and the cost split (issue 29) ---------------------------------------
def test_a_deterministic_metric_is_conclusive_at_three_lengths_where_time_is_not():
    """Counts at 256..1024 (what a short sweep counts): the sampled rule needs four points, a deterministic one three."""
    lengths = np.array([256, 512, 1024])
    values = 4.85e6 * (lengths / 256) ** 2 * np.array([1.0, 0.985, 0.98])
    assert not complexity.fit_exponent(lengths, values)[
        "conclusive"
    ]  # the sampled rule: too few points
    assert complexity.fit_deterministic(lengths, values)["conclusive"]
    lengths = np.array(
        [256, 512, 1024, 2048]
    )  # batched's peak bytes, an exact L² (4.85 MB -> 273 MB)
    values = 4.85e6 * (lengths / 256) ** 2 * np.array([1.0, 0.985, 0.98, 0.978])
    fit = complexity.fit_deterministic(lengths, values)
    assert fit["conclusive"] and abs(fit["exponent"] - 2) < 0.05 and fit["max_residual"] < 0.01
    counts = complexity.fit_deterministic(
        np.array([256, 512, 1024]), np.array([1.0, 3.93, 3.93 * 3.96])
    )
    assert (
        counts["conclusive"] and counts["n"] == 3 and complexity.verdict(counts, 2.0) == "matches"
    )


def test_a_deterministic_fit_drops_the_short_lengths_a_lower_term_bends_and_says_when_nothing_is_left():
    lengths = np.array([64, 128, 256, 512, 1024, 2048])
    fit = complexity.fit_deterministic(lengths, 2e5 + lengths**2.0)  # a fixed buffer, then L²
    assert fit["conclusive"] and fit["L_min"] > 64 and fit["exponent"] > 1.5
    bent = complexity.fit_deterministic(np.array([64, 256, 1024]), np.array([1.0, 1.1, 20.0]))
    assert not bent["conclusive"] and "no single power of L" in bent["note"]


def test_the_cost_split_finds_the_crossover_of_the_projections_and_the_scores():
    """nn.MultiheadAttention at E = H·D: projections 8·L·E², scores and weighted sum 4·L²·E: L* = 2E."""
    lengths = np.array([128, 256, 512, 1024, 2048])
    for e in (256, 512, 1024):
        split = complexity.cost_split(lengths, 8.0 * lengths * e**2 + 4.0 * lengths**2 * e)
        assert split.crossover == pytest.approx(2 * e, rel=1e-6) and split.max_residual < 1e-9
        assert split.share_at(2 * e) == pytest.approx(0.5)
    pure = complexity.cost_split(lengths, 3.0 * lengths**2)
    assert pure.crossover == 0 and pure.share[-1] == pytest.approx(1.0)
    assert complexity.cost_split(lengths, 7.0 * lengths).crossover == math.inf
    assert complexity.cost_split(np.array([128, 256]), np.array([1.0, 2.0])) is None


def test_a_shallower_slope_is_explained_by_its_crossover_in_the_findings(tmp_path):
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.measure.record import Measurement

    e, lengths = 512, (128, 256, 512, 1024, 2048)
    rows = []
    for n in lengths:
        count = 8.0 * n * e**2 + 4.0 * n**2 * e
        rows.append(
            Measurement(
                variant="torch_mha",
                spec=AttnSpec(seq_len=n, heads=8, head_dim=64),
                status="ok",
                samples=(count / 1e10,) * 5,
                runs=5,
                timing_method="wall",
                instructions=count,
            )
        )
    run = write_run(
        tmp_path / "run",
        rows,
        MeasureConfig(),
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 10.0},
    )
    analysis = analyse(load_results([run]))
    fit = analysis.fits.set_index("metric").loc["instructions"]
    assert fit["verdict"] == "shallower" and fit["crossover_L"] == pytest.approx(1024, rel=0.01)
    (text,) = [f.text for f in analysis.findings if "explains the shallower slopes" in f.text]
    assert "`torch_mha` instructions grow as L^" in text and "below L* ≈ 1,024" in text
    assert "its FLOP model puts L* at 1,024" in text


def _judged(exponent: float, declared: float, low: float, high: float, **extra) -> dict:
    fit = {"exponent": exponent, "ci_low": low, "ci_high": high, "conclusive": True, "note": ""}
    fit |= {"declared": declared, **extra}
    return {**fit, "verdict": complexity.verdict(fit, declared)}


@pytest.mark.parametrize(
    ("fit", "phrase"),
    [
        (_judged(1.97, 2.0, 1.9, 2.05), "matches O(L²)"),
        # within the tolerance, its interval excluding 2: still a match; the detail says the rest
        (_judged(1.91, 2.0, 1.85, 1.96, kind="deterministic"), "matches O(L²)"),
        (
            _judged(1.63, 2.0, 1.6, 1.66, crossover_L=1200.0, l2_share=0.46, L_max=1024),
            "grows slower than declared (L^1.63 vs L²): its O(L) part outweighs the L² part at "
            "every measured length (up to L ≈ 1,200); at L=1024 the L² part is 46% of it",
        ),
        (
            _judged(1.63, 2.0, 1.6, 1.66, crossover_L=300.0, l2_share=0.77, L_max=1024),
            "grows slower than declared (L^1.63 vs L²): its O(L) part outweighs the L² part below "
            "L ≈ 300; at L=1024 the L² part is 77% of it",
        ),
        (_judged(2.4, 1.0, 2.3, 2.5), "grows faster than declared (L^2.40 vs L): a mismatch"),
        (
            {**_judged(1.8, 2.0, 1.0, 2.6), "conclusive": False, "note": "2 points"},
            "inconclusive: 2 points",
        ),
        ({"method": "model", "exponent": math.nan, "declared": 1.0}, "predicted, not measured"),
    ],
)
def test_every_verdict_is_one_plain_phrase_and_its_details_the_rest(fit, phrase):
    """The cell read "memory shallower than declared by less than 0.25 (matches; its interval excludes 2)"."""
    if fit.get("conclusive") is False:
        fit["verdict"] = complexity.verdict(fit, fit["declared"])
    said, detail = complexity.plain_verdict(fit)
    assert said == phrase
    assert "interval" not in said and "tolerance" not in said
    # the tooltip opens with the verdict it explains, never beside a bare "excludes"
    if fit.get("method") != "model":
        assert detail.startswith(said.split(" (")[0].split(":")[0]), detail
    assert "exclude" not in detail, detail


@pytest.mark.parametrize(
    ("fit", "detail"),
    [
        (
            _judged(1.93, 2.0, 1.90, 1.96),
            "matches O(L²): fitted 1.93, within the 0.25 tolerance of 2 (95% interval 1.90 to "
            "1.96)",
        ),
        (
            _judged(1.91, 2.0, 1.85, 1.96, kind="deterministic"),
            "matches O(L²): fitted 1.91, within the 0.25 tolerance of 2 (local slopes 1.85 to "
            "1.96)",
        ),
        (
            _judged(2.3, 2.0, 1.95, 2.45),
            "matches O(L²): fitted 2.30, more than the 0.25 tolerance above 2, but its 95% "
            "interval 1.95 to 2.45 holds 2",
        ),
        (
            _judged(2.4, 1.0, 2.3, 2.5),
            "grows faster than declared O(L): fitted 2.40, more than the 0.25 tolerance above 1, "
            "and its 95% interval 2.30 to 2.50 leaves 1 out",
        ),
        (
            _judged(1.63, 2.0, 1.6, 1.66),
            "grows slower than declared O(L²): fitted 1.63, more than the 0.25 tolerance below 2, "
            "and its 95% interval 1.60 to 1.66 leaves 2 out",
        ),
    ],
)
def test_a_verdicts_tooltip_names_the_rule_that_decided_it(fit, detail):
    """A cell said "matches" and its tooltip "its interval excludes 2": the tolerance rule that
    decided was written only in the method text. Planted (seen failing): the old tooltip."""
    assert complexity.plain_verdict(fit)[1] == detail


def test_counts_agree_with_their_nouns_and_verbs():
    """ "1 are inconclusive" was printed: one helper picks the word for every count."""
    from attnbench.analysis.text import agree, count

    assert [count(1, "case"), count(3, "case"), count(1, "is", "are"), count(0, "is", "are")] == [
        "1 case",
        "3 cases",
        "1 is",
        "0 are",
    ]
    assert agree(1, "grows", "grow") == "grows" and agree(2, "grows", "grow") == "grow"


def test_a_series_without_a_slope_says_why_in_a_readers_words():
    """A newcomer read "time inconclusive: 1 point above the floor" and found the floor defined
    nowhere on the page. Planted (seen failing): the old note "1 point above the floor"."""
    fit = complexity.fit_exponent(np.array([64, 128]), np.array([1.0, 1.5]))
    assert fit["note"] == "only 1 length is clearly above the fixed per-call cost", fit["note"]
    phrase, _ = complexity.plain_verdict({**fit, "declared": 2.0, "verdict": "inconclusive"})
    assert phrase == "inconclusive: only 1 length is clearly above the fixed per-call cost"


def test_the_fit_rule_the_report_prints_is_plain_words():
    """A newcomer found "the method text is not written for readers": ":func:`constant_cost`",
    "FLOOR_FACTOR (2)", "MIN_POINTS (4)". Planted (seen failing): the old markup back in FIT_RULE."""
    import re

    assert not re.findall(r":\w+:`[^`]*`|``[^`]*``|\b[A-Z][A-Z_]{3,}\b", complexity.FIT_RULE)
    assert f"{complexity.FLOOR_FACTOR:g} times that constant cost" in complexity.FIT_RULE
    assert f"fewer than {complexity.MIN_POINTS} points" in complexity.FIT_RULE.replace("\n", " ")


def test_a_headline_with_an_open_claim_is_never_green():
    """A newcomer read "6 fits judged against the declared big-O: 3 match, ..., 3 inconclusive" in
    green: half the claims were still open. Green needs every compared fit settled and matching."""
    fit = {"variant": "batched", "metric": "time", "declared": 2.0, "note": ""}
    rows = [
        {**fit, "verdict": complexity.FitVerdict.MATCHES},
        {**fit, "variant": "sdpa", "verdict": complexity.FitVerdict.INCONCLUSIVE},
    ]
    assert complexity.headline(pd.DataFrame(rows[:1]))[0] == "good"
    assert complexity.headline(pd.DataFrame(rows))[0] == "neutral"
