"""The store contract: every state change of a held message is one atomic operation.

The store deals in stored values (bytes, see ``envelope.py``) and ids only; Celery and
kombu stay in ``holding.py`` and ``publisher.py``. All times are milliseconds since the epoch
passed in by the caller, so the operations are deterministic and testable.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


class BeginResult(enum.IntEnum):
    """What ``begin`` says about a dispatch a worker is about to run."""

    #: the dispatch is current: run it
    RUN = 1
    #: its slot had been reclaimed (lease ran out) and was taken again: run it
    RUN_REACQUIRED = 2
    #: the store never saw it (no record): run it, nothing held is ever dropped
    RUN_UNKNOWN = 0
    #: a stale duplicate: the message was held again and a newer dispatch carries it, or
    #: the dispatch already ran to its end and the broker redelivered it
    SKIP = -1


@dataclass(frozen=True)
class Picked:
    """One message taken by ``pick``."""

    dispatch_id: str
    hold_id: str
    value: bytes


@dataclass(frozen=True)
class Pushed:
    """One message ``pick`` pushed into the broker's list itself (for metrics)."""

    klass: str
    due_at: float | None  # epoch seconds it became due; None when not recorded
    group: str


@dataclass(frozen=True)
class DirectPush:
    """Where ``pick`` may push messages itself: kombu's Redis list of the real queue, on
    the store's own Redis (see ``celery_fair.direct``)."""

    queue: str
    sep: str
    priority_steps: tuple[int, ...]
    exchange: str  # the queue's own direct exchange ('' for none)
    routing_key: str
    binding_key: str  # kombu's binding set of that exchange


@dataclass(frozen=True)
class Policy:
    """Policy settings of one fair queue, shared by every dispatcher through the store."""

    default_cap: int | None
    interactive_reserve: int
    default_weight: float
    caps: Mapping[str, int]
    weights: Mapping[str, float]


class Store(abc.ABC):
    """Holding queues, fair picking and dispatch leases for the fair queues of one app."""

    @abc.abstractmethod
    def hold(self, queue: str, hold_id: str, value: bytes, due_ms: int, now_ms: int) -> str:
        """Atomically keep ``value`` in its group (or in the delayed set until ``due_ms``).

        Returns the hold id used: ``hold_id``, suffixed when a message with that id is
        already held (nothing is ever overwritten).

        Raises:
            StoreUnreachable: nothing was sent (so nothing is held).
            StoreFull: nothing was written (so nothing is held).
            StoreError: any other failure; the message may be held (a reply lost).
        """

    @abc.abstractmethod
    def pick(self, queue: str, limit: int, capacity: int | None, now_ms: int,
             lease_ms: int) -> list[Picked]:
        """Atomically take up to ``limit`` messages in fair order, without exceeding
        ``capacity`` in-flight dispatches or any group's cap; each becomes a 'picked'
        dispatch with a short lease. Two concurrent picks never return the same message."""

    @abc.abstractmethod
    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        """Mark dispatches the broker accepted 'queued'. Returns the stale ones."""

    @abc.abstractmethod
    def begin(self, queue: str, dispatch_id: str, deadline_ms: int, *,
              now_ms: int | None = None, run: str | None = None, acks_late: bool = False,
              host: str = "", gone: Callable[[str], bool] | None = None) -> BeginResult:
        """A worker is about to run a dispatch: mark it running, say whether to run it.

        ``run`` names this run (unique; generated when None): a copy of the dispatch that
        another run is running under a live lease is skipped when ``acks_late`` runs keep
        the message with the record, since reclaim can then hold it again should that run
        die. When that run's token starts with ``host`` (this machine's), ``gone(token)``
        says whether it has ended without a word (its pool process was killed): then
        this run takes it over at once. ``now_ms`` is the clock the lease is judged by."""

    @abc.abstractmethod
    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        """Extend leases of dispatches a worker holds. Returns how many were current."""

    @abc.abstractmethod
    def release(self, queue: str, dispatch_id: str, done_seconds: int = 0,
                run: str | None = None) -> bool:
        """Free a dispatch's slot. Idempotent; returns whether a slot was freed. With
        ``done_seconds`` (the task ran to its end) its record stays that long as a
        'released' tombstone, so a redelivered copy is skipped; 0 forgets it. With
        ``run``, only while that run holds it (no other run has taken it over)."""

    @abc.abstractmethod
    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        """Take back slots whose lease ran out: a dispatch no worker reported (picked or
        queued) is held again, one a worker had is lost with it (the broker redelivers).
        Returns (held again, lost to a dead worker)."""

    @abc.abstractmethod
    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        """Move due delayed messages into their groups. Returns (moved, next due ms)."""

    @abc.abstractmethod
    def configure(self, queue: str, policy: Policy) -> None:
        """Store the queue's policy settings and re-rank its groups under them."""

    @abc.abstractmethod
    def cancel(self, queue: str, task_ids: Iterable[str]) -> list[tuple[str, bytes]]:
        """Remove the held or delayed messages of ``task_ids`` (their tasks were revoked
        before running), including copies held under a suffixed hold id
        (``<task id>~<n>``: the same id held twice). The removal is atomic; a message
        already picked, queued or running is left alone. Returns ``(hold id, stored
        value)`` of every message removed."""


# -- lifetimes and bounds every backend keeps, and the summary read model ---------------

#: How long the record of a superseded or lost dispatch is kept (seconds). A stale copy
#: delivered later than this runs as an unknown dispatch.
TOMBSTONE_SECONDS = 86_400
#: How long what a cancel call removed is kept to answer that call again (seconds):
#: redis-py resends a call whose reply a dropped connection lost (10 retries by default),
#: and the resend must still see the messages, or their tasks are never marked REVOKED.
CANCELLED_SECONDS = 300
#: Most entries the quarantine of one fair queue keeps (the newest): it holds damaged data
#: for a human to look at, and must not grow without end. Each one dropped is logged.
QUARANTINE_MAX = 1_000
#: How long after its registration expired a worker's entry is dropped (ms). Expired
#: workers never count; the margin only keeps a registering worker whose clock runs ahead
#: from dropping entries another host's clock still sees as live.
PRUNE_GRACE_MS = 60_000


@dataclass(frozen=True)
class GroupFigures:
    """One group as ``summarize`` sees it; ``due_*``: when its oldest held message of
    that class became due (epoch seconds), None when it holds none (or an old message)."""

    group: str
    held_interactive: int
    held_background: int
    inflight: int
    delayed: int
    due_interactive: float | None
    due_background: float | None
