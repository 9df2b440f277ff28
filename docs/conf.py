"""Sphinx configuration of the celery-fair docs (``sphinx-build -W -b html docs docs/_build/html``).

The settings reference, the CLI reference and the API reference are generated from the
code at build time (``_ext/fair_docs.py``, sphinx-click, autodoc), so they never drift from
it. Everything builds and reads offline: the diagrams are Mermaid, drawn by the browser
with the copy of Mermaid under ``_static/mermaid/`` (``_ext/offline_mermaid.py``), never
loaded from a CDN.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
# Document this checkout's celery_fair (whatever else is installed), and load _ext/.
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]

import celery_fair  # noqa: E402  (after the path set-up, for the version)

project = "celery-fair"
author = "celery-fair contributors"
copyright = "celery-fair contributors"  # noqa: A001  (Sphinx's name)
release = version = celery_fair.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_click",
    "sphinxcontrib.mermaid",
    "offline_mermaid",
    "fair_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_default_options = {"undoc-members": False, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"celery-fair {release}"
html_static_path = ["_static"]

# Mermaid comes from _static/mermaid/ (SOURCE.txt there says which version and from where);
# offline_mermaid adds the script to the pages with a diagram.
mermaid_use_local = "mermaid/mermaid.mjs"
mermaid_version = "11.12.1"
