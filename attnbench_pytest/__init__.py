"""attnbench's pytest plugin: options, fixtures and a summary line per kernel checked.

pytest loads it through the ``pytest11`` entry point wherever attnbench is installed, so loading it
imports neither torch nor attnbench (it lives beside the package for that reason) and it prints
nothing unless a test used :mod:`attnbench.testing`:

* ``--attnbench-lengths 512,1024,2048,4096`` and ``--attnbench-device cuda`` set the lengths and the
  device the checks use by default (through ``ATTNBENCH_TEST_LENGTHS`` and
  ``ATTNBENCH_TEST_DEVICE``, so ``pytest-xdist``'s workers see them too); the fixtures
  ``attnbench_lengths`` and ``attnbench_device`` give them to a test;
* the marker ``attnbench`` selects such tests (``pytest -m attnbench``);
* after the run, one line per kernel: each check's outcome (exponents, predicted cost);
  ``--attnbench-report PATH`` also writes them as JSON.

Each test's checks travel in its report's ``user_properties``, so the summary holds the workers'
checks under ``pytest -n``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

__all__ = ["ENV_LENGTHS", "ENV_DEVICE", "KEY", "OPTIONS", "parse_lengths", "summary_lines"]

ENV_LENGTHS = "ATTNBENCH_TEST_LENGTHS"
"""What ``attnbench.testing.kernel.ENV_LENGTHS`` reads (repeated here: no attnbench import)."""
ENV_DEVICE = "ATTNBENCH_TEST_DEVICE"
"""What ``attnbench.testing.kernel.ENV_DEVICE`` reads."""
KEY = "attnbench"
"""The ``user_properties`` name of one check's record."""
_OUTCOME = "attnbench.testing.outcome"


OPTIONS: dict[str, tuple[str, str]] = {
    "--attnbench-lengths": (
        "L1,L2,L3",
        "comma-separated lengths the cost checks fit (three or more; default 512..4096)",
    ),
    "--attnbench-device": ("DEVICE", "cpu (default), cuda or cuda:N"),
    "--attnbench-report": ("PATH", "write every check's outcome there as JSON"),
}
"""The plugin's command-line options: metavar and help (the docs name them)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnbench", "attention kernel checks (attnbench.testing)")
    for option, (metavar, text) in OPTIONS.items():
        group.addoption(option, metavar=metavar, help=text)


def parse_lengths(raw: str) -> tuple[int, ...]:
    """``"512,1024,2048"`` -> ``(512, 1024, 2048)``.

    Raises:
        pytest.UsageError: not three distinct ints >= 1.
    """
    try:
        lengths = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        lengths = ()
    if len(set(lengths)) < 3 or min(lengths) < 1:
        raise pytest.UsageError(
            f"--attnbench-lengths must be three or more distinct ints >= 1, got {raw!r}"
        )
    return lengths


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "attnbench: checks an attention kernel with attnbench.testing"
    )
    raw = config.getoption("attnbench_lengths")
    if raw:
        os.environ[ENV_LENGTHS] = ",".join(map(str, parse_lengths(raw)))
    device = config.getoption("attnbench_device")
    if device:
        os.environ[ENV_DEVICE] = device
    config.pluginmanager.register(_Collector(config), "attnbench-collector")


@pytest.fixture
def attnbench_lengths() -> tuple[int, ...] | None:
    """The lengths ``--attnbench-lengths`` chose (None: the checks' default)."""
    raw = os.environ.get(ENV_LENGTHS, "")
    return parse_lengths(raw) if raw else None


@pytest.fixture
def attnbench_device() -> str:
    """The device ``--attnbench-device`` chose (default ``cpu``)."""
    return os.environ.get(ENV_DEVICE, "") or "cpu"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield  # the test ran (passed, failed or skipped): its checks are in the outcome module
    outcome = sys.modules.get(_OUTCOME)
    if outcome is not None:
        item.user_properties.extend((KEY, r.as_dict()) for r in outcome.take_records())


class _Collector:
    """Gathers the checks from every test's report, then prints and writes them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.records += [
                {**value, "test": report.nodeid}
                for name, value in report.user_properties
                if name == KEY and isinstance(value, dict)
            ]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.records:
            return
        terminalreporter.write_sep("-", "attnbench: kernels checked")
        for line in summary_lines(self.records):
            terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.config.getoption("attnbench_report")
        if path and not hasattr(self.config, "workerinput"):  # the controller writes it
            Path(path).write_text(json.dumps({"checks": self.records}, indent=1) + "\n")


def summary_lines(records: list[dict]) -> list[str]:
    """One line per kernel: ``blockwise: answer: 12 cases, ... [passed]; peak_tensor_bytes ...``."""
    by_kernel: dict[str, list[str]] = {}
    for r in records:
        item = f"{r['summary']} [{r['verdict']}]"
        items = by_kernel.setdefault(str(r["kernel"]), [])
        if item not in items:
            items.append(item)
    return [f"{kernel}: " + "; ".join(items) for kernel, items in by_kernel.items()]
