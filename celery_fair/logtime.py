"""Log timestamps in UTC, in ``celery fair dispatch`` and in workers that load celery_fair.

A dispatcher and its workers often run on hosts set to different zones, and Celery stamps
a log line with the local time and no zone, so lines from two processes cannot be put in
order. With ``fair_log_utc`` (the default) the formatters of the process's log handlers
read the time with ``time.gmtime`` and, unless a date format was chosen
(``worker_log_datefmt``), write it as ISO 8601 with a ``Z``:
``[2026-11-26T05:36:54.123Z: INFO/MainProcess] ...``. ``fair_log_utc = False`` leaves
Celery's local time.

A worker decides at ``worker_init`` (before Celery sets up its logging) and the
``after_setup_logger`` / ``after_setup_task_logger`` receivers convert the handlers
Celery then makes (a worker whose logging the app sets up itself, through Celery's
``setup_logging`` signal, keeps it as it is); the dispatcher command converts the
handlers it set up. Nothing else is touched: a worker embedded in a test process
(``celery.contrib.testing``) leaves the process's handlers alone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import signals

#: ISO 8601, the way ``logging.Formatter.formatTime`` puts it together.
ISO_TIME_FORMAT, ISO_MSEC_FORMAT = "%Y-%m-%dT%H:%M:%S", "%s.%03dZ"

_wanted = False  # set by log_in_utc: whether this process logs in UTC


def log_in_utc(wanted: bool, *, existing: bool = True) -> None:
    """With ``wanted``, make this process log in UTC: the handlers Celery sets up from now
    on and, with ``existing``, those the root logger has now."""
    global _wanted
    _wanted = wanted
    if wanted and existing:
        utc_handlers(logging.getLogger())


def utc_handlers(logger: logging.Logger) -> None:
    """Stamp the records of ``logger``'s handlers in UTC (see the module docstring)."""
    for handler in logger.handlers:
        if handler.formatter is not None:
            utc_formatter(handler.formatter)


def utc_formatter(formatter: logging.Formatter) -> None:
    formatter.converter = time.gmtime
    if formatter.datefmt is None:  # a chosen date format stays; only the clock changes
        formatter.default_time_format = ISO_TIME_FORMAT
        formatter.default_msec_format = ISO_MSEC_FORMAT


@signals.after_setup_logger.connect(weak=False)
@signals.after_setup_task_logger.connect(weak=False)
def _on_setup_logger(sender: Any = None, logger: logging.Logger | None = None,
                     **_: Any) -> None:
    if _wanted and logger is not None:
        utc_handlers(logger)
