"""What a first GPU run needs, checked on CPU: each test stands in for the card (issue 38)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench.capability import CallInfo
from attnbench.contract import Status
from attnbench.masks import MASK_KINDS
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.timer import TimerConfig, cuda_graph_seconds
from attnbench.spec import AttnSpec
from attnbench.variants import base, sdpa

ROOT = Path(__file__).parent.parent

# A GPU box as torch sees it, without a GPU: NVML counts one device, while the two calls that
# touch the CUDA runtime (and so forbid CUDA in every process forked afterwards) are recorded and
# refused, as a forked child would refuse them.
_PARENT = """
import json, sys
import torch

calls = []

def runtime_count():
    calls.append("torch._C._cuda_getDeviceCount (poisons fork)")
    return 1

def lazy_init():
    calls.append("torch.cuda._lazy_init")
    raise RuntimeError("CUDA initialised in asv's parent process")

torch.cuda._is_compiled = lambda: True
torch.cuda._device_count_nvml = lambda: 1
torch._C._cuda_getDeviceCount = runtime_count
torch.cuda._lazy_init = lazy_init

from asv_runner.discovery import disc_benchmarks

names = [b.name for b in disc_benchmarks(sys.argv[1], ignore_import_errors=False)]
from attnbench import asv_bench

print(json.dumps({"calls": calls, "names": names, "devices": asv_bench.DEVICES}))
"""


def test_asv_parent_process_never_initialises_cuda(tmp_path):
    """asv's forkserver imports the suite, then forks each benchmark: the import must leave CUDA be.

    On the H100 run of 2026-11-27, 104 of 128 parameter sets of every CUDA benchmark failed with
    "Cannot re-initialize CUDA in forked subprocess": ``torch.cuda.is_available()`` at import.
    A plugin module that asks the same at import must not undo that either.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNBENCH_")}
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    # a plugin that asks torch at import, as user code will
    (tmp_path / "asks_cuda.py").write_text("import torch\n\nHAS_CUDA = torch.cuda.is_available()\n")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])
    env["ATTNBENCH_PLUGINS"] = "asks_cuda"
    done = subprocess.run(
        [sys.executable, "-c", _PARENT, str(ROOT / "benchmarks")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["calls"] == [], found["calls"]
    # the suite did see the (stand-in) card: its CUDA grid and CUDA-only class are there
    assert "cuda" in found["devices"]
    assert any(n.startswith("bench_attention.AttentionCuda.") for n in found["names"])


# ---- capabilities from torch itself (torch.backends.cuda.can_use_*_attention) ---------------------
FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.5), measure_rss=False, probe=False
)
CUDA_CASE = AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16, dtype="bfloat16", device="cuda")
REFUSAL = "Flash attention does not support this call on this card (planted)"


class _Params:
    """Stands in for ``torch.backends.cuda.SDPAParams`` (its arguments kept for the test to read)."""

    def __init__(self, *args: object) -> None:
        self.args = args


@pytest.fixture
def torch_asked(monkeypatch):
    """CUDA as torch would answer: present, and each ``can_use_*`` recorded and answered.

    The answers come from ``answers`` (backend function name -> bool); a refusal warns, as torch's
    ``debug=True`` does.
    """
    asked: list[tuple[str, tuple, bool]] = []
    answers: dict[str, bool] = {}

    def fake(name: str):
        def can_use(params, debug=False):
            asked.append((name, params.args, debug))
            if not answers.get(name, True):
                warnings.warn(REFUSAL, UserWarning, stacklevel=2)
                return False
            return True

        return can_use

    for name in sdpa._CAN_USE.values():
        monkeypatch.setattr(torch.backends.cuda, name, fake(name), raising=False)
    monkeypatch.setattr(sdpa, "cuda_present", lambda: True)
    monkeypatch.setattr(
        sdpa, "_sdpa_params", lambda call, causal, masked: _Params(call, causal, masked)
    )
    sdpa._asked.cache_clear()
    yield asked, answers
    sdpa._asked.cache_clear()


def _own(variant, spec) -> list[str]:
    """The variant's reasons, without the base rule that this CPU box has no CUDA."""
    return [r for r in variant.not_supported_reasons(spec) if "CUDA is not available" not in r]


