"""The HTML report: self-contained, every figure present, and it renders in a real browser."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from attnbench.reporting import build_report
from tests.box import BOX

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"


def _multi_commit_multi_machine(tmp_path: Path) -> Path:
    """The fixture plus a second (older, slower) commit and a second machine."""
    out = tmp_path / "results"
    shutil.copytree(FIXTURE, out)
    machine_dir = next(p for p in out.iterdir() if p.is_dir())
    src = next(p for p in machine_dir.glob("*.json") if p.name != "machine.json")
    data = json.loads(src.read_text())
    older = dict(
        data, commit_hash="0123456789abcdef0123456789abcdef01234567", date=data["date"] - 86_400_000
    )
    for row in older["results"].values():
        row[0] = (
            [v * 1.5 if isinstance(v, float) else v for v in row[0]]
            if isinstance(row[0], list)
            else row[0]
        )
    (machine_dir / f"01234567-{src.name.split('-', 1)[1]}").write_text(json.dumps(older))
    other = out / "gpu-box"
    shutil.copytree(machine_dir, other)
    machine = json.loads((other / "machine.json").read_text())
    (other / "machine.json").write_text(json.dumps(dict(machine, machine="gpu-box")))
    for p in other.glob("*.json"):
        if p.name != "machine.json":
            d = json.loads(p.read_text())
            d["params"]["machine"] = "gpu-box"
            p.write_text(json.dumps(d))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    return build_report([_multi_commit_multi_machine(tmp)], tmp / "out", title="fixture report")


def test_report_files(report):
    out = report.parent
    assert report.name == "report.html"
    assert (out / "tidy.csv").stat().st_size > 0 and (out / "fits.csv").exists()
    for name in (
        "progression",
        "time",
        "memory",
        "gflops",
        "crossovers",
        "comparison_1",
        "machines",
    ):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
        assert (out / "figures" / f"{name}.svg").exists(), name


def test_report_is_self_contained_and_complete(report):
    page = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), (
        "external reference in the report"
    )
    for heading in (
        "Findings",
        "Fitted exponents",
        "Crossovers",
        "Memory model",
        "Skipped, failed and noisy",
        "Commits",
        "matmul peak",
        "Comparison",
    ):
        assert heading in page, heading
    assert page.count("data:image/png;base64,") >= 7
    assert (
        "01234567" in page and "0123456789abcdef0123456789abcdef01234567" not in page
    )  # short hashes only
    assert "01792c89cdb4659fc9be099ba8cb348011d51657" not in page
    assert "gpu-box" in page


@pytest.mark.slow
def test_report_from_a_run_directory(tmp_path):
    """Every figure a run can produce, including speedup over loop and the approximate-variant plot."""
    from attnbench.measure import MeasureConfig, sweep
    from attnbench.measure.timer import TimerConfig
    from attnbench.runs import grid, write_run
    from attnbench.spec import AttnSpec

    # No probe: a case measured beside the parallel tests is noisy, and a noisy performer draws no accuracy figure.
    config = MeasureConfig(
        timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.1), measure_rss=False, probe=False
    )
    cases = grid(
        ["loop", "batched", "sdpa", "chunked", "performer"],
        [16, 32, 64],
        AttnSpec(batch=1, heads=1, head_dim=8),
    )
    run = write_run(
        tmp_path / "run",
        sweep(cases, config),
        config,
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 50.0},
    )
    page = build_report([run], tmp_path / "out", demos=True).read_text()
    for name in (
        "progression",
        "time",
        "memory",
        "gflops",
        "speedup_loop",
        "speedup_batched",
        "accuracy",
        "nadaraya_watson",
    ):
        assert (tmp_path / "out" / "figures" / f"{name}.png").stat().st_size > 1000, name
    assert "SDPA kernel provenance" in page and "flash" in page


def test_report_from_nothing_readable_still_explains(tmp_path):
    page = build_report([tmp_path / "missing"], tmp_path / "out").read_text()
    assert "could not be read" in page


def _browse(page_path: Path | str, shot: Path, actions=None) -> dict:
    """Open a page (a file, or a URL) in headless Chromium at 1400x900 with no network (only localhost resolves)."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian package 'chromium'; .ci/run installs it)")
    out = {"failed": [], "requests": [], "console": []}
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("requestfailed", lambda r: out["failed"].append(r.url))
        page.on("request", lambda r: out["requests"].append(r.url))
        page.on("console", lambda m: out["console"].append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: out["console"].append(str(e)))
        page.goto(
            page_path if isinstance(page_path, str) else page_path.as_uri(), wait_until="load"
        )
        out["height"] = page.evaluate("document.documentElement.scrollHeight")
        out["width"] = page.evaluate("document.documentElement.scrollWidth")
        out["sizes"] = page.eval_on_selector_all(
            "img",
            "els => els.map(e => [e.alt, e.naturalWidth, e.getBoundingClientRect().height, e.getBoundingClientRect().top])",
        )
        out["findings"] = page.eval_on_selector_all(
            "#findings li", "els => els.map(e => e.getBoundingClientRect().bottom)"
        )
        out["open_details"] = page.eval_on_selector_all("details[open]", "els => els.length")
        if actions:
            out.update(actions(page))
        page.screenshot(path=str(shot), full_page=False)
        browser.close()
    return out


def test_report_renders_in_headless_chromium(report, tmp_path):
    """Open the page in Chromium: no failed or external requests, no console errors, every figure has a size."""
    seen = _browse(report, tmp_path / "report.png")
    assert seen["failed"] == []
    assert [u for u in seen["requests"] if not u.startswith(("file:", "data:"))] == []
    assert seen["console"] == []
    assert len(seen["sizes"]) >= 7
    assert all(w > 0 and h > 0 for _, w, h, _ in seen["sizes"]), seen["sizes"]
    assert (tmp_path / "report.png").stat().st_size > 10_000


CONSTANT_COLUMNS_JS = """() => { const out = [];
 for (const t of document.querySelectorAll('table')) {
   if (t.closest('details:not([open])') || t.classList.contains('meta')) continue;
   const rows = [...t.querySelectorAll('tbody tr')];
   if (rows.length < 2) continue;
   const heads = [...t.querySelectorAll('thead th')].map(h => h.textContent);
   for (let i = 0; i < rows[0].children.length; i++) {
     if (new Set(rows.map(r => r.children[i] ? r.children[i].textContent : '')).size === 1) out.push(heads[i]);
   }
 } return out; }"""


@pytest.fixture(scope="module")
def default_like_run(tmp_path_factory) -> Path:
    """A run shaped like the default sweep (many variants, 6 lengths), synthetic: no timing needed."""
    tmp = tmp_path_factory.mktemp("default")
    variants = [
        "loop",
        "vectorized",
        "batched",
        "multihead",
        "torch_mha",
        "sdpa",
        "sdpa_math",
        "chunked",
        "local",
        "block_sparse",
        "linear_elu",
        "performer",
        "dot",
        "scaled_dot",
        "bilinear",
        "additive",
    ]
    return _scaled_run(
        tmp / "run", variants, (64, 128, 256, 512, 1024, 2048), factor=1.0, counted=True
    )


@pytest.fixture(scope="module")
def default_like_report(default_like_run, tmp_path_factory) -> Path:
    """The page of :func:`default_like_run`, rendered once for the tests that read it."""
    return build_report([default_like_run], tmp_path_factory.mktemp("default-report") / "out")


@pytest.mark.slow
def test_first_screen_holds_findings_and_the_headline_figure_and_the_page_is_short(
    default_like_report, tmp_path
):
    """At 1400x900: the findings and a whole figure on the first screen, at most 10 screens, details
    collapsed, no horizontal scrolling, not even inside a table's box (the exponents table with time, memory and
    counts was cut off at 1400 px), and the inline sort works (click a header, the order flips)."""
    page_path = default_like_report

    def sort(page):
        first = lambda: page.eval_on_selector("#exponents tbody tr td", "e => e.textContent")  # noqa: E731
        before = first()
        page.click("#exponents th:first-child")
        page.click("#exponents th:first-child")  # asc, then desc
        cut = page.eval_on_selector_all(
            ".tw",
            "els => els.filter(e => !e.closest('details:not([open])') && "
            "e.scrollWidth > e.clientWidth).map(e => (e.closest('section') || {}).id || 'page')",
        )
        return {
            "sorted": (before, first()),
            "constant_columns": page.evaluate(CONSTANT_COLUMNS_JS),
            "cut": cut,
        }

    seen = _browse(page_path, tmp_path / "first.png", sort)
    assert seen["cut"] == [], "a table scrolls sideways inside its box"
    assert seen["console"] == [] and seen["failed"] == []
    assert seen["height"] <= 10 * 900, seen["height"]
    assert seen["width"] <= 1400, "the page scrolls sideways"
    assert seen["findings"] and max(seen["findings"]) < 900, seen["findings"]
    head = {alt: (h, top) for alt, _, h, top in seen["sizes"]}
    assert "progression" in head and head["progression"][1] + head["progression"][0] <= 900, (
        head.get("progression")
    )
    assert seen["open_details"] == 0
    assert seen["constant_columns"] == [], "a visible table column holds one repeated value"
    before, after = seen["sorted"]
    assert before == "additive" and after == "vectorized", seen["sorted"]


