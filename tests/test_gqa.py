"""Grouped-query attention (``kv_heads``) and the decode workload: the spec, the record and the frame.

Letters: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq, Lk, D, Dv.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from attnbench import contract
from attnbench.analysis.rundir import load_run
from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import Measurement
from attnbench.rundir_format import MEASUREMENTS
from attnbench.runs import write_run
from attnbench.spec import AttnSpec
from tests.test_loading import measurements, write_good_run


# ---- the spec ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [0, -1, 3, 16])
def test_kv_heads_must_be_a_positive_divisor_of_heads(kv_heads):
    with pytest.raises(ValueError, match="kv_heads"):
        AttnSpec(heads=8, kv_heads=kv_heads)


@pytest.mark.parametrize("kv_heads", [2.0, True, "2"])
def test_kv_heads_must_be_an_int(kv_heads):
    with pytest.raises(TypeError, match="kv_heads"):
        AttnSpec(heads=8, kv_heads=kv_heads)


def test_kv_heads_shapes_the_inputs_and_the_label():
    spec = AttnSpec(batch=2, heads=8, kv_heads=2, seq_len=3, seq_len_k=5, head_dim=4, head_dim_v=6)
    q, k, v, _ = spec.make_inputs()
    assert (q.shape, k.shape, v.shape) == ((2, 8, 3, 4), (2, 2, 5, 4), (2, 2, 5, 6))
    assert (spec.hkv, spec.group) == (2, 4)
    assert "H8 Hkv2" in spec.label
    assert (
        "Hkv" not in AttnSpec(heads=8, kv_heads=8).label
    )  # Hkv = H: multi-head, labelled as before
    assert AttnSpec(heads=8, kv_heads=8).hkv == AttnSpec(heads=8).hkv == 8


def test_mha_inputs_are_unchanged_by_the_new_field():
    """kv_heads = H draws exactly the inputs the spec drew before the field existed (same seed, same shapes)."""
    a = AttnSpec(seq_len=16).make_inputs(seed=3)
    b = AttnSpec(seq_len=16, kv_heads=8).make_inputs(seed=3)
    assert all(bool((x == y).all()) for x, y in zip(a[:3], b[:3], strict=True))


def test_input_and_moved_bytes_by_hand():
    # B=2, H=8, Hkv=2, Lq=3, Lk=5, D=4, Dv=6, float32 (4 bytes)
    spec = AttnSpec(batch=2, heads=8, kv_heads=2, seq_len=3, seq_len_k=5, head_dim=4, head_dim_v=6)
    q = 2 * 8 * 3 * 4 * 4  # 768
    k = 2 * 2 * 5 * 4 * 4  # 320
    v = 2 * 2 * 5 * 6 * 4  # 480
    out = 2 * 8 * 3 * 6 * 4  # 1152
    assert spec.input_bytes == q + k + v == 1568
    assert spec.output_bytes == out
    assert spec.bytes_moved == 1568 + 1152 == 2720
    # backward: forward + read q, k, v, out, grad_out + write dq, dk, dv
    assert spec.replace(mode="backward").bytes_moved == 2720 + (1568 + 1152 + 1152) + 1568 == 8160
    # the mask costs nothing in the ideal kernel's traffic
    assert spec.replace(mask="causal").bytes_moved == 2720
    # one decode step of MQA in bfloat16: q 8x64, k and v 1x4096x64 each, out 8x64, 2 bytes each
    step = AttnSpec(heads=8, kv_heads=1, seq_len=1, seq_len_k=4096, dtype="bfloat16")
    assert step.bytes_moved == 2 * (8 * 64 + 2 * 4096 * 64 + 8 * 64) == 1050624


# ---- the record ----------------------------------------------------------------------------------
def test_measurement_workload_is_validated_and_carried():
    spec = AttnSpec(heads=8, kv_heads=2, seq_len=1, seq_len_k=1024)
    with pytest.raises(ValueError, match="workload"):
        Measurement(variant="sdpa", spec=spec, status="ok", workload="training")
    m = Measurement(
        variant="sdpa", spec=spec, status="ok", samples=(1e-3, 1e-3, 1e-3), workload="decode"
    )
    row = m.to_row()
    assert row["workload"] == "decode" and row["spec_kv_heads"] == 2
    assert row["bytes_moved"] == spec.bytes_moved
    assert math.isclose(row["gbytes_per_s"], spec.bytes_moved / 1e-3 / 1e9)
    assert (
        Measurement(variant="sdpa", spec=spec, status="skipped").to_row()["gbytes_per_s"] != 0
    )  # NaN, never 0


def test_swept_length_names_frame_columns():
    assert set(contract.SWEPT_LENGTH) == set(contract.WORKLOADS)
    assert {"seq_len", "seq_len_k"} >= set(contract.SWEPT_LENGTH.values())


# ---- the frame -----------------------------------------------------------------------------------
def test_a_decode_gqa_run_loads_with_its_columns_and_traffic(tmp_path):
    spec = AttnSpec(heads=8, kv_heads=2, seq_len=1, seq_len_k=2048)
    ms = [
        Measurement(
            variant="sdpa",
            spec=spec.replace(seq_len_k=n),
            status="ok",
            samples=(2e-4,) * 3,
            runs=3,
            timing_method="wall",
            workload="decode",
        )
        for n in (1024, 2048)
    ]
    run = write_run(tmp_path / "run", ms, MeasureConfig(), seconds=1.0, command=["test"])
    frame_read = load_run(run)
    frame = frame_read.frame
    assert frame_read.problems == ()
    assert set(frame["workload"]) == {"decode"} and set(frame["kv_heads"]) == {2}
    moved = frame[frame.metric == "bytes"].set_index("seq_len_k")
    assert moved.loc[1024, "value"] == spec.replace(seq_len_k=1024).bytes_moved
    assert set(moved["method"]) == {"model"} and set(moved["unit"]) == {"bytes"}
    rate = frame[frame.metric == "gbps"].set_index("seq_len_k")
    assert math.isclose(rate.loc[2048, "value"], spec.bytes_moved / 2e-4 / 1e9)
    assert set(rate["unit"]) == {"GB/s"} and set(rate["method"]) == {"wall"}


def test_a_run_older_than_gqa_loads_as_prefill_mha_with_derived_traffic(tmp_path):
    run = write_good_run(tmp_path / "old")
    old = pd.read_csv(run / MEASUREMENTS)
    old.drop(columns=["workload", "spec_kv_heads", "bytes_moved", "gbytes_per_s"]).to_csv(
        run / MEASUREMENTS, index=False
    )
    frame_read = load_run(run)
    frame = frame_read.frame
    assert frame_read.problems == ()
    assert set(frame["workload"]) == {"prefill"}
    assert (frame["kv_heads"] == frame["heads"]).all()
    ok = measurements()[0]
    rate = frame[(frame.metric == "gbps") & (frame.seq_len == ok.spec.seq_len)]["value"].item()
    assert math.isclose(rate, ok.gbytes_per_s)


# ---- the command line and run directories ----------------------------------------------------------
FAST = [
    "--quiet",
    "--no-report",
    "--no-probe",
    "--min-time",
    "0.01",
    "--max-time",
    "0.05",
    "--min-runs",
    "2",
    "--no-instructions",
]


@pytest.mark.slow
def test_decode_run_crosses_kv_heads_head_dims_and_batches(tmp_path, capsys):
    from attnbench.cli import main

    out = tmp_path / "run"
    argv = [
        "run",
        "--workload",
        "decode",
        "--variants",
        "sdpa",
        "--lengths",
        "256",
        "--q-len",
        "2",
        "--kv-heads",
        "8,2",
        "--head-dims",
        "16,32",
        "--batches",
        "1,2",
        "--out",
        str(out),
        *FAST,
    ]
    assert main(argv) == 0, capsys.readouterr().err
    frame_read = load_run(out)
    frame = frame_read.frame
    assert frame_read.problems == ()
    time = frame[frame.metric == "time"]
    assert len(time) == 8 and set(time.status) == {"ok"}  # 2 x 2 x 2 cases, every one measured
    assert (
        set(time.workload) == {"decode"}
        and set(time.seq_len) == {2}
        and set(time.seq_len_k) == {256}
    )
    assert (
        set(time.kv_heads) == {8, 2}
        and set(time.head_dim) == {16, 32}
        and set(time.batch) == {1, 2}
    )
    assert (frame[frame.metric == "gbps"]["value"] > 0).all()


def test_decode_default_lengths_are_1k_to_128k():
    from attnbench.runs import DECODE_LENGTHS, grid

    assert DECODE_LENGTHS == (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    cases = grid(["sdpa"], DECODE_LENGTHS, workload="decode")
    assert [s.lk for _, s in cases] == list(DECODE_LENGTHS) and {s.lq for _, s in cases} == {1}


def test_a_run_dir_older_than_workloads_resumes(tmp_path):
    """A log whose header config has no workload (and whose case keys have no kv_heads) resumes as prefill."""
    import json

    from attnbench.rundir_format import LOG
    from attnbench.runs import RunDirectory

    run = write_good_run(tmp_path / "old")
    lines = (run / LOG).read_text().splitlines()
    header = json.loads(lines[0])
    del header["config"]["workload"]
    assert all("kv_heads" not in key for key in header["cases"])  # MHA case keys are what they were
    (run / LOG).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    cases = [(m.variant, m.spec) for m in measurements()]
    with RunDirectory(run, resume=True) as rd:
        todo = rd.start(MeasureConfig(), cases)
    assert todo == []  # every case was already measured: nothing is redone
    with RunDirectory(run, resume=True) as rd, pytest.raises(ValueError, match="workload"):
        rd.start(MeasureConfig(workload="decode"), cases)  # a different workload is a different run


def test_fits_stay_per_shape(tmp_path):
    """A sweep crossing head dims and key/value heads is fitted once per (D, Hkv): GROUP separates them."""
    from attnbench.analysis import complexity

    ms = []
    for d in (16, 32):
        for hkv in (8, 2):
            for n in (256, 512, 1024, 2048, 4096):
                t = 1e-9 * n * n * d / hkv
                ms.append(
                    Measurement(
                        variant="batched",
                        spec=AttnSpec(seq_len=n, head_dim=d, kv_heads=hkv),
                        status="ok",
                        samples=(t, t, t),
                        runs=3,
                        timing_method="wall",
                    )
                )
    frame_read = load_run(
        write_run(tmp_path / "run", ms, MeasureConfig(), seconds=1.0, command=["test"])
    )
    frame = frame_read.frame
    fits = complexity.fit_table(frame, metrics=("time",))
    assert len(fits) == 4 and set(zip(fits.head_dim, fits.kv_heads, strict=True)) == {
        (16, 8),
        (16, 2),
        (32, 8),
        (32, 2),
    }
    assert all(abs(s - 2.0) < 0.05 for s in fits["exponent"])