@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"])
def test_a_backend_torch_refuses_is_skipped_with_torchs_reason(torch_asked, name):
    asked, answers = torch_asked
    variant = attnbench.get_variant(name)
    function = sdpa._CAN_USE[variant.backend]
    answers[function] = False
    reasons = _own(variant, CUDA_CASE)
    assert len(reasons) == 1 and REFUSAL in reasons[0], reasons
    assert [(f, debug) for f, _, debug in asked] == [(function, True)]
    # the row a sweep records: skipped, with torch's words (nothing was built on this CPU box)
    row = measure(name, CUDA_CASE, FAST, peak_flops=1e10)
    assert row.status == Status.SKIPPED and REFUSAL in row.reason


def test_asv_setup_cache_says_torchs_reason_for_a_case_it_refuses(torch_asked, capsys):
    from attnbench import asv_bench

    _, answers = torch_asked
    answers["can_use_efficient_attention"] = False
    table = {"variant": ["sdpa_efficient"], "seq_len": [64], "device": ["cuda"]}
    table |= {"mode": ["forward"], "mask": ["none"]}
    verdicts = asv_bench.grid_verdicts(table)
    (found,) = verdicts.values()
    assert found.status == asv_bench.VerdictStatus.NOT_APPLICABLE and REFUSAL in found.reason
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("attnbench: case")]
    assert REFUSAL in line and line.endswith("s elapsed)")


def test_what_torch_accepts_runs_though_the_hand_table_refuses_it(torch_asked):
    """cuDNN with a document mask: the table (torch 2.4) refuses any mask, torch is asked instead."""
    asked, _ = torch_asked
    cudnn = attnbench.get_variant("sdpa_cudnn")
    spec = CUDA_CASE.replace(mask="document")
    with sdpa.hand_table_only():
        assert _own(cudnn, spec), "the table should refuse: the planted disagreement is gone"
    assert asked == []  # the table alone never asks torch
    assert _own(cudnn, spec) == []
    (call, causal, masked) = asked[0][1]
    assert (causal, masked) == (False, True) and call.lq == call.lk == 64


def test_causal_goes_to_torch_as_is_causal_and_the_answer_is_asked_once(torch_asked):
    asked, _ = torch_asked
    flash = attnbench.get_variant("sdpa_flash")
    spec = CUDA_CASE.replace(mask="causal")
    assert _own(flash, spec) == _own(flash, spec) == []
    assert len(asked) == 1 and asked[0][1][1:] == (True, False)


def test_without_can_use_functions_the_hand_table_answers(torch_asked, monkeypatch):
    asked, _ = torch_asked
    for name in sdpa._CAN_USE.values():
        monkeypatch.delattr(torch.backends.cuda, name)
    flash = attnbench.get_variant("sdpa_flash")
    assert any(
        "needs float16/bfloat16" in r for r in _own(flash, CUDA_CASE.replace(dtype="float32"))
    )
    assert asked == []


class _SixArguments:
    """``SDPAParams`` before ``enable_gqa`` (torch < 2.5): six arguments, a seventh is refused."""

    def __init__(self, q, k, v, mask, dropout, is_causal) -> None:
        self.args = (q, k, v, mask, dropout, is_causal)


@pytest.mark.parametrize("params", [_Params, _SixArguments])
def test_sdpa_params_are_built_for_either_constructor(monkeypatch, params):
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", params)
    call = CallInfo.from_spec(CUDA_CASE.replace(seq_len_k=40, head_dim_v=8, mode="backward"))
    built = sdpa._sdpa_params(call, False, True, device="cpu")
    q, k, v, mask = built.args[:4]
    assert (q.shape, k.shape, v.shape) == ((1, 2, 64, 16), (1, 2, 40, 16), (1, 2, 40, 8))
    assert q.dtype == mask.dtype == torch.bfloat16 and mask.shape == (1, 1, 64, 40)
    assert q.requires_grad and built.args[4:6] == (0.0, False)