def _scaled_run(
    path: Path,
    variants,
    lengths,
    factor: float = 1.0,
    wrong: dict | None = None,
    memory_factor: float = 1.0,
    skipped: tuple[str, ...] = (),
    counted: bool = False,
) -> Path:
    """A run of ``variants`` at ``lengths`` with time ~ factor * L^2 (L^1 for linear ones), memory ~
    memory_factor * L^p as declared; ``wrong`` maps (variant, L) to a planted time for a case that failed the gate;
    ``skipped`` variants are skipped at every length; ``counted`` gives every case an instruction count."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.registry import get_variant
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    env = BOX
    base = AttnSpec(batch=1, heads=8, head_dim=64)
    rows = []
    for k, variant in enumerate(variants):
        impl = get_variant(variant)
        for n in lengths:
            t = factor * 1e-6 * (1 + k) * (n / 16) ** impl.time_exponent
            status = "ok"
            if wrong and (variant, n) in wrong:
                t, status = wrong[(variant, n)], "wrong"
            rows.append(
                Measurement(
                    variant=variant,
                    spec=base.replace(seq_len=n),
                    status=status,
                    samples=(t, t, t),
                    runs=3,
                    timing_method="wall",
                    peak_tensor_bytes=float(memory_factor * (1 + k) * 64 * n**impl.memory_exponent),
                    memory_method="profiler",
                    predicted_peak_bytes=float(4 * n * n),
                    max_error=1e-3 if status == "wrong" else 1e-7,
                    tolerance=1e-5,
                    env=env,
                    instructions=t * 3e9 if counted else math.nan,
                    extra={"checked_slices": "8/8"},
                )
            )
    rows += [
        Measurement(
            variant=v, spec=base.replace(seq_len=n), status="skipped", reason="planted", env=env
        )
        for v in skipped
        for n in lengths
    ]
    return write_run(
        path, rows, MeasureConfig(), seconds=1.0, command=["t"], peak_gflops={"float32": 10.0}
    )


def _synthetic_run(tmp_path: Path) -> Path:
    """batched ~L^2 at 5 lengths, linear_elu ~L^2 (declared O(n): steeper), loop at 3 lengths with
    model memory, and one chunked case that failed the correctness gate."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    env = BOX
    base = AttnSpec(batch=1, heads=2, head_dim=16)
    rows = []

    def add(variant, n, status="ok", memory_method="profiler", memory_power=2):
        t = 1e-6 * (n / 16) ** 2
        rows.append(
            Measurement(
                variant=variant,
                spec=base.replace(seq_len=n),
                status=status,
                samples=(t, t, t),
                runs=3,
                timing_method="wall",
                peak_tensor_bytes=float(n**memory_power),
                memory_method=memory_method,
                predicted_peak_bytes=float(4 * n * n),
                max_error=1e-3 if status == "wrong" else 1e-7,
                tolerance=1e-5,
                env=env,
            )
        )

    for n in (64, 128, 256, 512, 1024):
        add("batched", n)
        add("linear_elu", n, memory_power=1)
        add("chunked", n, status="wrong" if n == 512 else "ok", memory_power=1)
    for n in (32, 64, 128):
        add("loop", n, memory_method="model")
    return write_run(
        tmp_path / "run",
        rows,
        MeasureConfig(),
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 10.0},
    )


def test_headline_counts_conclusive_fits_names_inconclusive_and_steeper(tmp_path):
    import pandas as pd

    out = tmp_path / "out"
    page = build_report([_synthetic_run(tmp_path)], out).read_text()
    headline = re.search(r'<h2>Fitted exponents[^<]*</h2><p class="(\w+)">([^<]*)</p>', page)
    assert headline, "no headline under the fitted-exponents heading"
    tone, text = headline.groups()
    assert tone == "bad" and "grows faster than declared (a mismatch): linear_elu time" in text
    # chunked time and memory: 4 lengths, and a pure power law's cost split has no constant, so none is the floor
    assert text.startswith(
        "7 big-O claims checked: 5 match, 0 grow slower, 1 grows faster, 1 inconclusive (time: "
    ), text
    count = re.search(r", (\d+) inconclusive \(", text)
    assert count, text
    inconclusive = page.split(f"Inconclusive fits ({count.group(1)}) and why")[1][:800]
    # too few lengths to split; the growth from 32 to 64 bounds the constant: all 3 are fitted
    assert "<li>loop time: 3 points, too few for a verdict (4 needed)</li>" in inconclusive
    assert "chunked time" not in inconclusive
    assert "No variant grows faster" not in page
    # wrong: its own red section, and out of the fits
    assert (
        '<h2 class="bad">Wrong results' in page
        and "chunked" in page.split('<h2 class="bad">Wrong results')[1][:3000]
    )
    fits = pd.read_csv(out / "fits.csv")
    chunked_time = fits[(fits["variant"] == "chunked") & (fits["metric"] == "time")].iloc[0]
    assert chunked_time["n"] == 4  # 512 was wrong: 64, 128, 256, 1024
    loop_mem = fits[(fits["variant"] == "loop") & (fits["metric"] == "peak_tensor_bytes")].iloc[0]
    assert (
        loop_mem["method"] == "model"
        and pd.isna(loop_mem["exponent"])
        and "not fitted" in loop_mem["range"]
    )
    tidy = pd.read_csv(out / "tidy.csv")
    assert set(
        tidy.loc[(tidy["variant"] == "loop") & (tidy["metric"] == "peak_tensor_bytes"), "method"]
    ) == {"model"}
    assert "model (predicted, not fitted)" in page
    # loop's memory is the model, drawn dotted in the headline: there (only) its caption says so
    assert "; dotted memory is the analytic model, not a measurement;" in page
    # which cases the findings read: time from ok ones, memory and page faults from noisy ones too
    assert re.search(
        r"Read from [^<]* cases: time from the cases that ran undisturbed \(status ok\); memory "
        "and page-fault fits also use noisy cases",
        page,
    ), re.findall(r"Read from [^<]*", page)


def test_no_green_headline_above_nothing(tmp_path):
    page = build_report([tmp_path / "missing"], tmp_path / "out").read_text()
    assert 'class="good"' not in page and "Nothing could be loaded" in page


