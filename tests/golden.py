"""What a report says, as comparable data: the tidy rows, the fits, the findings and every figure's data.

``tests/test_golden_report.py`` rebuilds the report of the run directories under
``tests/fixtures/runs/`` (written by attnbench 0.1.0, today's format) and compares this digest with
the one stored in ``tests/fixtures/report_golden.json``: a refactor of the load -> analyse ->
render path must not change a number, a label or a sentence. A deliberate change of behaviour
regenerates the file, in the commit that makes the change, with::

    .venv/bin/python -m tests.golden --write

Numbers are stored whole and compared with a tolerance that fits each quantity (``mismatches``):
text, statuses, counts and lengths exactly; values derived from measurements to ``REL_TOL``; and
near-zero values (a least-squares residual, a coefficient that cancels) to ``SCALE_TOL`` of the
largest magnitude among their peers. The last bits of a fit depend on the CPU's BLAS and
reductions and on the numpy, scipy and torch versions, not on what the report says.
"""

from __future__ import annotations

import argparse
import json
import math
import re
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
OVERLAPS = "overlaps"
"""The digest's key for the pairs of texts each figure prints over each other (every figure must have none,
tests/test_golden_report.py)."""
PAGE = "page"
"""The digest's key for the report page's HTML (read by tests/test_golden_report.py)."""
UNSTORED = (OVERLAPS, PAGE)
"""Digest keys the golden file does not hold: what the tests check of them is a rule, not a record."""
VOLATILE_COLUMNS = ("origin",)
"""Tidy columns that name where the fixture was copied to, not what it holds."""

REL_TOL = 1e-6
"""Values derived from measurements (medians, rates, exponents, figure coordinates) agree to this share of their
size. One ulp of a sample moves a fitted exponent by about 1e-15; an exponent moved by 0.1% is 1e-3."""
SCALE_TOL = 1e-9
"""A value near zero agrees to this share of the largest magnitude among its peers (its column across the rows,
or the other numbers of its array): residuals of an exact fit and coefficients that cancel carry the rounding of
the machine's arithmetic at the scale of the quantities they were computed from, not at their own."""
EXACT_FIELDS = frozenset(
    {
        "batch", "heads", "kv_heads", "head_dim", "seq_len", "seq_len_k", "threads", "n", "L_min",
        "L_max", "runs", "attempts",
    }
)  # fmt: skip
"""Counts and lengths: compared exactly (a row measured at another length is another row)."""
SORT_DIGITS = 4
"""Significant digits of the numbers in the key that orders rows and figure parts (stable under last-bit drift)."""


def _num(value: Any) -> Any:
    """A JSON-able number: NaN as None, infinities as strings, numpy scalars as Python ones."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        return bool(value) if value is not None else None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return None if math.isnan(value) else value if math.isfinite(value) else str(value)
    return value


def _sort_key(item: Any) -> str:
    """A key that orders rows, lines and figures the same way on every machine: numbers at ``SORT_DIGITS``."""

    def coarse(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: coarse(x) for k, x in v.items()}
        if isinstance(v, list):
            return [coarse(x) for x in v]
        return f"{v:.{SORT_DIGITS}g}" if isinstance(v, float) else v

    return json.dumps(coarse(item), sort_keys=True, default=str)


def _xy(values: Iterable[Any]) -> list[Any]:
    """A figure's coordinates as floats (an axis of integer lengths draws the same as one of floats)."""
    return [
        _num(float(v)) if _is_number(v) or isinstance(v, np.number) else _num(v) for v in values
    ]


def figure_data(fig: Figure) -> dict[str, Any]:
    """The data a figure shows: per axes its title, labels, lines, scattered points, texts and images."""
    axes = []
    for ax in fig.axes:
        lines = [[_xy(line.get_xdata()), _xy(line.get_ydata())] for line in ax.get_lines()]
        points = [
            [_xy(xy) for xy in c.get_offsets().tolist()]
            for c in ax.collections
            if hasattr(c, "get_offsets") and len(c.get_offsets())
        ]
        images = [
            [_xy(row) for row in im.get_array().filled(math.nan).tolist()] for im in ax.images
        ]
        axes.append(
            {
                "title": ax.get_title(),
                "xlabel": ax.get_xlabel(),
                "ylabel": ax.get_ylabel(),
                "xticks": [t.get_text() for t in ax.get_xticklabels()],
                "lines": sorted(lines, key=_sort_key),
                "points": sorted(points, key=_sort_key),
                "texts": sorted(t.get_text() for t in ax.texts),
                "images": images,
            }
        )
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return {"suptitle": suptitle, "axes": axes}


