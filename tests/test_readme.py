"""The README's two commands are the ones CI and users run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    commands = _commands()
    assert len(commands) == 2
    main, tests = commands
    assert "constraints.txt" in main and "attnbench run" in main
    assert "constraints.txt" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    assert _commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_asv_config_pins_torch_like_the_constraints():
    conf = (ROOT / "asv.conf.json").read_text()
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)
    assert f'"torch": "{pins["torch"]}"' in conf
    assert "--no-deps" in conf
