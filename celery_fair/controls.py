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
    controls.limit(app, "acme", rate="10/s", burst=20)     # rate limit (None: none)
    controls.limit(app, "acme", reset=True)                # the settings apply again

    controls.held(app, "acme", limit=20)                   # what acme waits with
    controls.purge(app, "acme", klass="background")        # drop its backlog: REVOKED
    controls.pause(app, "acme", for_seconds=3600, reason="incident 42")
    controls.resume(app, "acme")
    controls.pause(app, queue="reports")                   # the whole queue
    controls.boost(app, "acme", weight=10, for_seconds=3600)  # boosts.py
    controls.unboost(app, "acme")
    controls.boost_task(app, task_id)                      # to the front, once
    controls.throttle(app, "acme", 30)                     # nothing picked for 30 s

Every change is recorded in the audit log (:mod:`celery_fair.audit`, ``fair audit``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from . import audit, limits
from .backlog import CLASSES, MAX_LISTED, PURGE_BATCH, HeldTask, held, held_count, purge
from .boosts import Boost, TaskBoost, boost, boost_task, unboost
from .errors import InvalidControl, InvalidLimit, UnknownQueue
from .names import validate_group
from .queues import checked_queues
from .queues import known_queues as _known_queues
from .store import store_for
from .store.base import KEEP, RESET, now_ms
from .store.pausing import WHOLE_QUEUE
from .throttles import Throttle, throttle

__all__ = ["CLASSES", "MAX_LISTED", "MAX_PAUSE_SECONDS", "PURGE_BATCH", "UNCHANGED",
           "Boost", "HeldTask", "Limit", "Pause", "TaskBoost", "Unchanged", "boost",
           "boost_task", "held", "held_count", "known_queues", "limit", "parse_burst",
           "parse_concurrency", "parse_duration", "parse_rate", "parse_weight", "pause",
           "purge", "resume", "throttle", "Throttle", "unboost"]


class Unchanged(enum.Enum):
    """The type of :data:`UNCHANGED`."""

    UNCHANGED = "unchanged"


#: A limit argument left as it is (the default of every limit argument).
UNCHANGED = Unchanged.UNCHANGED

#: What ``concurrency`` takes: a cap, None for no cap, or :data:`UNCHANGED`.
Concurrency = Union[int, None, Unchanged]
#: What ``weight`` takes: a weight or :data:`UNCHANGED`.
Weight = Union[float, Unchanged]
#: What ``rate`` takes: a rate ('10/s', a number a second, a Rate), None for no rate
#: limit, or :data:`UNCHANGED`.
RateLimit = Union[str, float, limits.Rate, None, Unchanged]


@dataclass(frozen=True)
class Limit:
    """A group's limits in force in one fair queue after a change (``cap`` None: no cap)."""

    queue: str
    group: str
    cap: int | None
    weight: float
    rate: limits.Rate | None = None  # None: no rate limit

    def __str__(self) -> str:
        cap = "no cap" if self.cap is None else f"cap {self.cap}"
        rate = "" if self.rate is None else f", rate {self.rate}"
        return f"group {self.group} in queue {self.queue}: {cap}, weight {self.weight:g}{rate}"


def limit(app: Any, group: Any, *, queue: str | Sequence[str] | None = None,
          concurrency: Concurrency = UNCHANGED, weight: Weight = UNCHANGED,
          rate: RateLimit = UNCHANGED, burst: int | Unchanged = UNCHANGED,
          reset: bool = False, create: bool = False, actor: Any = None,
          reason: str | None = None) -> list[Limit]:
    """Set ``group``'s runtime cap, weight and rate limit in ``queue`` (default: every
    fair queue).

    Runtime limits take precedence over ``fair_group_concurrency``,
    ``fair_group_weights`` and the rate limit settings, and survive dispatcher
    restarts. With no number and no ``reset``, nothing changes and the limits in force
    are returned. A change of the rate in force starts the group's bucket full and lifts
    the throttle its old rate gave it, not a task's.

    Parameters:
        app: the Celery app whose fair queues are changed.
        group: the group (a tenant id, a user id).
        queue: a fair queue or several; None: every fair queue that has held a task.
        concurrency: most tasks of the group in flight, from 0 (pauses it) to
            :data:`~celery_fair.limits.MAX_CAP`; None: no cap.
        weight: its share of dispatches relative to other groups (default weight 1).
        rate: most dispatches of the group over time: Celery's notation (``"10/s"``,
            ``"100/m"``, ``"5/h"``) or a number a second; None: no rate limit, whatever
            ``fair_default_rate_limit`` says.
        burst: with ``rate``, how many may go at once after a quiet spell (default 1).
        reset: drop the group's runtime cap, weight and rate (the settings apply again).
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
    rate_arg = _rate_arg(group, rate, burst, reset)
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    store = store_for(app)
    done = []
    for name in checked_queues(app, store, queue, create):
        cap_now, weight_now = store.limit(name, group, cap_arg, weight_arg)
        done.append(Limit(name, group, cap_now, weight_now,
                          store.set_rate(name, group, rate_arg)))
        if (cap_arg, weight_arg, rate_arg) != (KEEP, KEEP, KEEP):  # a read: not logged
            audit.record(store, "limit", _limit_record(done[-1], cap_arg, weight_arg,
                                                       rate_arg), actor=who, reason=why)
    return done


def _rate_arg(group: str, rate: RateLimit, burst: int | Unchanged,
              reset: bool) -> limits.Rate | str | None:
    """The checked argument of :meth:`Store.set_rate`."""
    if reset:
        if rate is not UNCHANGED or burst is not UNCHANGED:
            raise InvalidLimit(f"reset of group {group!r} cannot be combined with a rate: "
                               "reset, then set")
        return RESET
    if isinstance(rate, Unchanged):
        if not isinstance(burst, Unchanged):
            raise InvalidLimit(f"a burst for group {group!r} needs its rate: give both")
        return KEEP
    if rate is None:
        if not isinstance(burst, Unchanged):
            raise InvalidLimit(f"a burst for group {group!r} needs a rate, not none")
        return None
    return limits.rate(rate, f"rate limit for group {group!r}",
                       1 if isinstance(burst, Unchanged) else burst)


def _limit_record(after: Limit, cap: int | str, weight: float | str,
                  rate: limits.Rate | str | None) -> dict[str, Any]:
    """What the audit log keeps of a limit change: what was asked and what is in force."""
    asked: dict[str, Any] = {"reset": True} if cap == RESET else {}
    if cap not in (KEEP, RESET):
        asked["concurrency"] = None if cap == -1 else cap
    if weight not in (KEEP, RESET):
        asked["weight"] = weight
    if rate not in (KEEP, RESET):
        asked["rate"] = None if rate is None else str(rate)
    in_force: dict[str, Any] = {"cap": after.cap, "weight": after.weight}
    if after.rate is not None:  # a rate only when one is in force: older entries' shape
        in_force["rate"] = str(after.rate)
    return {"queue": after.queue, "group": after.group, **asked, "in_force": in_force}


#: Longest pause with an end (a year); longer: pause without an end, resume by hand.
MAX_PAUSE_SECONDS = audit.MAX_SECONDS


@dataclass(frozen=True)
class Pause:
    """A pause set or lifted: ``group`` None is the whole ``queue``; ``until_ms`` None:
    no end (or lifted)."""

    queue: str
    group: str | None
    until_ms: int | None = None

    def __str__(self) -> str:
        what = f"queue {self.queue}" if self.group is None else \
            f"group {self.group} in queue {self.queue}"
        return what if self.until_ms is None else f"{what} until {audit.utc_text(self.until_ms)}"


def pause(app: Any, group: Any = None, *, queue: str | Sequence[str] | None = None,
          for_seconds: float | None = None, reason: str | None = None,
          actor: Any = None) -> list[Pause]:
    """Pause ``group`` (all its classes) in ``queue`` (default: every fair queue), or,
    with no group, the whole ``queue``: nothing of it is dispatched until
    :func:`resume`, or for ``for_seconds`` (then it resumes by itself at a dispatcher's
    next step). Running tasks finish; held and newly held tasks wait. A pause is not a
    cap: the group's limits stay as they are. It lives in the store (survives restarts).

    Returns:
        The pauses set, one per queue. Each is recorded in the audit log.

    Raises:
        InvalidGroup, InvalidControl (a duration, actor or reason), UnknownQueue (a queue
        never held a task, or none named for a whole-queue pause): nothing written.
    """
    names, g, who, why = _pause_args(app, group, queue, actor, reason)
    seconds = audit.check_seconds(for_seconds)
    until = None if seconds is None else now_ms() + int(seconds * 1000)
    store = store_for(app)
    done = []
    for name in names:
        store.pause(name, WHOLE_QUEUE if g is None else g, until)
        done.append(Pause(name, g, until))
        audit.record(store, "pause", {"queue": name, "group": g, "for_seconds": seconds},
                     actor=who, reason=why, until_ms=until)
    return done


def resume(app: Any, group: Any = None, *, queue: str | Sequence[str] | None = None,
           reason: str | None = None, actor: Any = None) -> list[Pause]:
    """Lift :func:`pause` of ``group`` (no group: of the whole ``queue``) in ``queue``
    (default: every fair queue); dispatch resumes at once.

    Returns:
        The pauses lifted (a queue where it was not paused is left out). Each is recorded
        in the audit log.

    Raises:
        As :func:`pause`.
    """
    names, g, who, why = _pause_args(app, group, queue, actor, reason)
    store = store_for(app)
    done = [Pause(name, g) for name in names
            if store.resume(name, WHOLE_QUEUE if g is None else g)]
    for lifted in done:
        audit.record(store, "resume", {"queue": lifted.queue, "group": g},
                     actor=who, reason=why)
    return done


def parse_duration(text: str) -> float:
    """A duration typed by a person: seconds (``90``), or a number with a unit ``s``,
    ``m``, ``h`` or ``d`` (``30m``, ``1.5h``).

    Raises:
        InvalidControl: naming the text and the accepted forms.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    scale = units.get(value[-1:], 1) if value else 1
    number = value[:-1] if value[-1:] in units else value
    try:
        return audit.check_seconds(float(number) * scale) or 0.0
    except (ValueError, InvalidControl):
        raise InvalidControl(f"duration must be seconds or a number with s, m, h or d "
                             f"(90, 30m, 1h), more than 0 and at most 366d, got {text!r}"
                             ) from None


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
    return _typed(text, lambda t: limits.cap(int(t) if _WHOLE.fullmatch(t) else t, what))  # type: ignore[no-any-return]


def _typed(text: str, check: Any) -> Any:
    """``text`` as typed: blank (:data:`UNCHANGED`), ``none`` (None) or what ``check``
    makes of it; its InvalidLimit says 'none' was accepted too."""
    text = text.strip()
    if not text:
        return UNCHANGED
    if text.lower() == "none":
        return None
    try:
        return check(text)
    except InvalidLimit as exc:
        raise InvalidLimit(f"{exc} (or 'none')") from None


def parse_rate(text: str, what: str = "rate limit") -> RateLimit:
    """A rate typed by a person (``10/s``, ``100/m``, ``5/h``), ``none`` (no rate limit),
    or blank (:data:`UNCHANGED`); its burst is given apart.

    Raises:
        InvalidLimit: naming ``what``, the accepted values and ``text``.
    """
    return _typed(text, lambda t: limits.rate(t, what))  # type: ignore[no-any-return]


def parse_burst(text: str, what: str = "burst") -> int | Unchanged:
    """A burst typed by a person: an integer, or blank (:data:`UNCHANGED`: 1 with a
    rate); ``limits.rate`` checks its range.

    Raises:
        InvalidLimit: naming ``what`` and ``text``.
    """
    text = text.strip()
    if not text:
        return UNCHANGED
    if not _WHOLE.fullmatch(text):  # not str.isdigit: '²' is a digit int() refuses
        raise InvalidLimit(f"{what} must be an integer from 1, got {text!r}")
    return int(text)


#: A whole number as people type it (ASCII digits only).
_WHOLE = re.compile(r"[0-9]+")


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


def _pause_args(app: Any, group: Any, queue: str | Sequence[str] | None, actor: Any,
                reason: Any) -> tuple[list[str], str | None, str, str | None]:
    """The checked queues, group (None: whole queue), actor and reason of a pause."""
    g = None if group is None else validate_group(group)
    if g is None and queue is None:
        raise UnknownQueue("name a group to pause, or a queue to pause whole")
    who, why = audit.actor_name(actor), audit.check_reason(reason)
    return checked_queues(app, store_for(app), queue, False, ""), g, who, why

