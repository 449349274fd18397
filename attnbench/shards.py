"""Split the asv suite across CI jobs and merge their results into one history (asv does neither).

A large suite runs in N jobs of a CI matrix: :func:`shard` gives job ``i`` of ``N`` an
``asv run --bench`` pattern naming its share of the suite's benchmarks (dealt round-robin in a fixed
order, so every benchmark lands in exactly one shard, and keeps its shard from commit to commit).
:func:`merge_results` unions the jobs' result files of one machine, commit and environment into the
single file asv itself would have written, and keeps every other file as it is, so ``asv publish``
and ``attnbench report --from`` read the merged directory as one run.

Example::

    attnbench shard 1/2 --grid ci >> "$GITHUB_ENV"  # ATTNBENCH_ASV_* and ATTNBENCH_ASV_BENCH
    asv run "$GITHUB_SHA^!" --bench "$ATTNBENCH_ASV_BENCH"
    attnbench merge-results shard-1/results shard-2/results --out .asv/results
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench import contract
from attnbench.errors import UsageError
from attnbench.io import atomic_write_text

__all__ = [
    "BENCHMARK_PREFIXES",
    "ShardError",
    "parse_shard",
    "suite_benchmarks",
    "shard",
    "bench_pattern",
    "shard_environment",
    "merge_results",
]

BENCHMARK_PREFIXES = ("time_", "timeraw_", "mem_", "peakmem_", "track_")
"""The method names asv runs as benchmarks."""
_BENCH_ENV = "ATTNBENCH_ASV_BENCH"
"""The variable :func:`shard_environment` sets to the ``--bench`` pattern of a shard."""


class ShardError(ValueError, UsageError):
    """A shard specification or a set of result files that cannot be used (usage error: exit 2)."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: shard 2 of 4 (1-based).

    Raises:
        ShardError: not ``I/N`` with 1 <= I <= N.
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise ShardError(f"--shard must be I/N with 1 <= I <= N (e.g. 2/4), got {text!r}")
    return int(match[1]), int(match[2])


