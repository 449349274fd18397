"""asv's pinned environment, made from the running interpreter's packages where they are the pins.

asv builds the gate's virtualenv with one ``pip install`` per pinned requirement: about 45 s of a
core and 1.3 GB on disk, on every fresh checkout or CI machine, for the same torch and packages the
interpreter running the gate already has when it was installed with ``constraints.txt``. Where every
requirement of asv's matrix is installed here at its pinned version (any version where the matrix
names none), :func:`seed_environments` makes the environment instead: a ``venv`` on the same base
interpreter whose ``site-packages`` entries are hard links of this one's (seconds, no second
gigabyte), the project's own distribution and any editable install the matrix does not require
left out (asv installs each commit's wheel into it; an editable attnbench that a repository of
your own pins, ``attnbench init``, is linked: it is what that repository's benchmarks import), and
asv's record of the environment written last, so asv finds it made and reuses it as it reuses one
it built. Anything else (another Python, a version that differs, a package missing, no virtual
environment, another filesystem) leaves the environment to asv, and the reason is said.

Safe to share for the same reason twins are (:func:`attnbench.gate.session.twin_environments`): pip
replaces a package's files with new ones and never writes into an installed file.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["environments", "seed_environments", "unseedable"]


def seed_environments(conf_path: Path, say: Callable[[str], None]) -> list[Path]:
    """Make each missing virtualenv of the asv configuration at ``conf_path`` from this interpreter.

    Returns the environments made; one that cannot be made is left to asv (``say`` is told why).
    """
    made = []
    for env, wanted in environments(conf_path):
        path = Path(env._path)
        if env.check_presence():
            continue
        why = unseedable(env._python, wanted, env.build_env_vars)
        if why is None:
            try:
                _seed(env, set(wanted))
            except (OSError, subprocess.CalledProcessError) as exc:
                why = f"linking this interpreter's packages failed: {exc}"
        if why is None:
            made.append(path)
            say(f"asv's environment made of this interpreter's pinned packages (links): {path}")
        else:
            say(f"asv builds its environment (minutes): {why}")
    return made


def environments(conf_path: Path) -> list[tuple[Any, dict[str, str]]]:
    """The configuration's virtualenvs, each with every requirement it must hold (as asv declares).

    The matrix's pins, asv's own (``pip+asv_runner``, ...; pip, which asv's build adds and installs
    each commit with), and the project's build requirements: the commits' wheels are built in the
    environment without isolation.
    """
    from asv import config, environment

    conf = config.Config.load(str(conf_path))
    pyproject = Path(conf.repo) / "pyproject.toml"
    build = (
        tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires", [])
        if pyproject.is_file()
        else []
    )
    return [
        (
            env,
            {
                **env._requirements,
                **env._base_requirements,
                **{f"pip+{requirement}": "" for requirement in ["pip>=8", *build]},
            },
        )
        for env in environment.get_environments(conf, None, verbose=False)
        if env.tool_name == "virtualenv"
    ]


def unseedable(python: str, requirements: dict[str, str], build_env: dict[str, str]) -> str | None:
    """Why this interpreter cannot stand for asv's environment (None: it can).

    ``python`` is the matrix's version (``3.11``), ``requirements`` asv's declarations: a name (or
    ``pip+`` and a requirement such as ``setuptools>=68``) and its pinned version (``""``: any).
    """
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if sys.prefix == sys.base_prefix:
        return "this interpreter is not a virtual environment"
    if python != here:
        return f"Python {here} here, {python} in asv's matrix"
    if build_env:
        return "asv's matrix sets build variables"
    for declared, pin in sorted(requirements.items()):
        wanted = Requirement(declared.removeprefix("pip+"))
        if pin:
            wanted.specifier &= SpecifierSet(f"=={pin}")
        found = next(importlib.metadata.distributions(name=wanted.name, path=_site_dirs()), None)
        if found is None:  # only what the environment's links will hold counts
            return f"{wanted.name} is not installed here"
        version = found.version
        if not wanted.specifier.contains(version, prereleases=True):
            return f"{wanted.name} {version} here, asv's matrix asks for {wanted}"
    return None


def _site_dirs() -> list[str]:
    """This interpreter's own ``site-packages`` (one directory, or its pure and platform ones)."""
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def _left_out(project: str, required: set[str] = frozenset()) -> set[str]:
    """Top-level ``site-packages`` names of the project's own distribution and of the editable
    installs that are not among ``required`` (asv's declarations, :func:`environments`).

    asv installs the project per commit. An editable install is a working tree's, not a pinned
    release, so it is left out unless the matrix asks for it by name: a repository set up by
    ``attnbench init`` pins attnbench, and a developer's editable attnbench is then the attnbench
    its benchmarks import (in attnbench's own checkout it is the project, left out by name).
    """
    from packaging.utils import canonicalize_name

    wanted = {canonicalize_name(_requirement_name(r)) for r in required}
    names: set[str] = set()
    for dist in importlib.metadata.distributions(path=_site_dirs()):
        name = canonicalize_name(dist.metadata["Name"] or "")
        direct = dist.read_text("direct_url.json")
        editable = bool(direct) and json.loads(direct).get("dir_info", {}).get("editable", False)
        if name == canonicalize_name(project) or (editable and name not in wanted):
            names.update(Path(str(f)).parts[0] for f in dist.files or ())
    return names


def _requirement_name(declared: str) -> str:
    """The distribution an asv declaration names: ``torch``, ``pip+setuptools>=68``."""
    from packaging.requirements import Requirement

    return Requirement(declared.removeprefix("pip+")).name


def _seed(env, required: set[str] = frozenset()) -> None:
    """A venv where asv's ``env`` lives, holding links of this interpreter's packages, then asv's
    record of it. ``required``: asv's declarations (an editable install among them is linked)."""
    path = Path(env._path)
    if path.exists():  # a half-built one asv left: asv removes it too
        shutil.rmtree(path)
    partial = path.with_name(path.name + ".seeding")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _link_venv(partial, path, env._project, required)
        env.save_info_file(str(partial))  # last: a record only where the environment is whole
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _link_venv(partial: Path, path: Path, project: str, required: set[str] = frozenset()) -> None:
    """At ``partial``, a venv to live at ``path``, its ``site-packages`` links of this one's."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(partial)],
        check=True,
        capture_output=True,
    )
    skip = _left_out(project, required)
    here = sysconfig.get_paths()
    there = sysconfig.get_paths(vars={"base": partial, "platbase": partial})
    for source, target in {(Path(here[k]), Path(there[k])) for k in ("purelib", "platlib")}:
        for entry in source.iterdir():
            if entry.name in skip or entry.name == "__pycache__":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.copytree(entry, target / entry.name, symlinks=True, copy_function=os.link)
            else:
                os.link(entry, target / entry.name, follow_symlinks=False)
    # asv looks for pip beside python; pip itself is one of the linked packages
    pip = partial / "bin" / "pip"
    pip.write_text(
        f"#!{path / 'bin' / 'python'}\nimport sys\n\nfrom pip._internal.cli.main import main\n\n"
        "sys.exit(main())\n"
    )
    pip.chmod(0o755)
