"""The README states what the code does: its settings table and its test command."""

from __future__ import annotations

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
