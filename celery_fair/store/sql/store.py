"""The SQL store: the store contract (``store/base.py``) on SQLAlchemy Core, for
PostgreSQL, MariaDB/MySQL and SQLite. Each operation is one transaction
(``engine.transaction``) over the rows it locks (``unit.py``); ``lifecycle.py`` and
``controls.py`` make the policy's decisions, ``reads.py`` answers the reads and
``wakes.py`` the wake-ups."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Connection, Engine

from ... import limits
from ...errors import HoldOutcomeUnknown, StoreConnectionError, StoreUnreachable
from ...names import validate_group
from ...policy import Placement
from ...redact import safe_url
from ..base import (
    CANCELLED_SECONDS,
    KEEP,
    QUARANTINE_MAX,
    RESET,
    TOMBSTONE_SECONDS,
    BeginAnswer,
    Picked,
    Policy,
    Store,
)
from ..bulk import Hold, check_holds
from ..connection import Bounds
from ..models import check_hold
from .audit import SqlAudit
from .boosting import SqlBoosting
from .bulk import hold_many, hold_one
from .controls import Controls
from .engine import make_engine, transaction
from .inspecting import SqlInspecting
from .lifecycle import Lifecycle
from .pausing import SqlPausing
from .registry import SqlRegistry
from .routing import SqlRouting
from .schema import DEFAULT_PREFIX, Tables
from .statements import Statements
from .throttling import SqlThrottling
from .wakes import Wakes, wakes_for

T = TypeVar("T")


def wall_ms() -> int:
    """The store's own clock, for what expires by itself (tombstones, cancel answers)."""
    return int(time.time() * 1000)


