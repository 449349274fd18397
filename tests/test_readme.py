"""The README and the docs are what users run: the README's two set-up commands are CI's, every ``attnbench`` command in
README.md and docs/ parses, and the tables the pages state by hand are the code's (tests/test_docs.py runs the examples)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_is_one_screen_of_commands_with_the_figure():
    """At most 200 lines (the rest lives in docs/), opening with the headline figure, a committed PNG under 300 KB.
    Planted (seen failing): the README of commit 0f7feb7, 923 lines and no figure."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    figures = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", text)
    assert figures and figures[0] == "docs/_static/headline.png", figures
    png = ROOT / figures[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000
    assert text.index(figures[0]) < text.index("## "), "the figure comes before the first section"


def test_readme_has_exactly_two_setup_commands():
    commands = _commands()
    assert len(commands) == 2
    main, tests = commands
    assert "constraints.txt" in main and "attnbench run" in main
    assert "constraints.txt" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    assert _commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_the_tests_workflow_runs_ci_on_every_pull_request():
    """GitHub runs the README's test command through .ci/run (which holds it verbatim, above): tests.yml runs that
    script on every pull request and push to main, on Python 3.11, unconditionally, and runs pytest no other way.
    Planted (seen failing): the step's ``run:`` changed to ``.ci/run || true``; a ``branches: [main]`` filter added to
    ``pull_request``."""
    import yaml

    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "tests.yml").read_text())
    triggers = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers and triggers["pull_request"] is None, triggers  # every PR
    assert triggers["push"] == {"branches": ["main"]}, triggers
    steps = [(job, step) for job in flow["jobs"].values() for step in job["steps"]]
    runs = [(job, step) for job, step in steps if str(step.get("run", "")).strip() == ".ci/run"]
    assert len(runs) == 1, [step.get("run") for _, step in steps]
    job, step = runs[0]
    assert "if" not in job and "if" not in step and not step.get("continue-on-error"), step
    assert "ubuntu" in job["runs-on"], job["runs-on"]
    pythons = [s["with"]["python-version"] for _, s in steps if "setup-python" in s.get("uses", "")]
    assert pythons == ["3.11"], pythons
    others = [s["run"] for _, s in steps if "pytest" in s.get("run", "") and s is not step]
    assert not others, f"pytest run other than through .ci/run: {others}"


def test_the_serial_step_runs_the_module_every_serial_test_lives_in(tmp_path):
    """The README's serial step collects one module; planted: a ``serial`` test in another module fails collection,
    naming it, where it would otherwise never run."""
    import os
    import subprocess
    import sys

    from tests.conftest import SERIAL_MODULE

    assert _commands()[1].endswith(f"pytest -m serial tests/{SERIAL_MODULE}")
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_elsewhere.py").write_text(
        "import pytest\n\n\n@pytest.mark.serial\ndef test_times_the_machine():\n    pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 4, out.stdout + out.stderr  # a usage error
    assert "test_elsewhere.py::test_times_the_machine" in out.stderr + out.stdout


def test_ci_fails_when_any_part_of_the_test_command_fails(tmp_path):
    """Planted (seen: a failing first pytest, then ruff passing, exit 0): the README command is an && chain, and
    ``set -e`` does not stop at a failed command that is not its last. Run .ci/run's status handling with the
    chain's commands replaced by ``false``/``true``."""
    import subprocess

    script = (ROOT / ".ci" / "run").read_text()
    command = _commands()[1]
    assert command in script
    parts_count = command.count("&&") + 1
    for failing in [None, *range(parts_count)]:  # None: every part passes, and so does the script
        parts = ["false" if i == failing else "true" for i in range(parts_count)]
        plant = script.replace(command, " && ".join(parts))
        for check in (".venv/bin/ruff check .", ".venv/bin/ruff format --check ."):
            assert check in plant
            plant = plant.replace(check, "true")
        plant = plant.replace(
            'cd "$(dirname "$0")/.."', "command() { return 1; }  # nothing to install"
        )
        (tmp_path / "run").write_text(plant)
        code = subprocess.run(["bash", str(tmp_path / "run")], cwd=tmp_path).returncode
        assert (code == 0) == (failing is None), failing


