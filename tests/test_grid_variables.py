"""The asv grid's environment variables (``ATTNBENCH_ASV_*``, ``ATTNBENCH_THREADS``) are checked
before any work: ``attnbench shard`` and ``attnbench regress`` exit 2 naming the variable, its
value and what it takes, without a traceback.

Every variable is checked through the CLI's ``main`` in this process (the commands read the
environment when they run, not when imported); one real ``python -m attnbench.cli`` per command
shows the same exit and message from a process of its own, where a traceback would show.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [["shard", "1/2", "--grid", "ci"], ["regress", "HEAD", "HEAD"]]
BAD = [
    ("ATTNBENCH_ASV_LENGTHS", "abc", "integers >= 1"),
    ("ATTNBENCH_ASV_VARIANTS", "bogus", "registered variant names (valid: loop,"),
    ("ATTNBENCH_ASV_MODES", "sideways", "passes: forward, backward"),
    ("ATTNBENCH_ASV_MASKS", "none,diagonal", "mask kinds"),
    ("ATTNBENCH_ASV_MAX_CALL_S", "nan", "a number of seconds > 0"),
    ("ATTNBENCH_THREADS", "0", "an integer >= 1"),
    ("ATTNBENCH_ASV_GRID", "fast", "must be one of default, full"),
    ("ATTNBENCH_ASV_COUNT_BUDGET_S", "-5", "a number of seconds > 0, or none"),
    ("ATTNBENCH_ASV_COUNT_PROCESSES", "0", "an integer >= 1"),
]


@pytest.mark.parametrize(("variable", "value", "said"), BAD)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_grid_variable_is_checked_before_any_work(
    variable, value, said, command, monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv(variable, value)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert variable in err and repr(value) in err and said in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_process_of_its_own_exits_2_without_a_traceback(command):
    variable, value, said = BAD[0]
    env = {**os.environ, variable: value, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert variable in proc.stderr and repr(value) in proc.stderr and said in proc.stderr