def figure_name(fig: Figure) -> str:
    """A figure's suptitle, or its first panel's title, cut to 60 characters."""
    if fig._suptitle:
        return fig._suptitle.get_text()[:60]
    return (fig.axes[0].get_title() if fig.axes else "?")[:60]


def _frame_records(frame, drop: Iterable[str] = ()) -> list[dict[str, Any]]:
    frame = frame.drop(columns=[c for c in drop if c in frame.columns])
    rows = [
        {k: v.isoformat() if hasattr(v, "isoformat") else _num(v) for k, v in rec.items()}
        for rec in frame.astype(object).to_dict("records")
    ]
    # Values that are neither numbers nor text (a tuple, a Path) as the text they print.
    rows = json.loads(json.dumps(rows, default=str))
    return sorted(rows, key=_sort_key)


def digest(sources: Iterable[Path], out_dir: Path) -> dict[str, Any]:
    """Build the report of ``sources`` into ``out_dir`` and return what it says (see the module docstring)."""
    from unittest import mock

    from attnbench.analysis import summary
    from attnbench.report import html
    from tests.text_boxes import overlapping

    figures: list[dict[str, Any]] = []
    overlaps: dict[str, list[tuple[str, str]]] = {}
    seen: dict[int, Figure] = {}  # holds each figure, so that no later one can take its id

    def record(fig: Figure, target: Any, *args: Any, **kwargs: Any) -> None:
        """Record what ``fig`` shows and which of its texts overlap, once (it is saved as PNG and
        as SVG), and write no image: the digest compares data, and rasterising every figure twice
        was most of its cost (tests/test_report.py renders the images)."""
        if id(fig) not in seen:
            seen[id(fig)] = fig
            # drawn first, as saving does: layout, and labels placed on draw
            overlaps[figure_name(fig)] = overlapping(fig)
            figures.append(figure_data(fig))
        if isinstance(target, str | Path):
            Path(target).write_bytes(b"")

    sources = list(sources)
    with mock.patch.object(Figure, "savefig", record):
        analysis = summary.analyse(summary.load_results([str(s) for s in sources]))
        page = html.render(analysis, out_dir).page.read_text()
    roots = sorted({str(Path(s).parent) for s in sources}, key=len, reverse=True)

    def anonymous(text: str) -> str:
        for root in roots:  # the fixtures may be read from a copy (the perturbed ones are)
            text = text.replace(root, "RUNS")
        return text

    return {
        "tidy": _frame_records(analysis.loaded.frame, VOLATILE_COLUMNS),
        "fits": _frame_records(analysis.fits),
        "findings": [[f.text, f.target] for f in analysis.findings],
        "problems": sorted(anonymous(p) for p in analysis.loaded.problems),
        "notes": sorted(anonymous(n) for n in analysis.loaded.notes),
        "figures": sorted(figures, key=_sort_key),
        OVERLAPS: overlaps,
        PAGE: page,
    }


def build_all(
    tmp: Path, runs: Path = RUNS, names: Iterable[str] = SCENARIOS
) -> dict[str, dict[str, Any]]:
    """The digest of the scenarios ``names`` (default: every one), from the run directories under
    ``runs``."""
    return {
        name: digest([runs / s for s in SCENARIOS[name]], tmp / name.replace(" ", "_"))
        for name in names
    }


def _close(want: float, got: float, scale: float) -> bool:
    return abs(want - got) <= max(REL_TOL * max(abs(want), abs(got)), SCALE_TOL * scale)


def _magnitude(values: Iterable[Any]) -> float:
    """The largest finite magnitude among ``values`` (0 when none is a number)."""
    numbers = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v)]
    return max(numbers, default=0.0)


def mismatches(want: Any, got: Any, where: str = "") -> list[str]:
    """Where ``got`` says something else than ``want``, each place with both values (empty: they agree)."""
    return _compare(want, got, where)


