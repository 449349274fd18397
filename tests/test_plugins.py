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


@pytest.mark.parametrize("given", ["/tmp/nr/mine_plugin.py", "mine_plugin.py", "plugins/mine"])
def test_a_file_path_is_refused_with_the_module_form_to_use(given):
    """A newcomer passed the plugin's file; the error said only "No module named '/tmp/nr/mine_plugin'"."""
    with pytest.raises(ValueError, match="expected a module name, not a file") as err:
        load_plugins([given])
    module = given.rsplit("/", 1)[-1].removesuffix(".py")
    assert f"--plugin {module} ..." in str(err.value)


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


def test_listing_and_describing_changes_no_dynamo_setting():
    code = (
        "import torch._dynamo.config as c\n"
        "before = (c.recompile_limit, c.fail_on_recompile_limit_hit)\n"
        "import attnbench\n"
        "from attnbench.registry import variant_class, variant_defaults\n"
        "for n in attnbench.variant_names():\n"
        "    variant_class(n); variant_defaults(n); attnbench.get_variant(n).describe()\n"
        "print(before == (c.recompile_limit, c.fail_on_recompile_limit_hit))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "True"


def test_registry_imports_no_variant_module_until_asked():
    code = (
        "import sys, attnbench.registry as r\n"
        "print('attnbench.variants.compiled' in sys.modules)\n"
        "print(r.variant_class('compiled_batched').__name__, r.variant_defaults('compiled_batched'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split("\n")[:2] == ["False", "CompiledVariant {'base': 'batched'}"]
