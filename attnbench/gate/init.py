"""``attnbench init``: a repository of your own, set up so ``attnbench regress`` gates its kernel.

``attnbench regress BASE HEAD`` runs asv on two commits of the repository it is given and decides on
the results (:mod:`attnbench.gate.session`). asv builds and installs the repository's *project* at
each commit, and runs the benchmarks of the *working tree* against it. In attnbench's own checkout
the project is attnbench. In yours it is your package, and the benchmarks are attnbench's suite
(:mod:`attnbench.asv_suite`) over the variants your plugin module registers. So :func:`init_repo`
writes:

* ``asv.conf.json``: your project built as a wheel per commit and installed without dependencies
  (as attnbench's own configuration does), in an environment whose matrix pins attnbench and its
  runtime dependencies at the versions installed here: the gate makes that environment of this
  interpreter's packages in seconds (:mod:`attnbench.gate.seed`), and attnbench is the same at
  every commit, so only your code differs between BASE and HEAD;
* ``benchmarks/bench_attention.py``: the suite's classes, with ``ATTNBENCH_PLUGINS`` (your module:
  every benchmark process imports it, from the commit being measured) and
  ``ATTNBENCH_ASV_VARIANTS`` (your variants) as defaults, the environment's values winning;
* ``pyproject.toml``, only where the repository has no packaging at all: the smallest one that
  installs the plugin module, so asv has something to build;
* ``.asv/`` in ``.gitignore`` (asv's environments and results).

Nothing is written before every check passed: the plugin module imports from the repository and
registers a variant, the variants named are registered, and no file would be overwritten (unless
``force``).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BENCHMARK_DIR", "SUITE_FILE", "Initialised", "init_repo"]

BENCHMARK_DIR = "benchmarks"
SUITE_FILE = "bench_attention.py"
"""The module asv discovers: its name is the prefix of the benchmark names the gate reads
(``bench_attention.AttentionMetrics.track_peak_tensor_bytes``)."""
_NOT_PINNED = frozenset({"asv"})
"""attnbench's dependencies its benchmark processes never import (as attnbench's own matrix)."""
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_SEEN: dict[str, list[str]] = {}
"""plugin -> the variants its import registered: a module is imported once per process."""


@dataclass(frozen=True)
class Initialised:
    """What :func:`init_repo` wrote, and what it measures."""

    repo: Path
    project: str  # the distribution asv builds at each commit
    plugins: list[str]
    variants: list[str]
    written: list[Path] = field(default_factory=list)
    pins: dict[str, str] = field(default_factory=dict)


def init_repo(
    repo: str | Path = ".",
    plugins: Sequence[str] = (),
    variants: Sequence[str] | None = None,
    force: bool = False,
) -> Initialised:
    """Write what ``attnbench regress`` needs to gate the variants ``plugins`` register in ``repo``.

    Args:
        repo: the top level of a git repository (its working tree holds the plugin modules).
        plugins: importable module names that call :func:`attnbench.register` on import.
        variants: the variants the gate measures (default: every one the plugins register).
        force: overwrite an ``asv.conf.json`` or a suite module already there.

    Raises:
        ValueError: not a git repository's top level, a plugin that does not import or registers
            nothing, an unknown variant, attnbench not installed, a file that would be
            overwritten, or other Python modules in ``benchmarks/`` (asv would import them).
    """
    root = _git_root(repo)
    plugins = _checked_plugins(plugins)
    found = _registered_by(root, plugins)
    chosen = _checked_variants(variants, found, plugins)
    project, packaging = _project(root, plugins)
    files = _files(root, plugins, chosen, project, packaging)
    _check_free(root, files, force)
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    if _ignore_asv(root):
        written.append(root / ".gitignore")
    pins = json.loads(files["asv.conf.json"])["matrix"]["req"]
    return Initialised(root, project, plugins, chosen, written, pins)


def _git_root(repo: str | Path) -> Path:
    """``repo`` resolved, where it is the top level of a git work tree (asv's ``repo: "."``)."""
    path = Path(repo).resolve()
    if not path.is_dir():
        raise ValueError(f"repo must be a directory, got {repo!r}")
    out = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise ValueError(f"repo must be a git repository, got {path}: {out.stderr.strip()}")
    top = Path(out.stdout.strip()).resolve()
    if top != path:
        raise ValueError(f"repo must be the repository's top level ({top}), got {path}")
    return path


def _checked_plugins(plugins: Sequence[str]) -> list[str]:
    if isinstance(plugins, str):
        plugins = [p for p in plugins.split(",") if p.strip()]
    names = [p.strip() for p in plugins]
    if not names:
        raise ValueError("plugins must name at least one module that registers your variants")
    for name in names:
        if not _MODULE.fullmatch(name):
            raise ValueError(f"plugins must be importable module names, got {name!r}")
    return names


def _registered_by(root: Path, plugins: list[str]) -> dict[str, list[str]]:
    """plugin -> the variants it registers, importing it from the repository's working tree.

    The repository comes first on ``sys.path`` (and its ``src/``, a common layout), as the
    project installed at a commit is in asv's environment.
    """
    from attnbench.plugins import load_plugins
    from attnbench.registry import variant_class, variant_names

    found = {}
    for plugin in plugins:
        before = set(variant_names())
        saved = list(sys.path)
        sys.path[:0] = [str(p) for p in (root / "src", root) if p.is_dir()]
        try:
            load_plugins([plugin])  # ValueError naming the module where it does not import
        finally:
            sys.path[:] = saved
        new = _SEEN.setdefault(plugin, [n for n in variant_names() if n not in before])
        if not new:  # imported before any call: its variants are those its classes define
            new = [
                n
                for n in variant_names()
                if (variant_class(n).__module__ + ".").startswith(plugin + ".")
            ]
        if not new:
            raise ValueError(
                f"plugin {plugin!r} registers no variant: call attnbench.register(NAME, CLASS) "
                "in it (see docs/examples/my_variants.py)"
            )
        found[plugin] = new
    return found


def _checked_variants(
    variants: Sequence[str] | None, found: dict[str, list[str]], plugins: list[str]
) -> list[str]:
    from attnbench.registry import variant_names

    mine = [n for plugin in plugins for n in found[plugin]]
    if variants is None:
        return mine
    if isinstance(variants, str):
        variants = variants.split(",")
    chosen = [v.strip() for v in variants if v.strip()]
    unknown = [v for v in chosen if v not in variant_names()]
    if not chosen or unknown:
        raise ValueError(
            f"variants must be registered names, got {list(variants)!r}; "
            f"your plugins register: {', '.join(mine)}"
        )
    return chosen


def _project(root: Path, plugins: list[str]) -> tuple[str, str | None]:
    """``(distribution name, pyproject.toml to write or None)``: what asv builds at each commit."""
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{pyproject} is not valid TOML: {exc}") from exc
        if name:
            return name, None
    if pyproject.is_file() or (root / "setup.py").is_file() or (root / "setup.cfg").is_file():
        raise ValueError(
            f"{root}: cannot read the project's name (asv's 'project'): give pyproject.toml a "
            "[project] table with its name"
        )
    top = plugins[0].split(".")[0]
    if (root / f"{top}.py").is_file():
        layout = f'[tool.setuptools]\npy-modules = ["{top}"]\n'
    elif (root / top / "__init__.py").is_file():
        layout = f'[tool.setuptools.packages.find]\ninclude = ["{top}*"]\n'
    else:
        raise ValueError(
            f"{root} has no packaging (pyproject.toml) and no {top}.py or {top}/ to package: "
            "asv builds the project at each commit, so write a pyproject.toml that installs "
            f"{plugins[0]}"
        )
    text = (
        "# Written by `attnbench init`: asv builds and installs this at each commit it measures.\n"
        '[build-system]\nrequires = ["setuptools>=68", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{top.replace("_", "-")}"\nversion = "0"\n'
        'requires-python = ">=3.11"\n\n' + layout
    )
    return top.replace("_", "-"), text


def _pins(root: Path, packaging: str | None) -> dict[str, str]:
    """asv's matrix: attnbench and its runtime dependencies as installed here, the build tools."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        version = importlib.metadata.version("attnbench")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ValueError(
            "attnbench is not installed as a distribution here (pip install attnbench): asv's "
            "environment pins the version this interpreter has"
        ) from exc
    pins = {"attnbench": version}
    for declared in importlib.metadata.requires("attnbench") or []:
        req = Requirement(declared)
        if req.marker is not None or req.name in _NOT_PINNED:  # extras and markers: optional
            continue
        # the public version: a local label (torch's +cpu) is no index's name, and == matches it
        pins[req.name] = Version(importlib.metadata.version(req.name)).public
    text = packaging or (root / "pyproject.toml").read_text()
    build = tomllib.loads(text).get("build-system", {}).get("requires", ["setuptools", "wheel"])
    for declared in [*build, "build"]:
        pins.setdefault(Requirement(declared).name, "")
    return pins


def _conf(root: Path, project: str, packaging: str | None) -> str:
    """asv.conf.json, as attnbench's own: a wheel per commit, installed without its dependencies."""
    conf = {
        "version": 1,
        "project": project,
        "repo": ".",
        "dvcs": "git",
        "environment_type": "virtualenv",
        "pythons": [f"{sys.version_info.major}.{sys.version_info.minor}"],
        "matrix": {"req": _pins(root, packaging)},
        "build_command": [
            "python -m build --wheel --no-isolation -o {build_cache_dir} {build_dir}"
        ],
        "install_command": [
            "in-dir={env_dir} python -m pip install --no-deps --force-reinstall {wheel_file}"
        ],
        "uninstall_command": [],
        "benchmark_dir": BENCHMARK_DIR,
        "env_dir": ".asv/env",
        "results_dir": ".asv/results",
        "html_dir": ".asv/html",
        "launch_method": "forkserver",
    }
    return json.dumps(conf, indent=4) + "\n"


def _suite(plugins: list[str], variants: list[str]) -> str:
    from attnbench import contract
    from attnbench.plugins import PLUGINS_ENV

    version = importlib.metadata.version("attnbench")
    return f'''"""asv benchmarks of this repository's attention variants, by attnbench's suite.

Written by `attnbench init` (attnbench {version}). asv imports this module from the working
tree, and {", ".join(plugins)} from the commit it measures: `attnbench regress BASE HEAD`
compares your commits. {PLUGINS_ENV} and {contract.ENV_VARIANTS} set in the
environment win over these defaults.
"""

import os

for name, default in [
    ("{PLUGINS_ENV}", "{",".join(plugins)}"),
    ("{contract.ENV_VARIANTS}", "{",".join(variants)}"),
]:
    if not os.environ.get(name, "").strip():  # unset or empty: this repository's
        os.environ[name] = default

from attnbench.asv_suite import *  # noqa: E402, F403
'''


def _files(
    root: Path, plugins: list[str], variants: list[str], project: str, packaging: str | None
) -> dict[str, str]:
    """Relative path -> text of every file to write."""
    files = {
        "asv.conf.json": _conf(root, project, packaging),
        f"{BENCHMARK_DIR}/{SUITE_FILE}": _suite(plugins, variants),
    }
    if not (root / BENCHMARK_DIR / "__init__.py").is_file():
        files[f"{BENCHMARK_DIR}/__init__.py"] = ""
    if packaging is not None:
        files["pyproject.toml"] = packaging
    return files


def _check_free(root: Path, files: dict[str, str], force: bool) -> None:
    """ValueError where a file would be overwritten, or asv would import other modules."""
    bench = root / BENCHMARK_DIR
    others = sorted(
        str(p.relative_to(root))
        for p in (bench.rglob("*.py") if bench.is_dir() else [])
        if p.name not in (SUITE_FILE, "__init__.py")
    )
    if others:
        raise ValueError(
            f"{bench} holds other Python modules, which asv would import as benchmarks: "
            f"{', '.join(others)}"
        )
    there = [
        rel for rel in files if (root / rel).exists() and rel != f"{BENCHMARK_DIR}/__init__.py"
    ]
    if there and not force:
        raise ValueError(f"would overwrite {', '.join(there)} in {root} (force=True to replace)")


def _ignore_asv(root: Path) -> bool:
    """Add ``.asv/`` to ``.gitignore`` unless git ignores it already; True where it was added."""
    out = subprocess.run(
        ["git", "check-ignore", "-q", ".asv/env"], cwd=root, capture_output=True, text=True
    )
    if out.returncode == 0:
        return False
    ignore = root / ".gitignore"
    text = ignore.read_text() if ignore.is_file() else ""
    ignore.write_text(text + ("" if not text or text.endswith("\n") else "\n") + ".asv/\n")
    return True