def _compare(
    want: Any, got: Any, where: str, *, field: str = "", scale: float = 0.0, columns=None
) -> list[str]:
    """``mismatches`` at one place: ``field`` names a record's column, ``scale`` the peers' magnitude.

    A list of records (dicts) scales each column by its largest value across the records; a list of
    numbers scales them by its largest.
    """
    if isinstance(want, dict) and isinstance(got, dict):
        if want.keys() != got.keys():
            return [f"{where}: keys {sorted(want.keys() ^ got.keys())} in one only"]
        columns = columns or {}
        return [
            m
            for k in want
            for m in _compare(want[k], got[k], f"{where}.{k}", field=k, scale=columns.get(k, 0.0))
        ]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(want)} items wanted, {len(got)} got"]
        pairs = list(zip(want, got, strict=True))
        if want and all(isinstance(w, dict) for w in want):
            names = {k for w in want for k in w}
            cols = {
                k: _magnitude(r.get(k) for r in [*want, *got] if isinstance(r, dict)) for k in names
            }
            return [
                m
                for i, (w, g) in enumerate(pairs)
                for m in _compare(w, g, f"{where}[{i}]", columns=cols)
            ]
        inner = max(scale, _magnitude([*want, *got]))
        return [
            m
            for i, (w, g) in enumerate(pairs)
            for m in _compare(w, g, f"{where}[{i}]", field=field, scale=inner)
        ]
    if _is_number(want) and _is_number(got):
        exact = field in EXACT_FIELDS or (isinstance(want, int) and isinstance(got, int))
        agree = want == got if exact else _close(float(want), float(got), scale)
        return [] if agree else [f"{where}: {want!r} wanted, {got!r} got"]
    if want == got and type(want) is type(got):
        return []
    return [f"{where}: {want!r} wanted, {got!r} got"]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def perturb(value: Any) -> Any:
    """``value`` with every non-integral float moved by one ulp (``numpy.nextafter``) toward +inf."""
    if isinstance(value, dict):
        return {k: perturb(v) for k, v in value.items()}
    if isinstance(value, list):
        return [perturb(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        return float(np.nextafter(value, math.inf))
    return value


def perturbed_runs(dest: Path) -> Path:
    """A copy of the fixture runs under ``dest`` whose measured floats (samples, errors, probe times) are
    one ulp off: what another CPU's arithmetic or another library version could have written."""
    import shutil

    shutil.copytree(RUNS, dest)
    for log in dest.glob("*/cases.jsonl"):
        lines = log.read_text().splitlines()
        out = [
            json.dumps(perturb(json.loads(line)))
            if json.loads(line).get("kind") == "case"
            else line
            for line in lines
        ]
        log.write_text("\n".join(out) + "\n")
    return dest


def make_noisy(run: Path, skip_first: str = "") -> Path:
    """Mark every ``ok`` case of the run directory ``run`` noisy, in place (a machine busy for the
    whole sweep, as a shared CI runner can be), and the first case of ``skip_first`` skipped."""
    lines, skipped = [], False
    log = run / "cases.jsonl"
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        m = rec.get("measurement") if rec.get("kind") == "case" else None
        if m is not None and m["variant"] == skip_first and not skipped:
            skipped = True
            m.update(status="skipped", reason="planted: over the time budget", samples=[])
        elif m is not None and m["status"] == "ok":
            m.update(status="noisy", reason="planted: calibration probe 3.00x slower")
        lines.append(json.dumps(rec))
    log.write_text("\n".join(lines) + "\n")
    return run


_SINGULAR_PLURAL = re.compile(
    r"(?<![\d.,])1 (?:are|have|were)\b|(?<![\d.,])1 (?:of \d+ )?(?:cases|fits|points|variants)"
    r" (?:are|have|match)\b"
)
"""A count of one with a plural verb or noun ("1 are inconclusive", "1 fits match")."""


def contradictions(d: dict[str, Any]) -> list[str]:
    """Where the sentences of a digest's page disagree with its own tables ([]: nowhere).

    * a count of one read with a plural ("1 are inconclusive");
    * a sentence saying the noisy cases are never fitted, beside a fit that read a noisy case's
      exact metric (peak bytes, counts): noise moves time, never bytes, so those are fitted;
    * the findings' count of cases against the subtitle's (one tally of cases on one page);
    * a zero-width interval ("[2.00, 2.00]": a fit through 2 points has none);
    * an inconclusive fit listed without the reason its verdict cell gives;
    * page faults beside peak memory or its verdict without what they count (pages first touched:
      "L^1.94" beside "memory matches O(L)" read as memory growing like L²);
    * big-O written in n where the page writes L;
    * a fit judged on fewer points than the page's method text allows its kind;
    * an exponent-table heading that names another kind of cell than it holds.
    """
    import html as html_module

    found = []
    page = html_module.unescape(re.sub(r"<[^>]+>", " ", d[PAGE]))
    texts = [text for text, _ in d["findings"]]
    found += [
        f"singular/plural: {m.group(0)!r}" for t in texts for m in _SINGULAR_PLURAL.finditer(t)
    ]
    found += [
        f"singular/plural on the page: {m.group(0)!r}" for m in _SINGULAR_PLURAL.finditer(page)
    ]
    noisy = {
        (r["variant"], r["seq_len"], r["mode"], r["mask"])
        for r in d["tidy"]
        if r["metric"] == "time" and r["status"] == "noisy"
    }
    exact = {
        r["variant"]
        for r in d["tidy"]
        if (r["variant"], r["seq_len"], r["mode"], r["mask"]) in noisy
        and r["status"] == "ok"
        and r["metric"] in ("peak_tensor_bytes", "instructions", "page_faults")
    }
    fitted = {
        f["variant"] for f in d["fits"] if f["variant"] in exact and f.get("exponent") is not None
    }
    for text in texts:
        if (
            fitted
            and "never fitted" in text
            and "noisy" in text
            and not re.search(r"\bare fitted|fitted like", text)
        ):
            found.append(
                f"says noisy cases are never fitted, but {sorted(fitted)} fit them: {text!r}"
            )
    subtitle = re.search(r"(\d+) cases \(([^)]*)\)", page)
    for text in texts:
        of = re.search(r"(\d+) of (\d+) cases? (?:have|has|are|is) ", text)
        if of and subtitle and of.group(2) != subtitle.group(1):
            found.append(f"{of.group(0)!r} against the subtitle's {subtitle.group(0)!r}")
    found += [
        f"a zero-width interval: {m.group(0)!r}"
        for m in re.finditer(r"\[(-?\d+\.\d+), \1\]|interval (-?\d+\.\d+) to \2\b", page)
    ]
    found += _inconclusive_unexplained(d[PAGE])
    found += _page_faults_unexplained(page)
    found += _notation(page, d["figures"])
    found += _fit_rule_broken(page, d["fits"])
    found += _fit_headers(d[PAGE])
    return found


def _inconclusive_unexplained(page_html: str) -> list[str]:
    """An entry of the "Inconclusive fits" list that does not give the reason its row's verdict
    cell gives ("batched time: 2 points (1 noisy, 1 at the overhead floor)" against "time
    inconclusive: 2 points (1 noisy, 1 at the overhead floor)")."""
    import html as html_module

    listed = re.search(r"Inconclusive fits \(\d+\) and why</summary><ul>(.*?)</ul>", page_html)
    table = re.search(r'<section id="exponents">.*?</table>', page_html, flags=re.S)
    if not (listed and table):
        return []
    text = lambda c: html_module.unescape(re.sub(r"<[^>]+>", "", c))  # noqa: E731
    heads = [text(h) for h in re.findall(r"<th>(.*?)</th>", table.group(0))]
    if "variant" not in heads or "verdict vs declared" not in heads:
        return []
    name, said = heads.index("variant"), heads.index("verdict vs declared")
    verdicts: dict[str, list[str]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table.group(0), flags=re.S):
        cells = [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        if len(cells) == len(heads):
            verdicts.setdefault(cells[name], []).append(cells[said])
    found = []
    for item in map(text, re.findall(r"<li>(.*?)</li>", listed.group(1))):
        fit, colon, why = item.partition(": ")
        variant, _, metric = re.sub(r" \(.*\)$", "", fit).partition(" ")  # "(decode)": where
        cells = verdicts.get(variant, [])
        if not colon or not why:
            found.append(f"an inconclusive fit listed without why: {item!r}")
        elif cells and not any(f"{metric} inconclusive: {why}" in c for c in cells):
            found.append(f"{item!r} gives another reason than its verdict cell: {cells}")
    return found


PAGE_FAULTS_SAID = "page faults count the pages a call touches first"
"""The phrase that says what page faults count (attnbench.analysis.findings.PAGE_FAULTS_COUNT)."""


def _page_faults_unexplained(page: str) -> list[str]:
    """Sentences (and the full fit table) that set page faults beside peak memory or the memory
    verdict without saying what page faults count."""
    text = re.sub(r"\s+", " ", page)
    beside = re.compile(r"\bpeak memory|\bmemory (?:matches|fits?|verdict|and page)", re.I)
    found = [
        f"page faults beside memory, not said what they count: {sentence[:160]!r}"
        for sentence in re.split(r"(?<=\.) ", text)
        if re.search(r"page[ -]faults?\b", sentence, re.I)
        and beside.search(sentence)
        and PAGE_FAULTS_SAID not in sentence.lower()
    ]
    table = text.partition("Full fit table")[2]
    if " page_faults " in table and f"page_faults: {PAGE_FAULTS_SAID}" not in table:
        found.append("the full fit table shows page_faults without what they count")
    return found


def _notation(page: str, figures: list[dict[str, Any]]) -> list[str]:
    """Big-O in n anywhere on the page or in a figure's text, where the page writes L."""
    texts = [page] + [
        t
        for f in figures
        for ax in f["axes"]
        for t in [f["suptitle"], ax["title"], ax["xlabel"], ax["ylabel"], *ax["texts"]]
    ]
    return sorted(
        {f"O(n) notation: {m.group(0)!r}" for t in texts for m in re.finditer(r"O\(n\S*\)", t)}
    )


def _fit_rule_broken(page: str, fits: list[dict[str, Any]]) -> list[str]:
    """Fits judged (matches, steeper, shallower) on fewer points than the page's own method text
    ("How the exponents are fitted") calls inconclusive for their kind (sampled or exact)."""
    rule = re.search(r"How the exponent is fitted\..*?(?=\n\n|Details|$)", page, flags=re.S)
    if not rule:
        return ["no method text (How the exponents are fitted) on the page"]
    text = re.sub(r"\s+", " ", rule.group(0))
    anyone = re.search(r"fewer than (\d+) points", text)
    sampled = re.search(r"sampled fit on fewer than (\d+) points", text) or anyone
    exact = re.search(r"exact fit on fewer than (\d+) points", text) or anyone
    if not (sampled and exact):
        return [f"the method text states no minimum of points: {text[:80]!r}"]
    need = {"deterministic": int(exact.group(1)), "sampled": int(sampled.group(1))}
    return [
        f"{f['variant']} {f['metric']} {f['verdict']} on {f['n']} points, but the method text "
        f"calls fewer than {need[f.get('kind') or 'sampled']} inconclusive"
        for f in fits
        if f.get("verdict") in ("matches", "steeper", "shallower")
        and f["n"] < need[f.get("kind") or "sampled"]
    ]


def _fit_headers(page_html: str) -> list[str]:
    """An exponent-table heading that says what its cells do not hold: "[95% CI]" over local slopes,
    or "(local slopes)" over bootstrap intervals."""
    table = re.search(r'<section id="exponents">.*?</table>', page_html, flags=re.S)
    if not table:
        return []
    heads = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th>(.*?)</th>", table.group(0))]
    rows = [
        [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
        for r in re.findall(r"<tr>(.*?)</tr>", table.group(0))
    ]
    # a column lifted into the caption: "time: fitted [95% CI] / declared: 2.01 [1.9, 2.1] / 2"
    lifted = re.findall(r"([\w ]+: fitted [^;:]+/ declared): ([^;<]*)", table.group(0))
    cells = [(h, r[i]) for r in rows for i, h in enumerate(heads) if i < len(r)] + lifted
    found = []
    for head, cell in cells:
        if "[95% CI" in head and "(local" in cell:
            found.append(f"{head!r} holds local slopes: {cell!r}")
        if "(local slopes)" in head and re.search(r"\[-?\d", cell):
            found.append(f"{head!r} holds an interval: {cell!r}")
    return found


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"(re)write {GOLDEN}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = build_all(Path(tmp))
    if args.write:
        stored = {
            name: {k: v for k, v in d.items() if k not in UNSTORED} for name, d in result.items()
        }
        GOLDEN.write_text(json.dumps(stored, indent=0, sort_keys=True) + "\n")
    for name, d in result.items():
        print(
            f"{name}: {len(d['tidy'])} tidy rows, {len(d['fits'])} fits, {len(d['findings'])} findings, "
            f"{len(d['figures'])} figures"
        )


if __name__ == "__main__":
    main()
