"""The results contract: one module names the benchmarks, the grid and the base spec for everyone."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from attnbench import contract

SUITE = Path(__file__).parent.parent / "benchmarks" / "bench_attention.py"


def _suite_names(source: str) -> set[str]:
    """``Class.method`` and module-level function names of an asv benchmark module, found as asv finds them.

    The module is executed (its ``track_`` methods are generated from the metric table) and its classes'
    members listed with ``inspect.getmembers``; a class defined under an ``if`` (CUDA-only ones) is read
    from the source, whatever this machine has.
    """
    pytest.importorskip("asv")
    namespace: dict = {"__name__": "suite_under_test"}
    exec(compile(source.replace("if ab.CUDA:", "if True:"), str(SUITE), "exec"), namespace)
    names = {n for n, v in namespace.items() if inspect.isfunction(v) and not n.startswith("_")}
    for cls in (v for v in namespace.values() if inspect.isclass(v) and v.__module__ == "suite_under_test"):
        names |= {f"{cls.__name__}.{n}" for n, m in inspect.getmembers(cls) if inspect.isfunction(m)}
    return names


def _missing(source: str) -> list[str]:
    names = _suite_names(source)
    wanted = [*contract.GATED_BENCHMARKS, contract.PEAKMEM_BENCHMARK, contract.PEAK_BENCHMARK]
    methods = {n.rsplit(".", 1)[-1] for n in names}
    return [n for n in wanted if n not in names] + [m for m in contract.ASV_METRICS if m not in methods]


def test_every_benchmark_the_contract_names_exists_in_the_suite():
    assert _missing(SUITE.read_text()) == []


def test_a_renamed_benchmark_is_caught():
    """Planted: the suite renames time_attention; the check names it."""
    renamed = SUITE.read_text().replace("def time_attention(", "def time_attn(")
    assert "Attention.time_attention" in _missing(renamed)


def test_asv_regress_and_loader_read_the_contract():
    pytest.importorskip("asv")
    from attnbench import asv_bench, regress
    from attnbench.analysis import frame

    assert regress.TIME_BENCHMARK == contract.TIME_BENCHMARK
    assert set(regress.GATED.split("|")) == set(contract.GATED_BENCHMARKS)
    assert set(regress.CI_SUBSET) <= set(contract.GRID_ENV)
    assert frame.ASV_METRICS is contract.ASV_METRICS and frame.UNITS is contract.UNITS
    assert frame.BASE_SPEC == contract.BASE_SPEC
    base = asv_bench.BASE
    assert (base.heads, base.head_dim, base.dtype) == (contract.BASE_SPEC.heads, contract.BASE_SPEC.head_dim, contract.BASE_SPEC.dtype)


def test_the_grid_follows_its_environment_variables():
    """Narrowing the grid through the contract's variables changes what asv_bench would run (fresh process)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, **{contract.ENV_LENGTHS: "64,128", contract.ENV_MODES: "forward"})
    code = "from attnbench import asv_bench as a; print(a.LENGTHS, a.MODES)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[64, 128] ['forward']"