# ---- findings, comparisons, figures: each defence planted -----------------------------------
def test_findings_rank_only_correct_cases_and_quote_only_conclusive_fits(tmp_path):
    """Planted: a wrong `batched` case at the longest L that would be the fastest by far, and a loop
    measured at two lengths (an inconclusive fit). Neither may appear as a fact."""
    from attnbench.analysis.summary import analyse, load_results

    run = _scaled_run(
        tmp_path / "run",
        ["loop", "batched", "sdpa", "chunked"],
        (64, 128, 256, 512, 1024),
        wrong={("batched", 1024): 1e-9},
    )
    analysis = analyse(load_results([run]))
    text = " ".join(f.text for f in analysis.findings)
    assert 3 <= len(analysis.findings) <= 7  # the answer check leads
    assert analysis.findings[0].text.startswith(
        "Wrong answers against the float64 reference: `batched` in 1 of 5 cases."
    ), analysis.findings[0].text
    fastest = next(f.text for f in analysis.findings if "fastest" in f.text)
    assert "`batched`" not in fastest.split("slowest")[0], fastest  # the wrong case is never ranked
    assert "1024" in fastest
    assert "1 of 20 cases has no time to rely on (1 wrong): its time is never fitted" in text
    assert "L^" in text  # conclusive fits are quoted ...
    short = _scaled_run(tmp_path / "short", ["batched", "sdpa"], (64, 128))
    quiet = analyse(load_results([short]))
    assert not any("L^" in f.text for f in quiet.findings), (
        quiet.findings
    )  # ... inconclusive ones never
    assert all(f.target for f in analysis.findings)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Runs A and B of batched, sdpa and chunked, B planted exactly 2x slower with 4x the peak tensor bytes, and
    their page (`report --from A --from B`), built once for the tests that read it."""
    from attnbench.cli import main

    tmp = tmp_path_factory.mktemp("two-runs")
    lengths = (64, 128, 256, 512)
    a = _scaled_run(tmp / "runA", ["batched", "sdpa", "chunked"], lengths)
    b = _scaled_run(
        tmp / "runB", ["batched", "sdpa", "chunked"], lengths, factor=2.0, memory_factor=4.0
    )
    assert main(["report", "--from", str(a), "--from", str(b), "--out", str(tmp / "out")]) == 0
    return a, b, tmp / "out"


def test_two_runs_side_by_side(two_runs):
    """`report --from A --from B`: B planted exactly 2x slower; the page says 2x in its ratio table,
    its finding and its figure."""
    _, _, out = two_runs
    page = (out / "report.html").read_text()
    section = page.split('<section id="comparison">')[1].split("</section>")[0]
    assert "runB against runA: median time ratio 2x over 12 cases" in page
    assert section.count('<td data-v="2.0">2x</td>') == 12  # every cell of the time ratio table
    assert (out / "figures" / "comparison_1.png").stat().st_size > 1000
    assert "run date" in section


def test_two_runs_compare_peak_tensor_memory_too(two_runs):
    """B planted with 4x the peak tensor bytes (and 2x the time): the memory table says 4x in every cell, the
    time table 2x (neither ratio leaks into the other); a side's "model" (predicted) memory and a zero-byte A
    are never made into a ratio."""
    from attnbench.analysis.slices import compare as _compare
    from attnbench.analysis.slices import sides as _sides

    a, b, out = two_runs
    page = (out / "report.html").read_text()
    section = page.split('<section id="comparison">')[1].split("</section>")[0]
    time_part, memory_part = section.split("Peak tensor memory ratio runB / runA")
    assert memory_part.split("</table>")[0].count('<td data-v="4.0">4x</td>') == 12
    assert time_part.count('<td data-v="2.0">2x</td>') == 12

    from attnbench.analysis.frame import load

    frame = load([a, b]).frame
    memory = frame["metric"] == "peak_tensor_bytes"
    frame.loc[
        memory & (frame["origin"].astype(str) == str(b)) & (frame["variant"] == "chunked"), "method"
    ] = "model"
    frame.loc[
        memory & (frame["origin"].astype(str) == str(a)) & (frame["seq_len"] == 64), "value"
    ] = 0.0
    (comp,) = _compare(frame, _sides(frame))
    assert set(comp.memory["variant"]) == {"batched", "sdpa"} and 64 not in set(
        comp.memory["seq_len"]
    )
    assert (comp.memory["ratio"] == 4.0).all() and len(comp.memory) == 6
    assert len(comp.ratios) == 12


def _asv_run_two_days_late(tmp: Path) -> tuple[Path, dict, int]:
    """A copy of the asv fixture results whose run started two days after its commit: the copy, the result
    file's data and the run's start (ms)."""
    results = tmp / "results"
    shutil.copytree(FIXTURE, results)
    path = next(p for p in results.glob("*/*.json") if p.name != "machine.json")
    data = json.loads(path.read_text())
    run_ms = data["date"] + 2 * 86_400_000
    col = data["result_columns"].index("started_at")
    for row in data["results"].values():
        row[col] = run_ms
    path.write_text(json.dumps(data))
    return results, data, run_ms


def test_asv_pages_show_run_dates_and_short_hashes(asv_report):
    """Planted: a run that started two days after its commit; the page gives the run date, the short hash."""
    import datetime as dt

    page, _, data, run_ms = asv_report
    run_date = dt.datetime.fromtimestamp(run_ms / 1e3, tz=dt.UTC)
    commit_date = dt.datetime.fromtimestamp(data["date"] / 1e3, tz=dt.UTC)
    assert f"run {run_date:%Y-%m-%d %H:%M}" in page
    assert f"run {commit_date:%Y-%m-%d %H:%M}" not in page
    assert data["commit_hash"][:8] in page and data["commit_hash"] not in page


def test_constant_columns_are_lifted_into_the_caption():
    import pandas as pd

    from attnbench.report.markup import html_table, lift_constants

    df = pd.DataFrame(
        {"variant": ["a", "b"], "device": ["cpu", "cpu"], "time": [1.0, 2.0], "empty": ["", ""]}
    )
    shown, constants = lift_constants(df, keep=("variant",))
    assert list(shown.columns) == ["variant", "time"] and constants == {"device": "cpu"}
    out = html_table(df, keep=("variant",))
    assert (
        "<th>device</th>" not in out
        and "Same on every row: device: cpu" in out
        and "<th>empty</th>" not in out
    )
    assert "<th>device</th>" in html_table(df, lift=False)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (1.08e9, "bytes", "1.08 GB"),
        (273_000_000.0, "bytes", "273 MB"),
        (512.0, "bytes", "512 B"),
        (112.34, "x", "112x"),
        (5123.0, "x", "5,120x"),
        (0.000322, "x", "0.000322x"),
        (3.1e-3, "s", "3.1 ms"),
        (2.5, "s", "2.5 s"),
        (4.2e-7, "s", "420 ns"),
        (float("nan"), "s", "n/a"),
    ],
)
def test_numbers_have_units_and_three_significant_figures(value, unit, text):
    from attnbench.report.plots import fmt

    assert fmt(value, unit) == text


def test_crossover_colours_are_centred_at_1x_and_clipped():
    """Planted: one 10^-5 ratio (loop) that would stretch the scale so 0.5x and 2x look alike."""
    import pandas as pd

    from attnbench.report import plots

    cross = pd.DataFrame(
        [
            {
                "variant": "loop",
                "baseline": "batched",
                "metric": "time",
                "crossover_L": "never",
                "ratio_at_longest": 1e-5,
            },
            {
                "variant": "sdpa",
                "baseline": "batched",
                "metric": "time",
                "crossover_L": "128",
                "ratio_at_longest": 2.0,
            },
            {
                "variant": "chunked",
                "baseline": "batched",
                "metric": "time",
                "crossover_L": "never",
                "ratio_at_longest": 0.5,
            },
        ]
    )
    fig = plots.crossover_matrix({"time": cross})
    norm = fig.axes[0].images[0].norm
    assert norm.vmin == -norm.vmax and norm.vmax == 3.0  # centred at 1x, at most 1000x either way
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {
        "never  1e-05x".replace("1e-05x", plots.fmt(1e-5, "x")),
        "L≥128  2x",
        "never  0.5x",
    } <= texts


@pytest.fixture(scope="module")
def steps_report(tmp_path_factory):
    """loop, batched and sdpa at four lengths: the run's load, two analyses of it, and the first rendered, with a
    planted Nadaraya-Watson demo that fails if it is trained (test_demos_are_opt_in)."""
    from unittest import mock

    from attnbench import demos
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.report.html import render

    def trained(*args, **kwargs):
        raise RuntimeError("the Nadaraya-Watson demo was trained")

    tmp = tmp_path_factory.mktemp("steps")
    run = _scaled_run(tmp / "run", ["loop", "batched", "sdpa"], (64, 128, 256, 512))
    loaded = load_results([run])
    first, second = analyse(loaded), analyse(loaded)
    with mock.patch.object(demos, "nadaraya_watson", trained):
        outcome = render(first, tmp / "out")
    return loaded, first, second, outcome


def test_demos_are_opt_in(steps_report, tmp_path, monkeypatch):
    """Planted: a demo that fails if it is trained. The default report never trains it (steps_report was rendered
    with it planted); --demos does."""
    from attnbench import demos

    def trained(*args, **kwargs):
        raise RuntimeError("the Nadaraya-Watson demo was trained")

    assert steps_report[3].page.exists()
    monkeypatch.setattr(demos, "nadaraya_watson", trained)
    run = _scaled_run(tmp_path / "run", ["batched"], (64, 128))  # small: the demos are drawn last
    with pytest.raises(RuntimeError, match="trained"):
        build_report([run], tmp_path / "out2", demos=True)


def test_report_steps_are_separate_functions(steps_report):
    """load -> analyse -> render: analysing twice gives the same findings; rendering writes the files."""
    loaded, first, second, outcome = steps_report
    assert first.findings == second.findings and len(first.findings) >= 3
    assert outcome.page.exists() and outcome.rows == len(loaded.frame)


@pytest.mark.parametrize("shape", [(["sdpa"], (64,)), (["local", "performer"], (64, 128))])
def test_tiny_runs_still_make_a_page(tmp_path, shape):
    """One family, one panel, one length: every figure copes (a single facet has no facet grid)."""
    variants, lengths = shape
    page = build_report(
        [_scaled_run(tmp_path / "run", variants, lengths)], tmp_path / "out"
    ).read_text()
    assert "Findings" in page or "Fitted exponents" in page
    assert (tmp_path / "out" / "figures" / "time.png").exists()


# ---- prefill vs decode, and the roofline ---------------------------------------------------------
def _decode_run(
    path: Path,
    decode_lengths=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
    prefill_lengths=(256, 512, 1024, 2048, 4096),
    peak_gbps: dict | None = None,
    commit: str = "",
) -> Path:
    """batched and sdpa: prefill time ~ L^2, decode time ~ bytes moved (so ~ Lk), with both roofs recorded."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.registry import get_variant
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    env = dataclasses.replace(BOX, commit=commit)
    base = AttnSpec(batch=1, heads=8, head_dim=64)
    wobble = (1.0, 1.03, 0.98, 1.01, 0.99, 1.02, 1.0)
    rows = []
    for k, variant in enumerate(("batched", "sdpa")):
        impl = get_variant(variant)
        for workload, lengths in (("prefill", prefill_lengths), ("decode", decode_lengths)):
            for n, w in zip(lengths, wobble, strict=False):
                spec = (
                    base.replace(seq_len=n)
                    if workload == "prefill"
                    else base.replace(seq_len=1, seq_len_k=n)
                )
                t = (
                    2e-10 * (1 + k) * n * n
                    if workload == "prefill"
                    else spec.bytes_moved / (4e9 * (1 + k))
                ) * w
                rows.append(
                    Measurement(
                        variant=variant,
                        spec=spec,
                        status="ok",
                        samples=(t, t, t),
                        runs=3,
                        timing_method="wall",
                        workload=workload,
                        peak_tensor_bytes=float(64 * n),
                        memory_method="profiler",
                        flops_executed=impl.flops(spec).executed,
                        max_error=1e-7,
                        tolerance=1e-5,
                        env=env,
                    )
                )
    return write_run(
        path,
        rows,
        MeasureConfig(),
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 60.0},
        peak_gbps={"copy": 8.0, "triad": 10.0} if peak_gbps is None else peak_gbps,
    )


