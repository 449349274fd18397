"""Shared test helpers: registry-driven case lists and the precision-relative tolerance."""

from __future__ import annotations

import fcntl
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import settings

import attnbench
from attnbench.measure import gate
from attnbench.registry import default_variants

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))
"""Each parallel worker gets its share of the cores: two workers of two threads on two cores spin in each other's
OpenMP barriers (measured: the variant tests take 2.5x as long)."""

FLOORS = gate.FLOORS  # one definition of the tolerance rule: the library's correctness gate
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


ROOT = Path(__file__).resolve().parents[1]
ASV_ENV_DIR = ROOT / ".asv" / "test-env"
"""asv's environments for the tests that run asv on commits (the README's regress command and the bisection's planted
history, both in tests/test_regress.py in the parallel part, one after the other on its worker; the planted-regression
gate in the serial part): made once, by the first (of the test environment's own packages: attnbench/gate/seed.py),
and reused by the others and by later sessions. Two asv processes must never install into it at once: keep a second
user of it out of the parallel part, or in that module. (The gate's own second process uses a twin of it,
``.asv/test-env-twin``.)"""


FIRST = (
    "test_regress.py",
    "test_asv.py",
    "test_report.py",
    "test_instructions.py",
    "test_errors.py",
    "test_golden_report.py",
    "test_sweep.py",
    "test_init.py",
    "test_variants.py",
    "test_docs.py",
    "test_flops.py",
    "test_testing.py",
    "test_gate.py",
    "test_regime.py",
    "test_gqa.py",
)
"""Modules with minutes of work (asv on commits, valgrind, whole sweeps, reports), longest first. The README's test
command hands out whole modules (``--dist loadscope --no-loadscope-reorder``: a module's fixtures are built once), in
this order: each of the first four starts at once on a worker of its own, none is left last to a worker alone at the
end. xdist hands every worker a second module at the start, in the same worker order: the fifth module waits behind
the first, the longest (the README's regress command, minutes), so it is a small one (seen: the golden report there,
started after 410 s, was the last 25 s of the run). Then the modules of two to four minutes each: left in their
alphabetical place, the variant tests (1,094 of them, 172 s cold on the 2-core machine) started 1,126 s in and were the
run's last 172 s, on one worker while the other three had finished."""


SERIAL_MODULE = "test_regress.py"
"""Where every ``serial`` test lives: the README's serial step collects this module alone (collecting every module
takes seconds more, alone on the machine). A ``serial`` test anywhere else fails every collection that sees it."""


def stray_serial_tests(items: list[pytest.Item]) -> list[str]:
    """The ``serial`` tests outside :data:`SERIAL_MODULE` (the serial step would never run them)."""
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker("serial") and item.path.name != SERIAL_MODULE
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if stray := stray_serial_tests(items):
        raise pytest.UsageError(
            f"serial tests belong in tests/{SERIAL_MODULE}, the module the README's serial step runs: "
            + ", ".join(stray)
        )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(FIRST)}
        items.sort(
            key=lambda item: rank.get(item.path.name, len(FIRST))
        )  # stable: same order in every worker


