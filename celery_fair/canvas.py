"""A ``group`` of fair tasks held in batches: ``group([...]).apply_async()`` (and a chord's
header) goes through the bulk hold (``bulk.py``) by itself.

Celery publishes a group's members one by one in ``group._apply_tasks``, each through its
own ``apply_async``, and offers no hook around the whole group. :func:`patch_groups` (run
by ``install``) wraps that method once per process: for an app with celery_fair
installed, the members are published inside :func:`~celery_fair.bulk_holds`, so their
fair messages are built as usual and held ``HOLD_BATCH`` per round trip once the last
is built (plain members go to the broker as before). Left as Celery does it: an app
without celery_fair, an eager app, a group published inside a bulk hold already (it
collects), and ``fair_on_store_error = "publish"`` (a bulk hold is never sent straight
to the broker, so each member keeps its own hold and its fallback).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from celery import Celery
from celery.canvas import group

from .bulk import bulk_holds
from .config import get_config
from .holding import COLLECTING

#: Marks the wrapper, so that the method is wrapped once per process.
_WRAPPED = "_celery_fair_bulk"


def patch_groups() -> None:
    """Wrap ``celery.canvas.group._apply_tasks`` (once) so that a group of an app with
    celery_fair installed holds its fair members in batches."""
    original = group._apply_tasks
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def _apply_tasks(self: Any, tasks: Any, producer: Any = None, app: Any = None,
                     *rest: Any, **options: Any) -> Iterator[Any]:
        target = app or self.app
        if not _bulk_for(target):
            yield from original(self, tasks, producer, app, *rest, **options)
            return
        with bulk_holds(target):
            yield from original(self, tasks, producer, app, *rest, **options)

    setattr(_apply_tasks, _WRAPPED, True)
    group._apply_tasks = _apply_tasks


def _bulk_for(app: Celery) -> bool:
    """Whether a group of ``app`` holds its fair members in batches."""
    return (getattr(app.amqp, "holds_fair_tasks", False) is True
            and not app.conf.task_always_eager
            and COLLECTING.get() is None and get_config(app).on_store_error != "publish")
