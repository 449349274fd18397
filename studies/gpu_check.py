"""Does attnbench work on this GPU? One command, within 8 minutes, and a gallery page of what it found.

It runs, in this order, each step a process of its own with a time limit, within one budget
(:data:`BUDGET_S`; a step the budget cannot fit is skipped with that reason):

1. the CUDA tests (``pytest -k cuda`` over the test files that hold them);
2. ``attnbench peak`` (the matmul and bandwidth roofs the reports use);
3. a prefill sweep, a decode sweep and a training sweep (forward + backward, no mask and causal) at
   bfloat16 on the fused SDPA backends, ``batched``, ``chunked`` and ``torch_mha``;
4. ``asv machine --yes`` and ``asv run --quick`` on CUDA (``ATTNBENCH_ASV_DEVICES=cuda``), or a
   line saying asv is missing.

It writes ``reports/gallery/<gpu-name>/``: one run directory per sweep (its ``report/`` inside),
``steps.log`` (each step's output) and ``README.md``, which names the card, driver, torch and CUDA,
gives each step's command, outcome and seconds, and what the runs say of the claims a card must
bear out (:mod:`studies.gpu_claims`). The exit status is 0 when every step passed, 1
when one failed, 2 when there is no CUDA device (nothing runs).

``--from-recorded DIR`` builds the same page from run directories recorded earlier (``prefill/``,
``decode/``, ``train/`` under DIR, each with ``cases.jsonl``, ``manifest.json`` and
``measurements.csv``): it copies them and rebuilds each report with ``attnbench report --from``,
without a GPU. The page then says it was built from those recordings, not by this script's run.

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.gpu_check                      # on the GPU box
    python -m studies.gpu_check --from-recorded ../shared/gpu-h100-2026-11-27 \\
        --note "recorded on 2026-11-27 at commit 0f7feb7"

Importing this module does nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

BUDGET_S = 480.0
"""Seconds the whole check may take on one GPU (the issue's 8 minutes)."""
GALLERY = Path("reports/gallery")
BACKENDS = "sdpa_flash,sdpa_efficient,sdpa_cudnn"
SWEPT = f"sdpa,{BACKENDS},batched,chunked,torch_mha"
CUDA_TEST_FILES = (
    "tests/test_gpu_features.py",
    "tests/test_variants.py",
    "tests/test_measure.py",
    "tests/test_mask_wiring.py",
    "tests/test_errors.py",
    "tests/test_bandwidth.py",
    "tests/test_cuda_ready.py",
)
RUN_FILES = ("cases.jsonl", "manifest.json", "measurements.csv")
"""What a run directory needs for ``attnbench report --from`` (its report is rebuilt from them)."""
SWEEPS = ("prefill", "decode", "train")


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the check: its name, argv, extra environment and time limit."""

    name: str
    argv: tuple[str, ...]
    timeout_s: float
    env: tuple[tuple[str, str], ...] = ()
    run_dir: str = ""  # the run directory it writes ("" for none)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a step went: ``passed``, ``failed`` (with its exit status) or ``skipped`` (why)."""

    step: Step
    status: str
    seconds: float
    detail: str = ""


Runner = Callable[[Step, Path], tuple[int, str]]
"""Runs a step (cwd: the repository root) -> ``(exit status, its output)``; 124 for a timeout."""


def plan(out: Path, python: str = sys.executable) -> list[Step]:
    """The steps of a check on the GPU box, writing under ``out`` (the card's gallery folder).

    The time limits add up to :data:`BUDGET_S`, so every step gets its slot; they are sized from
    the H100 run of 2026-11-27 (about 1.5 s per prefill or training case, 4 s per decode case,
    each report a further 10 to 20 s). The prefill and training sweeps take four lengths or more,
    so that their exponents can be conclusive; the prefill starts at L = 2048 (below it, launch
    overhead dominates a fused kernel on an H200) and reaches L = 32768 for the fused backends'
    rates at long lengths. asv's grid is narrowed to L = 1024 on CUDA, and asv runs as
    ``python -m asv`` (a GPU box's ``PATH`` may not hold the script).
    """
    cli = (python, "-m", "attnbench.cli")
    sweep = (*cli, "run", "--device", "cuda", "--dtypes", "bfloat16", "--no-instructions")
    sweep += ("--quiet", "--force")
    # The test warm-up compiles CPU shapes that the CUDA tests never use: /dev/null as its lock
    # tells the session there is none to start and nothing to wait for (tests/conftest.py).
    no_warm_up = (("ATTNBENCH_TEST_WARM_LOCK", os.devnull),)
    steps = [
        Step("cuda tests", (python, "-m", "pytest", "-q", "-n", "8", "-m", "not serial", "-k")
             + ("cuda", "-p", "no:cacheprovider", *CUDA_TEST_FILES), 50, env=no_warm_up),
        Step("peak", (*cli, "peak", "--device", "cuda", "--dtype", "bfloat16"), 20),
        Step("prefill", (*sweep, "--variants", SWEPT, "--lengths", "2048,4096,8192,16384,32768",
                         "--out", str(out / "prefill")), 90, run_dir="prefill"),
        Step("decode", (*sweep, "--workload", "decode", "--variants", SWEPT.removeprefix("sdpa,"),
                        "--lengths", "4096,65536", "--out", str(out / "decode")), 50,
             run_dir="decode"),
        Step("train", (*sweep, "--variants", f"{BACKENDS},batched,chunked,torch_mha",
                       "--masks", "none,causal", "--modes", "forward,backward",
                       "--lengths", "1024,2048,4096,8192", "--out", str(out / "train")), 150,
             run_dir="train"),
    ]  # fmt: skip
    asv = (python, "-m", "asv")
    run = (*asv, "run", "--python=same", "--quick", "--set-commit-hash", "HEAD")
    asv_env = (("ATTNBENCH_ASV_DEVICES", "cuda"), ("ATTNBENCH_ASV_LENGTHS", "1024"))
    return [
        *steps,
        Step("asv machine", (*asv, "machine", "--yes"), 10),
        Step("asv run --quick (cuda)", run, 110, env=asv_env),
    ]


def recorded_plan(recorded: Path, out: Path, python: str = sys.executable) -> list[Step]:
    """The steps of a gallery built from recorded run directories: one report per run."""
    cli = (python, "-m", "attnbench.cli", "report")
    return [
        Step(
            f"report {name}",
            (*cli, "--from", str(out / name), "--out", str(out / name / "report")),
            300,
            run_dir=name,
        )
        for name in SWEEPS
        if (recorded / name / "manifest.json").is_file()
    ]


def subprocess_runner(step: Step, root: Path) -> tuple[int, str]:
    """Run ``step`` as a process in ``root``; its output (stdout and stderr together) comes back."""
    env = {**os.environ, **dict(step.env)}
    try:
        done = subprocess.run(
            step.argv,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=step.timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode()
        return 124, f"{out}\ntimed out after {step.timeout_s:g} s"
    except FileNotFoundError as exc:
        return 127, str(exc)
    return done.returncode, done.stdout + done.stderr


def run_steps(
    steps: Sequence[Step],
    runner: Runner,
    root: Path,
    log: Path,
    budget_s: float,
    done: Callable[[list[Outcome]], None] = lambda outcomes: None,
) -> list[Outcome]:
    """Run ``steps`` in order within ``budget_s``, appending each one's output to ``log``.

    A step whose time limit does not fit in what is left of the budget is skipped with that reason
    (so the check ends within the budget); ``asv`` steps are skipped when asv is not installed.
    ``done`` is called with the outcomes so far after each step (the page is rewritten then, so a
    check stopped from outside keeps what it found).
    """
    outcomes: list[Outcome] = []
    start = time.monotonic()
    for step in steps:
        left = budget_s - (time.monotonic() - start)
        if _runs_asv(step) and importlib.util.find_spec("asv") is None:
            outcomes.append(Outcome(step, "skipped", 0.0, "asv is not installed here"))
            continue
        if step.timeout_s > left:
            why = (
                f"{left:.0f} s left of the {budget_s:g} s budget, step allows {step.timeout_s:g} s"
            )
            outcomes.append(Outcome(step, "skipped", 0.0, why))
            continue
        began = time.monotonic()
        code, output = runner(step, root)
        seconds = time.monotonic() - began
        with log.open("a", encoding="utf-8") as f:
            f.write(f"### {step.name} (exit {code}, {seconds:.0f} s)\n$ {_shell(step)}\n{output}\n")
        status = "passed" if code == 0 else "failed"
        detail = _summary(output) if code == 0 else f"exit {code}: {_summary(output)}"
        outcomes.append(Outcome(step, status, seconds, detail))
        done(outcomes)
    return outcomes


def _runs_asv(step: Step) -> bool:
    """Whether the step runs asv (as ``python -m asv``, or the ``asv`` script)."""
    return step.argv[0] == "asv" or tuple(step.argv[1:3]) == ("-m", "asv")


def _summary(output: str) -> str:
    """The last non-empty line of a step's output (pytest's and attnbench's say the outcome)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def _shell(step: Step) -> str:
    """The step as a shell line: environment, then argv (the interpreter as ``python``)."""
    argv = ["python" if a == sys.executable else a for a in step.argv]
    return " ".join([*(f"{k}={v}" for k, v in step.env), *argv])


def gpu_slug(name: str) -> str:
    """A folder name for a card: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not slug:
        raise ValueError(f"gpu name {name!r} gives no folder name")
    return slug


def machine_of_recorded(recorded: Path) -> dict[str, str]:
    """The card, driver, torch and CUDA of the first recorded run's manifest."""
    for name in SWEEPS:
        manifest = recorded / name / "manifest.json"
        if manifest.is_file():
            env = json.loads(manifest.read_text())["environment"]
            return {k: str(env.get(k, "")) for k in ("gpu_name", "gpu_driver", "torch", "cuda")}
    raise ValueError(f"--from-recorded {recorded}: no {'/'.join(SWEEPS)}/manifest.json under it")


def machine_here() -> dict[str, str]:
    """The card, driver, torch and CUDA of this machine (CUDA must be present)."""
    import torch

    from attnbench.measure.env import gpu_info

    info = gpu_info("cuda")
    return {
        "gpu_name": info.get("gpu_name", ""),
        "gpu_driver": info.get("gpu_driver", ""),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda or ""),
    }


def write_readme(folder: Path, machine: dict[str, str], outcomes: Sequence[Outcome], note: str):
    """``README.md`` of the card's gallery folder: the machine, then each step's command and result."""
    total = sum(o.seconds for o in outcomes)
    lines = [
        f"# attnbench on {machine['gpu_name']}",
        "",
        f"Card {machine['gpu_name']}, driver {machine['gpu_driver'] or 'unknown'}, "
        f"torch {machine['torch']}, CUDA {machine['cuda'] or 'unknown'}.",
        "",
        note,
        "",
        "| step | command | outcome | seconds |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        detail = o.detail.replace("|", "\\|")
        lines.append(
            f"| {o.step.name} | `{_shell(o.step)}` | {o.status}: {detail} | {o.seconds:.0f} |"
        )
    lines += ["", f"Total: {total:.0f} s."]
    found = _claims(folder)
    if found:
        lines += ["", "## What the runs say (`python -m studies.gpu_claims` on this folder)", ""]
        lines += [found]
    dirs = [o.step.run_dir for o in outcomes if o.step.run_dir and o.status == "passed"]
    if dirs:
        lines += ["", "Run directories (each with its `report/report.html`): "]
        lines += [f"- [`{d}/`]({d}/report/report.html)" for d in dirs]
    (folder / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _claims(folder: Path) -> str:
    """The claims table of the run directories in ``folder`` ("" while there are none)."""
    from studies.gpu_claims import claims, markdown

    if not any((folder / name / "measurements.csv").is_file() for name in SWEEPS):
        return ""  # no run directory yet
    try:
        return markdown(claims(folder))
    except (ValueError, KeyError, OSError) as exc:  # a run directory it cannot read
        return f"The claims could not be read from the run directories: {exc!r}.\n"


def copy_recorded(recorded: Path, folder: Path) -> None:
    """Copy each recorded run directory's own files (never a report or anything else there)."""
    for name in SWEEPS:
        source = recorded / name
        if not (source / "manifest.json").is_file():
            continue
        target = folder / name
        target.mkdir(parents=True, exist_ok=True)
        for file in RUN_FILES:
            shutil.copyfile(source / file, target / file)


def main(
    argv: list[str] | None = None,
    runner: Runner = subprocess_runner,
    cuda: Callable[[], bool] | None = None,
) -> int:
    """The command line (see the module docstring); ``runner`` and ``cuda`` are for tests."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        chosen(plan(Path()), args.only)
    except ValueError as exc:
        parser.error(str(exc))
    root = Path(__file__).resolve().parent.parent
    if args.from_recorded is not None:
        machine = machine_of_recorded(args.from_recorded)
    else:
        if cuda is None:
            from attnbench._checks import cuda_present as cuda
        if not cuda():
            print(
                "gpu_check: no CUDA device here (torch sees none), so there is nothing to check; "
                "run it on a GPU box, or build a page from recordings with --from-recorded DIR",
                file=sys.stderr,
            )
            return 2
        machine = machine_here()
    folder = _relative((args.out / gpu_slug(machine["gpu_name"])).resolve(), root)
    (root / folder).mkdir(parents=True, exist_ok=True)
    log = root / folder / "steps.log"
    log.write_text("", encoding="utf-8")
    if args.from_recorded is not None:
        copy_recorded(args.from_recorded, root / folder)
        steps = recorded_plan(args.from_recorded, folder)
    else:
        steps = chosen(plan(folder), args.only)
    note = args.note or (
        "Written by `python -m studies.gpu_check`."
        if args.from_recorded is None
        else f"Built from the run directories recorded in `{args.from_recorded.name}`, "
        "not by this script's own run: `python -m studies.gpu_check --from-recorded DIR`."
    )
    outcomes = run_steps(
        steps,
        runner,
        root,
        log,
        args.budget_s,
        done=lambda so_far: write_readme(root / folder, machine, so_far, note),
    )
    write_readme(root / folder, machine, outcomes, note)
    print(f"gpu_check: {root / folder}/README.md")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def step_word(step: Step) -> str:
    """The word ``--only`` names a step by: its name's first word (``cuda``, ``peak``, ``asv``...)."""
    return step.name.split()[0]


def chosen(steps: Sequence[Step], only: str) -> list[Step]:
    """The steps ``--only`` names (comma-separated first words), in plan order; all for ``""``."""
    if not only:
        return list(steps)
    words = {w.strip() for w in only.split(",") if w.strip()}
    known = {step_word(s) for s in steps}
    if not words or words - known:
        raise ValueError(
            f"--only: expected step words from {', '.join(sorted(known))}, got {only!r}"
        )
    return [s for s in steps if step_word(s) in words]


def _relative(path: Path, root: Path) -> Path:
    """``path`` relative to the repository root where it lies inside it (the steps run there)."""
    return path.relative_to(root) if path.is_relative_to(root) else path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=GALLERY, help="gallery root (default: %(default)s)"
    )
    parser.add_argument(
        "--from-recorded",
        type=Path,
        default=None,
        metavar="DIR",
        help="build the page from run directories recorded under DIR (no GPU needed)",
    )
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for all steps")
    parser.add_argument("--note", default="", help="a sentence for the README (where it came from)")
    parser.add_argument(
        "--only",
        default="",
        metavar="WORDS",
        help="run only these steps, by first word, comma-separated "
        "(cuda,peak,prefill,decode,train,asv): a second try at the ones that failed",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
