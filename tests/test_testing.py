"""attnbench.testing and its pytest plugin: each check passes a right kernel and fails a planted one,
with the message the docs page shows; the worked example runs as a user's repository would."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnbench
import attnbench_pytest
from attnbench import AttnSpec
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.timer import TimerConfig
from attnbench.testing import (
    Undecided,
    answer_shapes,
    assert_growth,
    assert_within,
    check_answer,
    measure_cost,
    outcome,
    wrap,
)
from attnbench.testing import kernel as kernel_module

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "kernel_repo"
PAGE = ROOT / "docs" / "testing.md"
SMALL = AttnSpec(heads=2, head_dim=32, mask="causal")
LENGTHS = (128, 256, 512)
BYTES_LENGTHS = (256, 512, 1024)
"""Peak bytes over 128..512 still bend (a kernel linear in L fits L^1.05 there): one octave up."""


def _example_kernel():
    """The worked example's kernel module, imported from its file."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        import blockwise_attention
    finally:
        sys.path.remove(str(EXAMPLE))
    return blockwise_attention.blockwise_attention


def _sdpa_causal_off_by_one(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """SDPA's call, with the causal edge one key short: a query no longer sees itself."""
    if is_causal:
        lq, lk = q.shape[2], k.shape[2]
        attn_mask = torch.ones(lq, lk, dtype=torch.bool).tril(-1)
        attn_mask[0, 0] = True  # the first row keeps one key (no empty-row NaN to hide behind)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


def _with_square_buffer(fn):
    """``fn`` plus one (Lq, Lk) bool buffer, the planted O(L²) memory."""

    def square(q, k, v, attn_mask=None, is_causal=False, scale=None):
        seen = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool)
        out = fn(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
        return out + 0 * seen[0, 0]

    return square


# ---- wrap: the adapters ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fn": 3}, TypeError, "fn must be callable"),
        ({"call": "jax"}, ValueError, "call must be one of"),
        ({"call": "hf", "layout": "blhd"}, ValueError, "layout must be one of \\('bhld',\\)"),
        ({"gqa": "sometimes"}, ValueError, "gqa must be"),
        ({"masks": ("causal", "diagonal")}, ValueError, "masks must name"),
        ({"masks": "causal"}, TypeError, "masks must be a collection"),
        ({"name": "two words"}, ValueError, "name must be letters"),
        ({"cross": 1}, TypeError, "cross must be a bool"),
    ],
)
def test_wrap_refuses_bad_arguments_by_name(kwargs, error, match):
    args = {"fn": F.scaled_dot_product_attention, "call": "sdpa", **kwargs}
    with pytest.raises(error, match=match):
        wrap(args.pop("fn"), **args)


def test_the_sdpa_adapter_passes_the_answer_check_on_every_default_case():
    """Every mask kind, GQA by repeat, Lq != Lk, odd D, Dv != D, batch 3 and backward."""
    kernel = wrap(
        F.scaled_dot_product_attention,
        call="sdpa",
        masks=attnbench.masks.MASK_KINDS,
        gqa="repeat",
        name="torch_sdpa",
    )
    report = check_answer(kernel)
    labels = " | ".join(c.spec.label for c in report.cases)
    for feature in ("Hkv2", "Hkv1", "Lq40 Lk91", "Lq91 Lk40", "Lq1 Lk91", "D33", "Dv24", "B3"):
        assert feature in labels, feature
    backward = [c.spec for c in report.cases if c.spec.mode == "backward"]
    assert sorted(s.hkv for s in backward) == [2, 2], backward  # plain (H2) and grouped (H4 Hkv2)
    assert all(f"mask={m}" in labels for m in attnbench.masks.MASK_KINDS if m != "none")
    assert report.passed and report.worst.error_ratio <= 1


def test_the_blhd_layout_hands_the_function_batch_length_heads_dim():
    def blhd(q, k, v, attn_mask=None, is_causal=False, scale=None):
        assert q.shape[1] == 67 and q.shape[2] == 2, q.shape  # (B, L, H, D)
        out = F.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in (q, k, v)), attn_mask=attn_mask, is_causal=is_causal
        )
        return out.transpose(1, 2)

    kernel = wrap(blhd, call="sdpa", layout="blhd", masks=("none", "causal"), cross=False)
    check_answer(kernel, [s for s in answer_shapes(kernel) if s.lq == 67 and s.heads == 2])