def test_prefill_vs_decode_and_the_roofline(tmp_path):
    """Decode's fitted slope is quoted (about 1), with its GB/s and % of the measured bandwidth; the roofline
    figure is drawn and its table collapsed; the page keeps its rules (short, nothing open, no constant column)."""
    from attnbench.analysis.summary import analyse, load_results

    run = _decode_run(tmp_path / "run")
    page_path = build_report([run], tmp_path / "out")
    page = page_path.read_text()
    for name in ("roofline", "prefill_decode"):
        assert (tmp_path / "out" / "figures" / f"{name}.png").stat().st_size > 1000, name
    assert "Prefill vs decode" in page and "% of the binding roof per case" in page
    assert "triad 10 GB/s" in page and "matmul 60 GFLOP/s" in page
    decode = [f.text for f in analyse(load_results([run])).findings if f.text.startswith("Decode")]
    assert len(decode) == 1 and re.search(r"Lk\^1\.0\d \[0\.9\d, 1\.0\d\]", decode[0]), decode
    # sdpa's decode moves 2 x 4 GB/s in the synthetic run (wobble 1.0 at Lk=65536): 80% of the 10 GB/s triad roof
    assert "at Lk=65536 it moves 8 GB/s, 80% of the measured bandwidth" in decode[0], decode[0]
    seen = _browse(
        page_path,
        tmp_path / "decode.png",
        lambda page: {"constant_columns": page.evaluate(CONSTANT_COLUMNS_JS)},
    )
    assert seen["console"] == [] and seen["failed"] == [] and seen["open_details"] == 0
    assert seen["height"] <= 10 * 900, seen["height"]
    assert seen["constant_columns"] == [], seen["constant_columns"]


@pytest.fixture(scope="module")
def short_decode(tmp_path_factory) -> tuple[Path, Path]:
    """batched and sdpa at three decode lengths (too few to fit), in a run that recorded no bandwidth, and its
    page, built once for the tests that read it."""
    tmp = tmp_path_factory.mktemp("short-decode")
    run = _decode_run(tmp / "run", decode_lengths=(1024, 2048, 4096), peak_gbps={})
    return run, build_report([run], tmp / "out")


def test_an_inconclusive_decode_fit_is_shown_but_never_a_finding(short_decode):
    """The planted fault: three decode lengths are too few to fit; the section shows them, the findings say nothing."""
    from attnbench.analysis.summary import analyse, load_results

    run, page_path = short_decode
    page = page_path.read_text()
    assert "Prefill vs decode" in page
    analysis = analyse(load_results([run]))
    decode = analysis.fits[
        (analysis.fits["workload"] == "decode") & (analysis.fits["metric"] == "time")
    ]
    assert set(decode["verdict"]) == {"inconclusive"}  # bytes have no noise: three lengths fit them
    assert not [f for f in analysis.findings if f.text.startswith("Decode")]


@pytest.mark.slow
def test_no_decode_section_without_decode_cases(default_like_report):
    page = default_like_report.read_text()
    assert (
        "Prefill vs decode" not in page
        and not (default_like_report.parent / "figures" / "prefill_decode.png").exists()
    )


def test_the_roofline_without_a_recorded_bandwidth_draws_the_compute_roof_only(short_decode):
    _, page_path = short_decode
    page = page_path.read_text()
    assert (
        page_path.parent / "figures" / "roofline.png"
    ).exists() and "bandwidth not recorded" in page


def test_prefill_and_decode_from_two_runs_of_one_machine(tmp_path):
    """A prefill sweep and a decode sweep are two run directories, made at two commits: the section and the finding read both."""
    from attnbench.analysis.summary import analyse, load_results

    runs = [
        _decode_run(tmp_path / "prefill", decode_lengths=(), commit="a" * 40),
        _decode_run(tmp_path / "decode", prefill_lengths=(), commit="b" * 40),
    ]
    page = build_report(runs, tmp_path / "out").read_text()
    assert "Prefill vs decode" in page and (tmp_path / "out" / "figures" / "roofline.png").exists()
    decode = [f.text for f in analyse(load_results(runs)).findings if f.text.startswith("Decode")]
    assert (
        decode
        and "against prefill's L^" in decode[0]
        and "% of the measured bandwidth" in decode[0]
    ), decode


def test_the_fastest_is_ranked_among_exact_softmax_attention_only(tmp_path):
    """Planted: linear_elu and local, O(L) and the fastest by far, compute something else: they are named, not ranked."""
    from attnbench.analysis.summary import analyse, load_results

    run = _scaled_run(
        tmp_path / "run",
        ["batched", "sdpa", "chunked", "linear_elu", "local"],
        (64, 128, 256, 512, 1024),
    )
    fastest = next(f.text for f in analyse(load_results([run])).findings if "fastest" in f.text)
    assert (
        "fastest of 3 exact softmax attention variants" in fastest and "is `batched`" in fastest
    ), fastest
    assert "(`linear_elu`, `local` compute something else and are not ranked)" in fastest, fastest


def test_lengths_and_counts_are_printed_exactly_in_every_table(tmp_path):
    """Planted: 1024 and 2048 where a 3-significant-figure formatter prints 1,020 and 2,050."""
    import html as html_lib
    from html.parser import HTMLParser

    from attnbench.analysis import complexity

    run = _scaled_run(
        tmp_path / "run",
        ["batched", "sdpa", "chunked"],
        (256, 512, 1024, 2048),
        wrong={("batched", 2048): 1.0},
        skipped=("local",),
    )  # a variant that never ran makes the largest-length column a float one
    page = build_report([run], tmp_path / "out").read_text()

    class Tables(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tables, self.cell, self.row = [], None, None

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                self.tables.append([])
            elif tag == "tr" and self.tables:
                self.row = []
                self.tables[-1].append(self.row)
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.row is not None:
                self.row.append(html_lib.unescape(self.cell or ""))
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parser = Tables()
    parser.feed(page)
    counts = re.compile(
        r"(^|[_ ])(L|Lq|Lk|seq_len|seq_len_k|batch|heads|head_dim|kv_heads|n|cases)$|(^|_)L(_|$)|^cases"
    )
    checked = 0
    for table in parser.tables:
        if len(table) < 2:
            continue
        for i, head in enumerate(table[0]):
            if counts.search(head):
                cells = [
                    row[i]
                    for row in table[1:]
                    if i < len(row) and row[i] not in ("", "always", "never", complexity.ONE_LENGTH)
                ]
                assert all(c.isdigit() for c in cells), (head, cells)
                checked += len(cells)
    assert checked > 20 and "2048" in page and "2,050" not in page and "1,020" not in page


@pytest.fixture(scope="module")
def asv_report(tmp_path_factory) -> tuple[str, dict[str, list], dict, int]:
    """The report of the asv fixture results, run two days after their commit (_asv_run_two_days_late), built
    once: its page, each figure's overlapping texts, the result file's data and the run's start (ms)."""
    out = tmp_path_factory.mktemp("asv-report")
    results, data, run_ms = _asv_run_two_days_late(out)
    overlaps = _report_overlaps([results], out / "out")
    return (out / "out" / "report.html").read_text(), overlaps, data, run_ms


def test_an_asv_report_says_its_times_carry_no_disturbance_check(asv_report):
    page = asv_report[0]
    assert "asv results carry no disturbance check" in page


def test_a_figureless_section_keeps_its_heading_and_says_why(tmp_path):
    """Planted: decode cases only (no prefill shape to draw in the families): the heading, and why it is empty."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    env = BOX
    rows = [
        Measurement(
            variant="sdpa",
            spec=AttnSpec(seq_len=1, seq_len_k=n),
            status="ok",
            samples=(1e-6 * n,) * 3,
            runs=3,
            timing_method="wall",
            env=env,
            workload="decode",
        )
        for n in (1024, 2048, 4096, 8192)
    ]
    run = write_run(
        tmp_path / "run", rows, MeasureConfig(workload="decode"), seconds=1.0, command=["t"]
    )
    page = build_report([run], tmp_path / "out").read_text()
    # the families have nothing to draw: the heading stays, and says why (it vanished without a word)
    assert "Prefill vs decode" in page and (
        '<h2 id="families">The families</h2><p class="note empty">Nothing to draw in the families: no '
        "time case had Lq = Lk (prefill): only decode ran; no memory was measured.</p>" in page
    )


def _gqa_run(path: Path) -> Path:
    """sdpa at Hkv = 8 and 2 (H = 8), time ~ L^2 with a 10% spread between blocks."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    env = BOX
    rows = []
    for hkv in (8, 2):
        for n in (128, 256, 512, 1024, 2048):
            t = 1e-9 * n * n * (1 if hkv == 8 else 0.5)
            rows.append(
                Measurement(
                    variant="sdpa",
                    spec=AttnSpec(seq_len=n, kv_heads=hkv),
                    status="ok",
                    samples=(0.95 * t, t, 1.05 * t),
                    runs=3,
                    timing_method="wall",
                    env=env,
                    peak_tensor_bytes=float(n * 1000 * hkv),
                    memory_method="profiler",
                )
            )
    return write_run(path, rows, MeasureConfig(), seconds=1.0, command=["t"])


def test_a_gqa_sweep_shows_hkv_in_its_tables_and_figures(tmp_path):
    """Planted: two key/value head counts whose times differ 2x: never one median line, never one summary row."""
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.report import plots

    analysis = analyse(load_results([_gqa_run(tmp_path / "run")]))
    assert sorted(analysis.summary["kv_heads"]) == [2, 8]
    fig = plots.scaling(analysis.main, "time")
    labels = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"sdpa Hkv=2", "sdpa Hkv=8"} <= labels, labels


