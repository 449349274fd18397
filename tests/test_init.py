"""`attnbench init` and `attnbench regress` in a repository of your own: the gate for a kernel that is not attnbench's.

End to end: a throwaway git repository holding one kernel module and what ``init`` wrote; ``regress HEAD~1 HEAD``
fails a commit that adds an L x L buffer to the kernel and passes one that edits a comment. On the exact measures
only (``--rounds 0``, ``--metric time``: peak tensor bytes, FLOPs and the correctness gate, no time rounds and no
valgrind), so nothing here times the machine.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnbench import contract
from attnbench.cli import main
from attnbench.gate.init import init_repo
from attnbench.gate.results import SESSION_MARK, suite_failure
from attnbench.plugins import PLUGINS_ENV
from attnbench.registry import unregister

ROOT = Path(__file__).resolve().parents[1]
INIT_ENV_DIR = ROOT / ".asv" / "test-env-init"
"""asv's environment for the repository of one's own (its matrix pins attnbench, so it is not the one of
``tests.conftest.ASV_ENV_DIR``): made once, of the test environment's packages (attnbench/gate/seed.py, the editable
attnbench linked), and reused by later sessions. A directory of its own: the gate makes a twin of every environment
of its directory, and this module must not do that to tests/test_regress.py's while it installs into them."""
LENGTHS = "128,256,512"
"""The fewest lengths the gate fits a growth on (three), as short as the suite allows: the buffer is x1.01-x1.04 at
these lengths, within the memory factor; its growth predicts x11 at L=131072."""

KERNEL = '''"""A blockwise attention kernel: keys in blocks of 64, an online softmax, no L x L buffer."""

import torch

import attnbench

BLOCK = 64  # keys per block


class BlockwiseAttention(attnbench.Variant):
    """Online-softmax attention over key blocks: extra memory grows as L, not L^2."""

    SUPPORTED_MASKS = frozenset({"none"})
    SCORE_BUFFERS = 0.0
    memory_exponent = 1.0

    def forward(self, q, k, v, mask):
        scale = self.scale_for(q.shape[-1])
        top = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
        total = torch.zeros_like(top)
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        for start in range(0, k.shape[-2], BLOCK):
            scores = q @ k[..., start : start + BLOCK, :].transpose(-2, -1) * scale
            new_top = torch.maximum(top, scores.amax(-1, keepdim=True))
            weights = torch.exp(scores - new_top)
            shrink = torch.exp(top - new_top)
            total = total * shrink + weights.sum(-1, keepdim=True)
            out = out * shrink + weights @ v[..., start : start + BLOCK, :]
            top = new_top
        return out / total


attnbench.register("blockwise", BlockwiseAttention)
'''
SQUARE = (
    "        out = torch.zeros(",
    "        seen = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)  # noqa: F841\n"
    "        out = torch.zeros(",
)
"""The planted fault: a boolean L x L buffer, alive until the kernel returns (L² bytes)."""
COMMENT = ("BLOCK = 64  # keys per block", "BLOCK = 64  # keys per block (one score tile)")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _repository(path: Path, kernel: str = KERNEL) -> Path:
    """A git repository holding only ``flash_mine.py``, the kernel module (nothing committed yet)."""
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    _git(path, "config", "user.email", "ci@attnbench")
    _git(path, "config", "user.name", "ci")
    (path / "flash_mine.py").write_text(kernel)
    return path


def _commit(repo: Path, message: str, plant: tuple[str, str] | None = None) -> None:
    if plant is not None:
        text = (repo / "flash_mine.py").read_text()
        assert plant[0] in text, f"planting {message!r}: pattern not found"
        (repo / "flash_mine.py").write_text(text.replace(plant[0], plant[1], 1))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)


