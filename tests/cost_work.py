"""Count the work a cost model does, in a fresh process per length: Python lines executed and the largest tensor built.

Work, not seconds: a count does not change when another process takes the CPU. Every variant x
mask x mode's cost model (flops, peak bytes, pair counts, declared support) is counted, and so is
:func:`attnbench.measure.measure` for cases its guard refuses (so the whole path before a
``skipped`` row is counted). A regression fails fast instead of hanging: the process stops at a
line budget and its heap is capped 2 GiB above its start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

WORK_COUNTER = textwrap.dedent(
    """
    import json, os, resource, sys, traceback
    import torch
    import torch._dynamo  # noqa: F401 - the first dispatch mode imports it lazily: an import, not the cost model's work
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    import attnbench
    from attnbench import AttnSpec
    from attnbench.measure import MeasureConfig, measure

    LINE_BUDGET = 2_000_000

    class Work(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    Work.largest = max(Work.largest, t.numel())
            return out

    lines = 0

    def tracer(frame, event, arg):
        global lines
        if event == "line":
            lines += 1
            if lines > LINE_BUDGET:
                raise RuntimeError(f"over {LINE_BUDGET} Python lines: the cost model walks the sequence")
        return tracer

    def count(call):
        global lines
        lines, Work.largest = 0, 0
        with Work():
            sys.settrace(tracer)
            try:
                call()
            finally:
                sys.settrace(None)
        return lines, Work.largest

    def at(length):
        # A regression must fail here, not thrash the machine: cap the heap 2 GiB above the start, and
        # stop at a line budget (a tile walk at L = 10**9 would run for hours).
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        used = int(open("/proc/self/statm").read().split()[5]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_DATA, (used + 2 * 2**30, hard))
        variants = [attnbench.get_variant(n) for n in attnbench.variant_names()]  # built outside the count
        out = {}
        for v in variants:
            for mask in attnbench.masks.MASK_KINDS:
                for mode in ("forward", "backward"):
                    spec = AttnSpec(batch=2, heads=8, seq_len=length, head_dim=64, mask=mask, mode=mode)
                    out[f"{v.name} {mask} {mode}"] = count(lambda: (v.flops(spec), v.predicted_peak_bytes(spec), v.useful_pairs(spec),
                                                                    v.executed_pairs(spec), v.not_supported_reasons(spec)))
        big = AttnSpec(batch=1, heads=16, seq_len=length, head_dim=1024)
        out["torch_mha H16 D1024"] = count(lambda: (attnbench.get_variant("torch_mha").flops(big),
                                                    attnbench.get_variant("torch_mha").predicted_peak_bytes(big)))
        refuse = MeasureConfig(memory_budget_bytes=1, probe=False)  # skipped at every length: the guard's own work
        for name, mask in (("chunked", "causal"), ("batched", "document"), ("flex", "causal"), ("local", "sliding_window")):
            spec = AttnSpec(seq_len=length, mask=mask)
            result = []
            out[f"measure {name} {mask}"] = count(lambda: result.append(measure(name, spec, refuse, peak_flops=1e11)))
            assert result[0].status == "skipped", (name, mask, result[0].status, result[0].reason)
        return {"work": out, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    # Each length in a child forked before any cost model ran: as cold as a fresh process (no cache or lazy import
    # warmed by another length), without importing torch again (3.5 CPU-s a process).
    results = {}
    for length in map(int, sys.argv[1:]):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                answer = {"ok": at(length)}
            except BaseException:
                answer = {"error": traceback.format_exc()}
            with os.fdopen(write, "w") as pipe:
                json.dump(answer, pipe)
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        results[length] = json.loads(text) if text else {"error": f"the child died (status {status})"}
    print(json.dumps(results))
    """
)


Work = tuple[dict[str, tuple[int, int]], int]
"""``({cost model call: (Python lines, largest tensor's elements)}, peak RSS bytes)`` at one length."""


def work_at(*lengths: int) -> dict[int, Work | str]:
    """The :data:`Work` at each length, each in a fresh process: a child forked, before any cost model ran, from one
    process that imported torch and attnbench (one process per length imported them three times). A length whose
    count failed (a line budget exceeded, the heap cap) gives its traceback instead: read it with :func:`at`."""
    out = subprocess.run(
        [sys.executable, "-c", WORK_COUNTER, *map(str, lengths)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        int(length): (
            ({k: tuple(v) for k, v in got["ok"]["work"].items()}, got["ok"]["maxrss"])
            if "ok" in got
            else got["error"]
        )
        for length, got in result.items()
    }


def at(work: dict[int, Work | str], length: int) -> Work:
    """The :data:`Work` at ``length``; the test fails with the child's traceback where its count failed."""
    got = work[length]
    if isinstance(got, str):
        pytest.fail(
            f"counting the cost models' work at L={length} failed:\n{got[-3000:]}", pytrace=False
        )
    return got


SHORT = 4096
"""The short length every long one is compared with."""


LONG = (65536, 10**9)
"""The long lengths tests/test_flops.py compares with :data:`SHORT`."""


def work_at_every_length(factory) -> dict[int, Work | str]:
    """:func:`work_at` of :data:`SHORT` and :data:`LONG`, counted once a session, in one process (two tests of
    tests/test_flops.py)."""
    from tests.conftest import once_per_session

    return once_per_session(factory, "cost-work", lambda: work_at(SHORT, *LONG))
