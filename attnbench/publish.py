"""An asv site that works offline: ``asv publish``, then every CDN file served from a vendored copy.

``asv publish`` writes pages that load jQuery, flot, bootstrap and a few plugins from CDNs; opened
without a network they show asv's "Can not determine continental origin of swallow" page instead of
graphs. :func:`publish` runs ``asv publish`` into a temporary folder, copies the files of
``attnbench/publish_assets`` (fetched once from npm; ``manifest.json`` there records each file's
package, version, sha256, license and the address it replaces) into the site's ``vendor/`` folder,
points every CDN reference at them, and only then puts the site in place. Any reference to an
external address that is left (an asv upgrade that loads a new file) fails the publish, naming the
address, so the site never silently goes back online.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.io import output_tail

__all__ = [
    "ASSETS",
    "SHIM",
    "PublishError",
    "load_assets",
    "verify_assets",
    "external_references",
    "localize",
    "publish",
]

ASSETS = Path(__file__).parent / "publish_assets"
"""The vendored files, their licenses and ``manifest.json``."""

_VENDOR = "vendor"
"""Folder of the published site that receives :data:`ASSETS`."""

SHIM = "attnbench-offline.js"
"""Our script in :data:`ASSETS` that answers a file:// page's data requests from JSON twins."""

_TAG = re.compile(r"""<(?P<name>[A-Za-z][\w-]*)(?P<attrs>(?:[^>"']|"[^"]*"|'[^']*')*)>""")
_ATTR = re.compile(
    r"""(?P<key>[^\s=/>"']+)\s*=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s>"']+))"""
)
_CSS_URL = re.compile(
    r"""(?:url\(\s*|@import\s+)["']?\s*(?P<url>(?:https?:)?//[^"')\s;]+)""", re.IGNORECASE
)
_EXTERNAL = re.compile(r"^\s*(?:https?:)?//", re.IGNORECASE)
# attributes whose address a page fetches (on any element)
_LOADING_ATTRS = ("src", "data", "poster", "srcset")
# meaningless for a local file; file:// fails on them
_DROPPED_ATTRS = ("integrity", "crossorigin", "referrerpolicy")


class PublishError(RuntimeError, AttnbenchError):
    """``asv publish`` failed, or its pages still load something from the network."""


@dataclass(frozen=True)
class _Asset:
    """One vendored file, as ``manifest.json`` lists it."""

    path: str  # relative to ASSETS and to the site's vendor/ folder, "/"-separated
    sha256: str  # hex digest of the file's bytes
    # the address asv's pages load it from; None: only other assets use it (fonts)
    replaces: str | None


@dataclass(frozen=True)
class _PublishOutcome:
    """What :func:`publish` wrote."""

    html_dir: Path  # the site's folder (open index.html in it)
    rewritten: int  # number of CDN references pointed at vendored copies
    asv_output: str  # asv publish's stdout and stderr


def load_assets(root: Path = ASSETS) -> tuple[_Asset, ...]:
    """The vendored files listed in ``root/manifest.json``.

    Args:
        root: folder holding ``manifest.json`` and the files (default: the installed assets).
    """
    manifest = json.loads((Path(root) / "manifest.json").read_text(encoding="utf-8"))
    return tuple(
        _Asset(path=f["path"], sha256=f["sha256"], replaces=f.get("replaces"))
        for pkg in manifest["packages"]
        for f in pkg["files"]
    )


