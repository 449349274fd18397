"""GPU numbers you can stand behind: executed FLOPs at the kernels' tiles, rates under the roof.

The recorded H100 train run (``tests/fixtures/runs/gpu_train``: 25 of its 80 cases, copied as
written) charged ``sdpa_cudnn`` causal the full square and so recorded 821 and 833 TFLOP/s against a
674 TFLOP/s matmul roof. These tests hold the loader, the findings and the cost model to that run.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import get_variant, mask_mods
from attnbench.analysis import roofline
from attnbench.analysis.rundir import load_run
from attnbench.analysis.summary import analyse, load_results
from attnbench.contract import Status
from attnbench.measure.record import Measurement
from attnbench.spec import AttnSpec
from attnbench.variants.sdpa import kernel_tiles

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
GPU_TRAIN = FIXTURES / "gpu_train"


def cuda_spec(**kw) -> AttnSpec:
    base = dict(device="cuda", dtype="bfloat16", batch=1, heads=8, head_dim=64, mask="causal")
    return AttnSpec(**(base | kw))


# ---- executed FLOPs at the kernel's tiles -------------------------------------------------------
@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seq_len=st.integers(1, 20000),
    head_dim=st.sampled_from([32, 64, 96, 128]),
    backend=st.sampled_from(["flash", "efficient"]),
)
def test_a_fused_causal_kernel_is_charged_for_the_tiles_it_computes(seq_len, head_dim, backend):
    """Forward: 2(D + Dv) per pair of every non-empty tile at the kernel's own tile size, the count
    ``chunked`` uses; never the full square (as the 821 TFLOP/s rows were charged)."""
    variant = get_variant(f"sdpa_{backend}")
    spec = cuda_spec(seq_len=seq_len, head_dim=head_dim)
    tq, tk = kernel_tiles(backend, "forward", head_dim)
    pairs = mask_mods.nonempty_tile_pairs(mask_mods.causal(), 1, 8, seq_len, seq_len, tq, tk)
    flops = variant.flops(spec)
    assert flops.executed == 2 * 8 * (2 * head_dim) * pairs
    assert flops.useful <= flops.executed <= 2 * 8 * (2 * head_dim) * seq_len**2
    if seq_len > 2 * max(tq, tk):  # whole tiles above the diagonal: skipped
        assert flops.executed < 2 * 8 * (2 * head_dim) * seq_len**2
    assert variant.executed_flops_unknown(spec) == ""


def test_the_recorded_case_is_charged_about_half_the_square():
    """sdpa_flash causal L=16384 D=64 (the recorded train case): 128 x 128 tiles, 50.4% of 549.8 GF."""
    spec = cuda_spec(seq_len=16384)
    executed = get_variant("sdpa_flash").flops(spec).executed
    assert executed == 2 * 8 * 128 * (128 * 16384 * 129 // 2)
    assert executed / (4 * 8 * 64 * 16384**2) == pytest.approx(0.5039, abs=1e-4)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seq_len=st.integers(1, 20000), head_dim=st.sampled_from([32, 64, 96, 128]))
def test_the_backward_kernels_tiles_give_the_forwards_count(seq_len, head_dim):
    """Why one count serves both passes: FlashAttention's backward tiles (64 x 128 at D=128, where
    the forward's are 128 x 64) cover the same causal pairs at Lq = Lk."""
    causal = mask_mods.causal()
    counts = {
        mask_mods.nonempty_tile_pairs(
            causal, 1, 8, seq_len, seq_len, *kernel_tiles("flash", p, head_dim)
        )
        for p in ("forward", "backward")
    }
    assert len(counts) == 1