def test_asv_config_pins_torch_like_the_constraints():
    conf = (ROOT / "asv.conf.json").read_text()
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    assert f'"torch": "{pins["torch"]}"' in conf
    assert "--no-deps" in conf


def _attnbench_argvs() -> list[list[str]]:
    """The arguments of every ``attnbench`` invocation README.md and docs/ show (run or not)."""
    from tests.docs_examples import SHELL, attnbench_argvs, blocks

    return [argv for b in blocks() if b.language in SHELL for argv in attnbench_argvs(b)]


def test_every_attnbench_command_in_the_readme_and_docs_parses(monkeypatch):
    """A documented command with a removed or misspelt option would fail for every reader: argparse decides.
    Planted (seen failing): ``--kv-heads`` renamed ``--kv-head-count`` in docs/workloads.md's block. A ``--plugin`` the
    pages name is one of docs/examples/, imported first as the CLI would, its variants unregistered after."""
    import importlib
    import sys

    from attnbench.cli import build_parser
    from attnbench.registry import unregister, variant_names

    argvs = _attnbench_argvs()
    assert len(argvs) >= 25, argvs
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "examples"))
    before = set(variant_names())
    try:
        for module in {a[a.index("--plugin") + 1] for a in argvs if "--plugin" in a}:
            sys.modules.pop(module, None)
            importlib.import_module(module)
        parser = build_parser()
        for argv in argvs:
            try:
                parser.parse_args(argv)
            except SystemExit as exc:  # argparse's usage error (exit 2); --help exits 0
                if exc.code == 0:
                    continue
                raise AssertionError(
                    f"documented command does not parse: attnbench {' '.join(argv)}"
                ) from exc
    finally:
        for name in set(variant_names()) - before:
            unregister(name)


FOREIGN_OPTIONS = {
    "--attribute",  # asv run
    "--bench",  # asv run
    "--launch-method",  # asv run
    "--python",  # asv run
    "--quick",  # asv run
    "--set-commit-hash",  # asv run
    "--no-deps",  # pip install (asv.conf.json's install command; docs/gpu.md's reinstall of torch)
    "--force-reinstall",  # pip install (docs/gpu.md: a CPU build of torch replaced by a CUDA one)
    "--check",  # ruff format
    "--tool",  # valgrind
}
"""Options of other tools that the pages name in running text."""


def test_every_option_named_in_running_text_exists():
    """Prose names options too (`--time-budget 60` runs them): each ``--option`` in an inline code span of README.md
    or docs/ is one of the attnbench parser's (any subcommand) or a named other tool's. Planted (seen failing):
    ``--time-budget`` renamed ``--time-limit`` in docs/measurement.md's prose."""
    import attnbench_pytest
    from attnbench.cli import build_parser
    from studies.gpu_check import _parser as gpu_check_parser
    from tests.docs_examples import pages

    known = set(FOREIGN_OPTIONS) | set(attnbench_pytest.OPTIONS)  # the pytest plugin's
    parsers = [build_parser(), gpu_check_parser()]  # the GPU check is a documented command too
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            known.update(action.option_strings)
            if isinstance(getattr(action, "choices", None), dict):
                parsers.extend(action.choices.values())
    stale = []
    for page in pages():
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # prose only
        for span in re.findall(r"`([^`\n]+)`", text):
            stale += [
                f"{page.relative_to(ROOT)}: {option} in `{span}`"
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span)
                if option not in known
            ]
    assert not stale, stale


