"""The roofline: arithmetic intensity, the binding roof and % of it, on hand-computed cases."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnbench.analysis import roofline as rl
from attnbench.analysis.tidy import COLUMNS

PEAK_GFLOPS, PEAK_GBPS = 100.0, 10.0  # ridge at 10 FLOP/byte


def case_rows(
    variant: str,
    seq_len: int,
    seq_len_k: int,
    flops: float,
    nbytes: float,
    seconds: float,
    workload: str = "prefill",
    status: str = "ok",
    gflops_method: str = "wall",
    peak_gbps: float = PEAK_GBPS,
) -> list[dict]:
    """The tidy rows one case produces: time, gflops (executed / time), bytes (model) and gbps."""
    base = {c: "" for c in COLUMNS} | {
        "source": "run",
        "variant": variant,
        "seq_len": seq_len,
        "seq_len_k": seq_len_k,
        "device": "cpu",
        "mode": "forward",
        "dtype": "float32",
        "mask": "none",
        "batch": 1,
        "heads": 8,
        "kv_heads": 8,
        "head_dim": 64,
        "status": status,
        "machine": "box",
        "date": pd.NaT,
        "threads": 1,
        "peak_gflops": PEAK_GFLOPS,
        "peak_gbps": peak_gbps,
        "spread": math.nan,
        "workload": workload,
        "origin": "run",
    }
    return [
        base | {"metric": "time", "method": "wall", "value": seconds},
        base | {"metric": "gflops", "method": gflops_method, "value": flops / seconds / 1e9},
        base | {"metric": "bytes", "method": "model", "value": nbytes},
        base | {"metric": "gbps", "method": "wall", "value": nbytes / seconds / 1e9},
    ]


def frame_of(*cases: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([r for rows in cases for r in rows])


def test_hand_computed_prefill_and_decode():
    # prefill: 4e9 FLOPs over 1e8 bytes = 40 FLOP/byte (above the ridge 10): compute-bound, roof 100 GFLOP/s;
    # 0.1 s -> 40 GFLOP/s = 40% of the roof.
    # decode: 2e6 FLOPs over 1e6 bytes = 2 FLOP/byte: bandwidth-bound, roof 2 x 10 = 20 GFLOP/s;
    # 2e-4 s -> 10 GFLOP/s = 50% of the roof, and 5 GB/s = 50% of the bandwidth.
    table = rl.roofline(
        frame_of(
            case_rows("sdpa", 4096, 4096, 4e9, 1e8, 0.1),
            case_rows("sdpa", 1, 4096, 2e6, 1e6, 2e-4, workload="decode"),
        )
    ).set_index("workload")
    pre, dec = table.loc["prefill"], table.loc["decode"]
    assert pre["ai"] == pytest.approx(40.0) and pre["bound"] == "compute"
    assert pre["roof_gflops"] == pytest.approx(100.0) and pre["pct_of_roof"] == pytest.approx(40.0)
    assert pre["ridge_ai"] == pytest.approx(10.0)
    assert dec["ai"] == pytest.approx(2.0) and dec["bound"] == "bandwidth"
    assert dec["roof_gflops"] == pytest.approx(20.0) and dec["pct_of_roof"] == pytest.approx(50.0)
    assert dec["gbps"] == pytest.approx(5.0) and dec["pct_of_bandwidth"] == pytest.approx(50.0)
    assert dec["pct_of_compute"] == pytest.approx(10.0)


def test_bytes_counted_twice_would_halve_the_intensity():
    """The planted fault: a frame whose bytes are doubled must not give the hand-computed AI."""
    good = rl.roofline(frame_of(case_rows("batched", 1, 1024, 1e6, 5e5, 1e-4, workload="decode")))
    doubled = rl.roofline(
        frame_of(case_rows("batched", 1, 1024, 1e6, 2 * 5e5, 1e-4, workload="decode"))
    )
    assert good["ai"].iloc[0] == pytest.approx(2.0)
    assert doubled["ai"].iloc[0] == pytest.approx(1.0)
    assert doubled["pct_of_roof"].iloc[0] == pytest.approx(2 * good["pct_of_roof"].iloc[0])


def test_only_measured_ok_cases_are_placed():
    frame = frame_of(
        case_rows("batched", 512, 512, 1e8, 1e6, 1e-2),
        case_rows("loop", 512, 512, 1e8, 1e6, 1e-2, status="wrong"),
        case_rows("chunked", 512, 512, 1e8, 1e6, 1e-2, status="noisy"),
        case_rows(
            "performer", 512, 512, 1e8, 1e6, 1e-2, gflops_method="model"
        ),  # a predicted rate: never a point
    )
    assert list(rl.roofline(frame)["variant"]) == ["batched"]


def test_no_bandwidth_recorded_gives_no_binding_roof():
    table = rl.roofline(frame_of(case_rows("sdpa", 256, 256, 1e8, 1e6, 1e-2, peak_gbps=math.nan)))
    rec = table.iloc[0]
    assert (
        rec["bound"] == ""
        and math.isnan(rec["pct_of_roof"])
        and rec["pct_of_compute"] == pytest.approx(10.0)
    )


def test_empty_and_old_frames():
    assert list(rl.roofline(pd.DataFrame(columns=COLUMNS)).columns) == rl.COLUMNS
    old = frame_of(case_rows("sdpa", 256, 256, 1e8, 1e6, 1e-2)).drop(
        columns=["workload", "kv_heads", "peak_gbps"]
    )
    old = old[
        old["metric"] != "bytes"
    ]  # a file from before bytes were recorded: no intensity, still a rate
    table = rl.roofline(old)
    assert (
        len(table) == 1
        and table["workload"].iloc[0] == "prefill"
        and math.isnan(table["ai"].iloc[0])
    )


@given(ai=st.floats(0.01, 1e4), fraction=st.floats(0.01, 1.0))
def test_the_roof_is_the_lower_of_the_two(ai: float, fraction: float):
    """Whatever the intensity, the roof is min(compute, AI x bandwidth), and % of it is achieved / roof."""
    nbytes = 1e6
    roof = min(PEAK_GFLOPS, ai * PEAK_GBPS)
    seconds = ai * nbytes / (fraction * roof * 1e9)
    rec = rl.roofline(frame_of(case_rows("sdpa", 1, 64, ai * nbytes, nbytes, seconds))).iloc[0]
    assert rec["roof_gflops"] == pytest.approx(roof)
    assert rec["pct_of_roof"] == pytest.approx(100 * fraction)
    assert rec["bound"] == ("compute" if ai >= PEAK_GFLOPS / PEAK_GBPS else "bandwidth")


# ---- decode fits: each workload along its own swept length ------------------------------------
def _series(variant: str, workload: str, lengths, seconds) -> pd.DataFrame:
    rows = []
    for n, t in zip(lengths, seconds, strict=True):
        lq = 1 if workload == "decode" else n
        rows += [
            r
            for r in case_rows(variant, lq, n, 1e6, 1e6, t, workload=workload)
            if r["metric"] == "time"
        ]
    return pd.DataFrame(rows)


def test_decode_fits_its_cache_length_and_prefill_its_square():
    from attnbench.analysis import complexity

    lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    wobble = [1.0, 1.02, 0.99, 1.01, 0.98, 1.0, 1.01]
    frame = pd.concat(
        [
            _series(
                "batched",
                "decode",
                lengths,
                [2e-8 * n * w for n, w in zip(lengths, wobble, strict=True)],
            ),
            _series(
                "batched",
                "prefill",
                lengths[:5],
                [1e-10 * n * n * w for n, w in zip(lengths[:5], wobble[:5], strict=True)],
            ),
        ],
        ignore_index=True,
    )
    fits = complexity.fit_table(frame, metrics=("time",)).set_index("workload")
    assert (
        fits.loc["decode", "exponent"] == pytest.approx(1.0, abs=0.05)
        and fits.loc["decode", "declared"] == 1.0
    )
    assert fits.loc["decode", "verdict"] == "matches" and fits.loc["decode", "L_max"] == 65536
    assert (
        fits.loc["prefill", "exponent"] == pytest.approx(2.0, abs=0.05)
        and fits.loc["prefill", "declared"] == 2.0
    )
    assert complexity.largest_length(frame).set_index("workload")["largest_ok_L"].to_dict() == {
        "decode": 65536,
        "prefill": 16384,
    }


def test_declared_decode_exponents():
    from attnbench.analysis import complexity

    assert complexity.declared_exponent("batched", "time", "decode") == 1.0
    assert complexity.declared_exponent("batched", "time", "prefill") == 2.0
    assert (
        complexity.declared_exponent("linear_elu", "time", "decode") == 1.0
    )  # recomputed over the cache: O(Lk)
    assert complexity.declared_exponent("batched", "peak_tensor_bytes", "decode") == 1.0
    assert math.isnan(complexity.declared_exponent("batched", "gflops", "decode"))


def test_every_dot_of_the_roofline_is_named_in_its_variants_colour():
    """The dots were coloured by family and the legend named families only: sdpa and sdpa_flash (both fused
    orange) could not be told apart, nor a plugin's dots found. Planted (seen failing): the family legend back."""
    from matplotlib import colors as mcolors

    from attnbench.report import plots, style

    frame = frame_of(
        *(
            case_rows(
                v, n, n, 4e9 * (n / 4096) ** 2, 1e8 * n / 4096, 0.1 * (k + 1) * (n / 4096) ** 2
            )
            for k, v in enumerate(("sdpa", "sdpa_flash", "batched"))
            for n in (1024, 2048, 4096)
        )
    )
    with style.drawing(("batched", "sdpa", "sdpa_flash")):
        fig = plots.roofline(rl.roofline(frame))
        legend = fig.axes[-1].get_legend()
        named = {
            t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
        }
        assert {"sdpa", "sdpa_flash", "batched"} <= set(named), sorted(named)
        for v in ("sdpa", "sdpa_flash", "batched"):
            assert mcolors.same_color(named[v].get_color(), style.colour(v)), v
        dots = {mcolors.to_hex(c.get_facecolor()[0]) for c in fig.axes[0].collections}
        assert dots == {mcolors.to_hex(style.colour(v)) for v in ("sdpa", "sdpa_flash", "batched")}
    import matplotlib.pyplot as plt

    plt.close(fig)