def test_points_show_their_spread(tmp_path):
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.report import plots

    analysis = analyse(load_results([_gqa_run(tmp_path / "run")]))
    for fig in (
        plots.scaling(analysis.main, "time"),
        plots.progression(analysis.main, analysis.main_fits),
    ):
        bars = [
            c
            for ax in fig.axes
            for c in ax.collections
            if type(c).__name__ == "LineCollection" and len(c.get_segments())
        ]
        assert bars and any(
            len(c.get_segments()) == 5 for c in bars
        )  # one bar per length of a series


def _overlapping_texts(fig) -> list[tuple[str, str, str]]:
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        boxes = [
            (t.get_text(), Text.get_window_extent(t, renderer)) for t in ax.texts
        ]  # the text, not its leader line
        found += [
            (ax.get_title(), a, b)
            for i, (a, box) in enumerate(boxes)
            for b, other in boxes[i + 1 :]
            if box.overlaps(other)
        ]
    return found


@pytest.mark.parametrize(
    "variants",
    [
        ["sdpa", "sdpa_flash"],
        ["sdpa", "sdpa_flash", "chunked", "local", "linear_elu", "performer", "batched"],
        ["loop", "vectorized", "batched", "multihead", "torch_mha"],
    ],
)
def test_line_end_labels_never_overlap(tmp_path, variants):
    """Planted: lines that end at (nearly) the same point, as sdpa and sdpa_flash do on a CPU, beside the O(n) and
    O(n²) guides."""
    _assert_line_end_labels_apart(
        _scaled_run(tmp_path / "run", variants, (64, 128, 256, 512), factor=0.01)
    )


def test_line_end_labels_of_the_fixture_run_never_overlap():
    """The fixture's real run, whose dense panel spans two short lengths (the guides' names met)."""
    _assert_line_end_labels_apart(Path(__file__).parent / "fixtures" / "runs" / "prefill")


def _assert_line_end_labels_apart(source: Path) -> None:
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.report import plots

    analysis = analyse(load_results([source]))
    for fig in (
        plots.scaling(analysis.main, "time"),
        plots.scaling(analysis.main, "peak_tensor_bytes"),
        plots.progression(analysis.main, analysis.main_fits),
    ):
        assert fig is None or _overlapping_texts(fig) == []


def test_rows_of_another_shape_are_never_pooled_into_a_finding(tmp_path):
    """The asv report said "sdpa (61.2 ms)": the median of Hkv=8 (61.5 ms) and a GQA case (60.8 ms). Planted: the GQA
    cases are 10x faster; the findings read the plain cases only, and the subtitle names what varies."""
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    rows = []
    for variant, base in (("sdpa", 1e-9), ("batched", 3e-9), ("chunked", 2e-9)):
        for hkv in (8, 2):
            for n in (128, 256, 512, 1024):
                t = base * n * n * (1 if hkv == 8 else 0.1)
                rows.append(
                    Measurement(
                        variant=variant,
                        spec=AttnSpec(seq_len=n, kv_heads=hkv),
                        status="ok",
                        samples=(t, t, t),
                        runs=3,
                        timing_method="wall",
                    )
                )
    run = write_run(tmp_path / "run", rows, MeasureConfig(), seconds=1.0, command=["t"])
    analysis = analyse(load_results([run]))
    assert analysis.primary["kv_heads"] == "8"
    (fastest,) = [f.text for f in analysis.findings if "the fastest of" in f.text]
    assert "`sdpa` (1.05 ms)" in fastest and "takes 3x as long" in fastest, fastest
    page = build_report([run], tmp_path / "out").read_text()
    assert "Varying between cases: Hkv (never pooled)" in page


def test_a_comparison_never_pools_two_shapes_into_one_ratio(tmp_path):
    """Planted: B is 2x slower at head dim 64 and unchanged at head dim 32. One ratio per (variant,
    L) would be the median of both shapes (1.5x, true of neither); each shape gets its own."""
    from attnbench.analysis.frame import load
    from attnbench.analysis.slices import compare, sides
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    def run(name: str, slower: float) -> Path:
        rows = []
        for n in (128, 256):
            for d in (32, 64):
                t = 1e-6 * n * (slower if d == 64 else 1.0)
                spec = AttnSpec(seq_len=n, head_dim=d)
                rows.append(Measurement("batched", spec, "ok", samples=(t, t, t), runs=3))
        return write_run(tmp_path / name, rows, MeasureConfig(), seconds=1.0, command=["t"])

    frame = load([run("A", 1.0), run("B", 2.0)]).frame
    (comparison,) = compare(frame, sides(frame))
    ratios = comparison.ratios.astype({"head_dim": int}).set_index(["seq_len", "head_dim"])
    assert sorted(ratios.index) == [(128, 32), (128, 64), (256, 32), (256, 64)]
    assert ratios["ratio"].to_dict() == pytest.approx(
        {(128, 32): 1.0, (128, 64): 2.0, (256, 32): 1.0, (256, 64): 2.0}
    )


def test_a_match_whose_interval_excludes_the_declared_exponent_says_so():
    """block_sparse time 1.24 [1.05, 1.43] was called "matches" O(L) without a word: it matches only within the
    tolerance. The cell said "time steeper than declared by less than 0.25 (matches; its interval excludes 1)",
    which read as a contradiction: the verdict is one phrase, and the detail its tooltip."""
    import pandas as pd

    from attnbench.analysis import complexity
    from attnbench.analysis.summary import exponent_summary

    fit = {
        "source": "run",
        "machine": "m",
        "commit": "",
        "device": "cpu",
        "mode": "forward",
        "dtype": "float32",
        "mask": "none",
        "workload": "prefill",
        "batch": 1,
        "heads": 8,
        "kv_heads": 8,
        "head_dim": 64,
        "variant": "block_sparse",
        "metric": "time",
        "method": "wall",
        "exponent": 1.24,
        "ci_low": 1.05,
        "ci_high": 1.43,
        "conclusive": True,
        "note": "",
        "declared": 1.0,
    }
    fits = pd.DataFrame([{**fit, "verdict": complexity.verdict(fit, 1.0)}])
    assert fits["verdict"].iloc[0] == "matches"
    tone, text = complexity.headline(fits)
    assert text.startswith(
        "1 big-O claim checked: 1 matches, 0 grow slower, 0 grow faster, 0 "
        "inconclusive (time: 1 matches)"
    ), text
    row = exponent_summary(fits).iloc[0]
    # one plain phrase; the interval and the tolerance are the tooltip's
    assert row["verdict vs declared"] == "time matches O(L)"
    assert row["verdict details"] == (
        "time: matches O(L): fitted 1.24, within the 0.25 tolerance of 1 (95% interval 1.05 to "
        "1.43)"
    )


def _gate_results(tmp_path: Path, head_factor: float) -> tuple[Path, str, str]:
    """The fixture's asv results as BASE, and the same with every time x ``head_factor`` as HEAD."""
    import json
    import shutil

    results = tmp_path / "results"
    shutil.copytree(Path(__file__).parent / "fixtures" / "asv_results", results)
    (base_file,) = (results / "fixture-box").glob("01792c89-*.json")
    data = json.loads(base_file.read_text())
    base, head = data["commit_hash"], "f" * 40
    time_key = "bench_attention.Attention.time_attention"
    data["results"][time_key][0] = [v * head_factor for v in data["results"][time_key][0]]
    data["commit_hash"] = head
    (results / "fixture-box" / base_file.name.replace("01792c89", "ffffffff")).write_text(
        json.dumps(data)
    )
    return results, base, head


