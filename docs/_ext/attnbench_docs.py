"""Reference tables generated from the code, so the documentation cannot restate them wrongly.

Directives (usable from MyST pages as ```` ```{attnbench-variants} ```` fences):

- ``attnbench-variants``: the registry's table, the rows ``attnbench list --wide`` prints
  (``Variant.describe()`` of every built-in variant).
- ``attnbench-metrics``: the metric table, :data:`attnbench.contract.METRICS`, row by row.
- ``attnbench-columns``: the tidy frame's columns in :data:`attnbench.analysis.tidy.COLUMNS` order.
  Its body gives each column's meaning as ``name[, name...] | meaning`` lines; the directive fails
  the build when a column has no line or a line names no column, so a column added to or removed
  from the frame cannot go unnoticed by the page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _cell(text: str) -> nodes.entry:
    """One table cell; ``code`` spans in ``text`` become literals (the pages' Markdown spelling)."""
    para = nodes.paragraph()
    for i, part in enumerate(re.split(r"`([^`]*)`", text)):
        if part:
            para += nodes.literal(part, part) if i % 2 else nodes.Text(part)
    return nodes.entry("", para)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> nodes.table:
    """A docutils table of text cells (``code`` spans rendered as literals)."""
    group = nodes.tgroup(cols=len(headers))
    group += [nodes.colspec(colwidth=1) for _ in headers]
    head = nodes.thead()
    head += nodes.row("", *(_cell(h) for h in headers))
    body = nodes.tbody()
    body += [nodes.row("", *(_cell(str(c)) for c in row)) for row in rows]
    group += [head, body]
    result = nodes.table(classes=["attnbench-generated", "colwidths-auto"])
    result += group
    return result


class VariantsTable(SphinxDirective):
    """The built-in variants as the registry describes them (``attnbench list --wide``)."""

    def run(self) -> list[nodes.Node]:
        from attnbench.registry import get_variant, variant_names

        rows = []
        for name in variant_names():
            variant = get_variant(name)
            if not type(variant).__module__.startswith("attnbench."):
                continue  # a plugin registered in this process
            d = variant.describe()
            rows.append(
                [
                    f"`{name}`",
                    "yes" if d["exact"] else "approximate",
                    d["time"],
                    d["memory"],
                    d["devices"].replace(",", ", "),
                    d["source"],
                ]
            )
        return [table(["name", "exact", "time", "memory", "devices", "source"], rows)]


class MetricsTable(SphinxDirective):
    """``contract.METRICS``: every metric's unit, label, method, asv benchmarks and fitting."""

    def run(self) -> list[nodes.Node]:
        from attnbench import contract

        rows = [
            [
                f"`{m.name}`",
                m.unit,
                m.label,
                f"`{m.csv_column}`" if m.csv_column else "(asv only)",
                ", ".join(f"`{b}`" for b in m.asv) or "-",
                "yes" if m.fitted else "no",
            ]
            for m in contract.METRICS.values()
        ]
        headers = ["metric", "unit", "label", "measurements.csv", "asv benchmarks", "fitted"]
        return [table(headers, rows)]


class ColumnsTable(SphinxDirective):
    """The tidy frame's columns, in the loader's order, with the meanings the page gives."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        from attnbench.analysis.tidy import COLUMNS

        meanings: dict[str, str] = {}
        for line in self.content:
            if not line.strip():
                continue
            names, sep, meaning = line.partition(" | ")
            if not sep:
                raise self.error(f"attnbench-columns: expected 'name | meaning', got {line!r}")
            for name in (n.strip() for n in names.split(",")):
                if name not in COLUMNS:
                    raise self.error(f"attnbench-columns: {name!r} is not a column of the frame")
                meanings[name] = meaning.strip()
        missing = [c for c in COLUMNS if c not in meanings]
        if missing:
            raise self.error(f"attnbench-columns: no meaning given for {', '.join(missing)}")
        rows = [[f"`{c}`", meanings[c]] for c in COLUMNS]
        return [table(["column", "what it holds"], rows)]


def setup(app: Sphinx) -> dict[str, object]:
    """Register the directives (Sphinx's extension entry point)."""
    app.add_directive("attnbench-variants", VariantsTable)
    app.add_directive("attnbench-metrics", MetricsTable)
    app.add_directive("attnbench-columns", ColumnsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
