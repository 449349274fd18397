"""A headline that decides on GPU: the fused backends with their slopes, the card named, 64K lengths.

Read from ``tests/fixtures/runs/gpu_train`` (25 cases of the recorded H100 train run, as written).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnbench import get_variant
from attnbench.analysis import complexity
from attnbench.analysis.summary import analyse, load_results
from attnbench.cli import build_parser, run_options
from attnbench.contract import CUDA_RUN_LENGTHS, PROGRESSION, Status
from attnbench.measure import guard
from attnbench.report import html, plots
from attnbench.session import run_cases

GPU_TRAIN = Path(__file__).parent / "fixtures" / "runs" / "gpu_train"
CPU_PREFILL = Path(__file__).parent / "fixtures" / "runs" / "prefill"


@pytest.fixture(scope="module")
def gpu():
    return analyse(load_results([GPU_TRAIN]))


def test_the_headline_shows_the_fused_backends_that_ran_on_cuda(gpu):
    variants = html.headline_variants(gpu.main)
    assert variants == (*PROGRESSION, "sdpa_flash", "sdpa_cudnn")
    # on CPU, sdpa already runs the flash kernel: the progression alone
    cpu = analyse(load_results([CPU_PREFILL]))
    assert html.headline_variants(cpu.main) == PROGRESSION


def test_every_headline_line_is_labelled_with_its_own_masks_fit(gpu, monkeypatch):
    """The train run varies the mask: each (variant, mask) line gets its own fit's label (before,
    a line was labelled only when its name was the bare variant, so none was)."""
    panels = []  # the time panel's end labels, then the memory panel's
    monkeypatch.setattr(plots, "end_labels", lambda ax, ends, text, colours: panels.append(text))
    fig = plots.progression(gpu.main, gpu.main_fits, html.headline_variants(gpu.main))
    plots.plt.close(fig)
    drawn, memory = panels
    assert set(drawn) >= {
        "batched mask none",
        "sdpa_flash mask none",
        "sdpa_flash mask causal",
        "sdpa_cudnn mask none",
    }
    for labels in panels:  # every line has a label
        assert all("  " in label for label in labels.values()), labels
    # sdpa_flash without a mask: four lengths, conclusive (a forward fit, not backward's)
    fits = gpu.main_fits
    own = fits[
        (fits["variant"] == "sdpa_flash")
        & (fits["metric"] == "time")
        & (fits["mode"] == "forward")
        & (fits["mask"] == "none")
    ].iloc[0]
    assert own["conclusive"]
    assert drawn["sdpa_flash mask none"].endswith(f"L^{own['exponent']:.2f} (time)")
    assert memory["sdpa_cudnn mask causal"].endswith("L^1.00")  # its own O(L) memory fit


def test_a_gpu_runs_subtitle_names_the_card(gpu):
    bits = " ".join(html._subtitle_bits(gpu.main, gpu.constants))
    assert "on NVIDIA H100 80GB HBM3" in bits and "thread" not in bits
    cpu = analyse(load_results([CPU_PREFILL]))
    assert "1 thread" in " ".join(html._subtitle_bits(cpu.main, cpu.constants))


def test_cuda_default_lengths_reach_64k_and_the_guard_stops_the_materialising_ones():
    args = build_parser().parse_args(
        ["run", "--device", "cuda", "--variants", "sdpa_flash,batched", "--dtypes", "bfloat16"]
    )
    cases = run_cases(run_options(args))
    lengths = {v: sorted(s.seq_len for n, s in cases if n == v) for v in ("sdpa_flash", "batched")}
    assert lengths["sdpa_flash"] == list(CUDA_RUN_LENGTHS) and CUDA_RUN_LENGTHS[-1] == 65536
    # on an 80 GB card, half of it the budget: the fused kernel fits at 64K, batched's scores not
    budget = 40e9
    fits = {
        (v, s.seq_len): guard.predicted_bytes(get_variant(v), s) <= budget
        for v, s in cases
        if s.seq_len in (16384, 65536)
    }
    assert fits[("sdpa_flash", 65536)] and fits[("batched", 16384)]
    assert not fits[("batched", 65536)]
    cpu = run_cases(run_options(build_parser().parse_args(["run", "--variants", "sdpa"])))
    assert max(s.seq_len for _, s in cpu) == 4096  # CPU's defaults are unchanged


def test_the_cost_split_carries_the_launch_constant_on_the_recorded_gpu_series(gpu):
    """sdpa_flash forward, no mask, on the H100: c0 is the per-call launch cost (about 13 us), the
    L² term holds nearly all of L=16384's time, and the fit's overhead floor comes from c0."""
    rows = gpu.main[
        (gpu.main["variant"] == "sdpa_flash")
        & (gpu.main["metric"] == "time")
        & (gpu.main["mode"] == "forward")
        & (gpu.main["mask"] == "none")
        & (gpu.main["status"] == Status.OK)
    ]
    by = rows.groupby("seq_len")["value"].median()
    lengths, values = by.index.to_numpy(float), by.to_numpy(float)
    split = complexity.cost_split(lengths, values)
    assert 5e-6 < split.c0 < 3e-5 and split.max_residual < complexity.SPLIT_TRUSTED
    assert split.share[-1] > 0.95
    assert complexity.constant_cost(lengths, values) == (split.c0, "the cost split's c0")
    assert np.all(np.diff(values) > 0)