def verify_assets(root: Path = ASSETS) -> tuple[_Asset, ...]:
    """Check every vendored file against the sha256 in the manifest.

    Args:
        root: folder holding ``manifest.json`` and the files (default: the installed assets).

    Returns:
        The assets, all verified.

    Raises:
        PublishError: a file is missing or its bytes differ from the manifest's digest.
    """
    assets = load_assets(root)
    for asset in assets:
        path = Path(root) / asset.path
        if not path.is_file():
            raise PublishError(f"vendored file {path} is missing (reinstall attnbench)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != asset.sha256:
            raise PublishError(
                f"vendored file {path} has sha256 {digest}, manifest says {asset.sha256} "
                "(reinstall attnbench)"
            )
    return assets


def _attrs(text: str) -> list[tuple[str, str, re.Match]]:
    return [
        (
            m["key"].lower(),
            m["dq"] if m["dq"] is not None else m["sq"] if m["sq"] is not None else m["bare"],
            m,
        )
        for m in _ATTR.finditer(text)
    ]


def _loaded_addresses(tag: str, attrs: list[tuple[str, str, re.Match]]) -> list[str]:
    """Addresses a browser fetches for one tag: a link's href, any src, data, poster, srcset."""
    out = []
    for key, value, _ in attrs:
        if key in _LOADING_ATTRS or (key == "href" and tag == "link"):
            out.extend(
                part.split()[0] for part in value.split(",") if part.strip()
            ) if key == "srcset" else out.append(value)
    return out


def external_references(site: Path) -> list[tuple[str, str]]:
    """Every external address a page or stylesheet of ``site`` would fetch.

    Looks at the tags of every ``.html`` file (a link's href; src, data, poster and srcset of any
    element; not the href of an ``<a>``, which is only followed when clicked) and at ``url(...)``
    and ``@import`` in stylesheets and pages.

    Args:
        site: folder of a published site.

    Returns:
        ``(file relative to site, address)`` pairs, sorted.
    """
    site = Path(site)
    found = set()
    for path in sorted(site.rglob("*")):
        if path.suffix.lower() not in (".html", ".htm", ".css"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        name = path.relative_to(site).as_posix()
        found.update((name, m["url"]) for m in _CSS_URL.finditer(text))
        if path.suffix.lower() != ".css":
            for tag in _TAG.finditer(text):
                for address in _loaded_addresses(tag["name"].lower(), _attrs(tag["attrs"])):
                    if _EXTERNAL.match(address):
                        found.add((name, address.strip()))
    return sorted(found)


def localize(site: Path, assets: tuple[_Asset, ...]) -> int:
    """Point every known CDN reference in the pages of ``site`` at ``site/vendor/``, in place.

    The vendored files must already be in ``site/vendor/``. A rewritten tag loses its ``integrity``,
    ``crossorigin`` and ``referrerpolicy`` attributes (a browser refuses them on a ``file://`` page;
    the bytes were checked against the manifest instead).

    Args:
        site: folder of a published site.
        assets: the vendored files (from :func:`verify_assets`).

    Returns:
        The number of references rewritten.

    Raises:
        PublishError: an external address is still fetched after the rewrite; the message names
            each address and the file it is in.
    """
    site = Path(site)
    by_url = {a.replaces: a for a in assets if a.replaces}
    rewritten = sum(_localize_page(page, site, by_url) for page in sorted(site.rglob("*.htm*")))
    left = external_references(site)
    if left:
        listed = "\n".join(f"  {name}: {url}" for name, url in left)
        raise PublishError(
            f"the published pages still load {len(left)} external address(es) that "
            f"attnbench has no offline copy of:\n{listed}\nAdd them to "
            f"{ASSETS / 'manifest.json'} (a newer asv loads new files)."
        )
    return rewritten


def _localize_page(page: Path, site: Path, by_url: dict[str, _Asset]) -> int:
    """Point a page's known CDN references at ``vendor/`` and add the shim; how many it rewrote."""
    text = page.read_text(encoding="utf-8")
    rewritten = 0

    def swap(tag: re.Match) -> str:
        nonlocal rewritten
        local = _vendored_tag(tag, page, site, by_url)
        rewritten += local is not None
        return tag.group(0) if local is None else local

    new = _TAG.sub(swap, text)
    if new != text:
        shim = os.path.relpath(site / _VENDOR / SHIM, page.parent).replace(os.sep, "/")
        new = re.sub(
            r"</head>",
            f'<script src="{shim}"></script>\n  </head>',
            new,
            count=1,
            flags=re.IGNORECASE,
        )
        page.write_text(new, encoding="utf-8")
    return rewritten


def _vendored_tag(tag: re.Match, page: Path, site: Path, by_url: dict[str, _Asset]) -> str | None:
    """A script or link ``tag`` of ``page`` from a known CDN, rewritten to load the vendored copy.

    The rewritten tag also drops the attributes a file:// page refuses. None for any other tag
    (one that loads no known CDN address).
    """
    attrs = _attrs(tag["attrs"])
    known = [v.strip() for k, v, _ in attrs if k in ("src", "href") and v.strip() in by_url]
    if not known or tag["name"].lower() not in ("script", "link"):
        return None
    local = os.path.relpath(site / _VENDOR / by_url[known[0]].path, page.parent).replace(
        os.sep, "/"
    )
    kept = tag["attrs"]
    # from the end: earlier offsets stay valid
    for key, _, m in sorted(attrs, key=lambda a: -a[2].start()):
        if key in _DROPPED_ATTRS:
            kept = kept[: m.start()].rstrip() + kept[m.end() :]
        elif key in ("src", "href") and m[0].find(known[0]) >= 0:
            kept = kept[: m.start()] + f'{key}="{local}"' + kept[m.end() :]
    return f"<{tag['name']}{kept}>"


def _write_json_twins(site: Path) -> int:
    """Write ``X.json.js`` beside every JSON file ``X.json`` of ``site`` (not under ``vendor/``).

    The twin holds ``attnbenchOffline(<X.json>);``: a file:// page may load scripts but not read
    files, so the offline shim loads these instead.

    Args:
        site: folder of a published site.

    Returns:
        The number of twins written.
    """
    site = Path(site)
    count = 0
    for path in sorted(site.rglob("*.json")):
        if path.relative_to(site).parts[0] == _VENDOR:
            continue
        twin = path.with_name(path.name + ".js")
        twin.write_text(
            f"attnbenchOffline({path.read_text(encoding='utf-8')});\n", encoding="utf-8"
        )
        count += 1
    return count


def _has_results(results_dir: Path) -> bool:
    return any(
        p.name != "machine.json"
        for machine in results_dir.glob("*/machine.json")
        for p in machine.parent.glob("*.json")
    )


def publish(
    config: str | Path = "asv.conf.json", html_dir: str | Path | None = None
) -> _PublishOutcome:
    """Run ``asv publish`` and make its site work offline; the site appears whole or not at all.

    asv runs in the configuration's folder, so the paths in the configuration are relative to it.

    Args:
        config: the asv configuration file (``asv.conf.json``).
        html_dir: the site's folder (default: the configuration's ``html_dir``); replaced only once
            the new site is complete.

    Returns:
        Where the site is, and how many references were rewritten.

    Raises:
        ValueError: ``config`` is missing or unreadable, or its ``results_dir`` holds no results.
        PublishError: asv failed, a vendored file is damaged, or an external reference remains.
    """
    config, target = _config_and_target(config, html_dir)
    assets = verify_assets()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        site = work / "site"
        cmd = [
            sys.executable,
            "-m",
            "asv",
            "publish",
            "--config",
            str(config),
            "--html-dir",
            str(site),
        ]
        out = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True)
        if out.returncode != 0 or not (site / "index.html").is_file():
            raise PublishError(f"asv publish failed (exit {out.returncode}):\n{output_tail(out)}")
        shutil.copytree(ASSETS, site / _VENDOR, ignore=shutil.ignore_patterns("__pycache__"))
        _write_json_twins(site)
        rewritten = localize(site, assets)
        _put_in_place(site, target, work / "old")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _PublishOutcome(
        html_dir=target, rewritten=rewritten, asv_output=(out.stdout or "") + (out.stderr or "")
    )


def _config_and_target(config: str | Path, html_dir: str | Path | None) -> tuple[Path, Path]:
    """The configuration's absolute path and the site's folder (ValueError: either unusable)."""
    from asv import util

    config = Path(config).absolute()
    if not config.is_file():
        raise ValueError(f"config: no asv configuration at {config} (give --config PATH)")
    try:
        conf = util.load_json(str(config), js_comments=True)
    except (OSError, ValueError, util.UserError) as exc:
        raise ValueError(f"config: cannot read {config}: {exc}") from None
    results = config.parent / conf.get("results_dir", "results")
    if not _has_results(results):
        raise ValueError(f"config: no asv results in {results} (run `asv run` first)")
    target = (
        Path(html_dir).absolute()
        if html_dir is not None
        else config.parent / conf.get("html_dir", "html")
    )
    if target.exists() and not target.is_dir():
        raise ValueError(f"html_dir: {target} exists and is not a directory")
    return config, target


def _put_in_place(site: Path, target: Path, old: Path) -> None:
    """Replace ``target`` by ``site``; the old site goes to ``old``, and back if the move fails."""
    if target.exists():
        os.replace(target, old)
    try:
        os.replace(site, target)
    except OSError:
        if old.exists():
            os.replace(old, target)  # put the previous site back
        raise