def suite_benchmarks(benchmark_dir: str | Path) -> list[str]:
    """Every benchmark of the asv suite in ``benchmark_dir``, named as asv names it.

    Names are ``module.Class.method``; the modules are imported as asv imports them (their generated
    ``track_`` methods included), in name order; every public class or function they hold counts,
    imported ones too, as asv counts them.
    """
    folder = Path(benchmark_dir)
    if not folder.is_dir():
        raise ShardError(
            f"--benchmarks {folder} is not a folder of asv benchmark modules "
            f"({'missing' if not folder.exists() else 'a file'}; run from the checkout's root, "
            "or name the folder asv.conf.json's benchmark_dir names)"
        )
    names = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(f"_attnbench_suite_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        # as asv discovers them: every public class and function the module holds, its own or
        # imported (benchmarks/bench_attention.py re-exports attnbench.asv_suite's classes)
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            if inspect.isclass(value) and not inspect.isabstract(value):
                names += [
                    f"{path.stem}.{attr}.{m}"
                    for m, _ in inspect.getmembers(value, inspect.isfunction)
                    if m.startswith(BENCHMARK_PREFIXES)
                ]
            elif inspect.isfunction(value) and attr.startswith(BENCHMARK_PREFIXES):
                names.append(f"{path.stem}.{attr}")
    if not names:
        raise ShardError(
            f"--benchmarks {folder} holds no asv benchmark "
            "(no module with a time_, peakmem_, track_ ... function or method)"
        )
    return sorted(names)


def shard(names: Sequence[str], index: int, count: int) -> list[str]:
    """Shard ``index`` of ``count`` (1-based) of ``names``.

    Every ``count``-th of the sorted names, from the ``index``-th.
    """
    return sorted(names)[index - 1 :: count]


def bench_pattern(names: Sequence[str]) -> str:
    """An ``asv run --bench`` pattern matching exactly ``names`` (asv searches it in full names)."""
    if not names:
        raise ShardError("the shard holds no benchmark (more shards than benchmarks)")
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def shard_environment(
    benchmark_dir: str | Path, index: int, count: int, grid: str | None = None
) -> dict[str, str]:
    """The variables a CI job sets: its grid's settings and its shard's ``--bench`` pattern.

    The grid's are ``ATTNBENCH_ASV_*`` (``grid`` names one of ``contract.GRIDS``); the ``--bench``
    pattern of its shard is :data:`_BENCH_ENV`.

    Raises:
        ShardError: an unknown grid, or a shard with nothing in it.
    """
    env = {}
    if grid is not None:
        if grid not in contract.GRIDS:
            raise ShardError(f"--grid must be one of {sorted(contract.GRIDS)}, got {grid!r}")
        env.update(contract.grid_environment(contract.GRIDS[grid]))
    env[_BENCH_ENV] = bench_pattern(shard(suite_benchmarks(benchmark_dir), index, count))
    return env


# ---- merging -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Merged:
    """What :func:`merge_results` wrote."""

    files: int  # result files written (one per machine, commit and environment)
    shards: int  # result files read
    benchmarks: int  # benchmark rows in the files written


def _result_files(source: Path) -> list[Path]:
    return sorted(p for p in source.glob("*/*.json") if p.name != "machine.json")


def merge_results(sources: Sequence[str | Path], out: str | Path) -> _Merged:
    """Union the asv results directories of several shards into ``out`` (created, or added to).

    Files of the same machine, commit and environment are merged benchmark by benchmark; a benchmark
    two shards both recorded differently is an error (the shards overlapped). ``benchmarks.json``
    and each ``machine.json`` come from the first source that has them. Files already in ``out`` (an
    earlier history) take part like a source, so a commit's shards can be merged into the history
    kept across CI runs.

    Raises:
        ShardError: a source that is not an asv results directory, or overlapping shards.
    """
    out = Path(out)
    sources = [Path(s) for s in sources]
    for source in sources:
        if not (source / "benchmarks.json").is_file():
            raise ShardError(f"{source} is not an asv results directory (no benchmarks.json)")
        _check_benchmarks_json(source / "benchmarks.json")
    if (out / "benchmarks.json").exists():
        _check_benchmarks_json(out / "benchmarks.json")
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[Path]] = {}
    for source in [out, *sources]:
        for path in _result_files(source):
            groups.setdefault(str(path.relative_to(source)), []).append(path)
    if not (out / "benchmarks.json").exists():
        shutil.copy2(sources[0] / "benchmarks.json", out / "benchmarks.json")
    rows = 0
    for rel, paths in groups.items():
        merged = _merge_files(paths)
        rows += len(merged["results"])
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        machine = next(
            (p.parent / "machine.json" for p in paths if (p.parent / "machine.json").is_file()),
            None,
        )
        if machine is not None and not (target.parent / "machine.json").exists():
            shutil.copy2(machine, target.parent / "machine.json")
        atomic_write_text(target, json.dumps(merged))
    return _Merged(files=len(groups), shards=sum(len(p) for p in groups.values()), benchmarks=rows)


def _check_benchmarks_json(path: Path) -> None:
    """Refuse a ``benchmarks.json`` asv could not read (not an object of benchmarks with names)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ShardError(
            f"{path}: not a readable asv benchmarks.json ({type(exc).__name__}: {str(exc)[:80]})"
        ) from None
    if not isinstance(data, dict) or not any(
        isinstance(v, dict) and "name" in v for v in data.values()
    ):
        raise ShardError(
            f"{path}: not an asv benchmarks.json "
            "(expected an object of benchmarks with their names)"
        )


def _merge_files(paths: Sequence[Path]) -> dict:
    """One asv result file from several of the same machine, commit and environment."""
    merged: dict | None = None
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ShardError(f"{path}: not a readable asv result file ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("results", {}), dict):
            raise ShardError(
                f"{path}: not an asv result file (expected an object with its results)"
            )
        if merged is None:
            merged = {
                **data,
                "results": dict(data.get("results", {})),
                "durations": dict(data.get("durations", {})),
            }
            continue
        if data.get("result_columns") != merged.get("result_columns"):
            raise ShardError(f"{path}: written by another asv result format than {paths[0]}")
        for key, row in data.get("results", {}).items():
            if key in merged["results"] and merged["results"][key] != row:
                raise ShardError(
                    f"{key} was recorded by two shards "
                    f"({paths[0].parent.parent} and {path.parent.parent}): shards must not overlap"
                )
            merged["results"][key] = row
        merged["durations"].update(data.get("durations", {}))
        merged["date"] = min(merged.get("date") or sys.maxsize, data.get("date") or sys.maxsize)
    assert merged is not None
    return merged
