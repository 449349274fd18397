"""``attnbench publish``: an asv site that draws its graphs with no network, from a file or a local server."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from attnbench import publish as pub
from attnbench.cli import main
from tests.test_report import FIXTURE, _browse, _multi_commit_multi_machine

REPO = Path(__file__).resolve().parent.parent
GRAPH = "bench_attention.Attention.time_attention"

# Series and drawn points of every visible flot plot inside the element `where`, through flot's own API.
PLOTTED_JS = """(where) => { let series = 0, points = 0;
  if (!window.jQuery) return [0, 0];
  jQuery(where).find('*').each(function () { const plot = jQuery(this).data('plot');
    if (plot && jQuery(this).is(':visible')) for (const s of plot.getData()) {
      series += 1; points += s.data.filter(d => d && d[1] !== null && isFinite(d[1])).length; } });
  return [series, points]; }"""

GRID_DRAWN_JS = """(() => { const shown = [...document.querySelectorAll(where + ' .benchmark-plot')].filter(d => {
  const r = d.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight; });
  return shown.length > 0 && shown.every(d => jQuery(d).data('plot')); })()"""
"""Every grid plot in view is drawn (asv draws them one by one as their data arrive, and only those in view)."""


def _site_config(tmp: Path) -> Path:
    """The repository's asv.conf.json, beside a copy of the two-commit, two-machine fixture results.

    asv draws only commits of the repository's branch, so the fixture's made-up older commit becomes
    the parent of the fixture's real one: the graphs then have lines, not single points.
    """
    from asv import util

    results = _multi_commit_multi_machine(tmp)
    first = json.loads(next((FIXTURE / "fixture-box").glob("01792c89-*.json")).read_text())[
        "commit_hash"
    ]
    parent = subprocess.run(
        ["git", "rev-parse", f"{first}~1"], cwd=REPO, capture_output=True, text=True
    )
    if parent.returncode != 0:
        pytest.skip(
            f"this checkout lacks the fixture's commit history (shallow clone?): {parent.stderr.strip()}"
        )
    for path in results.glob("*/01234567-*.json"):
        path.write_text(
            path.read_text().replace(
                "0123456789abcdef0123456789abcdef01234567", parent.stdout.strip()
            )
        )
    conf = util.load_json(str(REPO / "asv.conf.json"), js_comments=True)
    conf.update(
        repo=str(REPO), results_dir=results.name, html_dir="html"
    )  # relative: to the config's folder
    path = tmp / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    """``published``: ``attnbench publish``'s site; ``raw``: plain ``asv publish`` of the same results."""
    tmp = tmp_path_factory.mktemp("publish")
    config = _site_config(tmp)
    outcome = pub.publish(config)
    raw = tmp / "raw"
    subprocess.run(
        [sys.executable, "-m", "asv", "publish", "--config", str(config), "--html-dir", str(raw)],
        cwd=tmp,
        check=True,
        capture_output=True,
    )
    return {
        "published": outcome.html_dir,
        "raw": raw,
        "config": config,
        "rewritten": outcome.rewritten,
    }


def test_vendored_files_match_their_manifest(tmp_path):
    """Every vendored file has its manifest's sha256; one changed byte, or a missing file, fails loudly."""
    assets = pub.verify_assets()
    assert len(assets) >= 10
    manifest = json.loads((pub.ASSETS / "manifest.json").read_text())
    for package in manifest["packages"]:
        assert package["license"].startswith("MIT"), package["name"]
        assert (pub.ASSETS / package["license_file"]).stat().st_size > 300, package["name"]
    copy = tmp_path / "assets"
    shutil.copytree(pub.ASSETS, copy)
    victim = copy / assets[0].path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(pub.PublishError, match=assets[0].path.split("/")[-1]):
        pub.verify_assets(copy)
    victim.unlink()
    with pytest.raises(pub.PublishError, match="missing"):
        pub.verify_assets(copy)


