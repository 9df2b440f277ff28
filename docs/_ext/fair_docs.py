"""Sphinx directives of the celery-fair docs (reStructuredText; in a MyST page wrap them
in an ``{eval-rst}`` block).

``fair-settings``
    Renders ``celery_fair.config.SETTINGS`` — the table the code validates ``app.conf``
    against — as a summary table plus one ``confval`` entry per setting, so a setting added
    to the code appears in the docs by itself and ``{confval}`fair_x``` links to it (an
    unknown name is a warning, which the ``-W`` build turns into a failure).

``optional-toctree``
    A toctree of the listed pages that exist: pages other branches add later (the
    benchmark report) join the site when they land and are simply absent before.

Tags ``metrics`` (and so on, see :data:`FEATURES`) are set when the module providing the
feature exists, so pages describe a feature with ``{only} metrics`` and say it is not
there yet with ``{only} not metrics`` — true to the code either way.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util.docutils import SphinxDirective

from celery_fair import config
from celery_fair.config import SETTINGS

#: Sphinx tag → the module whose presence means the feature is built.
FEATURES = {"metrics": "celery_fair.metrics"}

_RST_SPECIAL = re.compile(r"([\\`*_|\[\]<>])")


def _escape(text: str) -> str:
    """Plain text as reStructuredText that renders it verbatim."""
    return _RST_SPECIAL.sub(r"\\\1", text)


def settings_rst() -> list[str]:
    """The reStructuredText of the settings summary table and reference entries."""
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 30 20 50",
        "",
        "   * - setting",
        "     - default",
        "     - meaning",
    ]
    for s in SETTINGS:
        lines += [
            f"   * - :confval:`{s.name}`",
            f"     - ``{s.default!r}``",
            f"     - {_escape(s.doc.split('. ')[0].rstrip('.'))}.",
        ]
    lines.append("")
    for s in SETTINGS:
        lines += [
            f".. confval:: {s.name}",
            f"   :default: ``{s.default!r}``",
            "",
            f"   {_escape(s.doc)}",
            "",
        ]
    return lines


class FairSettings(SphinxDirective):
    """Every ``fair_*`` setting, from the code's SETTINGS table."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        # Re-read the page when the settings table changes (incremental builds).
        self.env.note_dependency(config.__file__)
        return self.parse_text_to_nodes("\n".join(settings_rst()))


class OptionalToctree(SphinxDirective):
    """A toctree of the listed documents that exist in the source tree."""

    has_content = True
    option_spec = {"caption": directives.unchanged, "maxdepth": directives.positive_int}

    def run(self) -> list[nodes.Node]:
        srcdir = Path(self.env.srcdir)
        present = []
        for name in filter(None, (line.strip() for line in self.content)):
            paths = [srcdir / f"{name}{suffix}" for suffix in self.config.source_suffix]
            for path in paths:
                # Re-read this page when a listed page appears (a missing dependency
                # always counts as changed), so incremental builds pick it up too.
                self.env.note_dependency(str(path))
            if any(path.exists() for path in paths):
                present.append(name)
        if not present:
            return []
        lines = [".. toctree::"]
        if "caption" in self.options:
            lines.append(f"   :caption: {self.options['caption']}")
        lines.append(f"   :maxdepth: {self.options.get('maxdepth', 2)}")
        lines += ["", *(f"   {name}" for name in present)]
        return self.parse_text_to_nodes("\n".join(lines))


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _feature_tags(app: Sphinx, config: Config) -> None:
    for tag, module in FEATURES.items():
        if _module_exists(module):
            app.tags.add(tag)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", _feature_tags)
    app.add_directive("fair-settings", FairSettings)
    app.add_directive("optional-toctree", OptionalToctree)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
