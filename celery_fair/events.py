"""One DEBUG line per task event, in one shape wherever it happens.

``fair <event> task=<task id> group=<group> queue=<fair queue> <more key=value>``, for
``hold`` (the publishing process), ``dispatch`` (the dispatcher), ``begin-skip`` and
``release`` (the worker): grep a task id across the logs of every process and its life
reads in order. Each line goes to the logger of the process side that does it
(``celery_fair.task``, ``celery_fair.dispatcher``, ``celery_fair.worker``), so those
names keep filtering as they did. A leaf module: every side imports it.

Off at INFO and above at the price of one ``isEnabledFor`` call; callers whose arguments
cost something to work out (a decode) ask :func:`enabled` first.
"""

from __future__ import annotations

import logging
from typing import Any

HOLD, DISPATCH, BEGIN_SKIP, RELEASE = "hold", "dispatch", "begin-skip", "release"


def enabled(logger: logging.Logger) -> bool:
    """Whether ``logger`` writes event lines (DEBUG)."""
    return logger.isEnabledFor(logging.DEBUG)


def log_event(logger: logging.Logger, event: str, task_id: Any, group: Any, queue: Any,
              **more: Any) -> None:
    """Write one event line to ``logger`` at DEBUG; ``more`` adds ``key=value`` fields
    in the order given (a None value is left out)."""
    if not logger.isEnabledFor(logging.DEBUG):
        return
    extra = "".join(f" {key}={value}" for key, value in more.items() if value is not None)
    logger.debug("fair %s task=%s group=%s queue=%s%s", event, task_id or "-", group or "-",
                 queue or "-", extra)