def test_vendored_files_are_the_bytes_asv_asks_for_where_npm_has_them():
    """Where the manifest says a file is identical to the CDN's, its hash is the integrity asv's own page declares."""
    import asv

    template = (Path(asv.__file__).parent / "www" / "index.html").read_text()
    manifest = json.loads((pub.ASSETS / "manifest.json").read_text())
    files = [f for p in manifest["packages"] for f in p["files"] if f.get("replaces")]
    for f in files:
        assert (
            f'"{f["replaces"]}"' in template and f'integrity="{f["cdn_integrity"]}"' in template
        ), f["replaces"]
        alg = f["cdn_integrity"].split("-")[0]
        digest = base64.b64encode(
            hashlib.new(alg, (pub.ASSETS / f["path"]).read_bytes()).digest()
        ).decode()
        assert (f"{alg}-{digest}" == f["cdn_integrity"]) == f["identical_to_cdn"], f["path"]
    assert (
        sum(f["identical_to_cdn"] for f in files) >= 5
    )  # jquery, orderBars, md5, bootstrap js + css


def test_every_external_file_asv_loads_has_an_offline_copy():
    """The installed asv's page template loads nothing from the network that the manifest does not replace."""
    import asv

    www = Path(asv.__file__).parent / "www"
    known = {a.replaces for a in pub.load_assets()}
    loaded = pub.external_references(www)
    assert loaded, "asv's template loads nothing external: the check below would prove nothing"
    assert {url for _, url in loaded} <= known, sorted({url for _, url in loaded} - known)


def test_published_site_references_nothing_external(sites):
    """asv's own output loads its CDN files; the published site none, and has a data twin for every JSON file."""
    raw = pub.external_references(sites["raw"])
    assert len(raw) == sites["rewritten"] == 10, raw
    assert pub.external_references(sites["published"]) == []
    index = (sites["published"] / "index.html").read_text()
    assert "integrity=" not in index and "crossorigin" not in index and pub.SHIM in index
    jsons = [p for p in sites["published"].rglob("*.json") if "vendor" not in p.parts]
    assert len(jsons) > 10 and all(p.with_name(p.name + ".js").is_file() for p in jsons)
    graph = next(p for p in jsons if p.name == f"{GRAPH}.json")
    twin = graph.with_name(graph.name + ".js").read_text()
    assert json.loads(twin[len("attnbenchOffline(") : -len(");\n")]) == json.loads(
        graph.read_text()
    )


def test_a_new_cdn_file_fails_the_publish_and_keeps_the_old_site(sites, tmp_path, monkeypatch):
    """An asv that loads a file attnbench has no copy of: exit 1 naming the URL, the previous site untouched."""
    config = sites["config"]
    out = tmp_path / "site"
    out.mkdir()
    (out / "old.txt").write_text("previous site")
    jquery = next(a for a in pub.load_assets() if a.replaces and "jquery-" in a.replaces)
    monkeypatch.setattr(
        pub, "verify_assets", lambda: tuple(a for a in pub.load_assets() if a != jquery)
    )
    with pytest.raises(pub.PublishError, match=jquery.replaces.replace(".", r"\.")):
        pub.publish(config, out)
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["site"]  # no temporary folder left behind
    assert main(["publish", "--config", str(config), "--html-dir", str(out)]) == 1


