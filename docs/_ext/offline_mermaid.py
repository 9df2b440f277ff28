"""Mermaid from the docs themselves, not from a CDN, so the diagrams draw offline.

sphinxcontrib-mermaid writes, on each page with a diagram, a module script that imports
Mermaid from ``mermaid_use_local`` (conf.py: ``_static/mermaid/mermaid.mjs``, resolved per
page).
The vendored build, ``_static/mermaid/mermaid.min.js`` (version and source in
``_static/mermaid/SOURCE.txt``), is a classic script that sets ``globalThis.mermaid``; this
extension adds it to those pages, ahead of the module, which only re-exports the global.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx
from sphinxcontrib.mermaid import mermaid

SCRIPT = "mermaid/mermaid.min.js"  # under html_static_path


def _add_script(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any],
                doctree: Any) -> None:
    # Where sphinxcontrib-mermaid adds its module: pages with a diagram, and generated
    # pages (no doctree: the index, the search page).
    if doctree is None or doctree.next_node(mermaid) is not None:
        # A classic script runs as the page is parsed; module scripts run after it.
        app.add_js_file(SCRIPT, priority=app.config.mermaid_js_priority - 1)


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinxcontrib.mermaid")
    app.connect("html-page-context", _add_script)
    return {"parallel_read_safe": True}