def _gate_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No grid variable or plugin a caller set; the gate's environment shared; the suite's shortest lengths."""
    for name in [*contract.GRID_ENV, PLUGINS_ENV]:
        monkeypatch.delenv(name, raising=False)  # restored after the test, whatever main() set
    monkeypatch.setenv(contract.ENV_ENV_DIR, str(INIT_ENV_DIR))
    monkeypatch.setenv(contract.ENV_LENGTHS, LENGTHS)


@pytest.mark.slow
def test_the_gate_fails_a_square_buffer_and_passes_a_comment_in_a_repository_of_ones_own(
    tmp_path, monkeypatch, capsys
):
    """`attnbench init flash_mine`, then `attnbench regress HEAD~1 HEAD`, run from the repository as a user would
    (in this process: a second one would import torch again). The two planted commits are siblings on the kernel's
    commit, so the second gate finds BASE already built and installed in asv's environment."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = _repository(tmp_path / "mine")
    _gate_environment(monkeypatch)
    monkeypatch.chdir(repo)
    try:
        assert main(["init", "flash_mine"]) == 0, capsys.readouterr()
    finally:  # the plugin registered its variant in this process: no other test sees it
        unregister("blockwise")
        sys.modules.pop("flash_mine", None)
    suite = (repo / "benchmarks" / "bench_attention.py").read_text()
    assert '("ATTNBENCH_PLUGINS", "flash_mine")' in suite
    assert '("ATTNBENCH_ASV_VARIANTS", "blockwise")' in suite
    assert json.loads((repo / "asv.conf.json").read_text())["matrix"]["req"]["attnbench"]
    _commit(repo, "a blockwise kernel, set up by attnbench init")
    assert sorted(_git(repo, "ls-files").split()) == [
        ".gitignore",
        "asv.conf.json",
        "benchmarks/__init__.py",
        "benchmarks/bench_attention.py",
        "flash_mine.py",
        "pyproject.toml",
    ]
    _git(repo, "branch", "kernel")
    gate = ["regress", "HEAD~1", "HEAD", "--metric", "time", "--rounds", "0"]

    _commit(repo, "an L x L buffer", SQUARE)
    capsys.readouterr()
    code = main(gate)
    text = "\n".join(capsys.readouterr())
    assert code == 1 and "Traceback" not in text, text
    table = _verdicts(repo)
    flagged = table[table["verdict"] == "regressed"]
    assert list(zip(flagged["metric"], flagged["basis"], flagged["seq_len"], strict=True)) == [
        ("peak_tensor_bytes", "predicted", 131072)
    ], text
    assert flagged["ratio"].iloc[0] > 5, (
        text
    )  # x11.6: one L² buffer beside the kernel's L-sized ones
    measured = table[(table["metric"] == "peak_tensor_bytes") & (table["basis"] == "measured")]
    assert sorted(measured["seq_len"]) == [128, 256, 512], text
    assert (measured["verdict"] == "ok").all(), text  # x1.01-x1.04: within x1.1 where measured
    assert set(table["variant"]) == {"blockwise"}, text  # the repository's variant, no built-in

    _git(repo, "checkout", "-q", "-b", "comment", "kernel")
    _commit(repo, "a comment", COMMENT)
    code = main(gate)
    text = "\n".join(capsys.readouterr())
    assert code == 0 and "Traceback" not in text, text
    table = _verdicts(repo)
    assert (table["verdict"] == "ok").all() and (table["basis"] == "predicted").sum() >= 2, text


def _verdicts(repo: Path) -> pd.DataFrame:
    """The verdict table the gate wrote beside asv's results (every row's whole reason)."""
    return pd.read_csv(repo / ".asv" / "regress" / "results" / contract.GATE_VERDICTS)


