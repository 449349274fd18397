"""The package's import graph: no cycle, and every arrow points down the rooms below (checked statically, every
``import`` in a module's body or its functions: a deferred import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "attnbench"
ROOMS: tuple[tuple[str, ...], ...] = (
    # bottom: depends on nothing of the package
    (
        "_checks",
        "errors",
        "io",
        "plugins",
        "mask_sums",
        "mask_mods",
        "measure.timer",
        "measure.probe",
        "measure.schedstat",
        "measure.regime",
        "measure.memory",
        "measure._forkserver",
        "analysis.text",
    ),
    ("masks", "spec", "reference"),
    ("capability", "contract"),
    ("variants",),  # every variants.* module
    ("registry",),
    ("environ",),
    ("layer", "demos"),
    (
        "measure.record",
        "measure.config",
        "measure.gate",
        "measure.guard",
        "measure.peak",
        "measure.env",
        "measure.provenance",
        "measure.bandwidth",
    ),
    ("rundir_format",),  # a run directory's names, schemas and log reader: read by the analysis
    ("measure.runner",),
    ("measure.worker",),
    ("measure.sweep", "measure.instructions"),
    ("measure",),  # the package's facade: MeasureConfig, measure, sweep
    ("runs", "profile", "asv_bench"),
    ("asv_suite",),  # the asv classes: benchmarks/bench_attention.py and `attnbench init` re-export
    ("analysis.tidy",),
    ("analysis.rundir",),
    ("analysis.frame", "analysis.complexity", "analysis.roofline", "analysis.significance"),
    ("analysis.slices",),  # the sides compared and the primary slice
    ("analysis.findings",),  # the finding rules (they read the primary slice)
    ("analysis.changes", "analysis.growth"),
    ("gate.steps",),  # below the analysis, which reads a history's steps (git's order handed in)
    ("analysis.summary",),
    ("gate.decision", "gate.results", "gate.gitlog", "gate.seed", "gate.init", "gate.progress"),
    ("report.style",),
    ("report.plots", "report.history_plots"),
    ("report.markup",),
    ("report.details",),
    ("report.html",),
    ("reporting",),  # load -> analyse -> render, with git's commit order (gate.gitlog)
    ("gate.session", "publish", "shards"),
    ("gate.bisect", "gate.export", "gate.markdown"),
    ("session", "gate_table", "arguments"),
    ("cli",),
    # attnbench.testing: a user's tests call it (nothing in the package imports it)
    ("testing.outcome", "testing.kernel"),
    ("testing.answer", "testing.cost"),
)
"""Groups of modules from the bottom up: a module may import its own room's and lower rooms' modules only."""
FACADES = ("", "analysis", "gate", "report", "testing")
"""Package ``__init__`` modules that only gather public names (``attnbench``) or are empty: not a room."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules ``name`` imports (``from attnbench import masks`` is an arrow to ``masks``)."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [
                        "attnbench",
                        *package[: len(package) - node.level + 1],
                        *([base] if base else []),
                    ]
                )
            targets = [
                f"{base}.{a.name}"
                if f"{base}.{a.name}".removeprefix("attnbench.") in modules
                else base
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "attnbench" or target.startswith("attnbench."):
                found.add(target.removeprefix("attnbench").removeprefix("."))
    return {m for m in found if m in modules and m != name}


def _room(name: str) -> int:
    for i, room in enumerate(ROOMS):
        if name in room or any(name.startswith(f"{r}.") and r == "variants" for r in room):
            return i
    raise AssertionError(f"attnbench.{name} is in no room of ROOMS: place it")


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items()}


def arrows_up(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        if a not in FACADES
        for b in targets
        if b not in FACADES and _room(b) > _room(a)
    )


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (facades left out)."""
    edges = {a: {b for b in t if b not in FACADES} for a, t in edges.items() if a not in FACADES}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_room():
    for name in _modules():
        if name not in FACADES:
            _room(name)


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_arrow_runs_back_up():
    assert arrows_up(graph()) == []


@pytest.mark.parametrize(
    ("planted", "expect"),
    [
        ({"measure.runner": {"measure.worker"}, "measure.worker": {"measure.runner"}}, "cycle"),
        ({"variants.compiled": {"registry"}}, "measure.up"),
    ],
)
def test_the_checks_see_a_planted_cycle_and_a_planted_back_arrow(planted, expect):
    """The two faults the checks exist for, planted into today's graph (as they stood before they were removed)."""
    edges = graph()
    for a, targets in planted.items():
        edges[a] = edges[a] | targets
    if expect == "cycle":
        assert ["measure.runner", "measure.worker"] in cycles(edges)
    else:
        assert "variants.compiled -> registry" in arrows_up(edges)


