"""A group's held tasks: list them (``fair held``), purge them (``fair purge``).

Part of the control API (:mod:`celery_fair.controls` exports these names): checked before
anything is read or removed, and a purge is recorded in the audit log.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import audit, limits
from .envelope import Envelope
from .errors import CorruptMessage, InvalidLimit, InvalidOption
from .names import validate_group
from .queues import checked_queues
from .revoke import Cancelled, mark_revoked
from .store import store_for
from .store.base import Store

__all__ = ["CLASSES", "MAX_LISTED", "PURGE_BATCH", "HeldTask", "held", "held_count", "purge"]

#: Most messages one step of :func:`purge` reads and cancels (one store call each).
PURGE_BATCH = 500
#: Most tasks :func:`held` lists.
MAX_LISTED = 100_000
#: What ``klass`` takes -> the store's class.
CLASSES = {"interactive": "i", "background": "b"}


@dataclass(frozen=True)
class HeldTask:
    """A task waiting in its group (``age``: seconds since it was held or became due;
    None for a message without the time)."""

    task_id: str
    hold_id: str
    queue: str
    group: str
    klass: str  # "interactive" or "background"
    name: str
    age: float | None

    def as_json(self) -> dict[str, Any]:
        """As ``fair held --json`` prints it (``klass`` under the key "class")."""
        doc = dataclasses.asdict(self)
        doc["class"] = doc.pop("klass")
        return doc


def held(app: Any, group: Any, *, queue: str | Sequence[str] | None = None,
         klass: str | None = None, limit: int = 100) -> list[HeldTask]:
    """Up to ``limit`` tasks ``group`` holds (waiting, not delayed, not dispatched), per
    queue interactive first, each class head first: the next to run first.

    Raises:
        InvalidGroup: ``group`` is not a group name.
        InvalidLimit: ``limit`` is not from 1 to :data:`MAX_LISTED`.
        InvalidOption: ``klass`` is not ``'interactive'``/``'background'``/None.
        UnknownQueue: a queue named is not a known fair queue.
    """
    group, code = validate_group(group), _class_code(klass)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LISTED:
        raise InvalidLimit(f"limit must be an integer from 1 to {MAX_LISTED:_}, "
                           f"got {limit!r}")
    store, now = store_for(app), time.time()
    out: list[HeldTask] = []
    for name in _listed_queues(app, store, queue):
        for m in store.held_messages(name, group, limit - len(out), code):
            out.append(_held_task(name, group, m.hold_id, m.klass, m.value, now))
        if len(out) >= limit:
            break
    return out


def purge(app: Any, group: Any, *, queue: str | Sequence[str] | None = None,
          klass: str | None = None, batch: int = PURGE_BATCH, actor: Any = None,
          reason: Any = None) -> list[Cancelled]:
    """Remove every task ``group`` holds (waiting; in ``klass`` only when given) and mark
    each REVOKED in the result backend, as ``revoke()`` of a held task does (chords and
    errbacks behave alike): ``fair cancel`` of the group's held ids, ``batch`` at a time.
    Delayed tasks (countdown/ETA not reached) and dispatched or running ones are left:
    their slots are not touched. Returns what was removed. The audit log records the
    purge (``actor``: who, default the OS user; ``reason``: why), one entry per queue.

    Raises:
        what :func:`held` raises; StoreError when the store failed (the tasks removed
        until then are REVOKED).
    """
    group, code = validate_group(group), _class_code(klass)
    limits.cap(batch, "purge batch", 1)
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    done: list[Cancelled] = []
    for name in _listed_queues(app, store, queue):
        before = len(done)
        while True:
            listed = store.held_messages(name, group, batch, code)
            ids = sorted({m.hold_id.split("~")[0] for m in listed})
            removed = store.cancel(name, ids) if ids else []
            done += [mark_revoked(app, name, hold_id, value) for hold_id, value in removed]
            # a short batch was the last; none removed: the rest was dispatched meanwhile
            if len(listed) < batch or not removed:
                break
        audit.record(store, "purge", {"queue": name, "group": group, "class": klass,
                                      "removed": len(done) - before}, actor=who, reason=why)
    return done


def held_count(app: Any, group: Any, *, queue: str | Sequence[str] | None = None,
               klass: str | None = None) -> int:
    """How many tasks :func:`purge` would remove now (what its confirmation shows)."""
    group, code = validate_group(group), _class_code(klass)
    store, count = store_for(app), 0
    for name in _listed_queues(app, store, queue):
        for f in store.group_figures(name, [group]):
            count += (f.held_interactive if code != "b" else 0) + \
                (f.held_background if code != "i" else 0)
    return count


def _class_code(klass: str | None) -> str | None:
    if klass is not None and klass not in CLASSES:
        raise InvalidOption(f"class {klass!r} is invalid: expected 'interactive', "
                           "'background' or None (both)")
    return None if klass is None else CLASSES[klass]


def _listed_queues(app: Any, store: Store, queue: str | Sequence[str] | None) -> list[str]:
    """The queues named (checked), or every queue that has held a task."""
    return store.queues() if queue is None else checked_queues(app, store, queue, False)


def _held_task(queue: str, group: str, hold_id: str, klass: str, value: bytes,
               now: float) -> HeldTask:
    try:
        _, _, envelope = Envelope.decode(value)
        name, due = str(envelope.headers.get("task", "?")), envelope.due_at
    except CorruptMessage:
        name, due = "?", None
    return HeldTask(hold_id.split("~")[0], hold_id, queue, group,
                    "interactive" if klass == "i" else "background", name,
                    None if due is None else max(0.0, round(now - due, 3)))