# ---- the CUDA tests build what the variant declares it takes -------------------------------------
def test_reference_tests_hand_each_variant_the_mask_form_it_declares(monkeypatch):
    """Every case ``test_matches_reference`` runs on CUDA passes the variant's own validation.

    On the H100 run, ``sdpa_flash`` and ``sdpa_cudnn`` with a causal mask were declared able to
    run (causal as ``is_causal``) and then handed the dense mask, which they refuse: a test
    mismatch. Checked here on the CPU twins of the CUDA inputs, by the hand table (torch cannot
    say without a card).
    """
    from tests.test_variants import DTYPES, SHAPES, case_inputs

    monkeypatch.setattr(base, "cuda_present", lambda: True)
    refused = []
    with sdpa.hand_table_only():
        for name in attnbench.variant_names():
            variant = attnbench.get_variant(name)
            for shape, mask, dtype in itertools.product(SHAPES, MASK_KINDS, DTYPES):
                spec = AttnSpec(**SHAPES[shape], mask=mask, dtype=dtype, device="cuda", window=6)
                if variant.not_supported_reasons(spec):
                    continue
                q, k, v, m = case_inputs(variant, spec.replace(device="cpu"), seed=0)
                call = dataclasses.replace(CallInfo.from_tensors(q, k, v, m), device="cuda")
                if variant.reasons_for(call):
                    refused.append(f"{name}-{shape}-{mask}-{dtype}: {variant.reasons_for(call)}")
    assert refused == []


def test_compiled_flex_on_cuda_declares_the_head_dims_inductor_lowers():
    """Inductor's FlexAttention template refuses D or Dv under 16 on CUDA ("NYI: embedding dimension
    ... must be at least 16"): the cross cases of the H100 run (Dv = 12) failed inside it."""
    flex = attnbench.get_variant("flex")
    spec = AttnSpec(batch=1, heads=2, seq_len=32, head_dim=16, device="cuda")
    own = [r for r in flex.not_supported_reasons(spec) if "not available" not in r]
    assert own == []
    assert any("at least 16" in r for r in flex.not_supported_reasons(spec.replace(head_dim_v=12)))
    assert any("at least 16" in r for r in flex.not_supported_reasons(spec.replace(head_dim=8)))


# ---- CUDA graphs: nothing in the captured region reads a value on the host ----------------------
class _FakeCapture:
    """Stands in for CUDA's graph capture on CPU: inside, a host read of a value is recorded.

    A capturing stream refuses any synchronising call; the H100 run's ``--cuda-graphs`` test died
    on ``bool(torch.isfinite(q).all())`` in validation, inside ``torch.cuda.graph``.
    """

    def __init__(self, monkeypatch) -> None:
        self.capturing = False
        self.reads: list[str] = []
        self.outside = 0  # calls made before capture (the warm-up)
        for name in ("__bool__", "__float__", "__int__", "item"):
            monkeypatch.setattr(torch.Tensor, name, self._guard(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch.cuda, "synchronize", self._guard("synchronize", lambda *a: None))
        stream = type("Stream", (), {"wait_stream": lambda self, other: None})
        event = type(
            "Event",
            (),
            {
                "__init__": lambda self, **kw: None,
                "record": lambda self: None,
                "synchronize": lambda self: None,
                "elapsed_time": lambda self, end: 1.0,
            },
        )
        graph = type("CUDAGraph", (), {"replay": lambda self: None})
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "Event", event)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", graph)
        monkeypatch.setattr(torch.cuda, "graph", self._graph)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capturing)

    def _guard(self, name, real):
        def guarded(*args, **kwargs):
            if self.capturing:
                self.reads.append(name)
            return real(*args, **kwargs)

        return guarded

    @contextlib.contextmanager
    def _graph(self, graph):
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False


@pytest.mark.parametrize("name", ["batched", "chunked", "sdpa", "torch_mha", "linear_elu"])
def test_a_cuda_graph_captures_a_validated_call_without_reading_values(monkeypatch, name):
    q, k, v, _ = AttnSpec(batch=1, heads=2, seq_len=32, head_dim=16).make_inputs()
    variant = attnbench.get_variant(name)
    capture = _FakeCapture(monkeypatch)
    assert cuda_graph_seconds(lambda: variant(q, k, v), "cuda") == pytest.approx(1e-3)
    assert capture.reads == []
    # outside the capture the same checks still refuse bad values
    with pytest.raises(ValueError, match="q must be finite"):
        variant(torch.full_like(q, math.nan), k, v)
