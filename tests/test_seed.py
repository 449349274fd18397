"""The gate's asv environment made of the test interpreter's packages (attnbench/gate/seed.py): where every pin of
asv's matrix is installed here, a linked venv that asv takes for its own and that holds no attnbench; otherwise
nothing made and the reason said. The gate runs that use it end to end are tests/test_regress.py's."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.gate.seed import environments, seed_environments, unseedable
from attnbench.gate.session import _config

ROOT = Path(__file__).resolve().parents[1]
IN_A_VENV = pytest.mark.skipif(
    sys.prefix == sys.base_prefix, reason="the tests run outside a virtual environment"
)


def _conf(tmp_path: Path, monkeypatch, **pins: str) -> Path:
    """The project's asv configuration, its environments under ``tmp_path``, ``pins`` replacing the matrix's."""
    monkeypatch.setenv("ATTNBENCH_ASV_ENV_DIR", str(tmp_path / "env"))
    conf = _config(ROOT, tmp_path)
    if pins:
        data = json.loads(conf.read_text())
        data["matrix"]["req"].update(pins)
        conf.write_text(json.dumps(data))
    return conf


@IN_A_VENV
def test_the_test_environment_stands_for_asvs(tmp_path):
    """Every requirement of asv.conf.json's matrix (and asv's own) is installed here at its pin: constraints.txt and
    the test extra hold them, so CI's gate runs use the fast path. Planted (seen): without wheel in the test extra,
    "wheel is not installed here"."""
    ((env, wanted),) = environments(_config(ROOT, tmp_path))
    assert "pip+wheel" in wanted and "torch" in wanted  # the build's requirements and the matrix's
    assert unseedable(env._python, wanted, env.build_env_vars) is None


def test_each_reason_the_interpreter_cannot_stand_for_asvs(monkeypatch):
    torch = importlib.metadata.version("torch")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    monkeypatch.setattr(sys, "base_prefix", "/somewhere/else")  # a venv, whatever runs the tests
    assert unseedable(here, {"torch": torch.split("+")[0], "pip+setuptools>=40": ""}, {}) is None
    assert unseedable(here, {"torch": "1.0.0"}, {}) == (
        f"torch {torch} here, asv's matrix asks for torch==1.0.0"
    )
    assert unseedable(here, {"pip+setuptools>=9999": ""}, {}).startswith("setuptools ")
    assert unseedable(here, {"no-such-package": ""}, {}) == "no-such-package is not installed here"
    assert unseedable("2.7", {}, {}) == f"Python {here} here, 2.7 in asv's matrix"
    assert unseedable(here, {}, {"CFLAGS": "-O0"}) == "asv's matrix sets build variables"
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    assert unseedable(here, {}, {}) == "this interpreter is not a virtual environment"


@IN_A_VENV
def test_a_made_environment_is_asvs_own_holds_the_pins_and_no_attnbench(tmp_path, monkeypatch):
    """asv finds it present (its record, pip and python), its torch is this one's (a link: the same file), and it
    cannot import attnbench: asv installs each commit's wheel there, and an editable install of the checkout left in
    it would put the checkout's code in every commit's place (planted: not leaving it out fails here)."""
    said: list[str] = []
    conf = _conf(tmp_path, monkeypatch)
    (made,) = seed_environments(conf, said.append)
    assert said == [f"asv's environment made of this interpreter's pinned packages (links): {made}"]
    ((env, _),) = environments(conf)
    assert env.check_presence()
    python = made / "bin" / "python"
    probe = (
        "import torch, importlib.util as u; print(torch.__file__); print(u.find_spec('attnbench'))"
    )
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as asv runs it
    out = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path, env=alone
    )
    linked, attnbench = out.stdout.splitlines()
    assert attnbench == "None", f"the made environment imports attnbench: {attnbench}"
    import torch

    assert Path(linked).stat().st_ino == Path(torch.__file__).stat().st_ino
    pip = subprocess.run([made / "bin" / "pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(made) in pip.stdout, pip.stdout + pip.stderr
    assert seed_environments(conf, said.append) == [] and len(said) == 1  # made once


def test_a_pin_that_differs_leaves_the_environment_to_asv(tmp_path, monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(sys, "base_prefix", "/somewhere/else")
    conf = _conf(tmp_path, monkeypatch, torch="1.0.0")
    assert seed_environments(conf, said.append) == []
    assert said == [
        "asv builds its environment (minutes): torch "
        f"{importlib.metadata.version('torch')} here, asv's matrix asks for torch==1.0.0"
    ]
    assert not (tmp_path / "env").exists() or not any((tmp_path / "env").iterdir())


@IN_A_VENV
def test_packages_that_cannot_be_linked_leave_the_environment_to_asv_and_nothing_half_made(
    tmp_path, monkeypatch
):
    """Another filesystem (planted: every link fails as across devices): asv builds it, as before; no partial copy."""
    import errno

    def cross_device(*args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    said: list[str] = []
    conf = _conf(tmp_path, monkeypatch)
    monkeypatch.setattr(os, "link", cross_device)
    assert seed_environments(conf, said.append) == []
    assert len(said) == 1 and said[0].startswith(
        "asv builds its environment (minutes): linking this interpreter's packages failed"
    ), said
    assert not any((tmp_path / "env").iterdir())