def once_per_session(
    factory: pytest.TempPathFactory, name: str, compute: Callable[[], object]
) -> object:
    """``compute()`` once per test session even across parallel workers: the first to ask computes it under a file
    lock and leaves it pickled in the session's shared temporary directory; the others wait and read it."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-N/ holds every worker's popen-gwK/ of this session
    path = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value


WARM_LOCK = "ATTNBENCH_TEST_WARM_LOCK"
"""A file the warm-up (tests/warm_caches.py) holds locked while it fills the caches the workers share."""
WARM_WAIT_S = 900.0
"""The longest a worker waits for the warm-up before compiling on its own (one cold first compile took 3.3 min at load 8)."""
_warming: subprocess.Popen | None = None
_warm_waited = False


def _runs_a_compiling_module(config: pytest.Config) -> bool:
    """Whether the command line names a folder, or a module that compiles (:data:`tests.warm_caches.COMPILES`)."""
    from tests.warm_caches import COMPILES

    paths = [Path(arg.split("::")[0]) for arg in config.args] or [Path(".")]
    return any(p.is_dir() or p.name in COMPILES for p in paths)


def pytest_configure(config: pytest.Config) -> None:
    """In the process that hands tests to parallel workers: start the warm-up (tests/warm_caches.py) beside them.

    Its lock is taken here, before any worker exists, and handed to the warm-up process, which holds it until it
    exits: a worker can never see the caches unlocked before they are filled."""
    global _warming
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker, or one process: it compiles what it needs itself, once
    if os.environ.get(WARM_LOCK) or not _runs_a_compiling_module(config):
        return
    lock_path = Path(tempfile.gettempdir()) / f"attnbench-warm-{os.getpid()}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.environ[WARM_LOCK] = str(lock_path)  # the workers start from this environment
        _warming = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_caches"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(lock.fileno(),),
        )
    # closed here: the warm-up process's copy of the open file holds the lock until it exits


def pytest_unconfigure(config: pytest.Config) -> None:
    """A warm-up still running when the tests are done (a run that never reached a compiling module) is stopped."""
    if _warming is not None and _warming.poll() is None:
        _warming.kill()
        _warming.wait()
    if _warming is not None:
        Path(os.environ.pop(WARM_LOCK)).unlink(missing_ok=True)


def _wait_for_the_warm_up() -> None:
    """Block until the warm-up has filled the shared caches (at most :data:`WARM_WAIT_S`), once per worker."""
    global _warm_waited
    path = os.environ.get(WARM_LOCK)
    if _warm_waited or not path or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _warm_waited = True
    deadline = time.monotonic() + WARM_WAIT_S
    try:
        lock = open(path)  # noqa: SIM115 - held while waiting, closed below
    except OSError:  # gone: the warm-up's session has ended
        return
    with lock:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.5)


CRITICAL = FIRST[0]
"""The module whose worker keeps its priority: the README's regress command is the longest chain of subprocesses (asv's
environment, timing rounds, two valgrind processes: 3 minutes alone) and finished last when it shared the cores evenly
with three workers (7 minutes)."""
NICE = 10
_first_test = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``serial`` test judges the machine's timing: beside a parallel neighbour it would measure the neighbour.

    A parallel worker whose first test is not in :data:`CRITICAL` lowers its priority (``nice``) for the session, so
    the critical chain runs at nearly a core's speed and the others fill in around it."""
    global _first_test
    if item.get_closest_marker("serial") and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail(
            "a serial test times the machine and cannot run beside parallel workers: "
            f"run `pytest -n 4 -m 'not serial'` and then `pytest -m serial tests/{SERIAL_MODULE}`",
            pytrace=False,
        )
    if _first_test and os.environ.get("PYTEST_XDIST_WORKER"):
        _first_test = False
        if item.path.name != CRITICAL:
            os.nice(NICE)
    from tests.warm_caches import COMPILES

    if item.path.name in COMPILES:
        _wait_for_the_warm_up()


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that run ``regress`` or ``history`` never append to a CI job's real summary page."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def assert_close_to_reference(variant, q, k, v, mask, factor: float = gate.FACTOR) -> None:
    """Error vs float64 must be within ``factor`` x the plain same-precision error, plus a floor.

    The rule is :func:`attnbench.measure.gate.tolerance`; NaN or inf never passes.
    """
    out = variant(q, k, v, mask)
    assert out.shape == (*q.shape[:3], v.shape[-1]), f"{variant.name}: shape {tuple(out.shape)}"
    assert out.dtype == q.dtype
    assert torch.isfinite(out).all(), f"{variant.name} produced non-finite values"
    truth = variant.reference(q, k, v, mask)
    plain = variant.reference(q, k, v, mask, dtype=q.dtype)
    err = (out.double() - truth).abs().max().item()
    plain_err = (plain.double() - truth).abs().max().item()
    tol = gate.tolerance(plain_err, q.dtype, factor)
    assert gate.passes(err, tol), (
        f"{variant.name}: max error {err:.3g} > tolerance {tol:.3g} (plain {plain_err:.3g})"
    )


def all_variants() -> list[str]:
    return attnbench.variant_names()


def cheap_variants() -> list[str]:
    """Variants without per-shape compilation: the ones property tests can call on many shapes."""
    return default_variants()


def is_expensive(name: str) -> bool:
    return name not in default_variants()