def test_no_module_reaches_through_the_public_facade():
    """``import attnbench`` inside the package would hide which room a name comes from."""
    assert sorted(a for a, targets in graph().items() if "" in targets and a != "") == []


PURE = ("analysis", "gate.decision")
"""Modules (and packages: every module under them) that start no process: they decide on what
others measured, and can be imported, run and tested where no process may be started."""


def _type_only(tree: ast.AST) -> set[ast.AST]:
    """Import nodes under ``if TYPE_CHECKING:`` (annotations only, never executed)."""
    return {
        node
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }


def imports_subprocess(source: str) -> bool:
    """Whether ``source`` imports :mod:`subprocess` (anywhere but under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(source)
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "subprocess" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "subprocess":
            return True
    return False


def process_paths(edges: dict[str, set[str]], starts: list[str], sources: dict[str, str]) -> list:
    """For each of ``starts`` reaching a module that imports subprocess: the chain of imports."""
    found = []
    for start in starts:
        parent, todo = {start: ""}, [start]
        while todo:
            name = todo.pop(0)
            if imports_subprocess(sources[name]):
                chain = [name]
                while parent[chain[-1]]:
                    chain.append(parent[chain[-1]])
                found.append(" <- ".join(chain))
                break
            for target in sorted(edges.get(name, ())):
                if target not in parent and target not in FACADES:
                    parent[target] = name
                    todo.append(target)
    return found


def _pure_modules() -> list[str]:
    return sorted(n for n in _modules() if any(n == p or n.startswith(f"{p}.") for p in PURE))


def test_the_pure_modules_start_no_process():
    """Nothing under analysis/, nor the gate's decision, imports subprocess: not itself, not through
    any module it imports (deferred imports included, as for the rooms)."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    assert process_paths(graph(), _pure_modules(), sources) == []


