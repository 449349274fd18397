"""Sharding the asv suite across CI jobs, and merging the shards' results into one history."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from attnbench.cli import main
from attnbench.shards import (
    ShardError,
    bench_pattern,
    merge_results,
    parse_shard,
    shard,
    suite_benchmarks,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1", "a/b", "1/0", ""])
def test_a_bad_shard_is_a_usage_error(bad, capsys):
    with pytest.raises(ShardError, match="--shard must be I/N"):
        parse_shard(bad)
    assert main(["shard", bad]) == 2 and "--shard must be I/N" in capsys.readouterr().err


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shards_cover_the_suite_once(count):
    import re

    names = suite_benchmarks(ROOT / "benchmarks")
    assert (
        "bench_attention.Attention.time_attention" in names
        and "bench_attention.AttentionMetrics.track_page_faults" in names
    )
    parts = [shard(names, i, count) for i in range(1, count + 1)]
    assert sorted(n for part in parts for n in part) == sorted(
        names
    )  # every benchmark in exactly one shard
    for part in parts:
        pattern = re.compile(bench_pattern(part))
        assert {n for n in names if pattern.search(n)} == set(
            part
        )  # asv's --bench matches exactly the shard


def _split(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The fixture's results, as two shards would have written them (each with its half of the benchmarks)."""
    shards = []
    for i in (0, 1):
        out = tmp_path / f"shard{i}"
        shutil.copytree(FIXTURE, out)
        path = next(p for p in (out / "fixture-box").glob("*.json") if p.name != "machine.json")
        data = json.loads(path.read_text())
        data["results"] = {
            k: v for j, (k, v) in enumerate(sorted(data["results"].items())) if j % 2 == i
        }
        path.write_text(json.dumps(data))
        shards.append(out)
    return shards[0], shards[1], path.relative_to(shards[1])


def test_merged_shards_load_as_the_unsharded_run(tmp_path):
    from attnbench.analysis.frame import load_asv

    a, b, rel = _split(tmp_path)
    assert len(load_asv(a).frame) < len(load_asv(FIXTURE).frame)
    assert main(["merge-results", str(a), str(b), "--out", str(tmp_path / "merged")]) == 0
    merged_read, whole = load_asv(tmp_path / "merged"), load_asv(FIXTURE).frame
    merged = merged_read.frame
    assert merged_read.problems == ()
    cols = [c for c in whole.columns if c != "origin"]
    key = ["benchmark", "variant", "seq_len", "mode", "metric"]
    assert (
        merged[cols]
        .sort_values(key)
        .reset_index(drop=True)
        .equals(whole[cols].sort_values(key).reset_index(drop=True))
    )


def test_overlapping_shards_are_refused(tmp_path):
    """Planted: one benchmark recorded differently by two shards."""
    a, b, rel = _split(tmp_path)
    data = json.loads((b / rel).read_text())
    other = json.loads((a / rel).read_text())
    key = next(iter(other["results"]))
    data["results"][key] = [[1.0], [], "x" * 64]
    (b / rel).write_text(json.dumps(data))
    with pytest.raises(ShardError, match="recorded by two shards"):
        merge_results([a, b], tmp_path / "merged")


def test_a_commit_merges_into_the_kept_history(tmp_path):
    """The history kept across CI runs is a results directory: a new commit's shards join it, old commits stay."""
    from attnbench.analysis.frame import load_asv

    history = tmp_path / "history"
    shutil.copytree(FIXTURE, history)
    a, b, rel = _split(tmp_path)
    for shard_dir in (a, b):  # the new commit
        path = shard_dir / rel
        data = json.loads(path.read_text())
        data["commit_hash"] = "f" * 40
        path.rename(path.with_name("ffffffff-" + path.name.split("-", 1)[1]))
        path.with_name("ffffffff-" + path.name.split("-", 1)[1]).write_text(json.dumps(data))
    merge_results([a, b], history)
    frame = load_asv(history).frame
    assert set(frame["commit"]) == {"01792c89cdb4659fc9be099ba8cb348011d51657", "f" * 40}
    assert (frame["commit"] == "f" * 40).sum() == (frame["commit"] != "f" * 40).sum()


def test_a_source_that_is_not_asv_results_is_named(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert main(["merge-results", str(tmp_path / "x"), "--out", str(tmp_path / "o")]) == 2
    assert "not an asv results directory" in capsys.readouterr().err


def test_a_missing_benchmarks_folder_is_named(tmp_path):
    from attnbench.shards import ShardError, shard_environment

    for folder in (tmp_path / "nonexistent", tmp_path):
        with pytest.raises(ShardError, match=f"--benchmarks {folder} "):
            shard_environment(folder, 1, 2, "ci")


def test_merge_results_refuses_a_benchmarks_json_asv_cannot_read(tmp_path):
    from attnbench.shards import ShardError, merge_results

    source = tmp_path / "shard"
    source.mkdir()
    (source / "benchmarks.json").write_bytes(os.urandom(512))
    with pytest.raises(ShardError, match="not a readable asv benchmarks.json"):
        merge_results([source], tmp_path / "out")
    (source / "benchmarks.json").write_text('{"version": 2}')
    with pytest.raises(ShardError, match="not an asv benchmarks.json"):
        merge_results([source], tmp_path / "out")
    assert not (tmp_path / "out" / "benchmarks.json").exists()