def test_the_ci_report_shows_no_time_ratio_the_gate_did_not_decide(tmp_path):
    """`regress` decided on counts and called every time case "shown, noisy"; the report of its results then said
    "median time ratio 0.767x", a speedup nobody measured. The gate's verdicts beside the results now mark those rows."""
    import pandas as pd

    from attnbench.analysis.summary import analyse, load_results
    from attnbench.contract import GATE_VERDICTS

    results, base, head = _gate_results(tmp_path, 0.767)
    before = analyse(load_results([results]))
    assert any(
        "median time ratio 0.767x" in f.text for f in before.findings
    )  # what the page said without the gate
    time_rows = before.loaded.frame.query("metric == 'time' and status == 'ok'")
    table = pd.DataFrame(
        [
            {
                "metric": "time",
                "variant": r.variant,
                "seq_len": r.seq_len,
                "mode": r.mode,
                "mask": r.mask,
                "verdict": "shown",
                "reason": "noisy: 14 of 20 samples waited for a core",
                "base": base,
                "head": head,
            }
            for r in time_rows.drop_duplicates(["variant", "seq_len", "mode"]).itertuples()
        ]
        + [
            {
                "metric": "instructions",
                "variant": "batched",
                "seq_len": 64,
                "mode": "forward",
                "mask": "none",
                "verdict": "ok",
                "reason": "",
                "base": base,
                "head": head,
            }
        ]
    )
    table.to_csv(results / GATE_VERDICTS, index=False)
    after = analyse(load_results([results]))
    assert not any("median time ratio" in f.text for f in after.findings), [
        f.text for f in after.findings
    ]
    assert after.comparisons[0].ratios.empty
    assert any(
        "which decided on instructions" in n and "marked noisy here" in n
        for n in after.loaded.notes
    )
    marked = after.loaded.frame.query("metric == 'time' and status == 'noisy'")
    assert (
        len(marked) == len(time_rows) and marked["reason"].str.contains("waited for a core").all()
    )


def test_a_point_above_its_neighbours_line_is_flagged_before_a_crossover_rests_on_it(tmp_path):
    """`dot` at L=512 measured 46.2 ms between neighbours on a 17.7 ms-like line and a false crossover rested on such
    points. A cost is convex on log-log axes: the point is marked noisy, and nothing is fitted or ranked on it."""
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    rows = []
    for variant, base in (("batched", 1.0e-7), ("dot", 1.1e-7)):
        for n in (128, 256, 512, 1024, 2048):
            t = base * n * n * (2.6 if (variant, n) == ("dot", 512) else 1.0)
            rows.append(
                Measurement(
                    variant=variant,
                    spec=AttnSpec(seq_len=n),
                    status="ok",
                    samples=(t, t, t),
                    runs=3,
                    timing_method="wall",
                )
            )
    run = write_run(tmp_path / "run", rows, MeasureConfig(), seconds=1.0, command=["t"])
    analysis = analyse(load_results([run]))
    frame = analysis.loaded.frame
    spike = frame[
        (frame["variant"] == "dot") & (frame["seq_len"] == 512) & (frame["metric"] == "time")
    ]
    assert (
        list(spike["status"]) == ["noisy"] and "breaks its series' trend" in spike["reason"].iloc[0]
    )
    assert (
        frame.loc[frame["status"] == "noisy", "seq_len"] == 512
    ).all()  # nothing else: convex series stay ok
    fit = analysis.fits.set_index(["variant", "metric"]).loc[("dot", "time")]
    assert fit["n"] == 4 and fit["L_min"] == 128  # fitted, ranked and crossed over without 512


def _report_overlaps(sources: list[Path], out: Path) -> dict[str, list]:
    """Build the report of ``sources`` and list, per figure saved, its overlapping texts."""
    from unittest import mock

    from matplotlib.figure import Figure

    from attnbench.analysis.summary import analyse, load_results
    from attnbench.report import html
    from tests.golden import figure_name
    from tests.text_boxes import overlapping

    found: dict[str, list] = {}
    savefig = Figure.savefig

    def record(fig, *args, **kwargs):
        found.setdefault(figure_name(fig), overlapping(fig))
        return savefig(fig, *args, **kwargs)

    with mock.patch.object(Figure, "savefig", record):
        html.render(analyse(load_results([str(s) for s in sources])), out)
    return found


@pytest.mark.slow
def test_no_figure_of_any_report_kind_prints_text_over_text(tmp_path, asv_report):
    """Panel titles sat on the row above's tick labels, the speedup heatmap's labels on each other and its colour bar's,
    the accuracy axis crowded its minor labels: every figure of an asv and a CI report. The reports of a run, two runs
    and a roofline are checked on the golden build (tests/test_golden_report.py), which draws them already."""
    gate, _, _ = _gate_results(tmp_path / "gate", 0.767)
    kinds = {"asv": asv_report[1], "CI": _report_overlaps([gate], tmp_path / "CI")}
    for kind, found in kinds.items():
        assert {name: pairs for name, pairs in found.items() if pairs} == {}, kind
    assert sum(map(len, kinds.values())) >= 10


def test_a_log_axis_within_one_decade_still_has_labelled_ticks():
    """The CI report times only L=1024: 24 and 60 ms, no power of ten between them, and the axis had no label."""
    import matplotlib.pyplot as plt

    from attnbench.report.style import unit_axis

    def labels(low: float, high: float) -> list[str]:
        fig, ax = plt.subplots()
        ax.set_yscale("log")
        ax.plot([1, 2], [low, high])
        unit_axis(ax, "y", "s")
        fig.canvas.draw()
        lo, hi = ax.get_ylim()
        shown = [
            t.get_text()
            for t in ax.yaxis.get_majorticklabels() + ax.yaxis.get_minorticklabels()
            if t.get_text() and lo <= t.get_position()[1] <= hi
        ]
        plt.close(fig)
        return shown

    assert labels(0.024, 0.060) == ["30 ms", "50 ms"]
    assert labels(1e-4, 1.0) == [
        "100 µs",
        "1 ms",
        "10 ms",
        "100 ms",
        "1 s",
    ]  # decades only where there are any


def _register_mine() -> None:
    """A user's key-blocked kernel `mine`, declared O(L²) time and O(L) memory, over the default (dense)
    memory model: its author set the exponents and nothing else."""
    import attnbench

    class KeyBlocked(attnbench.Variant):
        time_exponent = 2.0
        memory_exponent = 1.0

        def forward(self, q, k, v, mask):  # never called: the runs are synthetic
            raise NotImplementedError

    attnbench.register("mine", KeyBlocked)


@pytest.fixture(scope="module")
def noisy_plugin(tmp_path_factory) -> tuple[Path, dict, object]:
    """A new user's run: their own `mine` beside sdpa and batched, on a machine busy for the whole sweep (every
    case noisy, batched's first skipped): the run, its page's digest (tests/golden.py) and its analysis, built
    once for the tests that read it (`mine` is registered only while they are built)."""
    import attnbench
    from attnbench.analysis.summary import analyse, load_results
    from tests import golden

    tmp = tmp_path_factory.mktemp("noisy-plugin")
    _register_mine()
    try:
        run = _scaled_run(tmp / "run", ["mine", "sdpa", "batched"], (64, 128, 256, 512))
        golden.make_noisy(run, skip_first="batched")
        return run, golden.digest([run], tmp / "out"), analyse(load_results([run]))
    finally:
        attnbench.unregister("mine")


def test_a_plugin_run_whose_every_time_was_noisy_leads_with_its_own_variant_and_agrees_with_itself(
    noisy_plugin, tmp_path, monkeypatch
):
    """A new user's run: their own key-blocked kernel `mine` beside sdpa and batched, on a machine busy for the
    whole sweep (every case noisy, one skipped). The headline showed batched and sdpa only, under "From the Python
    loop to fused SDPA", its time panel empty axes without a word; a finding said the noisy cases are "never
    fitted" beside fits of their peak bytes; the answer check was nowhere on the page."""
    import attnbench
    from attnbench.analysis import findings
    from tests import golden

    run, d, _ = noisy_plugin
    heads = [f for f in d["figures"] if f["suptitle"].startswith("This run's variants")]
    assert len(heads) == 1 and "mine" in heads[0]["suptitle"], (
        f"no headline leads with the plugin variant: {[f['suptitle'] for f in d['figures']]}"
    )
    head = heads[0]
    time_panel, memory_panel = head["axes"]
    assert time_panel["lines"] == [] and any(
        t.startswith("Nothing to draw: every time case was noisy (11) or skipped (1)")
        for t in time_panel["texts"]
    ), time_panel["texts"]
    # its second sentence read "a busy machine ... still exact See Details": a capital, a stop
    assert any(
        "\nA busy machine disturbed every timing: bytes and counts are still exact.\nSee Details"
        in t
        for t in time_panel["texts"]
    ), time_panel["texts"]
    assert any("mine" in t for t in memory_panel["texts"]), memory_panel["texts"]
    texts = [t for t, _ in d["findings"]]
    # the worse run read cleaner: "...; 0 are inconclusive" and a green "none inconclusive"
    said = (
        "3 big-O claims checked: 3 match, 0 grow slower, 0 grow faster, 0 "
        "inconclusive (peak memory: 3 match); time not fitted (every case noisy or skipped)."
    )
    assert said in texts, texts
    assert f'class="neutral">{said}</p>' in d[golden.PAGE], re.findall(
        r"<p class=\"\w+\">3 big-O claims checked[^<]*", d[golden.PAGE]
    )
    assert texts[0].startswith("Every answer checked against the float64 reference was correct")
    assert "`mine` " in texts[0], texts[0]
    assert "not fitted: every case noisy (4)" in d[golden.PAGE]
    # "ran correctly" read as a wrong answer: batched's cases were only disturbed or skipped
    assert "not fitted: no undisturbed case (3 noisy, 1 skipped)" in d[golden.PAGE]
    # "Read from ... cases that ran correctly (status ok)" on a page where no case was ok
    assert (
        "Read from cpu, forward, float32 cases: no time (no case ran undisturbed); memory and "
        "page-fault fits also use noisy cases" in d[golden.PAGE]
    ), re.findall(r"Read from [^<]*", d[golden.PAGE])
    assert golden.contradictions(d) == []

    # planted: the sentence the user read, and a count of one in the plural
    old = "12 of 12 cases are not measurements to rely on (11 noisy, 1 skipped): they are never fitted or ranked."
    monkeypatch.setattr(findings, "_not_facts", lambda e: findings.Finding(old, "problems"))
    _register_mine()
    try:
        planted = golden.digest([run], tmp_path / "planted")
    finally:
        attnbench.unregister("mine")
    found = golden.contradictions(planted)
    assert any(
        "says noisy cases are never fitted, but ['batched', 'mine', 'sdpa']" in f for f in found
    ), found
    planted["findings"].append(["3 of 3 conclusive complexity fits match; 1 are inconclusive", "x"])
    assert any("'1 are'" in f for f in golden.contradictions(planted))


