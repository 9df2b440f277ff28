"""Throttles: hold a group back for a while, as after an HTTP 429 from a partner API. Part
of the control API (:mod:`celery_fair.controls` re-exports :func:`throttle`), and what a
:class:`~celery_fair.task.FairTask` calls as ``self.fair_throttle(seconds)``::

    @fair_task(group="tenant_id", bind=True)
    def call_partner(self, tenant_id, payload):
        response = partner.post(payload)
        if response.status_code == 429:
            self.fair_throttle(float(response.headers.get("Retry-After", 30)))
            raise self.retry(countdown=30)

The dispatchers pick nothing of the group until the throttle ends (a longer one already
in force is kept); running tasks go on. A group's rate limit (``fair limit --rate``)
throttles it the same way between its tokens (``store/throttling.py``). Each throttle is
recorded in the audit log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import audit
from .errors import InvalidControl
from .names import validate_group
from .queues import checked_queues
from .store import store_for
from .store.base import now_ms

__all__ = ["Throttle", "throttle"]


@dataclass(frozen=True)
class Throttle:
    """A throttle in force: nothing of ``group`` in ``queue`` is picked before
    ``until_ms``."""

    queue: str
    group: str
    until_ms: float

    def __str__(self) -> str:
        return (f"group {self.group} in queue {self.queue} throttled until "
                f"{audit.utc_text(int(self.until_ms))}")


def throttle_seconds(seconds: Any) -> float:
    """A throttle's duration, checked (a throttle always ends).

    Raises:
        InvalidControl: not above 0 and at most a year.
    """
    checked = audit.check_seconds(seconds, "throttle seconds") if seconds is not None else None
    if checked is None:
        raise InvalidControl("throttle seconds must be a number of seconds above 0, got None")
    return checked


def throttle(app: Any, group: Any, seconds: float, *,
             queue: str | Sequence[str] | None = None, reason: str | None = None,
             actor: Any = None) -> list[Throttle]:
    """Pick nothing of ``group`` in ``queue`` (default: every fair queue) for ``seconds``.

    Raises:
        InvalidGroup: ``group`` is not a group name.
        InvalidControl: ``seconds`` is not above 0 and at most a year, or ``actor`` or
            ``reason`` is not valid.
        UnknownQueue: a queue has never held a task.
        StoreError: the store failed.
    """
    group = validate_group(group)
    checked = throttle_seconds(seconds)
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    done = []
    for name in checked_queues(app, store, queue, False):
        until = store.throttle(name, group, now_ms() + checked * 1000)
        done.append(Throttle(name, group, until))
        audit.record(store, "throttle", {"queue": name, "group": group, "seconds": checked},
                     actor=who, reason=why, until_ms=int(until))
    return done
