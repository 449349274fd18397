"""A pytest plugin: each test's CPU seconds, its own and its subprocesses', one JSON line per test.

Loaded by name (``-p tests.cpu_seconds``, as ``studies/cold_ci.py`` does through ``PYTEST_ADDOPTS``) with
``ATTNBENCH_TEST_CPU_LOG`` naming the file; without that variable it records nothing. Every parallel worker appends to
the same file (one short ``O_APPEND`` write per line). A line holds the test's id, the worker, its wall seconds, and
the CPU seconds (user + system) of the worker process and of the subprocesses it waited for during the test (asv,
valgrind, ``attnbench`` commands, compilers). A subprocess still running when the test ends is counted by the test
that waits for it, or by none.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest

__all__ = ["ENV", "pytest_runtest_protocol"]

ENV = "ATTNBENCH_TEST_CPU_LOG"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    wall, (own, children) = time.perf_counter(), _cpu()
    yield
    own2, children2 = _cpu()
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_s": round(own2 - own, 3),
        "children_cpu_s": round(children2 - children, 3),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