def test_the_answer_check_states_the_checked_slices_beside_the_worst_error(noisy_plugin):
    """`checked_slices` (8/8) was in measurements.csv but nowhere on the page. Planted (seen failing): the
    loader without the column (the table's slices cells blank)."""
    from tests import golden

    _, d, _ = noisy_plugin
    assert {r["checked_slices"] for r in d["tidy"] if r["metric"] == "time"} == {"8/8"}
    table = d[golden.PAGE].split('id="answers"')[1].split("</table>")[0]
    heads = re.findall(r"<th>(.*?)</th>", table)
    assert "slices checked" in heads and heads.index("worst error") < heads.index(
        "its tolerance"
    ), heads
    column = heads.index("slices checked")
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr><td.*?</tr>", table)]
    assert [c[column] for c in cells] == ["8/8"] * 3, cells


def test_a_section_with_nothing_to_draw_keeps_its_heading_and_says_why(noisy_plugin):
    """Every time case noisy: the roofline's section vanished without a word (the families' and the crossovers'
    would too, with nothing to draw). Planted (seen failing): the roofline section returning "" again."""
    import html

    from tests import golden

    page = noisy_plugin[1][golden.PAGE]
    assert '<section id="roofline-s">' in page, "the roofline's section vanished without a word"
    roof = html.unescape(page.split('<section id="roofline-s">')[1].split("</section>")[0])
    assert "<h2>Roofline" in roof and (
        "Nothing to draw in the roofline: it places correct, undisturbed rates; every GFLOP/s case "
        "was noisy (11)." in roof
    ), roof
    families = html.unescape(page.split('<h2 id="families">')[1].split("<h2")[0])
    assert (
        "Nothing to draw in the time figure: every time case was noisy (11) or skipped (1)."
        in families
    )
    gflops = page.split("Achieved GFLOP/s and % of the matmul peak")[1].split("</details>")[0]
    assert "Nothing to draw in the GFLOP/s figure: every GFLOP/s case was noisy (11)." in gflops


def test_dotted_is_said_only_where_a_dotted_line_is_drawn(noisy_plugin):
    """The headline's caption and memory panel said "(dotted: model)" where nothing dotted was drawn (no case's
    memory was the model's; test_headline_counts_... sees it said where one is). Planted (seen failing): the
    unconditional caption."""
    from tests import golden

    _, d, _ = noisy_plugin
    assert not any(r["method"] == "model" for r in d["tidy"] if r["metric"] == "peak_tensor_bytes")
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", d[golden.PAGE], flags=re.S)
    titles = [t for f in d["figures"] for t in (f["suptitle"], *(ax["title"] for ax in f["axes"]))]
    said = [t for t in captions + titles if "dotted" in t.lower()]
    assert len(captions) >= 3 and said == [], said


def test_the_memory_model_follows_the_declared_exponent_or_says_there_is_none(noisy_plugin):
    """`mine` declares O(L) memory over the default model of dense (Lq, Lk) buffers: the memory-model rows
    predicted O(L²) for it. Now they say there is no model; no built-in variant's model grows faster than it
    declares, at any mask, pass or workload. Planted (seen failing): the model rows without the check."""
    from attnbench.analysis import complexity
    from attnbench.analysis.findings import built_in
    from attnbench.registry import get_variant, variant_names
    from attnbench.spec import AttnSpec
    from tests import golden

    _, d, analysis = noisy_plugin
    table = analysis.memory_model
    mine, rest = table[table["variant"] == "mine"], table[table["variant"] != "mine"]
    assert len(mine) == 4 and mine["predicted_MiB"].isna().all(), mine[
        ["seq_len", "predicted_MiB", "note"]
    ]
    no_model = "no model: the memory model grows as L^2.00, but the variant declares O(L)"
    assert mine["note"].str.startswith(no_model).all() and no_model in d[golden.PAGE]
    assert len(rest) and rest["predicted_MiB"].notna().all() and (rest["note"] == "").all()
    steeper = []
    for name in (v for v in variant_names() if built_in(v)):
        for mode in ("forward", "backward"):
            for mask in ("none", "causal", "sliding_window"):
                for workload, lq in (("prefill", 1024), ("decode", 1)):
                    spec = AttnSpec(seq_len=lq, seq_len_k=1024, mode=mode, mask=mask)
                    declared = complexity.declared_exponent(name, "peak_tensor_bytes", workload)
                    slope = complexity.model_slope(get_variant(name), spec, workload)
                    if slope > declared + complexity.TOLERANCE:
                        steeper.append((name, mode, mask, workload, round(slope, 2)))
    assert steeper == []


def test_a_plugin_variant_has_a_colour_of_its_own_on_every_figure():
    """A plugin variant was drawn in YlOrBr, sdpa's orange to the eye (0.11 apart in RGB), on every figure but the
    headline. Planted (seen failing): YlOrBr back."""
    import numpy as np

    from attnbench.registry import variant_names
    from attnbench.report import style

    with style.drawing((*variant_names(), "mine", "theirs")):
        rgb = {v: np.array(style.colour(v)[:3]) for v in (*variant_names(), "mine", "theirs")}
    for plugin in ("mine", "theirs"):
        near = min((float(np.linalg.norm(rgb[plugin] - rgb[v])), v) for v in rgb if v != plugin)
        assert near[0] >= 0.15, f"{plugin} is {near[0]:.2f} from {near[1]}"


def test_a_finding_sets_the_users_own_variant_against_sdpa(noisy_plugin, tmp_path):
    """No finding compared the user's own `mine` with the baselines. Now one does (its time / sdpa's at the
    longest length both ran undisturbed), or says why there is no ratio. Planted (seen failing): the rule gone."""
    import attnbench
    from attnbench.analysis.summary import analyse, load_results
    from attnbench.analysis.text import fmt

    texts = [t for t, _ in noisy_plugin[1]["findings"]]
    assert (
        "`mine` against `sdpa`: no time ratio, because every time case of `mine` was noisy (4) (a "
        "disturbed time is no measurement)." in texts
    ), texts
    _register_mine()
    try:
        run = _scaled_run(tmp_path / "quiet", ["mine", "sdpa", "batched"], (64, 128, 256, 512))
        texts = [f.text for f in analyse(load_results([run])).findings]
    finally:
        attnbench.unregister("mine")
    mine, sdpa = (
        1e-6 * (512 / 16) ** 2,
        2e-6 * (512 / 16) ** 2,
    )  # _scaled_run: mine first, sdpa twice as long
    assert (
        f"`mine` against `sdpa`: 2x faster at L=512 ({fmt(mine, 's')} vs {fmt(sdpa, 's')} per call), "
        "the longest length both ran undisturbed." in texts
    ), texts


