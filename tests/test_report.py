"""The HTML report: self-contained, every figure present, and it renders in a real browser."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from attnbench.report.html import build_report

FIXTURE = Path(__file__).parent / "fixtures" / "asv_results"


def _multi_commit_multi_machine(tmp_path: Path) -> Path:
    """The fixture plus a second (older, slower) commit and a second machine."""
    out = tmp_path / "results"
    shutil.copytree(FIXTURE, out)
    machine_dir = next(p for p in out.iterdir() if p.is_dir())
    src = next(p for p in machine_dir.glob("*.json") if p.name != "machine.json")
    data = json.loads(src.read_text())
    older = dict(data, commit_hash="0123456789abcdef0123456789abcdef01234567", date=data["date"] - 86_400_000)
    for row in older["results"].values():
        row[0] = [v * 1.5 if isinstance(v, float) else v for v in row[0]] if isinstance(row[0], list) else row[0]
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
    for name in ("time", "memory", "gflops", "history", "machines", "nadaraya_watson", "masked_weights"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
        assert (out / "figures" / f"{name}.svg").exists(), name


def test_report_is_self_contained_and_complete(report):
    page = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "external reference in the report"
    for heading in ("Fitted exponents", "Crossovers", "Memory model", "Skipped and failed", "Commits", "Roofline"):
        assert heading in page, heading
    assert page.count("data:image/png;base64,") >= 7
    assert "0123456789abcdef" in page  # commit hashes are listed
    assert "gpu-box" in page


def test_report_from_a_run_directory(tmp_path):
    """Every figure a run can produce, including speedup over loop and the approximate-variant plot."""
    from attnbench.measure import MeasureConfig, sweep
    from attnbench.measure.timer import TimerConfig
    from attnbench.runs import grid, write_run
    from attnbench.spec import AttnSpec

    config = MeasureConfig(timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.1), measure_rss=False)
    cases = grid(["loop", "batched", "sdpa", "chunked", "performer"], [16, 32, 64], AttnSpec(batch=1, heads=1, head_dim=8))
    run = write_run(tmp_path / "run", sweep(cases, config), config, seconds=1.0, command=["t"], peak_gflops={"float32": 50.0})
    page = build_report([run], tmp_path / "out").read_text()
    for name in ("time", "memory", "gflops", "speedup_loop", "speedup_batched", "accuracy", "nadaraya_watson"):
        assert (tmp_path / "out" / "figures" / f"{name}.png").stat().st_size > 1000, name
    assert "SDPA kernel provenance" in page and "flash" in page


def test_report_from_nothing_readable_still_explains(tmp_path):
    page = build_report([tmp_path / "missing"], tmp_path / "out").read_text()
    assert "could not be read" in page


def test_report_renders_in_headless_chromium(report, tmp_path):
    """Open the page in Chromium: no failed requests, every figure has a non-zero rendered size."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is not installed (Debian package 'chromium'; .ci/run installs it)")
    failed, requests = [], []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(report.as_uri(), wait_until="load")
        sizes = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, e.naturalWidth, e.getBoundingClientRect().height])")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=False)
        browser.close()
    assert failed == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert len(sizes) >= 7
    assert all(w > 0 and h > 0 for _, w, h in sizes), sizes
    assert (tmp_path / "report.png").stat().st_size > 10_000


def _synthetic_run(tmp_path: Path) -> Path:
    """batched ~L^2 at 5 lengths, linear_elu ~L^2 (declared O(n): steeper), loop at 3 lengths with
    model memory, and one chunked case that failed the correctness gate."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.record import Environment, Measurement
    from attnbench.runs import write_run
    from attnbench.spec import AttnSpec

    env = Environment(hostname="box", python="3.11", torch="2.x", threads=1, cpu_model="cpu", cpu_count=2, device_name="cpu")
    base = AttnSpec(batch=1, heads=2, head_dim=16)
    rows = []

    def add(variant, n, status="ok", memory_method="profiler", memory_power=2):
        t = 1e-6 * (n / 16) ** 2
        rows.append(Measurement(
            variant=variant, spec=base.replace(seq_len=n), status=status, samples=(t, t, t), runs=3, timing_method="wall",
            peak_tensor_bytes=float(n**memory_power), memory_method=memory_method, predicted_peak_bytes=float(4 * n * n),
            max_error=1e-3 if status == "wrong" else 1e-7, tolerance=1e-5, env=env,
        ))

    for n in (64, 128, 256, 512, 1024):
        add("batched", n)
        add("linear_elu", n, memory_power=1)
        add("chunked", n, status="wrong" if n == 512 else "ok", memory_power=1)
    for n in (32, 64, 128):
        add("loop", n, memory_method="model")
    return write_run(tmp_path / "run", rows, MeasureConfig(), seconds=1.0, command=["t"], peak_gflops={"float32": 10.0})


def test_headline_counts_conclusive_fits_names_inconclusive_and_steeper(tmp_path):
    import pandas as pd

    out = tmp_path / "out"
    page = build_report([_synthetic_run(tmp_path)], out).read_text()
    headline = re.search(r'<h2>Fitted exponents[^<]*</h2><p class="(\w+)">([^<]*)</p>', page)
    assert headline, "no headline under the fitted-exponents heading"
    tone, text = headline.groups()
    assert tone == "bad" and "steeper than declared: linear_elu time" in text
    assert text.startswith("3 of 4 conclusive fits match their declared complexity")
    inconclusive = text.split("inconclusive: ")[1]
    assert "loop time (2 points)" in inconclusive  # 32 is the floor; 64 and 128 are fitted
    assert "chunked time (3 points)" in inconclusive
    assert "No variant grows faster" not in page
    # wrong: its own red section, and out of the fits
    assert '<h2 class="bad">Wrong results' in page and "chunked" in page.split('<h2 class="bad">Wrong results')[1][:3000]
    fits = pd.read_csv(out / "fits.csv")
    chunked_time = fits[(fits["variant"] == "chunked") & (fits["metric"] == "time")].iloc[0]
    assert chunked_time["n"] == 3  # 64 is the floor, 512 was wrong: 128, 256, 1024
    loop_mem = fits[(fits["variant"] == "loop") & (fits["metric"] == "peak_tensor_bytes")].iloc[0]
    assert loop_mem["method"] == "model" and pd.isna(loop_mem["exponent"]) and "not fitted" in loop_mem["range"]
    tidy = pd.read_csv(out / "tidy.csv")
    assert set(tidy.loc[(tidy["variant"] == "loop") & (tidy["metric"] == "peak_tensor_bytes"), "method"]) == {"model"}
    assert "model (predicted, not fitted)" in page


def test_no_green_headline_above_nothing(tmp_path):
    page = build_report([tmp_path / "missing"], tmp_path / "out").read_text()
    assert 'class="good"' not in page and "Nothing could be loaded" in page
