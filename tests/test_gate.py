"""The correctness gate: planted wrong variants are recorded ``wrong`` (never ``ok``, never timed).

Each plant is a real fault a pull request could introduce while keeping the speed: a scaled
output, swapped heads, swapped batch entries, a wrong gradient. The gate checks the result of the
timed closure itself, so the faults are planted in ``forward`` (what the closure calls).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

import attnbench
from attnbench.measure import MeasureConfig, gate, measure
from attnbench.measure.timer import TimerConfig
from attnbench.variants.batched import BatchedAttention

FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.2),
    measure_rss=False,
    measure_memory=False,
    probe=False,
)  # the gate's verdict, not the machine's business (tests/test_noise.py)
SPEC = attnbench.AttnSpec(batch=2, heads=3, seq_len=64, head_dim=16)

PLANTS = '''
import torch
import attnbench
from attnbench.variants.batched import BatchedAttention


class Scaled(BatchedAttention):
    def forward(self, q, k, v, mask):
        return super().forward(q, k, v, mask) * 1.1  # output 10% too large


class HeadsSwapped(BatchedAttention):
    def forward(self, q, k, v, mask):
        return torch.roll(super().forward(q, k, v, mask), 1, dims=1)  # head h gets head h-1's output


class BatchSwapped(BatchedAttention):
    def forward(self, q, k, v, mask):
        return torch.roll(super().forward(q, k, v, mask), 1, dims=0)  # batch entries exchanged


class _WrongDq(torch.autograd.Function):
    """Identity on q forward; backward scales dq by 1.1 (the output stays exact)."""

    @staticmethod
    def forward(ctx, q):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.1


class WrongGrad(BatchedAttention):
    def forward(self, q, k, v, mask):
        return super().forward(_WrongDq.apply(q), k, v, mask)


class GqaModulo(BatchedAttention):
    SUPPORTS_GQA = "repeat"

    def forward(self, q, k, v, mask):
        wrong = [h % k.shape[1] for h in range(q.shape[1])]  # head h reads kv head h % Hkv, not h // G
        return super().forward(q, k[:, wrong], v[:, wrong], mask)


class Stateful(BatchedAttention):
    """Right on its first call only: a reused output buffer that is never cleared accumulates every later call."""

    def forward(self, q, k, v, mask):
        out = super().forward(q, k, v, mask).detach()
        if getattr(self, "_buf", None) is None or self._buf.shape != out.shape:
            self._buf = torch.zeros_like(out)
        self._buf += out
        return self._buf.clone()


class Float64(BatchedAttention):
    """Computes and returns float64 for float32 inputs: closer to the reference than float32 could be."""

    def forward(self, q, k, v, mask):
        out = super().forward(q.double(), k.double(), v.double(), mask)
        return out if q.requires_grad else out.detach()  # backward: the gradients flow back in float32


class Mutates(BatchedAttention):
    """Scales q in place on every call: checked against the already-changed q, its result looked right."""

    def forward(self, q, k, v, mask):
        with torch.no_grad():
            q.mul_(1.01)
        return super().forward(q, k, v, mask)


class EverySecond(BatchedAttention):
    """Wrong on every second call (+0.05): caught or not, before, by the parity of the calls timed."""

    calls = 0

    def forward(self, q, k, v, mask):
        EverySecond.calls += 1
        out = super().forward(q, k, v, mask)
        return out + 0.05 if EverySecond.calls % 2 == 0 else out


for _name, _cls in (("plant_stateful", Stateful), ("plant_gqa_modulo", GqaModulo), ("plant_scaled", Scaled), ("plant_heads", HeadsSwapped), ("plant_batch", BatchSwapped),
                    ("plant_grad", WrongGrad), ("plant_correct", BatchedAttention), ("plant_float64", Float64),
                    ("plant_mutates", Mutates), ("plant_every_second", EverySecond)):
    attnbench.register(_name, _cls)
'''
FORWARD_PLANTS = [
    "plant_scaled",
    "plant_heads",
    "plant_batch",
    "plant_float64",
    "plant_mutates",
    "plant_every_second",
]


@pytest.fixture(scope="module")
def plants():
    namespace: dict = {}
    exec(compile(PLANTS, "plants", "exec"), namespace)  # noqa: S102 - the test's own source
    names = [
        "plant_stateful",
        "plant_gqa_modulo",
        "plant_scaled",
        "plant_heads",
        "plant_batch",
        "plant_grad",
        "plant_correct",
        "plant_float64",
        "plant_mutates",
        "plant_every_second",
    ]
    yield names
    for n in names:
        attnbench.unregister(n)


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("name", ["plant_scaled", "plant_heads", "plant_batch"])
def test_planted_wrong_outputs_are_recorded_wrong(plants, name, mode):
    m = measure(name, SPEC.replace(mode=mode), FAST, peak_flops=1e10)
    assert m.status == "wrong", (m.status, m.reason)
    assert m.max_error > m.tolerance > 0 and m.error_ratio > 1
    assert "output max error" in m.reason and m.samples == () and m.runs == 0  # never timed


CONTRACT_PLANTS = {  # issue 28's blind spots: each was recorded ok
    "plant_float64": "output dtype torch.float64 != torch.float32",
    "plant_mutates": "changed its inputs in place (q)",
    "plant_every_second": "right on the first call, wrong on call",
}


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("seq_len", [16, 32, 64])
@pytest.mark.parametrize("name", list(CONTRACT_PLANTS))
def test_a_wrong_dtype_an_input_written_in_place_and_a_fault_on_every_second_call_are_wrong(
    plants, name, seq_len, mode
):
    """Each length changes how many calls are timed: the every-second-call fault is caught whatever their parity."""
    m = measure(name, SPEC.replace(seq_len=seq_len, mode=mode), FAST, peak_flops=1e10)
    assert m.status == "wrong" and CONTRACT_PLANTS[name] in m.reason, (m.status, m.reason)
    assert m.error_ratio > 1


@pytest.mark.parametrize("name", list(CONTRACT_PLANTS))
def test_asv_accuracy_fails_the_contract_plants(plants, name):
    from attnbench import asv_bench

    prepared = asv_bench.prepare_spec(name, SPEC)
    reason = "output max error" if name == "plant_every_second" else CONTRACT_PLANTS[name]
    assert prepared.checked.error_ratio > 1 and reason in prepared.checked.reason()
    with pytest.raises(asv_bench.WrongResult):
        asv_bench._gated_prepared(name, SPEC)


def test_a_variant_wrong_after_its_first_call_is_recorded_wrong(plants):
    """Planted: right on the checked first call, wrong on every later one (recorded ok before the re-check)."""
    m = measure("plant_stateful", SPEC, FAST, peak_flops=1e10)
    assert (
        m.status == "wrong"
        and "right on the first call, wrong on call 1 of 2 checked after the timed ones" in m.reason
    ), m.reason
    assert m.error_ratio > 1 and m.samples == ()


def test_asv_reports_a_variant_wrong_after_its_first_call(plants):
    from attnbench import asv_bench

    assert asv_bench.prepare_spec("plant_stateful", SPEC).checked.error_ratio > 1
    assert asv_bench.prepare_spec("plant_correct", SPEC).checked.error_ratio < 1


def test_planted_wrong_gradient_is_recorded_wrong(plants):
    m = measure("plant_grad", SPEC.replace(mode="backward"), FAST, peak_flops=1e10)
    assert m.status == "wrong", (m.status, m.reason)
    assert m.max_error <= m.tolerance  # the output is right: only the gradient is caught
    assert m.grad_error > m.grad_tolerance and "gradient dq" in m.reason
    assert (
        measure("plant_grad", SPEC, FAST, peak_flops=1e10).status == "ok"
    )  # forward alone is correct


@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_a_correct_variant_stays_ok(plants, mode):
    m = measure("plant_correct", SPEC.replace(mode=mode), FAST, peak_flops=1e10)
    assert m.status == "ok" and m.error_ratio < 1 and m.extra["checked_slices"] == "6/6"
    assert (m.grad_error < m.grad_tolerance) if mode == "backward" else math.isnan(m.grad_error)


def test_a_sample_always_holds_the_first_and_last_slice(plants):
    """Over the reference budget, a seeded sample of slices is checked: a swap of the last head is caught."""
    spec = SPEC.replace(batch=2, heads=8)
    per_slice = gate.slice_reference_bytes(attnbench.get_variant("batched"), spec)
    config = MeasureConfig(
        timer=FAST.timer,
        measure_rss=False,
        measure_memory=False,
        reference_budget_bytes=4 * per_slice,
        probe=False,
    )
    m = measure("plant_heads", spec, config, peak_flops=1e10)
    assert m.status == "wrong" and "4/16 (batch, head) slices checked" in m.reason
    ok = measure("plant_correct", spec, config, peak_flops=1e10)
    assert ok.status == "ok" and ok.extra["checked_slices"] == "4/16"
    slices = gate.checked_slices(spec, per_slice, 4 * per_slice, seed=0)
    assert slices[0] == (0, 0) and slices[-1] == (1, 7) and len(slices) == 4


def test_the_check_has_its_own_time_budget_and_never_costs_a_length(plants):
    """Planted: a float64 reference predicted at 5.2 s a slice (a matmul peak of 1 MFLOP/s) over 16 slices, calls
    predicted at 1 ms, a 12 s budget. The guard once summed the calls and the whole reference (84 s) and skipped the
    case; now the calls alone meet the time budget, the check takes what its own budget holds (the first and the
    last slice: 2/16), and a swap of the last head is still caught. A slice over the check's budget: measured,
    unchecked, saying why."""
    spec = SPEC.replace(batch=2, heads=8)
    config = MeasureConfig(
        timer=FAST.timer, measure_rss=False, measure_memory=False, probe=False, time_budget_s=12.0
    )
    ok = measure("plant_correct", spec, config, peak_flops=1e6, expected_call_s=1e-3)
    assert ok.status == "ok" and ok.extra["checked_slices"] == "2/16", (ok.status, ok.reason)
    bad = measure("plant_heads", spec, config, peak_flops=1e6, expected_call_s=1e-3)
    assert bad.status == "wrong" and "2/16 (batch, head) slices checked" in bad.reason, bad.reason
    wider = measure(
        "plant_correct",
        spec,
        dataclasses.replace(config, check_budget_s=30.0),
        peak_flops=1e6,
        expected_call_s=1e-3,
    )
    assert (
        wider.status == "ok" and wider.extra["checked_slices"] == "5/16"
    )  # 30 s hold 5 slices of 5.2 s
    unchecked = measure("plant_heads", spec, config, peak_flops=1e5, expected_call_s=1e-3)
    assert (
        unchecked.status == "ok" and "checked_slices" not in unchecked.extra and unchecked.samples
    )
    assert unchecked.reason.startswith(
        "accuracy not checked: one (batch, head) slice of the float64 reference is "
        "predicted to take 52.4 s"
    ), unchecked.reason
    assert "the check's time budget 12 s" in unchecked.reason
    with pytest.raises(ValueError, match="check_budget_s"):
        MeasureConfig(check_budget_s=0.0)


def test_the_time_sample_and_the_memory_sample_take_the_smaller():
    spec = attnbench.AttnSpec(batch=2, heads=8)
    assert gate.checked_slices(spec, 1.0, 100.0, limit=5) == gate.checked_slices(
        spec, 1.0, 5.0
    )  # same draw
    assert len(gate.checked_slices(spec, 1.0, 4.0, limit=9)) == 4
    assert gate.checked_slices(spec, 1.0, 100.0, limit=1) == [
        (0, 0),
        (1, 7),
    ]  # the first and the last at least
    assert len(gate.checked_slices(spec, 1.0, 100.0, limit=16)) == 16


def test_the_sample_is_the_same_in_every_process():
    code = (
        "import attnbench; from attnbench.measure import gate; "
        "print(gate.checked_slices(attnbench.AttnSpec(batch=4, heads=16), 1.0, 10.0, seed=3))"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": str(i)},
        ).stdout
        for i in (1, 2)
    }
    assert len(runs) == 1 and "(0, 0)" in runs.pop()


def test_non_finite_never_passes():
    assert (
        not gate.passes(math.nan, 1.0) and not gate.passes(math.inf, 1.0) and gate.passes(0.5, 1.0)
    )
    q = k = v = torch.randn(1, 1, 8, 4)
    bad = torch.full((1, 1, 8, 4), math.nan)
    result = gate.check(attnbench.get_variant("batched"), q, k, v, None, bad, [(0, 0)])
    assert not result.passed and result.error_ratio == math.inf


def test_a_wrongly_shaped_result_fails():
    q = k = v = torch.randn(1, 2, 8, 4)
    result = gate.check(
        attnbench.get_variant("batched"), q, k, v, None, torch.zeros(1, 2, 8, 3), [(0, 0)]
    )
    assert not result.passed


class _Blowup(BatchedAttention):
    """An approximate variant whose own reference is itself (so it passes the exact check) but which is far from softmax."""

    exact = False
    APPROX_ERROR_BOUND = 0.1

    def forward(self, q, k, v, mask):
        return (
            v.mean(dim=2, keepdim=True).expand(*q.shape[:3], v.shape[-1]).contiguous()
        )  # uniform attention

    def reference(self, q, k, v, mask=None, dtype=torch.float64):
        return v.to(dtype).mean(dim=2, keepdim=True).expand(*q.shape[:3], v.shape[-1])


def test_an_approximate_variant_is_held_to_its_declared_bound():
    attnbench.register("plant_blowup", _Blowup)
    try:
        m = measure("plant_blowup", SPEC, FAST, peak_flops=1e10)
    finally:
        attnbench.unregister("plant_blowup")
    assert m.status == "wrong" and "declared bound 0.1" in m.reason
    assert m.max_error <= m.tolerance and m.extra["softmax_mean_error"] > 0.1


def test_performer_passes_its_own_bound():
    m = measure("performer", SPEC, FAST, peak_flops=1e10)
    assert m.status == "ok", m.reason
    assert (
        0 < m.extra["softmax_mean_error"] <= attnbench.get_variant("performer").APPROX_ERROR_BOUND
    )
    assert m.softmax_error >= m.extra["softmax_mean_error"]  # the max is recorded too


@pytest.mark.slow
def test_cli_run_records_planted_variants_wrong(tmp_path):
    (tmp_path / "gate_plants.py").write_text(PLANTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "attnbench.cli",
        "--plugin",
        "gate_plants",
        "run",
        "--variants",
        ",".join([*FORWARD_PLANTS, "plant_grad", "plant_correct"]),
        "--lengths",
        "32",
        "--batch",
        "2",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--modes",
        "forward,backward",
        "--out",
        str(out_dir),
        "--no-report",
        "--quiet",
        "--min-time",
        "0.01",
        "--max-time",
        "0.05",
        "--min-runs",
        "2",
        "--threads",
        "1",
        "--no-probe",
        "--no-instructions",
    ]  # the gate's verdicts; a busy machine would make correct cases "noisy" (tests/test_noise.py)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import pandas as pd

    frame = pd.read_csv(out_dir / "measurements.csv")
    got = {(r.variant, r.spec_mode): r.status for r in frame.itertuples()}
    expected = {(n, m): "wrong" for n in FORWARD_PLANTS for m in ("forward", "backward")}
    expected |= {
        ("plant_grad", "backward"): "wrong",
        ("plant_grad", "forward"): "ok",
        ("plant_correct", "forward"): "ok",
        ("plant_correct", "backward"): "ok",
    }
    assert got == expected, frame[["variant", "spec_mode", "status", "reason"]].to_string()
    wrong = frame[frame["status"] == "wrong"]
    assert (wrong["error_ratio"] > 1).all() and wrong["tolerance"].notna().all()


def _frame(rows):
    import pandas as pd

    base = {
        "device": "cpu",
        "mode": "forward",
        "spread": math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
    }
    return pd.DataFrame([{**base, **r} for r in rows])


def test_regress_fails_a_case_that_turns_wrong():
    from attnbench.gate import compare

    rows = []
    for commit in ("B", "H"):
        for variant, ratio_head in (("good", 0.2), ("bad", 9.0)):
            ratio = 0.2 if commit == "B" else ratio_head
            time_status = (
                "ok" if ratio <= 1 else "failed"
            )  # asv's timing setup refuses a wrong result
            rows += [
                {
                    "commit": commit,
                    "benchmark": "AttentionAccuracy.track_error_ratio",
                    "variant": variant,
                    "seq_len": 64,
                    "metric": "error_ratio",
                    "value": ratio,
                    "status": "ok",
                },
                {
                    "commit": commit,
                    "benchmark": "Attention.time_attention",
                    "variant": variant,
                    "seq_len": 64,
                    "metric": "time",
                    "value": 1e-3 if time_status == "ok" else math.nan,
                    "status": time_status,
                },
            ]
    table = compare(_frame(rows), "B", "H")
    verdicts = {(r.variant, r.metric): r.verdict for r in table.itertuples()}
    # no timing samples in this synthetic frame: the time statistic cannot decide "good" (never a silent pass)
    assert verdicts == {
        ("bad", "error_ratio"): "wrong",
        ("bad", "time"): "wrong",
        ("good", "error_ratio"): "ok",
        ("good", "time"): "undecided",
    }
    # the loader's own "wrong" status (error_ratio > 1 turned into a status) counts the same
    rows[-2] = {**rows[-2], "status": "wrong", "value": math.nan}
    assert set(compare(_frame(rows), "B", "H").query("variant == 'bad'")["verdict"]) == {"wrong"}


@pytest.mark.slow
def test_asv_records_planted_variants_wrong(tmp_path):
    """A quick asv run over the plants: wrong ones fail their timing setup and report error_ratio > 1."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout: asv needs a commit hash to record results")
    (tmp_path / "gate_plants.py").write_text(PLANTS)
    conf = {
        "version": 1,
        "project": "attnbench",
        "repo": str(root),
        "branches": ["main"],
        "environment_type": "virtualenv",
        "benchmark_dir": str(root / "benchmarks"),
        "results_dir": str(tmp_path / "results"),
        "html_dir": str(tmp_path / "html"),
        "env_dir": str(tmp_path / "env"),
        "launch_method": "forkserver",
    }
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    # asv drops PYTHONPATH from benchmark processes and puts ASV_PYTHONPATH on sys.path instead:
    # this checkout (not an installed attnbench) and the plant module.
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "ASV_PYTHONPATH": os.pathsep.join([str(root), str(tmp_path)]),
        "ATTNBENCH_PLUGINS": "gate_plants",
        "ATTNBENCH_ASV_LENGTHS": "64",
        "ATTNBENCH_ASV_BATCH": "2",
        "ATTNBENCH_ASV_VARIANTS": ",".join([*FORWARD_PLANTS, "plant_grad", "plant_correct"]),
        "ATTNBENCH_ASV_MODES": "forward,backward",
        "ATTNBENCH_ASV_DEVICES": "cpu",
        "OMP_NUM_THREADS": "1",
    }

    def asv(*args):
        return subprocess.run(
            [sys.executable, "-m", "asv", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    assert asv("machine", "--yes", "--machine", "gate").returncode == 0
    out = asv(
        "run",
        "--python=same",
        "--quick",
        "--set-commit-hash",
        head.stdout.strip(),
        "--machine",
        "gate",
        "--bench",
        "Attention.time_attention|AttentionAccuracy.track_error_ratio",
    )
    from asv import util
    from asv.results import Results

    assert (tmp_path / "results" / "benchmarks.json").exists(), (
        out.stdout[-3000:] + out.stderr[-3000:]
    )
    benchmarks = util.load_json(str(tmp_path / "results" / "benchmarks.json"), api_version=2)
    (path,) = [
        p for p in (tmp_path / "results" / "gate").glob("*.json") if p.name != "machine.json"
    ]
    res = Results.load(str(path))
    got = {}
    for key in ("Attention.time_attention", "AttentionAccuracy.track_error_ratio"):
        full = next(k for k in res.get_result_keys(benchmarks) if k.endswith(key))
        params = res.get_result_params(full)
        import itertools

        for combo, value in zip(
            itertools.product(*params), res.get_result_value(full, params), strict=True
        ):
            variant, mode = combo[0].strip("'"), combo[3].strip("'")
            got[key.split(".")[1], variant, mode] = value
    wrong = {(n, m) for n in FORWARD_PLANTS for m in ("forward", "backward")} | {
        ("plant_grad", "backward")
    }
    for variant in (*FORWARD_PLANTS, "plant_grad", "plant_correct"):
        for mode in ("forward", "backward"):
            ratio, time = (
                got["track_error_ratio", variant, mode],
                got["time_attention", variant, mode],
            )
            if (variant, mode) in wrong:
                assert ratio > 1 and time is None, (variant, mode, ratio, time, out.stdout[-3000:])
            else:
                assert ratio < 1 and time is not None and time > 0, (
                    variant,
                    mode,
                    ratio,
                    time,
                    out.stdout[-3000:],
                )


GQA_SPEC = attnbench.AttnSpec(batch=2, heads=8, kv_heads=2, seq_len=32, head_dim=16)


@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_a_wrong_gqa_head_mapping_is_recorded_wrong(plants, mode):
    """Query head h must read key/value head h // G; the plausible h % Hkv is caught on both passes."""
    m = measure("plant_gqa_modulo", GQA_SPEC.replace(mode=mode), FAST, peak_flops=1e10)
    assert m.status == "wrong", (m.status, m.reason)
    assert "output max error" in m.reason


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_a_correct_gqa_variant_stays_ok_with_whole_groups_checked(plants, kv_heads, mode):
    m = measure(
        "plant_correct", GQA_SPEC.replace(kv_heads=kv_heads, mode=mode), FAST, peak_flops=1e10
    )
    assert m.status == "ok" and m.error_ratio < 1, m.reason
    assert m.extra["checked_slices"] == "16/16"


def test_gqa_backward_checks_whole_groups_of_a_sample(plants):
    """Over the budget, each sampled query head brings its group: dk of a shared head sums over G heads."""
    spec = GQA_SPEC.replace(mode="backward")
    per_slice = gate.slice_reference_bytes(attnbench.get_variant("batched"), spec)
    assert per_slice == pytest.approx(
        4
        * gate.slice_reference_bytes(attnbench.get_variant("batched"), spec.replace(kv_heads=None))
    )
    config = MeasureConfig(
        timer=FAST.timer,
        measure_rss=False,
        measure_memory=False,
        reference_budget_bytes=3 * per_slice,
        probe=False,
    )
    m = measure("plant_correct", spec, config, peak_flops=1e10)
    assert m.status == "ok", m.reason
    checked, total = map(int, m.extra["checked_slices"].split("/"))
    assert total == 16 and checked % 4 == 0 and 4 <= checked < 16


def test_a_case_whose_dense_reference_exceeds_the_budget_is_checked_blockwise(plants):
    """Planted: a reference budget below one slice's dense float64 reference (3 score matrices). The
    dense reference left such a case unchecked; the blockwise one (tiles made tiny here) checks it
    and still catches a swapped head."""
    from attnbench import reference

    spec = SPEC.replace(seq_len=64)
    dense_scores = gate.REFERENCE_BUFFERS * 64 * 64 * 8
    config = dataclasses.replace(FAST, reference_budget_bytes=dense_scores)
    tiles = dict(Q_TILE=8, TILE_ELEMENTS=8 * 16)
    with mock.patch.multiple(reference, **tiles), mock.patch.object(gate, "TILE_ELEMENTS", 8 * 16):
        ok = measure("plant_correct", spec, config, peak_flops=1e10)
        bad = measure("plant_heads", spec, config, peak_flops=1e10)
    assert ok.status == "ok" and "checked_slices" in ok.extra, (ok.status, ok.reason)
    assert bad.status == "wrong" and "slices checked" in bad.reason, bad.reason


def test_at_gpu_lengths_one_slice_fits_the_default_budget_and_tiny_sizes_show_their_unit():
    """Forward at L=65536 and backward at L=16384 (1,560-10,000 MiB a slice dense from L=4096-8192
    up on the recorded H100 run) fit 512 MiB blockwise (what is left is O(L): the float64 copies of
    the inputs and, backward, their gradients); planted: a 1 KiB budget, whose message once read
    'needs 0 MiB > reference budget 0 MiB'."""
    from attnbench.measure.runner import check_plan

    chunked = attnbench.get_variant("chunked")
    for mode, length in (("forward", 65536), ("backward", 16384)):
        spec = attnbench.AttnSpec(batch=1, heads=4, seq_len=length, head_dim=64, mode=mode)
        assert gate.slice_reference_bytes(chunked, spec) < 512 * 2**20, mode
        plan = check_plan(chunked, spec, MeasureConfig())
        assert plan.note == "" and len(plan.slices) >= 2, plan.note
    tiny = check_plan(
        chunked, SPEC.replace(seq_len=8), MeasureConfig(reference_budget_bytes=1024.0)
    )
    assert not tiny.slices and "> reference budget 1 KiB" in tiny.note, tiny.note
    assert "0 MiB" not in tiny.note, tiny.note