def test_readme_profile_command_runs(tmp_path):
    """The cheap profiling command, exactly as docs/profiling.md shows it (output redirected)."""
    import subprocess
    import sys

    (argv,) = [a for a in _attnbench_argvs() if a[:2] == ["profile", "batched"]]
    out = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *argv, "--out", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "GFLOP/s" in out.stdout and (tmp_path / "p" / "trace.json.gz").exists()
    steps = [line for line in out.stderr.splitlines() if line.startswith("profile: ")]
    assert len(steps) == 3 and "torch.profiler" in steps[1], (
        out.stderr
    )  # long work says what it is doing
    assert "memory timeline of its" in steps[2] and "operator calls" in steps[2]


def test_reports_readme_names_only_folders_that_a_command_makes():
    """Planted before: it described a committed ``gallery/`` that does not exist."""
    text = (ROOT / "reports" / "README.md").read_text()
    for folder in re.findall(
        r"^- `([a-z_-]+)/", text, flags=re.M
    ):  # the top-level folders it lists
        made = folder in ("runs", "profiles") or (ROOT / "reports" / folder).is_dir()
        assert made, f"reports/README.md names reports/{folder}/, which nothing makes"


def test_the_variant_families_name_every_builtin_variant_once():
    """docs/variants.md generates its table from the registry, and describes each family by hand below it: every
    built-in variant must be in exactly one family line. Planted (seen failing): a registered variant left out."""
    from attnbench.registry import get_variant, variant_names

    text = (ROOT / "docs" / "variants.md").read_text()
    section = text.split("What each family is:", 1)[1].split("\n\n", 2)[1]
    named = [
        n for line in section.splitlines() for n in re.findall(r"`(\w+)`", line.split(": ", 1)[0])
    ]
    builtin = sorted(
        n for n in variant_names() if type(get_variant(n)).__module__.startswith("attnbench.")
    )  # not plugins
    assert sorted(named) == builtin, set(named) ^ set(builtin)


def _asv_section() -> str:
    return (
        (ROOT / "docs" / "asv.md")
        .read_text()
        .split("# airspeed velocity", 1)[1]
        .split("\n## ", 1)[0]
    )


def test_the_asv_tiers_the_readme_states_are_the_contracts():
    """docs/asv.md's table of asv tiers is ``contract.GRIDS``, tier by tier (variants, lengths, passes, masks, counting
    budget), and names every tier ``ATTNBENCH_ASV_GRID`` accepts. Planted: the default tier's lengths changed in the
    contract and not in the README (and the README still stating L = 64 to 8192 for the suite) both fail here."""
    import itertools

    from attnbench import contract

    rows = [
        line for line in _asv_section().splitlines() if line.startswith("| ") and "---" not in line
    ]
    header, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert header[:3] == ["tier", "`ATTNBENCH_ASV_GRID`", "grid"], header
    assert {row[0] for row in rows} == set(contract.ASV_TIERS)
    for tier, value, grid_name, variants, lengths, passes, masks, counts in rows:
        grid = contract.GRIDS[contract.ASV_TIERS[tier]]
        assert grid_name == f"`{contract.ASV_TIERS[tier]}`" and f"`{tier}`" in value, tier
        if grid.variants is None:
            assert "every default-sweep variant" in variants, tier
        else:
            assert re.findall(r"`(\w+)`", variants) == list(grid.variants), tier
        assert [int(n) for n in lengths.split(",")] == list(grid.lengths), tier
        assert [p.strip() for p in passes.split(",")] == list(grid.modes), tier
        assert re.findall(r"`(\w+)`", masks) == list(grid.masks), tier
        budget = re.search(r"within ([\d,]+) s predicted", counts)
        assert (budget is None) == (grid.count_budget_s is None), tier
        assert budget is None or float(budget.group(1).replace(",", "")) == grid.count_budget_s, (
            tier
        )
    default = contract.GRIDS[contract.ASV_TIERS["default"]]
    size = len(
        list(itertools.product(default.variants, default.lengths, default.modes, default.masks))
    )
    assert f"{size} cases" in _asv_section()
    assert "64 to 8192" not in _asv_section()  # the suite's grid before the tiers