class SqlStore(SqlInspecting, SqlAudit, SqlPausing, SqlBoosting, SqlThrottling, SqlRegistry,
               SqlRouting, Store):
    """Fair queues of one namespace in one SQL database."""

    def __init__(self, engine: Engine, namespace: str = "fair",
                 table_prefix: str = DEFAULT_PREFIX, where: str = "",
                 wakes: Wakes | None = None, retries: int = 3, timeout: float = 5.0) -> None:
        self.engine = engine
        self.retries, self.timeout = retries, timeout
        self.namespace = namespace
        self.where = where or safe_url(engine.url.render_as_string(hide_password=True))
        self.t = Tables(table_prefix)
        self.s = Statements(self.t)
        self.wakes = wakes or wakes_for(engine, namespace)
        self.s.on_hand = self.wakes.wake_here
        self.life = Lifecycle(self.s, namespace, self.wakes.notice)
        self.controls = Controls(self.s, namespace, self.wakes.notice)

    @classmethod
    def from_url(cls, url: str, namespace: str = "fair", bounds: Bounds | None = None,
                 table_prefix: str = DEFAULT_PREFIX) -> SqlStore:
        """A store on the database at ``url`` (its schema must be current: ``fair
        migrate``)."""
        bounds = bounds or Bounds()
        return cls(make_engine(url, bounds), namespace, table_prefix, retries=bounds.retries,
                   timeout=bounds.socket_timeout)

    def _do(self, name: str, queue: str, work: Callable[[Connection], T]) -> T:
        self.require_schema()
        return transaction(self.engine, f"{self.where}: {name} on {queue!r}", work,
                           self.retries, self.timeout)

    def _wake_if(self, queue: str, woken: bool) -> None:
        """After a transaction that woke ``queue`` (it notified other processes)."""
        if woken:
            self.wakes.wake_here(queue)

    # -- the lifecycle ------------------------------------------------------------------

    def hold(self, queue: str, hold_id: str, value: bytes, placement: Placement,
             due_ms: int, now_ms: int) -> str:
        """See :meth:`Store.hold`; a lost reply raises :class:`HoldOutcomeUnknown`."""
        placement = check_hold(hold_id, value, placement)
        with _hold_outcome():
            held, woken = self._do("hold", queue, lambda c: hold_one(
                self.life, c, queue, hold_id, value, placement, due_ms, now_ms))
        self._wake_if(queue, woken)
        return held

    def hold_many(self, queue: str, holds: Sequence[Hold], now_ms: int) -> list[str]:
        """See :meth:`Store.hold_many`: one transaction; a lost reply raises
        :class:`HoldOutcomeUnknown`."""
        checked = check_holds(holds)
        if not checked:
            return []
        with _hold_outcome():
            held, woken = self._do("hold_many", queue, lambda c: hold_many(
                self.life, c, queue, checked, now_ms))
        self._wake_if(queue, woken)
        return held

    def pick(self, queue: str, limit: int, capacity: int | None, now_ms: int,
             lease_ms: int, *, token: str | None = None) -> list[Picked]:
        tok = token or uuid.uuid4().hex[:12] + "."
        return self._do("pick", queue, lambda c: self.life.pick(
            c, queue, limit, capacity, now_ms, lease_ms, tok))

    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        ids = list(dispatch_ids)
        if not ids:
            return []
        return self._do("confirm", queue, lambda c: self.life.confirm(c, queue, ids,
                                                                        deadline_ms))

    def begin_run(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str = "") -> BeginAnswer:
        return self._begin(queue, dispatch_id, deadline_ms, now_ms, run, acks_late, host, "")

    def take_over(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str, token: str) -> BeginAnswer:
        return self._begin(queue, dispatch_id, deadline_ms, now_ms, run, acks_late, host,
                           token)

    def _begin(self, queue: str, did: str, deadline_ms: int, now_ms: int, run: str,
               acks_late: bool, host: str, taken_over: str) -> BeginAnswer:
        answer = self._do("begin", queue, lambda c: self.life.begin(
            c, queue, did, deadline_ms, now_ms, wall_ms(), run, acks_late, host, taken_over))
        return answer

    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        ids, now = list(dict.fromkeys(dispatch_ids)), wall_ms()
        if not ids:
            return 0
        return self._do("renew", queue, lambda c: self.life.renew(c, queue, ids, deadline_ms,
                                                                    now))

    def release(self, queue: str, dispatch_id: str, done_seconds: int = 0,
                run: str | None = None, runtime: float | None = None,
                now_ms: int | None = None) -> bool:
        now = wall_ms()  # ``now_ms``: the head time of a singleton key's waiter entering
        until = now + done_seconds * 1000 if done_seconds > 0 else None
        freed = self._do("release", queue, lambda c: self.life.release(
            c, queue, dispatch_id, until, run or "", now, runtime, now_ms or now))
        self._wake_if(queue, freed)
        return freed

    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        taken = self._do("reclaim", queue, lambda c: self.life.reclaim(
            c, queue, now_ms, limit, wall_ms() + TOMBSTONE_SECONDS * 1000))
        self._wake_if(queue, sum(taken) > 0)
        return taken

    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        return self._do("promote", queue, lambda c: self.life.promote(c, queue, now_ms,
                                                                        limit))

    def cancel(self, queue: str, task_ids: Iterable[str], *, token: str | None = None,
               now_ms: int | None = None) -> list[tuple[str, bytes]]:
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        tok, now = token or uuid.uuid4().hex, wall_ms()
        return self._do("cancel", queue, lambda c: self.controls.cancel(
            c, queue, ids, tok, now + CANCELLED_SECONDS * 1000, now,
            now if now_ms is None else now_ms))

    def quarantine(self, queue: str, dispatch_id: str, value: bytes, reason: str) -> None:
        self._do("quarantine", queue, lambda c: self.controls.set_aside(
            c, queue, dispatch_id, value, reason))
        self.release(queue, dispatch_id)
        self.trim_quarantine(queue)

    def trim_quarantine(self, queue: str, keep: int = QUARANTINE_MAX) -> list[str]:
        """Keep the newest ``keep`` quarantined entries; returns the ids dropped."""
        return self._do("trim quarantine", queue, lambda c: self.controls.trim_quarantine(
            c, queue, keep))

    # -- the policy -------------------------------------------------------------------

    def configure(self, queue: str, policy: Policy) -> None:
        limits.check_policy(policy)
        self._do("configure", queue, lambda c: self.controls.configure(c, queue, policy))
        self.wakes.wake_here(queue)

    def limit(self, queue: str, group: str, cap: int | str = KEEP,
              weight: float | str = KEEP) -> tuple[int | None, float]:
        group = validate_group(group)
        if cap not in (KEEP, RESET):
            cap = limits.cap(cap, f"concurrency for group {group!r}", minimum=-1)
        if weight not in (KEEP, RESET):
            weight = limits.weight(weight, f"weight for group {group!r}")
        new_cap, new_weight = cap, weight
        cap_now, weight_now, entered = self._do("limit", queue, lambda c: self.controls.limit(
            c, queue, group, new_cap, new_weight))
        self._wake_if(queue, entered)
        return (None if cap_now < 0 else cap_now), weight_now

    def close(self) -> None:
        self.wakes.close()
        self.engine.dispose()


@contextmanager
def _hold_outcome() -> Iterator[None]:
    """A connection lost during a hold's transaction (not before it was sent): its
    outcome is unknown."""
    try:
        yield
    except StoreUnreachable:
        raise
    except StoreConnectionError as exc:
        raise HoldOutcomeUnknown(
            f"{exc}; the hold's outcome is unknown: the task may be held (it then runs "
            "when dispatched), so it was not published to the broker") from exc.__cause__
