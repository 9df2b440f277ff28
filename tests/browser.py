"""The real browser of the page tests: Debian's chromium, driven headless by Playwright."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("CELERY_FAIR_CHROMIUM", "/usr/bin/chromium")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed at the end; the test fails
    (never skips) when the binary is missing: CI installs it."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: this test needs Debian's chromium "
                    "(apt-get install -y chromium) or CELERY_FAIR_CHROMIUM=<path>")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: $CELERY_FAIR_ARTIFACTS (CI keeps it), else ``tmp_path``."""
    where = Path(os.environ.get("CELERY_FAIR_ARTIFACTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where
