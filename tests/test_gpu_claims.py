"""``studies.gpu_claims``: each claim met and not met on run directories written here, and on the recorded H100 runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from studies import gpu_claims

ROOF = 600_000.0  # GFLOP/s, the card's bf16 matmul roof in the manifests below
LENGTHS = (2048, 4096, 8192, 16384, 32768)


def _rows(good: bool) -> list[dict]:
    """A prefill's rows: sdpa and batched quadratic, sdpa_flash fast; ``good=False`` plants one fault per claim."""
    rows = []
    for variant, share in (("sdpa", 0.5), ("batched", 0.1), ("sdpa_flash", 0.75 if good else 0.5)):
        for n in LENGTHS:
            flops = 4 * 8 * 64 * n * n
            rate = ROOF * share
            rows.append(
                dict(variant=variant, spec_seq_len=n, spec_mode="forward", spec_mask="none",
                     spec_dtype="bfloat16", status="ok", reason="", median_s=flops / (rate * 1e9),
                     gflops_per_s=rate, error_ratio=0.1, peak_tensor_bytes=float(n * 1024))
            )  # fmt: skip
    if not good:
        rows[0].update(gflops_per_s=ROOF * 1.2)  # above the roof
        for i in (1, 3):  # sdpa keeps 3 ok lengths: too few for a conclusive fit
            rows[i].update(status="noisy", reason="1 other process(es) on the GPU (pid 7)")
        rows[2].update(error_ratio=float("nan"))  # never checked
    return rows


def _train(good: bool) -> list[dict]:
    rows = []
    for n in LENGTHS[:4]:
        bytes_ = n * 4096 if good else n * n * 2  # chunked's backward: linear, or a square buffer
        rows.append(
            dict(variant="chunked", spec_seq_len=n, spec_mode="backward", spec_mask="none",
                 spec_dtype="bfloat16", status="ok", reason="", median_s=1e-3 * n,
                 gflops_per_s=ROOF * 0.2, error_ratio=0.1, peak_tensor_bytes=float(bytes_))
        )  # fmt: skip
    return rows


def _folder(tmp_path: Path, good: bool) -> Path:
    for name, rows in (("prefill", _rows(good)), ("train", _train(good))):
        run = tmp_path / name
        run.mkdir(parents=True)
        pd.DataFrame(rows).to_csv(run / "measurements.csv", index=False)
        manifest = {"peak_gflops": {"bfloat16": ROOF}}
        (run / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_an_idle_cards_good_runs_meet_every_claim(tmp_path):
    found = gpu_claims.claims(_folder(tmp_path, good=True))
    assert [c.met for c in found] == [True] * 6, gpu_claims.markdown(found)
    table = gpu_claims.markdown(found)
    assert "best rate 75% of the 600 TFLOP/s roof" in table
    assert "sdpa: L^2.00" in table and "batched: L^2.00" in table
    assert "L^1.00" in table  # chunked's backward bytes


def test_each_planted_fault_fails_its_claim(tmp_path):
    found = gpu_claims.claims(_folder(tmp_path, good=False))
    by = {c.text: c for c in found}
    assert [c.met for c in found] == [False] * 6, gpu_claims.markdown(found)
    assert "120% of the 600 TFLOP/s roof" in found[0].figure
    assert "2 of 19 cases noisy: 2 x '1 other process(es) on the GPU'" in found[1].figure
    assert found[2].figure.startswith("18 of 19 cases that ran were checked")
    assert found[3].figure.startswith("sdpa: inconclusive (")
    assert "L^2.00" in by["chunked's backward peak bytes fitted at most L^1.1"].figure
    assert "sdpa_flash 50%" in found[5].figure


def test_a_folder_without_runs_is_refused_and_the_recorded_h100_runs_read():
    with pytest.raises(ValueError, match="no prefill/ or train/"):
        gpu_claims.claims(Path("tests"))
    found = gpu_claims.claims(Path("reports/gallery/nvidia-h100-80gb-hbm3"))
    assert "124% of the 674 TFLOP/s roof" in found[0].figure  # before the tile accounting
    assert found[4].figure.startswith("L^1.8")  # before chunked's backward recomputed
