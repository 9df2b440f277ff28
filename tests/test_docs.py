"""The README states what the code does: its settings table and its test command."""

from __future__ import annotations

import re
from pathlib import Path

from celery_fair.config import settings_table

README = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")


def _between(marker: str) -> str:
    start = README.index(f"<!-- {marker} -->") + len(f"<!-- {marker} -->")
    return README[start:README.index(f"<!-- /{marker} -->")].strip()


def test_readme_settings_table_is_generated_from_the_code():
    assert _between("settings-table") == settings_table()


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "test-command" in ci
    assert "pytest" in _between("test-command")


def test_tox_covers_every_supported_celery():
    # CI runs the newest; running the oldest (5.3) in CI too is pending (issue 3).
    root = Path(__file__).parent.parent
    tox = (root / "tox.ini").read_text(encoding="utf-8")
    envlist = next(line for line in tox.splitlines() if line.startswith("envlist"))
    assert all(f"celery5{minor}" in envlist for minor in range(3, 8))
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"celery(\[redis\])?>=5\.3,<6"', pyproject)
