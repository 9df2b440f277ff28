"""The real browser of the page tests: Debian's chromium, driven headless by Playwright."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .components import CHROMIUM, require


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed at the end. Without the
    binary the test is skipped with the reason (components.py), or failed in CI."""
    path = require(CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: $CELERY_FAIR_ARTIFACTS (CI keeps it), else ``tmp_path``."""
    where = Path(os.environ.get("CELERY_FAIR_ARTIFACTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where