def test_a_time_fit_left_few_lengths_by_noisy_cases_blames_them(tmp_path):
    """Each variant had 4 lengths, the 2 longest noisy: the verdict read "time inconclusive: 1 point
    above the floor", blaming a floor nobody defined instead of the noisy cases (the floor was then tied
    to the smallest value, so at most 1 of 2 points could be above it). It names the reasons, counted in
    the points fitted as the rest of the page counts them (a newcomer read "3 undisturbed lengths"
    beside "2 points" twice). Planted (seen failing): the verdict without
    :func:`summary._too_few_undisturbed`."""
    from attnbench.analysis.summary import VERDICT, analyse, load_results

    run = _scaled_run(tmp_path / "run", ["sdpa", "batched"], (64, 128, 256, 512), counted=True)
    log = run / "cases.jsonl"
    lines = []
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        m = rec.get("measurement") if rec.get("kind") == "case" else None
        if m is not None and m["spec"]["seq_len"] >= 256:
            m.update(status="noisy", reason="planted: calibration probe 3.00x slower")
        if m is not None and m["variant"] == "batched":  # its counts: valgrind ran out of time
            m["instructions"] = None
            m["extra"]["instructions_note"] = "error: valgrind ran out of time (planted)"
        lines.append(json.dumps(rec))
    log.write_text("\n".join(lines) + "\n")
    analysis = analyse(load_results([run]))
    # a blank count says why, from the count's own status and reason, never a bare "not measured"
    counts = analysis.summary.set_index("variant")["instructions: fitted (local slopes) / declared"]
    assert counts["batched"] == (
        "not fitted: every case error (4): valgrind ran out of time (planted)"
    ), counts
    from attnbench.analysis.summary import fit_column

    # the fit its verdict names is in the cell, marked (a reader looked for "its 95% interval"),
    # with its count where an interval would be: too few points for a verdict
    cells = list(analysis.summary[fit_column("time", "time")])
    assert cells and all(
        re.match(r"^\d\.\d\d \(2 points\) / 2, inconclusive$", c) for c in cells
    ), cells
    verdicts = list(analysis.summary[VERDICT])
    # the settled verdicts first, the long reason why time is open after them
    assert all(v.startswith("peak memory matches") for v in verdicts), verdicts
    assert verdicts and all(
        "time inconclusive: 2 points fitted (2 noisy at L=256, 512 left out), too few for a verdict (4 needed)"
        in v
        for v in verdicts
    ), verdicts
    # the list of inconclusive fits gives the same reason, from the same note
    from attnbench.analysis import complexity

    listed = [i for i in complexity.tally(analysis.fits).inconclusive if " time: " in i]
    assert len(listed) == 2 and all(
        i.endswith(
            " time: 2 points fitted (2 noisy at L=256, 512 left out), too few for a verdict (4 needed)"
        )
        for i in listed
    ), listed
    # "3 of 3 conclusive complexity fits match the declared big-O; 3 are inconclusive" read as a
    # contradiction: they were memory fits and time fits
    texts = [f.text for f in analysis.findings]
    assert any(
        t.startswith(
            "5 big-O claims checked: 3 match, 0 grow slower, 0 grow faster, "
            "2 inconclusive (time: 2 inconclusive; instructions: 1 matches; peak memory: 2 match)"
        )
        for t in texts
    ), texts


def test_the_answer_finding_counts_every_variants_checked_cases_not_only_the_worst_three(
    monkeypatch,
):
    """Past six variants the finding names the worst three; its count once summed only theirs (a
    newcomer's default run read "correct (19 cases)" above a table of 103 checked)."""
    import types

    import pandas as pd

    from attnbench.analysis import findings

    rows = [
        {"variant": f"v{i}", "cases run": 10, "checked": 10, "wrong": 0,
         "worst / tolerance": 0.1 * (i + 1)}
        for i in range(7)
    ]  # fmt: skip
    monkeypatch.setattr(findings, "answer_check", lambda frame: pd.DataFrame(rows))
    found = findings._answers(types.SimpleNamespace(frame=None))
    assert "was correct (70 cases)" in found.text and "(the worst three)" in found.text


@pytest.fixture(scope="module")
def four_families(tmp_path_factory):
    """A run of four of the six families (dense, fused, blockwise, linear) and its analysis."""
    from attnbench.analysis.summary import analyse, load_results

    tmp = tmp_path_factory.mktemp("four_families")
    run = _scaled_run(tmp / "run", ["batched", "sdpa", "chunked", "linear_elu"], (64, 128, 256))
    return analyse(load_results([run])), tmp


CLOSED_SHAPES = frozenset("osD^vphH<>d8")
"""Filled, closed marker outlines: none has the arms of a cross ("x", "X", "+", "P", a four-pointed star)."""


def test_no_variants_points_look_like_the_wrong_results_cross(four_families):
    """Issue 49: sdpa's correct points were orange crosses in the time and memory figures, under a caption
    saying "red crosses: wrong results" (seaborn's own markers: o, X, a diamond, P, ...). Every variant's
    points now take a closed shape; the cross is the wrong cases' alone. Planted (seen failing):
    markers=True back in scaling: "time figure draws variants as ['(4, 0, 45)', 'P', 'X', 'o']"; "X" put in
    VARIANT_MARKERS: "Extra items in the left set: 'X'"."""
    from attnbench.report import plots, style

    analysis, _ = four_families
    assert style.WRONG_MARKER in ("x", "X", "+", "P")
    many = style.variant_markers([f"v{i}" for i in range(3 * len(style.VARIANT_MARKERS))])
    assert set(many.values()) <= CLOSED_SHAPES
    with style.drawing(analysis.variant_order):
        figures = {
            "time": plots.scaling(analysis.main, "time"),
            "memory": plots.scaling(analysis.main, "peak_tensor_bytes"),
            "headline": plots.progression(analysis.main, analysis.main_fits),
        }
    for name, fig in figures.items():
        shapes = [
            line.get_marker()
            for ax in fig.axes
            for line in ax.get_lines()
            if line.get_linestyle() != "None" and line.get_marker() not in ("None", "", None)
        ]
        assert shapes, f"{name} figure draws no marked line"
        crosses = [m for m in shapes if m not in CLOSED_SHAPES]
        assert not crosses, f"{name} figure draws variants as {sorted(set(map(str, shapes)))}"


def test_the_time_figures_caption_names_the_panels_it_draws(four_families, monkeypatch):
    """Issue 49: the caption listed every family ("dense, fused SDPA, blockwise, linear, scoring functions,
    compiled") above panels "dense / fused / other". It now names the panels from the rows that decide them.
    Planted (seen failing): the fixed list back: "- one panel per family: dense, fused, blockwise, linear
    + one panel per family (dense, fused SDPA, blockwise, linear, scoring functions, compiled)"."""
    from matplotlib.figure import Figure

    from attnbench.report import html, plots, style
    from attnbench.report.markup import Page

    # the caption is the point: no image is rasterised
    monkeypatch.setattr(Figure, "savefig", lambda *args, **kwargs: None)
    analysis, tmp = four_families
    with style.drawing(analysis.variant_order):
        titles = [ax.get_title() for ax in plots.scaling(analysis.main, "time").axes]
        section = html._families(Page(analysis, tmp / "figures"))
    assert titles == ["dense", "fused", "blockwise", "linear"]
    caption = re.search(r"Time per call vs L, (.*?), lines labelled", section)
    assert caption, section
    assert caption.group(1) == f"one panel per family: {', '.join(titles)}"


def test_a_variant_has_one_colour_on_every_figure_of_a_page(four_families):
    """Issue 49: textbook was green on the headline (tab10, one hue a line) and olive on the time and memory
    figures (its family's shade). Every figure now takes a variant's colour from style.colour: the line-end
    labels (each in its line's colour) agree across the figures. Planted (seen failing): tab10 back in the
    headline: "batched: {'headline': {'#1f77b4'}, 'time': {'#3b8bc2'}, 'memory': {'#3b8bc2'}}"."""
    from matplotlib import colors as mcolors

    from attnbench.report import plots, style

    analysis, _ = four_families
    variants = ("batched", "sdpa", "chunked", "linear_elu")
    with style.drawing(analysis.variant_order):
        figures = {
            "headline": plots.progression(analysis.main, analysis.main_fits, variants),
            "time": plots.scaling(analysis.main, "time"),
            "memory": plots.scaling(analysis.main, "peak_tensor_bytes"),
        }
    seen: dict[str, dict[str, set[str]]] = {v: {} for v in variants}
    for name, fig in figures.items():
        for ax in fig.axes:
            for text in ax.texts:
                variant = text.get_text().split(" ")[0]
                if variant in seen:
                    seen[variant].setdefault(name, set()).add(mcolors.to_hex(text.get_color()))
    for variant, by_figure in seen.items():
        assert set(by_figure) == set(figures), f"{variant} is labelled on {sorted(by_figure)} only"
        assert len(set().union(*by_figure.values())) == 1, f"{variant}: {by_figure}"


def test_the_time_caption_names_only_the_marks_its_figure_draws():
    """A newcomer read of red crosses and hollow circles under a time figure that drew neither: each
    mark is named only where a time row has that status (planted: the fixed sentence back)."""
    import pandas as pd

    from attnbench.report.html import _marks

    rows = pd.DataFrame({"metric": ["time", "time", "peak_tensor_bytes"], "status": ["ok"] * 3})
    assert _marks(rows) == ""
    rows.loc[2, "status"] = "wrong"  # a wrong memory row: not on the time figure
    assert _marks(rows) == ""
    rows.loc[0, "status"] = "noisy"
    assert _marks(rows).startswith("Hollow circles") and "cross" not in _marks(rows)
    rows.loc[1, "status"] = "wrong"
    assert _marks(rows).startswith("Red crosses") and "neither a fact" in _marks(rows)
