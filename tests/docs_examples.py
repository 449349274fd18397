"""The code blocks of README.md and docs/: found, classified by their marker, and made runnable.

Every shell block (```` ```bash ````, ``sh``, ``shell``, ``console``) carries a marker on the last
non-blank line before its fence, an HTML comment a reader of the rendered page does not see:

- ``<!-- example: run -->``: tests/test_docs.py runs every line of the block, in order, in one
  scratch directory (``.venv/bin/attnbench`` and ``.venv/bin/python`` become this interpreter).
- ``<!-- example: run; append to run: --lengths 64,128 -->``: the same, with those arguments added
  to every ``attnbench run`` line (argparse keeps the last value of an option, so this makes a
  documented sweep small enough for CI). Several ``; append to SUBCOMMAND: ARGS`` parts may follow.
- ``<!-- example: run; in the checkout -->``: run from the repository's root instead (for commands
  that read the checkout, such as ``attnbench shard``; such a block must write nothing).
- ``<!-- example: skip: REASON -->``: not run (it needs CUDA, asv's minutes, a git history...), and
  says why. Its ``attnbench`` lines are still parsed by the real argument parser.

Python blocks run unless marked ``skip`` the same way. A block with no marker, a skip without a
reason, or a marker of another kind fails tests/test_docs.py.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", flags=re.M | re.S)
MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->\s*$", flags=re.S)


@dataclass
class Block:
    """One fenced code block of a page, with the marker before it."""

    path: Path
    line: int
    language: str
    code: str
    marker: str | None  # the text after "example:", or None when the block has none
    appends: dict[str, list[str]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.marker is not None and self.marker.split(";")[0].strip() == "run"

    @property
    def in_checkout(self) -> bool:
        """``run; in the checkout``: run from the repository's root (a command that reads its files)."""
        return self.runs and "in the checkout" in [p.strip() for p in self.marker.split(";")]

    @property
    def skip_reason(self) -> str | None:
        if self.marker is None or not self.marker.startswith("skip"):
            return None
        return self.marker.removeprefix("skip").lstrip(":").strip()


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site (not the build output)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [ROOT / "README.md", *docs]


def blocks(paths: list[Path] | None = None) -> list[Block]:
    """Every fenced block of the pages, in page order."""
    found = []
    for path in paths or pages():
        text = path.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
            marker = MARKER.search(before)
            found.append(
                Block(
                    path=path,
                    line=text.count("\n", 0, match.start()) + 1,
                    language=match.group(1),
                    code=match.group(2),
                    marker=marker.group(1) if marker else None,
                    appends=_appends(marker.group(1))
                    if marker and marker.group(1).startswith("run")
                    else {},
                )
            )
    return found


def _appends(marker: str) -> dict[str, list[str]]:
    """``run; append to run: --lengths 64`` -> ``{"run": ["--lengths", "64"]}``."""
    result = {}
    for part in marker.split(";")[1:]:
        if part.strip() == "in the checkout":
            continue
        match = re.fullmatch(r"\s*append to ([\w-]+):(.*)", part, flags=re.S)
        if not match:
            raise ValueError(f"marker part {part!r}: expected 'append to SUBCOMMAND: ARGS'")
        result[match.group(1)] = shlex.split(match.group(2))
    return result


def command_lines(code: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comments and blanks dropped."""
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def attnbench_argvs(block: Block) -> list[list[str]]:
    """The arguments of every ``attnbench`` invocation of a shell block (after ``&&`` too)."""
    argvs = []
    for line in command_lines(block.code):
        for part in line.split("&&"):
            words = shlex.split(part.strip())
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value prefixes
                words = words[1:]
            if words and words[0].endswith("bin/attnbench"):
                argvs.append(words[1:])
    return argvs
