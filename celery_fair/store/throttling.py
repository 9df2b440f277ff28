"""Rate limits and throttles (``fair limit --rate``, ``self.fair_throttle``), a family of
the store contract (:class:`~celery_fair.store.base.Store` inherits it).

A group with a rate limit (:class:`~celery_fair.limits.Rate`: one dispatch every
``interval_ms``, ``burst`` at once) is metered by GCRA in the pick: each dispatch moves
the group's theoretical arrival time (TAT) on by one interval, and once the bucket is
empty the group is *throttled* until its next token is due. A throttled group is not
eligible in either class: it leaves the ready sets, so the pick never scans it. A task
can throttle its own group for a while (after an HTTP 429) the same way.

Throttles end in ``promote`` (every dispatcher step already makes that call, and its
"next due" answer covers the soonest throttle, so the dispatcher wakes when a token comes
due); a token counts from its own time or from
:data:`~celery_fair.store.models.RATE_EARLY_MS` (at most half an interval) before the
pick, whichever is later, so a dispatcher's lateness never adds up into a slower rate,
and never lets more than the burst go at once.

Rates come from the settings (``configure``: a default and per group) with runtime
limits laid over them, as caps and weights are; they live in the store and survive
dispatcher and store restarts. A change of a group's rate in force (at runtime, or by a
restart with other settings) starts its bucket full and lifts the throttle its old rate
gave it; a task's throttle stays (a change never shortens it).
"""

from __future__ import annotations

import abc
import math
from typing import Any

from .. import limits
from ..errors import InvalidControl
from ..limits import Rate
from .models import KEEP, RESET

__all__ = ["Throttling", "check_rate_arg", "check_until"]


def check_until(until_ms: Any) -> float:
    """A throttle's end as given to :meth:`Throttling.throttle`: a finite number of ms.

    Raises:
        InvalidControl: naming what was given.
    """
    if isinstance(until_ms, bool) or not isinstance(until_ms, (int, float)) \
            or not math.isfinite(until_ms):
        raise InvalidControl(f"a throttle's end must be a finite time in ms, got {until_ms!r}")
    return float(until_ms)


def check_rate_arg(rate: Any, group: str) -> Rate | str | None:
    """A rate as given to :meth:`Throttling.set_rate`: :data:`KEEP` and :data:`RESET` as
    they are, None (no rate limit) or a rate (:func:`celery_fair.limits.rate`).

    Raises:
        InvalidLimit: naming the group and what was given.
    """
    if rate is None or (isinstance(rate, str) and rate in (KEEP, RESET)):
        return rate
    return limits.rate(rate, f"rate limit for group {group!r}")


class Throttling(abc.ABC):
    """Rate limits and throttles of the groups of each fair queue."""

    @abc.abstractmethod
    def set_rate(self, queue: str, group: str, rate: Rate | str | None) -> Rate | None:
        """Set ``group``'s runtime rate limit (a :class:`Rate`; None: none, whatever the
        default), clear it (``RESET``: the setting applies again) or read it (``KEEP``).
        A change of the rate in force starts the group's bucket full and lifts its old
        rate's throttle, not a task's. Returns the rate in force (None: none). The group's
        name and the rate are checked before anything is written (InvalidGroup,
        InvalidLimit: :func:`check_rate_arg`)."""

    @abc.abstractmethod
    def throttle(self, queue: str, group: str, until_ms: float) -> float:
        """Pick nothing of ``group`` before ``until_ms``: a throttle that ends later is
        kept (a throttle never shortens another). Returns when the group's throttle
        ends. The group's name and the end are checked before anything is written
        (InvalidGroup, InvalidControl: :func:`check_until`)."""

    @abc.abstractmethod
    def throttles(self, queue: str) -> dict[str, float]:
        """{group: when its throttle ends (ms)}, from its rate or a task's ``throttle``.
        Reads only; a throttle past its end stays listed until ``promote`` lifts it."""

    @abc.abstractmethod
    def rates(self, queue: str) -> dict[str, Rate | None]:
        """{group: its rate in force (None: none)} of the groups with a rate of their
        own (a setting or a runtime limit); the others have the default's. Reads only."""
