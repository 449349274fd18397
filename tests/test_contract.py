"""The results contract: one module names the benchmarks, the grid and the base spec for everyone."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnbench import contract

SUITE = Path(__file__).parent.parent / "attnbench" / "asv_suite.py"
"""The suite's classes (``benchmarks/bench_attention.py`` re-exports them)."""


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
    for cls in (
        v for v in namespace.values() if inspect.isclass(v) and v.__module__ == "suite_under_test"
    ):
        names |= {
            f"{cls.__name__}.{n}" for n, m in inspect.getmembers(cls) if inspect.isfunction(m)
        }
    return names


def _missing(source: str) -> list[str]:
    names = _suite_names(source)
    wanted = [*contract.GATED_BENCHMARKS, contract.PEAKMEM_BENCHMARK, contract.PEAK_BENCHMARK]
    methods = {n.rsplit(".", 1)[-1] for n in names}
    return [n for n in wanted if n not in names] + [
        m for m in contract.ASV_METRICS if m not in methods
    ]


FORK_SERVER = """
import json, os, sys, tempfile, traceback
import numpy, pandas, torch  # noqa: F401 - the third-party imports every child would repeat, paid once
assert not any(m == "attnbench" or m.startswith("attnbench.") for m in sys.modules), "attnbench imported before the fork"
for line in sys.stdin:
    job = json.loads(line)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.environ.clear()
            os.environ.update(job["env"])
            code = 0
            try:
                exec(compile(job["code"], "<child>", "exec"), {"__name__": "__main__"})
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                          "stdout": out.read().decode(), "stderr": err.read().decode()}), flush=True)
"""
"""Runs each job (environment, code) in a forked child of one process that has imported torch, numpy and pandas but
not attnbench: each child imports attnbench afresh under the job's environment, as a new process would, without
paying torch's import again (3.5 CPU-s a process; this module started 13 of them)."""


