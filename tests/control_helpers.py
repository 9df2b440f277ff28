"""Shared by the control tests (tests/test_audit.py, tests/test_pause.py): the ``fair``
CLI run in-process, and an app whose fair queue exists."""

from __future__ import annotations

from typing import Any

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_fair.cli import fair


def cli(app: Any, *args: str) -> Result:
    """``celery -A app fair ARGS`` in this process."""
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(fair, list(args), obj=obj, catch_exceptions=False)


@pytest.fixture(name="held")
def held_fixture(app: Any) -> Any:
    """acme holds a task in the app's fair queue: the queue exists."""
    app.tasks["proj.work"].delay("acme", "x")
    return app
