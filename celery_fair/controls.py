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

    controls.held(app, "acme", limit=20)                   # what acme waits with
    controls.purge(app, "acme", klass="background")        # drop its backlog: REVOKED

Later controls (pausing a group, boosting one) belong here too, one function each.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from . import limits
from .envelope import Envelope
from .errors import CorruptMessage, InvalidLimit, InvalidOption, UnknownQueue
from .names import validate_group
from .queues import known_queues as _known_queues
from .queues import unknown_queues_message
from .revoke import Cancelled, mark_revoked
from .store import store_for
from .store.base import KEEP, RESET, Store

__all__ = ["UNCHANGED", "HeldTask", "Limit", "Unchanged", "held", "held_count",
           "known_queues", "limit", "parse_concurrency", "parse_weight", "purge"]


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
          reset: bool = False, create: bool = False) -> list[Limit]:
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

    Returns:
        The limits in force afterwards, one per queue.

    Raises:
        InvalidGroup: ``group`` is not a group name.
        InvalidLimit: a number is out of range, or ``reset`` is combined with one.
        UnknownQueue: a queue has never held a task (and ``create`` is false), or no
            queue is named and none exists yet.
        StoreError: the store failed (some queues may have been changed then).
    """
    group = validate_group(group)
    cap_arg, weight_arg = _limit_args(group, concurrency, weight, reset)
    store = store_for(app)
    return [Limit(name, group, *store.limit(name, group, cap_arg, weight_arg))
            for name in _queues(app, store, queue, create)]


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


# -- a group's held tasks: list them (`fair held`), purge them (`fair purge`) -------------

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
          klass: str | None = None, batch: int = PURGE_BATCH) -> list[Cancelled]:
    """Remove every task ``group`` holds (waiting; in ``klass`` only when given) and mark
    each REVOKED in the result backend, as ``revoke()`` of a held task does (chords and
    errbacks behave alike): ``fair cancel`` of the group's held ids, ``batch`` at a time.
    Delayed tasks (countdown/ETA not reached) and dispatched or running ones are left:
    their slots are not touched. Returns what was removed.

    Raises:
        what :func:`held` raises; StoreError when the store failed (the tasks removed
        until then are REVOKED).
    """
    group, code = validate_group(group), _class_code(klass)
    limits.cap(batch, "purge batch", 1)
    store = store_for(app)
    done: list[Cancelled] = []
    for name in _listed_queues(app, store, queue):
        while True:
            listed = store.held_messages(name, group, batch, code)
            ids = sorted({m.hold_id.split("~")[0] for m in listed})
            removed = store.cancel(name, ids) if ids else []
            done += [mark_revoked(app, name, hold_id, value) for hold_id, value in removed]
            # a short batch was the last; none removed: the rest was dispatched meanwhile
            if len(listed) < batch or not removed:
                break
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
    return store.queues() if queue is None else _queues(app, store, queue, False)


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