def test_unmasked_cases_keep_the_full_square_and_cpu_follows_its_own_blocks():
    """Only a kernel given is_causal skips tiles: mask-free cases keep the square on CUDA and CPU;
    causal on CPU is charged the CPU flash kernel's blocks (256 x 512 at L=4096), not CUDA's."""
    full = 4 * 8 * 64 * 4096**2
    for spec in (
        cuda_spec(seq_len=4096, mask="none"),
        cuda_spec(seq_len=4096, device="cpu", mask="none"),
    ):
        assert get_variant("sdpa_flash").flops(spec).executed == full
    cpu = cuda_spec(seq_len=4096, device="cpu")
    blocks = sum(256 * min(4096, 512 * -(-(m + 256) // 512)) for m in range(0, 4096, 256))
    assert get_variant("sdpa_flash").flops(cpu).executed == 4 * 8 * 64 * blocks


@pytest.mark.parametrize(
    "variant, mode",
    [("sdpa_cudnn", "forward"), ("sdpa", "forward"), ("sdpa_efficient", "backward")],
)
def test_unknown_tiles_say_so_and_report_no_rate(variant, mode):
    """cuDNN (closed), auto (picked at run time), efficient backward: FLOPs unknown, no rate."""
    spec = cuda_spec(seq_len=4096, mode=mode)
    why = get_variant(variant).executed_flops_unknown(spec)
    assert why.startswith("executed FLOPs unknown")
    m = Measurement(
        variant=variant,
        spec=spec,
        status=Status.OK,
        samples=(1e-3,) * 5,
        flops_executed=get_variant(variant).flops(spec).executed,
        extra={"flops_unknown": why},
    )
    assert math.isnan(m.gflops_per_s)
    assert m.gbytes_per_s == m.gbytes_per_s  # bytes moved do not depend on the tiles


# ---- rates above the roof ----------------------------------------------------------------------
def test_the_recorded_rates_above_the_roof_are_flagged_not_shown():
    frame_read = load_run(GPU_TRAIN)
    frame = frame_read.frame
    rates = frame[frame["metric"] == "gflops"]
    above = rates[rates["status"] == Status.ABOVE_ROOF]
    assert sorted(zip(above["mode"], above["seq_len"], strict=True)) == [
        ("backward", 16384),
        ("forward", 8192),
        ("forward", 16384),
    ]
    assert set(above["variant"]) == {"sdpa_cudnn"} and set(above["mask"]) == {"causal"}
    assert (above["value"] > above["peak_gflops"]).all()
    assert all("accounting error" in r for r in above["reason"])
    # everything else is under the roof; the times of the flagged cases stay facts
    assert (rates[rates["status"] != Status.ABOVE_ROOF]["value"] < 673_752).all()
    times = frame[(frame["metric"] == "time") & (frame["variant"] == "sdpa_cudnn")]
    assert Status.ABOVE_ROOF not in set(times["status"])
    problems = " ".join(frame_read.problems)
    assert "821,000 GFLOP/s" in problems and "833,000 GFLOP/s" in problems
    # the roofline places no case above its roof
    table = roofline.roofline(frame)
    assert len(table) and (table["gflops"] <= table["peak_gflops"]).all()


def test_the_findings_name_the_accounting_errors_first():
    analysis = analyse(load_results([GPU_TRAIN]))
    first = analysis.findings[0].text
    assert first.startswith("3 rate(s) are above the roof") and "accounting errors" in first
    assert "833,000 GFLOP/s" in first
    # the memory exponents of the trimmed run (forward: four lengths each) fit conclusively
    fits = analysis.fits
    mem = fits[(fits["metric"] == "peak_tensor_bytes") & (fits["mode"] == "forward")]
    assert len(mem) == 6 and mem["conclusive"].all()


def test_a_cpu_rate_above_its_roof_is_flagged(tmp_path):
    """On CPU too: the same CPU run with its recorded matmul peak planted 100x lower."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "prefill", run)
    before = load_run(run).frame
    assert Status.ABOVE_ROOF not in set(before["status"])
    lines = (run / "cases.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["peak_gflops"] = {k: v / 100 for k, v in header["peak_gflops"].items()}
    (run / "cases.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    after = load_run(run).frame
    rates = after[(after["metric"] == "gflops") & after["value"].notna()]
    over = rates["value"] > rates["peak_gflops"]
    assert over.any()
    assert (rates[over]["status"] == Status.ABOVE_ROOF).all()
    assert (rates[~over]["status"] != Status.ABOVE_ROOF).all()