def test_a_declared_feature_is_checked_and_an_undeclared_one_is_left_out():
    kernel = wrap(F.scaled_dot_product_attention, call="sdpa", masks=("none",), backward=False)
    shapes = answer_shapes(kernel)
    assert {s.mask for s in shapes} == {"none"}
    assert all(s.mode == "forward" and s.hkv == s.heads for s in shapes)
    with pytest.raises(ValueError, match="mask causal not supported"):
        check_answer(kernel, [SMALL])


# ---- the answer check ------------------------------------------------------------------------
def test_a_wrong_mask_edge_fails_with_the_worst_case_the_tolerance_and_a_repro():
    """Planted: the causal edge one key short (SDPA's call)."""
    kernel = wrap(_sdpa_causal_off_by_one, call="sdpa", masks=("none", "causal"))
    shapes = [
        AttnSpec(batch=2, heads=2, seq_len=67, head_dim=32, mask=m) for m in ("none", "causal")
    ]
    with pytest.raises(AssertionError) as failed:
        check_answer(kernel, shapes)
    message = str(failed.value)
    assert "answer check of _sdpa_causal_off_by_one: 1 of 2 cases wrong" in message
    assert "worst: B2 H2 L67 D32 float32 cpu mask=causal forward" in message
    assert re.search(r"output max error [\d.]+ > tolerance [\d.e-]+", message), message
    repro = re.search(r"repro: (.*)", message).group(1)
    with pytest.raises(AssertionError, match="1 of 1 cases wrong"):
        eval(repro, {"attnbench": attnbench, "kernel": kernel})  # noqa: S307 - the printed line
    assert outcome.take_records()[-1].verdict == "failed"


def test_a_kernel_that_raises_is_a_wrong_case_named_with_its_error():
    def broken(q, k, v, mask):
        raise RuntimeError("shape mismatch in block 3")

    with pytest.raises(AssertionError, match="the kernel raised RuntimeError: shape mismatch"):
        check_answer(wrap(broken), [AttnSpec(batch=1, heads=2, seq_len=16, head_dim=8)])


# ---- cost growth -----------------------------------------------------------------------------
def test_linear_memory_passes_and_a_square_buffer_fails_on_peak_bytes_at_the_target():
    """Planted: one (L, L) bool buffer beside the example's blockwise kernel."""
    good = wrap(_example_kernel(), call="sdpa", masks=("causal",))
    bounds = dict(spec=SMALL, lengths=BYTES_LENGTHS, max_exponent=1.1, max_at_length=5e9)
    check = assert_growth(good, **bounds)
    assert check.exponent == pytest.approx(1.0, abs=0.05) and len(check.values) == 3
    bad = wrap(_with_square_buffer(_example_kernel()), call="sdpa", masks=("causal",), name="bad")
    with pytest.raises(AssertionError) as failed:
        assert_growth(bad, **bounds)
    lines = str(failed.value).splitlines()
    assert lines[0].startswith("peak_tensor_bytes of bad (B1 H2 D32 float32 cpu mask=causal")
    assert "exponent 1.1" in lines[0] and "> bound 1.1; predicted" in lines[0]
    assert "GB at L=131072 > bound 5 GB" in lines[0]
    assert re.fullmatch(r"  L=256: [\d.]+ kB, L=512: [\d.]+ MB, L=1024: [\d.]+ MB", lines[1])
    assert re.fullmatch(r"  fitted L\^1\.\d\d \(local slopes [\d.]+ \.\. [\d.]+\)", lines[2])
    assert re.fullmatch(
        r"  predicted [\d.]+ GB at L=131072 \(x[\d,]+ the value at L=1024\)", lines[3]
    )


def test_flops_are_counted_for_a_wrapped_function_and_compared_with_a_baseline():
    """The causal blocks skip later keys: fewer FLOPs than batched; planted: twice the work."""
    good = wrap(_example_kernel(), call="sdpa", masks=("causal",))
    flops = measure_cost(good, "flops", LENGTHS, spec=SMALL)
    assert all(f > 0 for f in flops) and flops[2] / flops[1] > 3.4  # L² work, less for blocks
    within = assert_within(good, "batched", "flops", LENGTHS, spec=SMALL)
    assert max(within.ratios) < 1

    def twice(q, k, v, attn_mask=None, is_causal=False, scale=None):
        _example_kernel()(q, k, v, attn_mask, is_causal, scale)
        return _example_kernel()(q, k, v, attn_mask, is_causal, scale)

    with pytest.raises(AssertionError, match=r"flops of twice beyond x1 of batched") as failed:
        assert_within(wrap(twice, call="sdpa", masks=("causal",)), "batched", "flops", LENGTHS,
                      spec=SMALL)  # fmt: skip
    assert "predicted x1." in str(failed.value) and "at L=131072" in str(failed.value)


