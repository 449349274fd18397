"""What a report says, as comparable data: the tidy rows, the fits, the findings and every figure's data.

``tests/test_golden_report.py`` rebuilds the report of the run directories under
``tests/fixtures/runs/`` (written by attnbench 0.1.0, today's format) and compares this digest with
the one stored in ``tests/fixtures/report_golden.json``: a refactor of the load -> analyse ->
render path must not change a number, a label or a sentence. A deliberate change of behaviour
regenerates the file, in the commit that makes the change, with::

    .venv/bin/python -m tests.golden --write
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
RUNS = FIXTURES / "runs"
GOLDEN = FIXTURES / "report_golden.json"
SCENARIOS: dict[str, tuple[str, ...]] = {
    "one run": ("prefill",),
    "two runs": ("prefill", "prefill_b"),
    "prefill and decode": ("prefill", "decode"),
}
"""Report name -> the fixture runs it is built from."""
VOLATILE_COLUMNS = ("origin",)
"""Tidy columns that name where the fixture was copied to, not what it holds."""


def _num(value: Any) -> Any:
    """Numbers rounded to 9 significant figures (text written by two code paths may differ in the last bit)."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return bool(value) if value is not None else None
    if isinstance(value, (int, float, np.integer, np.floating)):
        value = float(value)
        return (
            None
            if math.isnan(value)
            else float(f"{value:.9g}")
            if math.isfinite(value)
            else str(value)
        )
    return value


def figure_data(fig: Figure) -> dict[str, Any]:
    """The data a figure shows: per axes its title, labels, lines, scattered points, texts and images."""
    axes = []
    for ax in fig.axes:
        lines = sorted(
            json.dumps([[_num(x) for x in line.get_xdata()], [_num(y) for y in line.get_ydata()]])
            for line in ax.get_lines()
        )
        points = sorted(
            json.dumps([[_num(v) for v in xy] for xy in c.get_offsets().tolist()])
            for c in ax.collections
            if hasattr(c, "get_offsets") and len(c.get_offsets())
        )
        images = [
            json.dumps([[_num(v) for v in row] for row in im.get_array().filled(math.nan).tolist()])
            for im in ax.images
        ]
        axes.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "xticks": [t.get_text() for t in ax.get_xticklabels()],
                "lines": lines,
                "points": points,
                "texts": sorted(t.get_text() for t in ax.texts),
                "images": images,
            }
        )
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return {"suptitle": suptitle, "axes": axes}


def _frame_records(frame, drop: Iterable[str] = ()) -> list[str]:
    frame = frame.drop(columns=[c for c in drop if c in frame.columns])
    rows = []
    for rec in frame.astype(object).to_dict("records"):
        rows.append(
            json.dumps(
                {
                    k: _num(v) if not hasattr(v, "isoformat") else v.isoformat()
                    for k, v in rec.items()
                },
                sort_keys=True,
                default=str,
            )
        )
    return sorted(rows)


def digest(sources: Iterable[Path], out_dir: Path) -> dict[str, Any]:
    """Build the report of ``sources`` into ``out_dir`` and return what it says (see the module docstring)."""
    from unittest import mock

    from attnbench.analysis import summary
    from attnbench.report import html

    figures: list[str] = []
    seen: set[int] = set()
    savefig = Figure.savefig

    def record(fig: Figure, *args: Any, **kwargs: Any) -> Any:
        if id(fig) not in seen:  # each figure is saved as PNG and as SVG: record it once
            seen.add(id(fig))
            figures.append(json.dumps(figure_data(fig), sort_keys=True))
        return savefig(fig, *args, **kwargs)

    with mock.patch.object(Figure, "savefig", record):
        analysis = summary.analyse(summary.load_results([str(s) for s in sources]))
        html.render(analysis, out_dir)
    return {
        "tidy": _frame_records(analysis.loaded.frame, VOLATILE_COLUMNS),
        "fits": _frame_records(analysis.fits),
        "findings": [[f.text, f.target] for f in analysis.findings],
        "problems": sorted(p.replace(str(RUNS), "RUNS") for p in analysis.loaded.problems),
        "notes": sorted(n.replace(str(RUNS), "RUNS") for n in analysis.loaded.notes),
        "figures": sorted(figures),
    }


def build_all(tmp: Path) -> dict[str, dict[str, Any]]:
    return {
        name: digest([RUNS / s for s in runs], tmp / name.replace(" ", "_"))
        for name, runs in SCENARIOS.items()
    }


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"(re)write {GOLDEN}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = build_all(Path(tmp))
    if args.write:
        GOLDEN.write_text(json.dumps(result, indent=0, sort_keys=True) + "\n")
    for name, d in result.items():
        print(
            f"{name}: {len(d['tidy'])} tidy rows, {len(d['fits'])} fits, {len(d['findings'])} findings, "
            f"{len(d['figures'])} figures"
        )


if __name__ == "__main__":
    main()
