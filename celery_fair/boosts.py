"""Boosts (``celery -A proj fair boost``), part of the control API (:mod:`celery_fair.controls`
re-exports these functions) kept in a module of its own, as :mod:`celery_fair.backlog`::

    from celery_fair import controls

    controls.boost(app, "acme", weight=10, for_seconds=3600, reason="launch day")
    controls.unboost(app, "acme")              # the configured weight again, at once
    controls.boost_task(app, task_id)          # this held task next in its class, once

A group boost is kept apart from the group's limits (``store/boosting.py``): while it
lasts, the pick uses its weight; when it ends (its time, at a dispatcher's next step:
:func:`expire_boosts`, or :func:`unboost`) the weight in force is the configured one
(the settings or ``fair limit``, whatever it is then): nothing is saved or restored.
Each change and each expiry is recorded in the audit log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import audit, limits
from .errors import InvalidControl
from .names import validate_group
from .queues import checked_queues
from .store import store_for
from .store.base import Store, now_ms

__all__ = ["Boost", "TaskBoost", "boost", "boost_task", "expire_boosts", "unboost"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Boost:
    """A boost set (``weight``, until ``until_ms``: None no end) or ended (``weight``
    None) of ``group`` in ``queue``."""

    queue: str
    group: str
    weight: float | None = None
    until_ms: int | None = None

    def __str__(self) -> str:
        what = f"group {self.group} in queue {self.queue}"
        if self.weight is None:
            return what
        until = "" if self.until_ms is None else f" until {audit.utc_text(self.until_ms)}"
        return f"{what}: weight {self.weight:g}{until}"


def boost(app: Any, group: Any, *, weight: Any, queue: str | Sequence[str] | None = None,
          for_seconds: float | None = None, reason: str | None = None,
          actor: Any = None) -> list[Boost]:
    """Pick ``group`` with ``weight`` in ``queue`` (default: every fair queue) for
    ``for_seconds`` (None: until :func:`unboost`); a boost again replaces the last. The
    group's limits (``fair limit``, the settings) are not touched.

    Returns:
        The boosts set, one per queue. Each is recorded in the audit log.

    Raises:
        InvalidGroup, InvalidLimit (the weight), InvalidControl (a duration, actor or
        reason), UnknownQueue: nothing written.
    """
    g = validate_group(group)
    number = limits.weight(weight, f"boost weight for group {g!r}")
    seconds = audit.check_seconds(for_seconds)
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    names = checked_queues(app, store, queue, False, "")
    until = None if seconds is None else now_ms() + int(seconds * 1000)
    done = []
    for name in names:
        store.boost(name, g, number, until)
        done.append(Boost(name, g, number, until))
        audit.record(store, "boost", {"queue": name, "group": g, "weight": number,
                                      "for_seconds": seconds},
                     actor=who, reason=why, until_ms=until)
    return done


def unboost(app: Any, group: Any, *, queue: str | Sequence[str] | None = None,
            reason: str | None = None, actor: Any = None) -> list[Boost]:
    """End :func:`boost` of ``group`` in ``queue`` (default: every fair queue) now.

    Returns:
        The boosts ended (a queue where it was not boosted is left out), each recorded
        in the audit log.

    Raises:
        As :func:`boost`.
    """
    g = validate_group(group)
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    names = checked_queues(app, store, queue, False, "")
    done = [Boost(name, g) for name in names if store.unboost(name, g)]
    for ended in done:
        audit.record(store, "unboost", {"queue": ended.queue, "group": g},
                     actor=who, reason=why)
    return done


@dataclass(frozen=True)
class TaskBoost:
    """A held task moved to the front (:func:`boost_task`)."""

    task_id: str
    queue: str
    group: str

    def __str__(self) -> str:
        return f"task {self.task_id}: front of group {self.group} in queue {self.queue}"


def boost_task(app: Any, task_id: Any, *, reason: str | None = None,
               actor: Any = None) -> TaskBoost:
    """Move the held task ``task_id`` to the front of its group, and its group to the
    front of its class's ready set once: it is dispatched next in its class (unless its
    group is capped or paused: then first of its group when it may run again).

    Returns:
        Where it is. Recorded in the audit log.

    Raises:
        InvalidControl: ``task_id`` is not a held task (delayed, dispatched, unknown, or
        only held as a copy under a suffixed id): nothing changed.
    """
    if not isinstance(task_id, str) or not task_id.strip():
        raise InvalidControl(f"task id must be a non-empty text, got {task_id!r}")
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    where = store.locate(task_id)
    group = where and where.state == "held" and store.boost_task(where.queue, task_id)
    if not where or not group:
        state = "unknown to the fair queues" if where is None else where.state
        raise InvalidControl(f"task {task_id!r} is not held ({state}): only a held task "
                             "can be boosted")
    audit.record(store, "boost", {"queue": where.queue, "group": group, "task": task_id},
                 actor=who, reason=why)
    return TaskBoost(task_id, where.queue, group)


def expire_boosts(store: Store, queue: str, now: int, actor: str) -> list[str]:
    """End the due boosts of ``queue`` and record each (``expire``, ``"of": "boost"``):
    the dispatcher's part (``pauses.PauseExpiry``), once per second. The store ends each
    once, so among several dispatchers one records it."""
    ended = store.expire_boosts(queue, now)
    for g in ended:
        logger.info("celery_fair: boost of group %s in queue %s ended", g, queue)
        audit.record(store, "expire", {"queue": queue, "group": g, "of": "boost"},
                     actor=actor)
    return ended
