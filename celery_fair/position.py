"""Where a task stands, for people: ``celery_fair.position(app, task_id)``.

The same reads as ``fair inspect`` (:meth:`~celery_fair.store.base.Store.locate`, which
also finds a copy held under a suffixed id ``<task_id>~<n>``), as a small typed answer a
web page can show ("#12, about 40 s"). The state comes from one function,
:func:`state_of`, so a new state (a paused group) is added in one place.

The wait estimate (``eta_seconds``): the dispatches before the task, plus its own, over
the fair queue's recent release rate (the ``release_rate`` the dispatcher's summary keeps,
smoothed over about 30 s). In a steady queue releases and dispatches keep pace. It
assumes the current backlog, unit costs and no new arrivals, like ``dispatches_ahead``;
None when there is no basis: no live dispatcher summary, no releases lately (rate 0),
or the task is not held.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .store.base import Location, Store

#: The states a position has besides a dispatch's own ("picked", "queued", "running").
HELD, DELAYED, DISPATCHED, NOT_HELD = "held", "delayed", "dispatched", "not held"


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a task stands in its fair queue.

    ``in_group``: its 1-based place among its group's held messages of its class (0 once
    dispatched, None when not held or not known); ``groups_ahead``: groups ranked before
    its group in the ready set (None when its group waits at its cap, or not held);
    ``dispatches_ahead``: about how many dispatches come before it (a lower bound when
    ``lower_bound``); ``eta_seconds``: the estimated wait (see the module docstring);
    ``state``: "held", "delayed", "dispatched" (picked, queued or running) or "not held"
    (finished, cancelled or never published fair).
    """

    in_group: int | None
    groups_ahead: int | None
    dispatches_ahead: int | None
    eta_seconds: float | None
    state: str
    queue: str | None = None
    group: str | None = None
    lower_bound: bool = False

    def as_json(self) -> dict[str, Any]:
        """The JSON document the web endpoints answer."""
        return dataclasses.asdict(self)


def position(app: Any, task_id: str) -> Position:
    """Where ``task_id`` stands in any fair queue of ``app`` (reads only).

    Raises:
        ValueError: ``task_id`` is not a non-empty string.
        StoreError: the store could not be read.
    """
    from .store import store_for

    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError(f"task_id {task_id!r}: expected a non-empty task id string")
    store = store_for(app)
    return position_of(store, store.locate(task_id))


def position_of(store: Store, where: Location | None) -> Position:
    """The :class:`Position` of what ``locate`` found (``where``)."""
    state = state_of(where)
    if where is None:
        return Position(None, None, None, None, state)
    if state == DISPATCHED:
        return Position(0, None, 0, 0.0, state, where.queue, where.group)
    place = where.place
    if place is None:  # delayed: not in its group's list until it is due
        return Position(None, None, None, None, state, where.queue, where.group)
    return Position(place.position, place.groups_ahead, place.dispatches_before,
                    _eta(store, where.queue, place.dispatches_before), state,
                    where.queue, where.group, place.estimate_is_lower_bound)


def state_of(where: Location | None) -> str:
    """The position's state: the one place a new state (a pause) is told."""
    if where is None:
        return NOT_HELD
    if where.state in (HELD, DELAYED):
        return where.state
    return DISPATCHED  # picked, queued or running


def _eta(store: Store, queue: str, before: int) -> float | None:
    doc = store.summaries([queue]).get(queue)
    rate = json.loads(doc).get("release_rate") if doc else None
    if not rate or rate <= 0:
        return None
    return round((before + 1) / float(rate), 1)