def test_init_refuses_a_plugin_that_does_not_import_and_writes_nothing(tmp_path, capsys):
    """Planted: a wrong plugin name. A usage error naming the module, before any file is written."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = _repository(tmp_path / "mine")
    assert main(["init", "flash_mne", "--repo", str(repo)]) == 2
    err = capsys.readouterr().err
    assert "plugin module 'flash_mne' could not be imported: ModuleNotFoundError" in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in repo.iterdir()) == [".git", "flash_mine.py"]


def test_init_refuses_what_the_gate_could_not_use(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ValueError, match="must be a git repository"):
        init_repo(plain, ["flash_mine"])
    repo = _repository(tmp_path / "mine", kernel='"""Registers nothing."""\n')
    with pytest.raises(ValueError, match="plugins must name at least one module"):
        init_repo(repo, [])
    (repo / "idle_kernel.py").write_text('"""Registers nothing."""\n')
    with pytest.raises(ValueError, match="plugin 'idle_kernel' registers no variant"):
        init_repo(repo, ["idle_kernel"])
    (repo / "asv.conf.json").write_text("{}")
    (repo / "kernel_with_a_variant.py").write_text(
        "import attnbench\nfrom attnbench.variants.batched import BatchedAttention\n\n"
        "attnbench.register('init_test_variant', BatchedAttention)\n"
    )
    try:
        with pytest.raises(ValueError, match="variants must be registered names"):
            init_repo(repo, ["kernel_with_a_variant"], variants=["no_such_variant"])
        with pytest.raises(ValueError, match=r"would overwrite asv\.conf\.json"):
            init_repo(repo, ["kernel_with_a_variant"])
        assert not (repo / "benchmarks").exists()
        done = init_repo(repo, ["kernel_with_a_variant"], force=True)
        assert done.variants == ["init_test_variant"] and done.project == "kernel-with-a-variant"
    finally:
        from attnbench.registry import unregister

        unregister("init_test_variant")


def test_a_suite_asv_cannot_import_is_named_by_its_exception():
    """asv's own words when discovery failed, as the gate's log holds them (asv 0.6.6; abridged): one line, the
    exception, not its traceback; a failure of an earlier run in the kept log is not this run's."""
    log = [
        f"{SESSION_MARK} in /tmp/mine",
        "[  10.6 s] ·· Building e2439469 <main> for virtualenv-py3.11-attnbench0.1.0",
        "[  37.2 s] ·· Error running .../bin/python .../asv/benchmark.py discover /tmp/mine/benchmarks (exit status 1)",
        "[  37.2 s]    STDERR -------->",
        "[  37.2 s]    Traceback (most recent call last):",
        '[  37.2 s]      File "/tmp/mine/benchmarks/bench_attention.py", line 14, in <module>',
        "[  37.2 s]        from attnbench.asv_suite import *  # noqa: E402, F403",
        "[  37.2 s]        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "[  37.2 s]    ValueError: plugin module 'flash_mne' could not be imported: ModuleNotFoundError: No module named 'flash_mne'",
        "[  37.2 s] ",
        "[  37.2 s] ·· Last error: Command '.../bin/python .../asv/benchmark.py discover' returned non-zero exit status 1",
        "[  37.2 s] ·· Failed to build the project and import the benchmark suite.",
    ]
    assert suite_failure(log) == (
        "ValueError: plugin module 'flash_mne' could not be imported: ModuleNotFoundError: No module named 'flash_mne'"
    )
    assert (
        suite_failure([*log, f"{SESSION_MARK} in /tmp/mine", "[ 1.0 s] · Creating environments"])
        is None
    )


def test_the_seeded_environment_links_an_editable_attnbench_the_matrix_pins():
    """asv installs the project at each commit, so the seed leaves the project's own distribution out, and an editable
    install too, unless the matrix pins it by name: a repository set up by ``init`` pins attnbench, whose benchmarks
    import it (planted before: every editable install left out, and asv's discovery failed with "No module named
    'attnbench'"). In attnbench's own checkout attnbench is the project, left out by name."""
    from attnbench.gate.seed import _left_out, _site_dirs

    # this interpreter's own site-packages, as the seed reads them (not the checkout's egg-info)
    dist = next(importlib.metadata.distributions(name="attnbench", path=_site_dirs()), None)
    if dist is None or not json.loads(dist.read_text("direct_url.json") or "{}").get(
        "dir_info", {}
    ).get("editable"):
        pytest.skip("attnbench is not an editable install here")
    files = {Path(str(f)).parts[0] for f in dist.files or ()}
    assert files and files <= _left_out("flash-mine")  # not pinned: a working tree's, left out
    assert not files & _left_out("flash-mine", {"attnbench", "torch"})  # pinned: linked
    assert files <= _left_out(
        "attnbench", {"attnbench", "torch"}
    )  # the project itself: asv installs it