class Forks:
    """One fork server (:data:`FORK_SERVER`) for the module's fresh imports."""

    def __init__(self) -> None:
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )

    def run(self, code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        """``code`` run in a child whose environment is exactly ``env`` (its exit status, stdout, stderr)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"code": code, "env": env}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.errors.seek(0)
            pytest.fail(
                f"the fork server ended (exit {self.proc.wait()}): "
                + self.errors.read().decode(errors="replace")[-2000:],
                pytrace=False,
            )
        got = json.loads(line)
        return subprocess.CompletedProcess(code, got["returncode"], got["stdout"], got["stderr"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.errors.close()


@pytest.fixture(scope="module")
def forks() -> Iterator[Forks]:
    server = Forks()
    yield server
    server.close()


def test_every_benchmark_the_contract_names_exists_in_the_suite():
    assert _missing(SUITE.read_text()) == []


def test_a_renamed_benchmark_is_caught():
    """Planted: the suite renames time_attention; the check names it."""
    renamed = SUITE.read_text().replace("def time_attention(", "def time_attn(")
    assert "Attention.time_attention" in _missing(renamed)


def test_asv_regress_and_loader_read_the_contract():
    pytest.importorskip("asv")
    from attnbench import asv_bench
    from attnbench.analysis import frame
    from attnbench.gate import session

    assert session.TIME_BENCHMARK == contract.TIME_BENCHMARK
    assert set(session.GATED.split("|")) == set(contract.GATED_BENCHMARKS)
    assert set(session.CI_SUBSET) <= set(contract.GRID_ENV)
    assert frame.ASV_METRICS is contract.ASV_METRICS and frame.UNITS is contract.UNITS
    assert frame.BASE_SPEC == contract.BASE_SPEC
    base = asv_bench.BASE
    assert (base.heads, base.head_dim, base.dtype) == (
        contract.BASE_SPEC.heads,
        contract.BASE_SPEC.head_dim,
        contract.BASE_SPEC.dtype,
    )


def test_the_grid_follows_its_environment_variables(forks):
    """Narrowing the grid through the contract's variables changes what asv_bench would run (a fresh import in a
    forked child: :data:`FORK_SERVER`; planted, the server importing attnbench before the fork fails here)."""
    env = dict(os.environ, **{contract.ENV_LENGTHS: "64,128", contract.ENV_MODES: "forward"})
    out = forks.run("from attnbench import asv_bench as a; print(a.LENGTHS, a.MODES)", env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[64, 128] ['forward']"


# ---- asv's tiers: one place (contract.GRIDS), selected by ATTNBENCH_ASV_GRID, narrowed by the other variables ------
def _suite_grid(forks: Forks, env: dict[str, str], expr: str = "a.PARAMS") -> str:
    """What a fresh import of the suite's logic reports, with only ``env``'s asv variables set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTNBENCH_")}
    out = forks.run(f"from attnbench import asv_bench as a; print({expr})", {**clean, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def _params(grid: contract.Grid, variants: list[str] | None = None) -> dict:
    return {
        "variant": list(grid.variants) if variants is None else variants,
        "seq_len": list(grid.lengths),
        "device": ["cpu"],
        "mode": list(grid.modes),
        "mask": list(grid.masks),
    }


def test_the_default_tier_is_the_asv_grid_and_full_is_the_whole_grid(forks):
    """Unset (or ``default``): ``GRIDS["asv"]``, the teaching progression and a representative per family; ``full``:
    ``GRIDS["asv-full"]`` (every default-sweep variant, L = 64..8192). Planted: the suite reading ``GRIDS["asv-full"]``
    whatever the variable says (the grid before this change) fails the first assertion."""
    from attnbench.registry import default_variants, get_variant

    default = contract.GRIDS[contract.ASV_TIERS["default"]]
    assert set(contract.PROGRESSION) <= set(default.variants)
    assert {contract.family(v) for v in default.variants} == set(contract.FAMILIES) - {"compiled"}
    assert _suite_grid(forks, {contract.ENV_DEVICES: "cpu"}) == str(_params(default))
    assert _suite_grid(forks, {contract.ENV_GRID: "default", contract.ENV_DEVICES: "cpu"}) == str(
        _params(default)
    )
    full = contract.GRIDS[contract.ASV_TIERS["full"]]
    on_cpu = [
        n
        for n in default_variants()
        if not get_variant(n).not_supported_reasons(contract.BASE_SPEC)
    ]
    assert _suite_grid(forks, {contract.ENV_GRID: "full", contract.ENV_DEVICES: "cpu"}) == str(
        _params(full, on_cpu)
    )
    assert full.lengths == (64, 128, 256, 512, 1024, 2048, 4096, 8192) and full.modes == (
        "forward",
        "backward",
    )


def test_the_variables_narrow_either_tier(forks):
    narrowed = {
        contract.ENV_VARIANTS: "batched",
        contract.ENV_LENGTHS: "64",
        contract.ENV_DEVICES: "cpu",
    }
    for tier, grid in contract.ASV_TIERS.items():
        got = _suite_grid(forks, {contract.ENV_GRID: tier, **narrowed})
        assert got == str({**_params(contract.GRIDS[grid], ["batched"]), "seq_len": [64]}), tier


def test_an_unknown_tier_fails_naming_the_variable_and_the_values(forks):
    with pytest.raises(
        ValueError,
        match=r"ATTNBENCH_ASV_GRID must be one of default, full \(unset: default\), got 'fast'",
    ):
        contract.asv_tier({contract.ENV_GRID: "fast"})
    assert contract.asv_tier({contract.ENV_GRID: " Full "}) == (
        "asv-full",
        contract.GRIDS["asv-full"],
    )
    out = forks.run("import attnbench.asv_bench", {**os.environ, contract.ENV_GRID: "fast"})
    assert out.returncode != 0 and "ATTNBENCH_ASV_GRID must be one of default, full" in out.stderr


def test_the_ci_grid_is_unchanged_and_counted_whole(forks):
    """The regression gate's grid stays what it was, and its Instructions run counts every case of it under either
    tier (the default tier's counting budget would leave L=1024 out): its variables carry ``none``."""
    assert contract.GRIDS["ci"] == contract.Grid(
        lengths=(256, 512, 1024),
        variants=("batched", "chunked", "sdpa", "local", "linear_elu"),
        devices=("cpu",),
    )
    ci = contract.grid_environment(contract.GRIDS["ci"])
    assert ci[contract.ENV_COUNT_BUDGET_S] == "none" and contract.ENV_GRID not in ci
    got = _suite_grid(forks, ci, "(a.INSTRUCTION_PARAMS, a.COUNT_BUDGET_S)")
    assert got == str((_params(contract.GRIDS["ci"]), None))


def test_a_named_grid_travels_as_variables(forks):
    """``attnbench shard --grid NAME`` and the gate hand a grid to asv as variables: each tier comes back whole."""
    for name in contract.ASV_TIERS.values():
        grid = contract.GRIDS[name]
        env = {**contract.grid_environment(grid), contract.ENV_DEVICES: "cpu"}
        assert _suite_grid(forks, env, "(a.PARAMS, a.COUNT_BUDGET_S)") == _suite_grid(
            forks,
            {
                contract.ENV_GRID: "full" if name == "asv-full" else "default",
                contract.ENV_DEVICES: "cpu",
            },
            "(a.PARAMS, a.COUNT_BUDGET_S)",
        ), name


def test_case_key_reads_missing_values_as_the_defaults_and_tells_every_column_apart():
    """An old row (no mask, kv_heads or Lk; NaN, None or pandas' NA) and a new row of one case have
    one key; a change in any identity column gives another key."""
    import pandas as pd

    new = {
        "machine": "box",
        "device": "cpu",
        "workload": "prefill",
        "variant": "sdpa",
        "seq_len": 16,
        "seq_len_k": 16,
        "dtype": "float32",
        "batch": 1,
        "heads": 8,
        "kv_heads": 8,
        "head_dim": 64,
        "mask": "none",
        "mode": "forward",
    }
    assert set(new) == set(contract.CASE_IDENTITY)
    old = {"machine": "box", "variant": "sdpa", "seq_len": 16.0, "kv_heads": pd.NA}
    old |= {"seq_len_k": float("nan"), "mask": None, "workload": ""}
    assert contract.case_key(old) == contract.case_key(new)
    changed = {
        "machine": "box2",
        "device": "cuda",
        "workload": "decode",
        "variant": "batched",
        "seq_len": 32,
        "seq_len_k": 64,
        "dtype": "bfloat16",
        "batch": 2,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "mask": "causal",
        "mode": "backward",
    }
    assert set(changed) == set(contract.CASE_IDENTITY)
    for col, value in changed.items():
        assert contract.case_key(new | {col: value}) != contract.case_key(new), col


def test_case_columns_keep_a_tables_order_and_append_the_rest_of_the_identity():
    lead = ("source", "variant", "seq_len")
    columns = contract.case_columns(lead, without=("seq_len_k",))
    assert columns[:3] == lead and "seq_len_k" not in columns and "source" in columns
    assert set(columns) == {"source"} | set(contract.CASE_IDENTITY) - {"seq_len_k"}
    rest = [c for c in contract.CASE_IDENTITY if c in columns[3:]]
    assert list(columns[3:]) == rest  # the identity's own order
    assert set(contract.SHAPE) | set(contract.LENGTHS) | set(contract.ASV_CASE) <= set(
        contract.CASE_IDENTITY
    )
    with pytest.raises(ValueError, match="without: expected columns of the case identity"):
        contract.case_columns(without=("lenght",))
    with pytest.raises(ValueError, match="without"):
        contract.case_columns(("variant",), without=("variant",))


# the tables whose keys are a whole case (less what a table varies along or fixes), as (module, name)
_CASE_TABLES = (
    ("attnbench.analysis.roofline", "_CASE"),
    ("attnbench.analysis.complexity", "GROUP"),
    ("attnbench.analysis.growth", "SERIES"),
    ("attnbench.analysis.tidy", "COLUMNS"),
    ("attnbench.analysis.slices", "SLICE"),
    ("attnbench.analysis.slices", "_CASE"),
    ("attnbench.report.details", "RUNQUEUE_CASE"),
)


def test_a_column_added_to_the_case_identity_reaches_every_tables_keys(forks):
    """The identity is defined once: a column added to it (``window``, in a fresh import of attnbench,
    before the tables' modules are imported) is in every table's keys, so no table can merge two
    cases that differ only in it. A list written out by hand would miss it."""
    code = f"""
import importlib, json
from attnbench import contract
contract.CASE_DEFAULTS["window"] = 0
contract.CASE_IDENTITY = tuple(contract.CASE_DEFAULTS)
print(json.dumps([list(getattr(importlib.import_module(m), n)) for m, n in {_CASE_TABLES!r}]))
"""
    out = forks.run(code, dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    keys = dict(zip(_CASE_TABLES, json.loads(out.stdout), strict=True))
    assert [t for t, columns in keys.items() if "window" not in columns] == []
    assert [t for t, columns in keys.items() if "kv_heads" not in columns] == []
