"""Installing for CUDA (docs/gpu.md): the documented command keeps every pin and resolves torch's.

CI has no GPU and no route to PyTorch's own index, so the CUDA build itself is not installed here:
these tests check what the command relies on. The constraints' torch pin admits the local builds
(`2.13.0+cu128`) that index serves, and pip, asked for torch under the constraints on the indexes
this machine reaches, resolves exactly the pinned release.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _torch_pin() -> str:
    pins = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert len(pins) == 1, f"constraints.txt must pin torch exactly once, found {pins}"
    return pins[0]


def _documented_command() -> str:
    text = (ROOT / "docs" / "gpu.md").read_text()
    commands = [line for line in text.splitlines() if "download.pytorch.org/whl/cu" in line]
    assert len(commands) == 1, "docs/gpu.md gives one CUDA install command"
    return commands[0]


def test_the_cuda_install_command_keeps_the_constraints_and_the_readme_install():
    command = _documented_command()
    assert "-c constraints.txt" in command, command
    assert "--extra-index-url https://download.pytorch.org/whl/cu" in command, command
    assert "--index-url" not in command.replace("--extra-index-url", ""), (
        "an --index-url would drop PyPI, where every other pin lives"
    )
    assert '-e ".[test]"' in command


@pytest.mark.parametrize("build", ["cu128", "cu126", "cpu"])
def test_the_torch_pin_admits_the_builds_pytorchs_index_serves(build):
    pin = _torch_pin()
    assert Version(f"{pin}+{build}") in SpecifierSet(f"=={pin}")
    assert Version(f"{pin}.post1") not in SpecifierSet(f"=={pin}")  # and nothing else


def test_pip_resolves_the_pinned_torch_under_the_constraints(tmp_path):
    """A dry run of the install's torch requirement on the indexes this machine reaches."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps"]
        + ["--quiet", "--retries", "0", "--timeout", "15", "-c", str(ROOT / "constraints.txt")]
        + ["--report", str(report), "torch"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"no index reachable for a dry run: {done.stderr.strip()[-300:]}")
    installs = json.loads(report.read_text())["install"]
    (torch,) = [item for item in installs if item["metadata"]["name"] == "torch"]
    assert Version(torch["metadata"]["version"]).base_version == _torch_pin()