def test_localize_names_an_unknown_external_script(sites, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(sites["raw"], site)
    index = site / "index.html"
    index.write_text(
        index.read_text().replace(
            "</head>", '<script src="https://cdn.example.org/x.js"></script></head>'
        )
    )
    (site / "extra.css").write_text("@import 'https://fonts.example.org/f.css'; a { color: red }")
    with pytest.raises(pub.PublishError) as err:
        pub.localize(site, pub.load_assets())
    assert "index.html: https://cdn.example.org/x.js" in str(err.value)
    assert "extra.css: https://fonts.example.org/f.css" in str(err.value)
    assert "code.jquery.com" not in str(err.value)  # the known ones were rewritten


def test_publish_replaces_an_existing_site_and_the_cli_says_where(sites, tmp_path, capsys):
    out = tmp_path / "site"
    out.mkdir()
    (out / "stale.txt").write_text("x")
    assert main(["publish", "--config", str(sites["config"]), "-o", str(out)]) == 0
    assert f"site: {out / 'index.html'}" in capsys.readouterr().out
    assert not (out / "stale.txt").exists() and (out / "vendor" / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_publish_errors_name_the_problem(tmp_path, capsys):
    with pytest.raises(ValueError, match="no asv configuration"):
        pub.publish(tmp_path / "missing.json")
    (tmp_path / "asv.conf.json").write_text('{"version": 1, "repo": ".", "results_dir": "results"}')
    with pytest.raises(ValueError, match="no asv results in .*results"):
        pub.publish(tmp_path / "asv.conf.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        pub.publish(tmp_path / "bad.json")
    assert main(["publish", "--config", str(tmp_path / "missing.json")]) == 2
    assert "no asv configuration" in capsys.readouterr().err
    assert not (tmp_path / "html").exists()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def serve():
    """``serve(folder)`` -> ``http://127.0.0.1:PORT/``: a local static server, as ``python -m http.server``."""
    servers = []

    def start(folder: Path) -> str:
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder))
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _tour(shots: Path):
    """Actions for ``_browse`` opened on a graph page: the graph, then the list, regressions and grid pages.

    Each step waits for its own event (a plot with points, rows in the table), or for the sign that none can come:
    no jQuery once the page has loaded (its scripts failed), as on a site whose assets are on a CDN."""

    def act(page) -> dict:
        def settle(condition: str, arg: str) -> None:
            with contextlib.suppress(
                Exception
            ):  # a page that never draws (or leaves for error.html) is asserted on below
                page.wait_for_function(
                    f"where => !window.jQuery || ({condition})", arg=arg, timeout=15_000
                )

        seen = {}
        settle(f"({PLOTTED_JS})(where)[1] > 0", "#graph-display")
        seen["plotted"] = page.evaluate(PLOTTED_JS, "#graph-display")
        seen["graph_text"] = page.inner_text("body")
        page.screenshot(path=str(shots / "graph.png"))
        rows = {}
        for view, selector in (
            ("summarylist", "#summarylist-body table tbody tr"),
            ("regressions", "#regressions-body"),
        ):
            page.evaluate(f"window.location.hash = '#{view}'")
            settle("document.querySelectorAll(where).length > 0", selector)
            rows[view] = page.eval_on_selector_all(selector, "els => els.length")
        seen["rows"] = rows
        page.evaluate("window.location.hash = ''")
        settle(GRID_DRAWN_JS, "#summarygrid-display")
        seen["grid_plots"] = page.evaluate(PLOTTED_JS, "#summarygrid-display")
        seen["text"] = page.inner_text("body")
        return seen

    return act


def _check_offline(url: str, shots: Path) -> dict:
    shots.mkdir(parents=True, exist_ok=True)
    return _browse(url, shots / "index.png", actions=_tour(shots))


def _assert_drawn(seen: dict, base: str) -> None:
    assert seen["failed"] == [], seen["failed"]
    assert [u for u in seen["requests"] if not u.startswith((base, "data:"))] == []
    assert seen["console"] == []
    assert "swallow" not in seen["graph_text"] and "swallow" not in seen["text"]
    series, points = seen["plotted"]
    assert series >= 2 and points >= 2, seen["plotted"]
    assert seen["rows"]["summarylist"] >= 5, seen["rows"]
    assert seen["grid_plots"][0] >= 7 and seen["grid_plots"][1] >= 14, seen[
        "grid_plots"
    ]  # 7 benchmarks x 2 commits


def test_published_site_draws_its_graphs_from_a_file_with_no_network(sites, tmp_path):
    index = sites["published"] / "index.html"
    seen = _check_offline(f"{index.as_uri()}#{GRAPH}", tmp_path)
    _assert_drawn(seen, sites["published"].as_uri())
    assert (tmp_path / "graph.png").stat().st_size > 20_000


def test_published_site_draws_its_graphs_from_a_local_server_with_no_network(
    sites, tmp_path, serve
):
    base = serve(sites["published"])
    seen = _check_offline(f"{base}index.html#{GRAPH}", tmp_path)
    _assert_drawn(seen, base)


@pytest.mark.parametrize("how", ["file", "server"])
def test_the_browser_check_catches_plain_asv_output(sites, tmp_path, serve, how):
    """The same check on ``asv publish``'s own site: CDN requests fail and the swallow page shows."""
    base = sites["raw"].as_uri() + "/" if how == "file" else serve(sites["raw"])
    seen = _check_offline(f"{base}index.html#{GRAPH}", tmp_path)
    assert any("cdn" in u or "code.jquery.com" in u for u in seen["failed"]), seen["failed"]
    assert "swallow" in seen["text"]
    assert seen["plotted"] == [0, 0] and seen["grid_plots"] == [0, 0]