def test_the_process_check_sees_a_planted_import():
    """A subprocess import planted two arrows below the decision, and one planted under
    ``if TYPE_CHECKING:`` (an annotation only: not a process)."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    edges = graph()
    assert "analysis.significance" in edges["gate.decision"]
    planted = {
        **sources,
        "analysis.significance": sources["analysis.significance"] + "\nimport subprocess\n",
    }
    assert process_paths(edges, ["gate.decision"], planted) == [
        "analysis.significance <- gate.decision"
    ]
    assert not imports_subprocess(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import subprocess\n"
    )
    assert imports_subprocess("def f():\n    from subprocess import run\n")


DRAWS_ONLY = ("report",)
"""Packages that only draw and write what the analysis computed: they start no process and read no
git (the history's commit order comes in the :class:`~attnbench.analysis.summary.Analysis`)."""


def _draws_only_modules() -> list[str]:
    return sorted(n for n in _modules() if any(n == p or n.startswith(f"{p}.") for p in DRAWS_ONLY))


def test_the_report_starts_no_process_and_reads_no_git():
    """Nothing under report/ imports subprocess, itself or through any module it imports (git is
    read by gate.gitlog, which imports it)."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    assert _draws_only_modules(), "no module under report/: DRAWS_ONLY names nothing"
    assert process_paths(graph(), _draws_only_modules(), sources) == []


def test_the_report_check_sees_a_planted_git_reader():
    """The history's steps read through the git reader again: the check names the chain."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    edges = {n: set(t) for n, t in graph().items()}
    edges["analysis.summary"].add("gate.gitlog")
    found = process_paths(edges, ["report.html"], sources)
    assert found == ["gate.gitlog <- analysis.summary <- report.html"], found


MAX_FUNCTION_LINES = 60
"""The longest a function of the package may be (decorators and docstring included)."""


def long_functions(source: str) -> list[str]:
    """The functions of ``source`` longer than :data:`MAX_FUNCTION_LINES`, with their lengths."""
    return [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def compared_words(source: str) -> list[str]:
    """String literals of a closed set (a status, a gate verdict) that ``source`` compares with."""
    from attnbench.contract import GateVerdict, Status

    words = {str(w) for w in (*Status, *GateVerdict)}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [
                    f"line {node.lineno}: {item.value!r}"
                    for item in items
                    if isinstance(item, ast.Constant) and item.value in words
                ]
    return found


def test_no_function_is_longer_than_a_screen():
    found = {
        name: long
        for name, path in _modules().items()
        if (long := long_functions(path.read_text()))
    }
    assert found == {}


def test_statuses_and_verdicts_are_compared_as_members_not_words():
    found = {
        name: words
        for name, path in _modules().items()
        if (words := compared_words(path.read_text()))
    }
    assert found == {}


def test_the_style_checks_see_a_planted_long_function_and_a_compared_word():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}") == [f"f: {MAX_FUNCTION_LINES + 1} lines"]
    assert long_functions(f"def f():\n{body[: body.rindex('    x')]}") == []
    assert compared_words('ok = status == "ok" or verdict in ("regressed", "fine")') == [
        "line 1: 'ok'",
        "line 1: 'regressed'",
    ]
    assert compared_words("ok = status == Status.OK") == []


NO_ALL_YET: tuple[str, ...] = ()
"""Modules without a declared ``__all__`` yet: being split (their public surface is settled when
the split lands; empty this then)."""


def declared_names(source: str) -> list[str] | None:
    """The names of a module's top-level ``__all__`` (a list or tuple of strings), None if it has none."""
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def undeclared_or_missing(modules: dict[str, str]) -> dict[str, str]:
    """For each module (name -> source): no ``__all__``, or the names of it the module lacks."""
    import importlib

    found = {}
    for name, source in sorted(modules.items()):
        if name in NO_ALL_YET:
            continue
        names = declared_names(source)
        if names is None:
            found[name] = "no __all__"
            continue
        module = importlib.import_module(f"attnbench.{name}".rstrip("."))
        if missing := [n for n in names if not hasattr(module, n)]:
            found[name] = f"__all__ names what it lacks: {missing}"
    return found


def public_but_undeclared(modules: dict[str, str]) -> dict[str, list[str]]:
    """For each module with an ``__all__`` (name -> source): the public top-level names it defines
    and leaves out. A helper nobody else imports is underscored; one others import is declared."""
    found = {}
    for name, source in sorted(modules.items()):
        declared = declared_names(source)
        if declared is None:
            continue
        defined = []
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.append(node.name)
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            defined += [t.id for t in targets if isinstance(t, ast.Name)]
        left = [n for n in defined if not n.startswith("_") and n not in declared]
        if left:
            found[name] = left
    return found


def test_every_public_name_is_declared_or_underscored():
    """Planted (seen failing): a public helper added to ``io`` and left out of its ``__all__``."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    assert public_but_undeclared(sources) == {}
    planted = {**sources, "io": sources["io"] + "\n\ndef helper() -> None:\n    pass\n"}
    assert public_but_undeclared(planted) == {"io": ["helper"]}


def private_imports(modules: dict[str, str]) -> list[str]:
    """``module: name`` for each underscored name a module imports from another of the package."""
    found = []
    for name, source in sorted(modules.items()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnbench"):
                found += [
                    f"{name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found


def test_no_module_imports_another_modules_private_names():
    """What one module lends another is declared in its ``__all__``, never an underscored helper.
    Planted (seen failing): io importing a private helper of spec."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    assert private_imports(sources) == []
    planted = {**sources, "io": "from attnbench.spec import _helper\n" + sources["io"]}
    assert private_imports(planted) == ["io: attnbench.spec._helper"]


def test_every_module_declares_its_public_names():
    """Planted (seen failing): a name in ``io.__all__`` that io does not define, and no ``__all__``."""
    sources = {n: p.read_text() for n, p in _modules().items()}
    assert undeclared_or_missing(sources) == {}
    assert all(n in _modules() for n in NO_ALL_YET), "a module of NO_ALL_YET is gone: drop it"
