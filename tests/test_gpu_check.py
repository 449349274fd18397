"""``studies.gpu_check``'s orchestration on CPU: the heavy steps are scripted, the order is real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies import gpu_check

MACHINE = {
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_driver": "580.1",
    "torch": "2.11",
    "cuda": "13.0",
}


class Scripted:
    """A runner that records each step and answers from a script: step name -> (exit, output)."""

    def __init__(self, answers: dict[str, tuple[int, str]] | None = None) -> None:
        self.answers = answers or {}
        self.ran: list[gpu_check.Step] = []
        self.now = 0.0  # each step takes its whole time limit (the clock the check reads)

    def __call__(self, step: gpu_check.Step, root: Path) -> tuple[int, str]:
        self.ran.append(step)
        self.now += step.timeout_s
        return self.answers.get(step.name, (0, f"{step.name} done"))

    def clock(self) -> float:
        return self.now


def test_without_cuda_it_refuses_before_running_anything(tmp_path, capsys):
    runner = Scripted()
    code = gpu_check.main(["--out", str(tmp_path)], runner=runner, cuda=lambda: False)
    assert code == 2 and runner.ran == []
    assert "no CUDA device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_check_runs_every_step_and_writes_the_cards_page(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "machine_here", lambda: MACHINE)
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: object())
    runner = Scripted({"cuda tests": (0, "594 passed in 37.0s")})
    monkeypatch.setattr(gpu_check.time, "monotonic", runner.clock)  # every step to its limit
    assert gpu_check.main(["--out", str(tmp_path)], runner=runner, cuda=lambda: True) == 0
    names = [s.name for s in runner.ran]
    assert names == [
        "cuda tests",
        "peak",
        "prefill",
        "decode",
        "train",
        "asv machine",
        "asv run --quick (cuda)",
    ]
    by = {s.name: s for s in runner.ran}
    assert "-k" in by["cuda tests"].argv and "cuda" in by["cuda tests"].argv
    for sweep in ("prefill", "decode", "train"):
        argv = by[sweep].argv
        assert argv[argv.index("--device") + 1] == "cuda" and "bfloat16" in argv
        for v in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "batched", "chunked", "torch_mha"):
            assert v in argv[argv.index("--variants") + 1]
    train = by["train"].argv
    assert train[train.index("--modes") + 1] == "forward,backward"
    assert train[train.index("--masks") + 1] == "none,causal"
    assert "decode" in by["decode"].argv
    assert dict(by["asv run --quick (cuda)"].env)["ATTNBENCH_ASV_DEVICES"] == "cuda"
    assert sum(s.timeout_s for s in runner.ran) <= gpu_check.BUDGET_S
    page = (tmp_path / "nvidia-h100-80gb-hbm3" / "README.md").read_text()
    for text in ("NVIDIA H100 80GB HBM3", "driver 580.1", "torch 2.11", "594 passed", "peak"):
        assert text in page
    assert "(prefill/report/report.html)" in page


def test_a_failing_step_fails_the_check_and_the_budget_skips_what_cannot_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "machine_here", lambda: MACHINE)
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)  # no asv
    runner = Scripted({"prefill": (1, "Traceback ...\nRuntimeError: boom")})
    monkeypatch.setattr(gpu_check.time, "monotonic", runner.clock)
    budget = str(60 + 20 + 80 + 50)  # tests, peak, prefill, decode: train cannot fit
    code = gpu_check.main(
        ["--out", str(tmp_path), "--budget-s", budget], runner=runner, cuda=lambda: True
    )
    assert code == 1
    assert [s.name for s in runner.ran] == ["cuda tests", "peak", "prefill", "decode"]
    page = (tmp_path / "nvidia-h100-80gb-hbm3" / "README.md").read_text()
    assert "failed: exit 1: RuntimeError: boom" in page
    assert "skipped:" in page and "left of the 210 s budget" in page
    assert "asv is not installed here" in page
    assert "RuntimeError: boom" in (tmp_path / "nvidia-h100-80gb-hbm3" / "steps.log").read_text()


def test_a_page_from_recorded_runs_copies_them_and_rebuilds_each_report(tmp_path):
    recorded = tmp_path / "recorded"
    for name in ("prefill", "train"):
        (recorded / name).mkdir(parents=True)
        env = {
            "environment": {
                "gpu_name": "NVIDIA H100 80GB HBM3",
                "gpu_driver": "580",
                "torch": "2.11",
            }
        }
        (recorded / name / "manifest.json").write_text(json.dumps(env))
        for file in ("cases.jsonl", "measurements.csv"):
            (recorded / name / file).write_text(f"{name} {file}")
    (recorded / "prefill" / "huge.bin").write_text("not copied")
    runner = Scripted()
    out = tmp_path / "gallery"
    argv = ["--out", str(out), "--from-recorded", str(recorded), "--note", "recorded on a day"]
    assert gpu_check.main(argv, runner=runner, cuda=lambda: pytest.fail("no CUDA asked")) == 0
    folder = out / "nvidia-h100-80gb-hbm3"
    assert [s.name for s in runner.ran] == ["report prefill", "report train"]
    report = runner.ran[0].argv
    assert report[report.index("--from") + 1] == str(folder / "prefill")
    assert report[report.index("--out") + 1] == str(folder / "prefill" / "report")
    assert sorted(p.name for p in (folder / "prefill").iterdir()) == sorted(gpu_check.RUN_FILES)
    assert "recorded on a day" in (folder / "README.md").read_text()


def test_gpu_names_become_folder_names():
    assert gpu_check.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    with pytest.raises(ValueError, match="gpu name"):
        gpu_check.gpu_slug("???")


def test_only_reruns_the_named_steps_and_refuses_an_unknown_word(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "machine_here", lambda: MACHINE)
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: object())
    runner = Scripted()
    argv = ["--out", str(tmp_path), "--only", "train,asv"]
    assert gpu_check.main(argv, runner=runner, cuda=lambda: True) == 0
    assert [s.name for s in runner.ran] == ["train", "asv machine", "asv run --quick (cuda)"]
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(
            ["--out", str(tmp_path), "--only", "trian"], runner=runner, cuda=lambda: True
        )
    assert exit_.value.code == 2
    assert "--only: expected step words from" in capsys.readouterr().err


def test_the_page_is_written_after_every_step(tmp_path, monkeypatch):
    """A check stopped from outside (a machine's time running out) keeps the steps it finished."""
    monkeypatch.setattr(gpu_check, "machine_here", lambda: MACHINE)
    page = tmp_path / "nvidia-h100-80gb-hbm3" / "README.md"
    seen: list[str] = []

    def runner(step, root):
        seen.append(page.read_text() if page.exists() else "")
        return 0, f"{step.name} ok"

    gpu_check.main(
        ["--out", str(tmp_path), "--only", "peak,prefill"], runner=runner, cuda=lambda: True
    )
    assert "peak ok" in seen[1]  # written before the prefill started
