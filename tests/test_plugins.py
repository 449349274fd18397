"""Plugins: a module named on the command line or in ATTNBENCH_PLUGINS registers variants everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnbench.plugins import PLUGINS_ENV, export_plugins, load_plugins, plugin_names


def test_names_are_parsed_from_the_environment(monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, " a.b , ,c ")
    assert plugin_names() == ["a.b", "c"]
    export_plugins(["c", "d"])
    assert plugin_names() == ["a.b", "c", "d"]


def test_a_missing_module_is_named():
    with pytest.raises(ValueError, match="no_such_plugin_module"):
        load_plugins(["no_such_plugin_module"])


@pytest.mark.slow
def test_cli_plugin_registers_a_variant(tmp_path):
    (tmp_path / "my_variants.py").write_text(
        "import attnbench\nfrom attnbench.variants.batched import BatchedAttention\n"
        "attnbench.register('my_batched', BatchedAttention)\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "--plugin", "my_variants", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
    )
    assert out.returncode == 0, out.stderr
    assert "my_batched" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "--plugin", "nope_nope", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "nope_nope" in bad.stderr
