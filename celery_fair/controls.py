"""The control API: what an operator changes at runtime, for every dispatcher at once.

``celery -A proj fair limit`` and the Django admin page both call these functions, so a
change is validated, refused and reported the same way wherever it is made. Each
function checks everything it is given (the group name, the numbers through
:mod:`celery_fair.limits`, the queues against the store's) and raises before writing
anything, so a bad request changes nothing::

    from celery_fair import controls

    controls.limit(app, "acme", concurrency=2)             # every fair queue
    controls.limit(app, "acme", queue="reports", weight=0.5)
    controls.limit(app, "acme", concurrency=None)          # no cap
    controls.limit(app, "acme", reset=True)                # the settings apply again

Later controls (pausing a group, boosting one) belong here too, one function each.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from . import audit, limits
from .errors import InvalidLimit, UnknownQueue
from .names import validate_group
from .queues import known_queues as _known_queues
from .queues import unknown_queues_message
from .store import store_for
from .store.base import KEEP, RESET, Store

__all__ = ["UNCHANGED", "Limit", "Unchanged", "known_queues", "limit", "parse_concurrency",
           "parse_weight"]


class Unchanged(enum.Enum):
    """The type of :data:`UNCHANGED`."""

    UNCHANGED = "unchanged"


#: A limit argument left as it is (the default of every limit argument).
UNCHANGED = Unchanged.UNCHANGED

#: What ``concurrency`` takes: a cap, None for no cap, or :data:`UNCHANGED`.
Concurrency = Union[int, None, Unchanged]
#: What ``weight`` takes: a weight or :data:`UNCHANGED`.
Weight = Union[float, Unchanged]


@dataclass(frozen=True)
class Limit:
    """A group's limits in force in one fair queue after a change (``cap`` None: no cap)."""

    queue: str
    group: str
    cap: int | None
    weight: float

    def __str__(self) -> str:
        cap = "no cap" if self.cap is None else f"cap {self.cap}"
        return f"group {self.group} in queue {self.queue}: {cap}, weight {self.weight:g}"


def limit(app: Any, group: Any, *, queue: str | Sequence[str] | None = None,
          concurrency: Concurrency = UNCHANGED, weight: Weight = UNCHANGED,
          reset: bool = False, create: bool = False, actor: Any = None,
          reason: str | None = None) -> list[Limit]:
    """Set ``group``'s runtime cap and weight in ``queue`` (default: every fair queue).

    Runtime limits take precedence over ``fair_group_concurrency`` and
    ``fair_group_weights`` and survive dispatcher restarts. With neither number nor
    ``reset``, nothing changes and the limits in force are returned.

    Parameters:
        app: the Celery app whose fair queues are changed.
        group: the group (a tenant id, a user id).
        queue: a fair queue or several; None: every fair queue that has held a task.
        concurrency: most tasks of the group in flight, from 0 (pauses it) to
            :data:`~celery_fair.limits.MAX_CAP`; None: no cap.
        weight: its share of dispatches relative to other groups (default weight 1).
        reset: drop the group's runtime cap and weight (the settings apply again).
        create: accept a queue that has not held a task yet (limits set ahead of work).
        actor: who makes the change, for the audit log (a name, or a Django user);
            None: the OS user.
        reason: why, for the audit log (at most :data:`~celery_fair.audit.MAX_REASON`
            characters).

    Returns:
        The limits in force afterwards, one per queue. A change (not a plain read) is
        recorded in the audit log (:mod:`celery_fair.audit`), one entry per queue.

    Raises:
        InvalidGroup: ``group`` is not a group name.
        InvalidLimit: a number is out of range, or ``reset`` is combined with one.
        InvalidControl: ``actor`` or ``reason`` is not valid.
        UnknownQueue: a queue has never held a task (and ``create`` is false), or no
            queue is named and none exists yet.
        StoreError: the store failed (some queues may have been changed then).
    """
    group = validate_group(group)
    cap_arg, weight_arg = _limit_args(group, concurrency, weight, reset)
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    done = []
    for name in _queues(app, store, queue, create):
        done.append(Limit(name, group, *store.limit(name, group, cap_arg, weight_arg)))
        if (cap_arg, weight_arg) != (KEEP, KEEP):  # a read changes nothing: not logged
            audit.record(store, "limit", _limit_record(done[-1], cap_arg, weight_arg),
                         actor=who, reason=why)
    return done