def test_an_undecided_time_comparison_skips_with_its_reason_never_passes():
    """Too few samples a side (a 1 ms budget) can decide nothing: skip inside pytest, else raise."""
    kernel = wrap(F.scaled_dot_product_attention, call="sdpa", name="fsdpa")
    args = (kernel, "batched", "time", (16, 32, 64))
    with pytest.raises(pytest.skip.Exception, match="undecided") as skipped:
        assert_within(*args, spec=AttnSpec(heads=1, head_dim=8), seconds=0.001)
    assert "too few samples to decide" in str(skipped.value) or "disturbed" in str(skipped.value)
    assert outcome.take_records()[-1].verdict == "undecided"


def test_outside_pytest_an_undecided_check_raises_undecided(monkeypatch):
    monkeypatch.delitem(sys.modules, "pytest")
    with pytest.raises(Undecided, match="no valgrind here"):
        outcome.undecided("no valgrind here")


def test_instruction_counts_skip_with_the_reason_when_valgrind_is_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="instruction counts need valgrind on PATH"):
        measure_cost("batched", "instructions", LENGTHS, spec=SMALL)


def test_bounds_and_lengths_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="give max_exponent, max_at_length or both"):
        assert_growth("batched", "flops", LENGTHS)
    with pytest.raises(ValueError, match="three distinct lengths"):
        assert_growth("batched", "flops", (128, 256), max_exponent=2)
    with pytest.raises(ValueError, match="metric must be one of"):
        measure_cost("batched", "seconds", LENGTHS)
    with pytest.raises(ValueError, match="factor must be a finite number > 1"):
        assert_within("batched", "sdpa", "time", LENGTHS, factor=1.0)


def test_a_wrapped_kernel_registers_for_the_runner_that_run_and_asv_use():
    kernel = wrap(F.scaled_dot_product_attention, call="sdpa", masks=("none", "causal"),
                  name="registered_sdpa", register=True)  # fmt: skip
    try:
        assert "registered_sdpa" in attnbench.variant_names()
        config = MeasureConfig(probe=False, timer=TimerConfig(min_time=0.005, max_time=0.02))
        m = measure("registered_sdpa", AttnSpec(seq_len=64, heads=2, mask="causal"), config)
        assert str(m.status) in ("ok", "noisy"), m.reason
        assert m.error_ratio <= 1 and "wrapped function without a cost model" in m.reason
        assert repr(kernel).startswith("wrap(torch")
    finally:
        attnbench.unregister("registered_sdpa")


# ---- transformers' attention functions, unchanged ---------------------------------------------
def _transformers():
    return pytest.importorskip(
        "transformers",
        reason="the transformers extra is not installed: pip install -c constraints.txt -e '.[transformers]'",
    )


def test_transformers_attention_functions_pass_the_answer_check_and_a_growth_bound():
    _transformers()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import eager_attention_forward

    masks = ("none", "causal", "valid_lengths", "document")
    eager = wrap(eager_attention_forward, call="hf", masks=masks, gqa=True)
    sdpa = wrap(sdpa_attention_forward, call="hf", masks=masks, gqa=True)
    for kernel in (eager, sdpa):
        report = check_answer(kernel)
        assert len(report.cases) >= 12 and report.passed
    # eager materialises the scores: L² work and memory; SDPA's CPU kernel holds O(L)
    assert_growth(eager, "flops", LENGTHS, spec=SMALL, max_exponent=2.01)
    assert_growth(eager, "peak_tensor_bytes", LENGTHS, spec=SMALL, max_exponent=2.01)
    assert_growth(sdpa, "peak_tensor_bytes", LENGTHS, spec=SMALL, max_exponent=1.2)


# ---- the plugin --------------------------------------------------------------------------------
_USERS_ENV = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
"""A user's pytest gets none of this suite's pytest options (a measuring run adds a plugin of
``tests/`` through PYTEST_ADDOPTS, which a user's repository cannot import)."""


def test_the_plugin_loads_without_torch_and_refuses_bad_lengths(tmp_path):
    code = "import sys, attnbench_pytest; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--attnbench-lengths", "512,1024", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_USERS_ENV,
    )  # fmt: skip
    assert out.returncode == 4 and "three or more distinct ints" in out.stderr, out.stderr[-500:]
    assert attnbench_pytest.ENV_LENGTHS == kernel_module.ENV_LENGTHS
    assert attnbench_pytest.ENV_DEVICE == kernel_module.ENV_DEVICE


