"""The README and the docs state what the code does; the docs build without a warning."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from celery_fair.cli import fair, main
from celery_fair.config import SETTINGS, settings_table

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _between(marker: str) -> str:
    start = README.index(f"<!-- {marker} -->") + len(f"<!-- {marker} -->")
    return README[start:README.index(f"<!-- /{marker} -->")].strip()


def test_readme_settings_table_is_generated_from_the_code():
    assert _between("settings-table") == settings_table()


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "test-command" in ci
    assert "pytest" in _between("test-command")


def test_tox_covers_every_supported_celery_and_ci_runs_the_oldest():
    root = Path(__file__).parent.parent
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    assert '"celery[redis]>=5.3,<5.4" "kombu>=5.3.4,<5.4"' in ci
    tox = (root / "tox.ini").read_text(encoding="utf-8")
    envlist = next(line for line in tox.splitlines() if line.startswith("envlist"))
    assert all(f"celery5{minor}" in envlist for minor in range(3, 8))
    assert all(env in envlist for env in ("lint", "type", "docs"))
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"celery(\[redis\])?>=5\.3,<6"', pyproject)
    assert "celery53: celery[redis]>=5.3,<5.4" in tox and "celery53: kombu>=5.3.4,<5.4" in tox


def test_docs_build_with_warnings_as_errors(tmp_path):
    # What `tox -e docs` runs: any warning (a broken reference, a bad docstring, a page in
    # no toctree, a setting linked that the code does not have) fails the build.
    out = tmp_path / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    # The reference pages are generated from the code: every setting and every command.
    settings = (out / "settings.html").read_text(encoding="utf-8")
    assert all(f'id="confval-{s.name}"' in settings for s in SETTINGS)
    cli = (out / "cli.html").read_text(encoding="utf-8")
    for group, section in ((fair, "celery-a-proj-fair"), (main, "celery-fair")):
        assert all(f'<section id="{section}-{name}"' in cli for name in group.commands)
