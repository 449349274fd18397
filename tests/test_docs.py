"""The documentation cannot lie: the site builds with warnings as errors, and its examples run.

- ``sphinx-build -W --keep-going`` fails on a dangling reference or link, a page left out of the
  table of contents, a broken directive, or a generated table whose source moved.
- Every Python block of README.md and docs/ runs (unless marked ``skip`` with its reason).
- Every shell block is marked: ``run`` blocks run here, ``skip`` blocks say why not; every
  ``attnbench`` line of either kind goes through the real argument parser (tests/test_readme.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.contract import Status
from tests.docs_examples import ROOT, SHELL, Block, blocks, command_lines, pages

ALL = blocks()
PYTHON = [b for b in ALL if b.language == "python"]
RUNNABLE_SHELL = [b for b in ALL if b.language in SHELL and b.runs]


def test_every_shell_block_is_run_or_says_why_not():
    """Planted (seen failing): a bash block with no marker, and a ``skip:`` with no reason."""
    shell = [b for b in ALL if b.language in SHELL]
    assert len(shell) >= 20, len(shell)
    unmarked = [b.id for b in shell if b.marker is None]
    assert not unmarked, (
        f"shell blocks without an <!-- example: run|skip: REASON --> marker: {unmarked}"
    )
    for block in shell:
        assert block.runs or block.skip_reason, (
            f"{block.id}: marker {block.marker!r} is neither 'run' nor 'skip: REASON'"
        )
    assert len(RUNNABLE_SHELL) >= 3, [b.id for b in RUNNABLE_SHELL]


def test_python_blocks_are_run_or_say_why_not():
    for block in PYTHON:
        assert block.marker is None or block.skip_reason, (
            f"{block.id}: a Python block runs unless marked 'skip: REASON'"
        )
    assert any(b.marker is None for b in PYTHON)


@pytest.mark.parametrize("block", [b for b in PYTHON if b.marker is None], ids=lambda b: b.id)
def test_python_example_runs(block: Block, tmp_path, monkeypatch):
    """Planted (seen failing): ``get_variant("chunkd")`` in the masks example."""
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__docs_example__"}
    exec(compile(block.code, block.id, "exec"), scope)  # noqa: S102 - the page's own example


def _argv(line: str, block: Block) -> tuple[list[str], dict[str, str]]:
    """A documented command line as this interpreter runs it (no shell, no venv path), and the
    ``VAR=value`` words before it (a relative path there is the repository's)."""
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = str(ROOT / value) if value and (ROOT / value).exists() else value
    if words[0].endswith("bin/attnbench"):
        argv = [sys.executable, "-m", "attnbench.cli", *words[1:]]
        sub = next((w for w in words[1:] if not w.startswith("-") and w != argv_plugin(words)), "")
        return argv + block.appends.get(sub, []), env
    if words[0].endswith("bin/python"):
        return [sys.executable, *words[1:]], env
    raise AssertionError(f"{block.id}: a 'run' block runs attnbench or python only, not {line!r}")


def argv_plugin(words: list[str]) -> str | None:
    """The module named by ``--plugin MODULE`` (a global option before the subcommand), if any."""
    return words[words.index("--plugin") + 1] if "--plugin" in words else None


@pytest.mark.parametrize("block", RUNNABLE_SHELL, ids=lambda b: b.id)
def test_shell_example_runs(block: Block, tmp_path):
    """Each line in order, in one scratch directory, each exiting 0."""
    for line in command_lines(block.code):
        for part in line.split("&&"):
            argv, extra = _argv(part.strip(), block)
            path = os.pathsep.join(p for p in (extra.pop("PYTHONPATH", ""), str(ROOT)) if p)
            out = subprocess.run(
                argv,
                cwd=ROOT if block.in_checkout else tmp_path,
                env={**os.environ, **extra, "PYTHONPATH": path},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode == 0, f"{block.id}: {part.strip()}\n{out.stderr[-3000:]}"
            _assert_every_case_measured(argv, tmp_path, block)


def _assert_every_case_measured(argv: list[str], cwd: Path, block: Block) -> None:
    """A sweep exits 0 even when every case is skipped (a sweep never dies on a case): a documented
    ``attnbench run`` must measure every case it shows. Planted (seen failing): ``--masks causal``
    added to the README's plugin sweep, whose variant supports no mask."""
    if "run" not in argv:
        return
    if "--out" in argv:
        log = cwd / argv[len(argv) - argv[::-1].index("--out")] / "cases.jsonl"
    else:  # the default, reports/runs/<time>-<host>/: the newest
        log = max((cwd / "reports" / "runs").glob("*/cases.jsonl"), key=lambda p: p.stat().st_mtime)
    cases = [json.loads(line) for line in log.read_text().splitlines()]
    statuses = {
        f"{c['measurement']['variant']} L={c['measurement']['spec']['seq_len']}": c["measurement"][
            "status"
        ]
        for c in cases
        if c.get("kind") == "case"
    }
    assert statuses, f"{block.id}: no case was measured"
    measured = {Status.OK, Status.NOISY}
    assert all(s in measured for s in statuses.values()), f"{block.id}: {statuses}"


def _slug(title: str) -> str:
    """A heading's anchor as MyST (``myst_heading_anchors``) and GitHub make it."""
    title = re.sub(r"`", "", title.strip().lower())
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def test_readme_links_point_at_pages_and_headings_that_exist():
    """README.md is read on GitHub, outside the Sphinx build: check its relative links here.
    Planted (seen failing): a link to ``docs/regression.md#compare-two-comits``."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?!https?:)[^)\s]+)\)", text)
    assert len(links) >= 8, links
    for link in links:
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#{1,6} (.+)$", path.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, (
                f"README.md: no heading #{anchor} in {target}"
            )


def build_docs(out: Path) -> subprocess.CompletedProcess:
    """The documented build: ``sphinx-build -W --keep-going -b html docs <out>``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "docs",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    built = build_docs(out)
    assert built.returncode == 0, built.stderr[-5000:]
    return out


def test_docs_build_without_warnings(site: Path):
    """Planted (seen failing): a dangling reference, ``[x](asv.md#no-such-heading)``, and a page left
    out of every table of contents."""
    assert (site / "index.html").exists()
    assert (site / "_static" / "headline.png").exists()


def test_generated_reference_pages_hold_what_the_code_holds(site: Path):
    """The CLI page lists every subcommand's options from the parser; the variants and metric tables
    list every registered variant and metric; the API page documents ``attnbench.__all__``."""
    import attnbench
    from attnbench import contract
    from attnbench.cli import build_parser
    from attnbench.registry import get_variant, variant_names

    cli = (site / "reference" / "cli.html").read_text()
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, subparser in sub.choices.items():
        for action in subparser._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                assert option in cli, f"attnbench {name} {option} missing from the CLI page"
    variants = (site / "variants.html").read_text()
    for name in variant_names():
        if type(get_variant(name)).__module__.startswith("attnbench."):
            assert f">{name}<" in variants, name
    metrics = (site / "reference" / "metrics.html").read_text()
    for name in contract.METRICS:
        assert f">{name}<" in metrics, name
    api = (site / "reference" / "api.html").read_text()
    for name in attnbench.__all__:
        assert f'id="attnbench.{name}"' in api or name == "masks", name


def test_every_page_is_markdown_the_site_builds():
    """No page of docs/ is left out of the build (Sphinx warns about one outside every toctree)."""
    docs = [p for p in pages() if p.name != "README.md"]
    assert len(docs) >= 14, docs


def test_readme_workflow_and_this_test_build_the_docs_alike():
    """One documented command builds the site: the README shows it, the workflow's docs job runs it,
    and :func:`build_docs` runs its arguments (only `-q` and the output folder differ)."""
    (block,) = [b for b in ALL if b.path.name == "README.md" and "sphinx-build" in b.code]
    (command,) = command_lines(block.code)
    workflow = (ROOT / ".github" / "workflows" / "benchmarks.yml").read_text()
    assert f"run: {command}\n" in workflow
    assert command.endswith("-b html docs docs/_build/html") and "-W --keep-going" in command


def test_site_reads_offline_in_chromium_at_1400_px(site: Path, tmp_path):
    """Every page from file:// in headless Chromium at 1400x900, with no network: nothing requested
    beyond the site, no script error, no page wider than the window, no code block or generated table
    wider than its box, and the headline figure on the first screen of the front page. Planted (seen
    failing): the code blocks' ``white-space: pre-wrap`` removed from docs/_static/attnbench.css."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian package 'chromium'; .ci/run installs it)")
    html = sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)
    seen: dict[str, object] = {"requests": [], "errors": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("request", lambda r: seen["requests"].append(r.url))
        page.on("pageerror", lambda e: seen["errors"].append(str(e)))
        for path in html:
            page.goto(path.as_uri(), wait_until="load")
            name = str(path.relative_to(site))
            assert page.evaluate("document.documentElement.scrollWidth") <= 1400, name
            wide = page.eval_on_selector_all(
                "article pre, article table.attnbench-generated",
                "els => els.filter(e => e.scrollWidth > e.clientWidth + 1).length",
            )
            assert wide == 0, f"{name}: {wide} code block(s) or table(s) wider than their box"
            if name == "index.html":
                (bottom,) = page.eval_on_selector_all(
                    "article img", "els => els.map(e => e.getBoundingClientRect().bottom)"
                )
                assert 0 < bottom <= 900, bottom
                page.screenshot(path=str(tmp_path / "index.png"))
        browser.close()
    assert [u for u in seen["requests"] if not u.startswith(("file:", "data:"))] == []
    assert seen["errors"] == []
    assert len(html) >= 18, html


def test_the_extending_page_names_every_attribute_a_variant_declares():
    """A new user found `time_exponent` and `memory_exponent` in base.py, not on the page that said
    "exponents, the memory model; see attnbench.Variant"."""
    from attnbench.variants.base import declared_attributes

    page = (ROOT / "docs" / "extending.md").read_text()
    missing = [a for a in declared_attributes() if f"| `{a}` |" not in page]
    assert missing == [], f"docs/extending.md's table lacks {missing}"


def test_the_extending_page_names_every_method_a_variant_overrides():
    """Each public method of Variant that a built-in variant overrides is a row of the page's
    methods table (the compiled wrapper aside: it forwards every method to its base), and each row
    names a method of Variant. Planted (seen failing): the `useful_pairs` row misspelt
    `useful_pair` ("lacks ['useful_pairs']"), and a row naming `frobnicate`."""
    from attnbench.registry import variant_class, variant_names
    from attnbench.variants.base import Variant
    from attnbench.variants.compiled import CompiledVariant

    public = {n for n, v in vars(Variant).items() if callable(v) and not n.startswith("_")}
    overridden: set[str] = set()
    for name in variant_names():
        for klass in variant_class(name).__mro__:
            if klass in (Variant, CompiledVariant):
                break
            overridden |= public & set(vars(klass))
    page = (ROOT / "docs" / "extending.md").read_text()
    cells = re.findall(r"^\| (`\w+\(.*?) \|", page, flags=re.M)
    rows = {m for cell in cells for m in re.findall(r"`(\w+)\(", cell)}
    assert "forward" in overridden and len(rows) >= 10, (overridden, rows)
    assert sorted(overridden - rows) == [], "docs/extending.md's methods table lacks these"
    assert sorted(rows - public) == [], "docs/extending.md names methods Variant does not have"
