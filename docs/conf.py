"""Sphinx configuration: the worklease documentation site (Markdown pages through MyST, the
API reference from the docstrings of both flavours). Build with ``nox -s docs``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import worklease  # noqa: E402

project = "worklease"
author = "worklease developers"
copyright = "2026, worklease developers"
release = worklease.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
# package-description.md is the package index page (pyproject readme), not a page of the site.
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "package-description.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"worklease {release}"
html_static_path = ["_static"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The public names live in private modules and say ``__module__ = "worklease"``; type hints
# name private helpers and third-party types that have no page here.
nitpicky = False
suppress_warnings = ["myst.xref_missing"]