def _limit_record(after: Limit, cap: int | str, weight: float | str) -> dict[str, Any]:
    """What the audit log keeps of a limit change: what was asked and what is in force."""
    asked: dict[str, Any] = {"reset": True} if cap == RESET else {}
    if cap not in (KEEP, RESET):
        asked["concurrency"] = None if cap == -1 else cap
    if weight not in (KEEP, RESET):
        asked["weight"] = weight
    return {"queue": after.queue, "group": after.group, **asked,
            "in_force": {"cap": after.cap, "weight": after.weight}}


def known_queues(app: Any) -> list[str]:
    """Every known fair queue of ``app`` (held a task, or declared by the app:
    :mod:`celery_fair.queues`), sorted."""
    return _known_queues(app, store_for(app))


def parse_concurrency(text: str, what: str = "concurrency") -> Concurrency:
    """A concurrency typed by a person: an integer, ``none`` (no cap), or blank
    (:data:`UNCHANGED`).

    Raises:
        InvalidLimit: naming ``what``, the accepted values and ``text``.
    """
    text = text.strip()
    if not text:
        return UNCHANGED
    if text.lower() == "none":
        return None
    try:
        return limits.cap(int(text) if text.isdigit() else text, what)
    except InvalidLimit as exc:
        raise InvalidLimit(f"{exc} (or 'none')") from None


def parse_weight(text: str, what: str = "weight") -> Weight:
    """A weight typed by a person (a number), or blank (:data:`UNCHANGED`).

    Raises:
        InvalidLimit: naming ``what``, the accepted range and ``text`` as typed.
    """
    text = text.strip()
    if not text:
        return UNCHANGED
    try:
        number: Any = float(text)
    except ValueError:
        number = text
    try:
        return limits.weight(number, what)
    except InvalidLimit as exc:  # named as typed (1e7, not 10000000.0)
        raise InvalidLimit(f"{str(exc).rpartition(', got ')[0]}, got {text}") from None


def _limit_args(group: str, concurrency: Concurrency, weight: Weight,
                reset: bool) -> tuple[int | str, float | str]:
    """The checked arguments of :meth:`Store.limit` (cap -1: no cap)."""
    if reset:
        if concurrency is not UNCHANGED or weight is not UNCHANGED:
            raise InvalidLimit(f"reset of group {group!r} cannot be combined with a "
                               "concurrency or a weight: reset, then set")
        return RESET, RESET
    cap: int | str = KEEP
    if concurrency is None:
        cap = -1
    elif not isinstance(concurrency, Unchanged):
        cap = limits.cap(concurrency, f"concurrency for group {group!r}")
    number: float | str = KEEP
    if not isinstance(weight, Unchanged):
        number = limits.weight(weight, f"weight for group {group!r}")
    return cap, number


def _queues(app: Any, store: Store, queue: str | Sequence[str] | None,
            create: bool) -> list[str]:
    """The queues named, checked against the known ones; when none is named, every queue
    that has held a task."""
    if queue is None:
        every = store.queues()
        if not every:
            raise UnknownQueue("no fair queue has held a task yet: name the queue to set "
                               "limits ahead of its first task")
        return every
    known = _known_queues(app, store)
    names = [queue] if isinstance(queue, str) else list(queue)
    if not names:
        raise UnknownQueue("no fair queue named: name one, or none for all of them")
    unknown = [name for name in names if name not in known]
    if unknown and not create:
        raise UnknownQueue(unknown_queues_message(
            unknown, known, "; to set limits before its first task, add --create"))
    return names
