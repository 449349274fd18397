"""Sphinx configuration of attnbench's documentation (MyST Markdown pages, furo theme).

Built by ``.venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html``;
tests/test_docs.py builds it the same way, so a dangling reference or a broken directive fails the
test suite. Nothing here reaches the network: no intersphinx, no external link check.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "attnbench"
author = "the attnbench authors"
copyright = "2026, the attnbench authors"  # noqa: A001 - Sphinx's name for it

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "attnbench_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
# Every Markdown heading down to ### gets an anchor, so `page.md#a-heading` links are checked.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
# A reference that resolves to nothing is a warning, and -W makes it an error.
nitpicky = False
suppress_warnings: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "attnbench"
html_static_path = ["_static"]
html_css_files = ["attnbench.css"]
html_theme_options = {"navigation_with_keys": True}
# The site is read from file:// as well as from Pages: no search index fetched from elsewhere.
html_copy_source = False