def test_summary_lines_give_one_line_per_kernel():
    records = [
        {"kernel": "k", "verdict": "passed", "summary": "answer: 16 cases"},
        {"kernel": "k", "verdict": "failed", "summary": "flops L^2.00"},
        {"kernel": "k", "verdict": "passed", "summary": "answer: 16 cases"},
        {"kernel": "j", "verdict": "undecided", "summary": "time"},
    ]
    assert attnbench_pytest.summary_lines(records) == [
        "k: answer: 16 cases [passed]; flops L^2.00 [failed]",
        "j: time [undecided]",
    ]


# ---- the worked example, as a user's repository ---------------------------------------------------
def _planted(source: str, kind: str) -> str:
    if kind == "square":
        return source.replace(
            "    out = q.new_empty(*q.shape[:3], v.shape[-1])\n",
            "    out = q.new_empty(*q.shape[:3], v.shape[-1])\n"
            "    scored = torch.zeros(lq, lk, dtype=torch.bool, device=q.device)\n",
        ).replace(
            "        scores = q[:, :, start:stop] @",
            "        scored[start:stop, :keys] = True\n        scores = q[:, :, start:stop] @",
        )
    return source.replace("> rows", ">= rows")


def _page_blocks(title: str) -> list[list[str]]:
    """The ```text blocks under the page's heading ``title``, as lines."""
    section = PAGE.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0].splitlines() for b in section.split("```text\n")[1:]]


def _page_shows(title: str, planted: str, output: str) -> None:
    """The page's diff is what was planted, and its message is what the run printed (numbers in
    scientific notation aside: the tolerance is the plain float32 error, which another CPU's kernels
    may round differently)."""
    diff, message = _page_blocks(title)
    for line in diff:
        if line.startswith("+"):
            assert line[1:].strip() in planted, f"the page plants a line the test does not: {line}"
    number = r"[\d.]+e[+-]\d+"
    got = {re.sub(number, "N", re.sub(r"^E\s+", "", line).strip()) for line in output.splitlines()}
    for line in message:
        assert re.sub(number, "N", line.strip()) in got, f"the page's line is not printed:\n{line}"


def test_the_worked_example_passes_and_each_planted_fault_fails_as_the_page_shows(tmp_path):
    """One pytest process, as a user runs it: the example as written (passes; its time
    comparison skips), the square buffer (fails on peak bytes) and the mask edge (fails the answer
    check). Planted as the page describes them; the messages are the page's."""
    source = (EXAMPLE / "blockwise_attention.py").read_text()
    tests = (EXAMPLE / "test_blockwise_attention.py").read_text()
    (tmp_path / "blockwise_attention.py").write_text(source)
    (tmp_path / "test_blockwise_attention.py").write_text(tests)
    header, *functions = tests.split("\n\n\ndef ")
    for kind, test in (("square", "test_memory_grows_linearly"),
                       ("edge", "test_answer_matches_the_float64_reference")):  # fmt: skip
        (tmp_path / f"blockwise_{kind}.py").write_text(_planted(source, kind))
        imports = header.replace("from blockwise_attention import", f"from blockwise_{kind} import")
        body = next(f for f in functions if f.startswith(test))
        (tmp_path / f"test_{kind}.py").write_text(f"{imports}\n\n\ndef {body}")
    report = tmp_path / "checks.json"
    env = {**_USERS_ENV, "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfs",
         "--attnbench-report", str(report), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    text = out.stdout
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"the example's pytest process: {cpu.ru_utime + cpu.ru_stime:.1f} CPU-s")
    assert "3 failed" not in text and re.search(r"2 failed, 3 passed, 1 skipped", text), text[
        -3000:
    ]
    assert "FAILED test_square.py::test_memory_grows_linearly" in text
    assert "FAILED test_edge.py::test_answer_matches_the_float64_reference" in text
    assert re.search(r"SKIPPED .*time of blockwise_attention against batched .* undecided", text)
    _page_shows("An O(L²) buffer", _planted(source, "square"), text)
    _page_shows("A wrong mask edge", _planted(source, "edge"), text)
    checks = json.loads(report.read_text())["checks"]
    assert {c["check"] for c in checks} >= {"answer", "growth", "within", "time"}
    assert "attnbench: kernels checked" in text and "blockwise_attention: answer: 16 cases" in text
