"""The memory store: fair queues in this process, for fast unit tests of the dispatcher,
worker and CLI logic without a server.

It executes the shared policy (:mod:`celery_fair.policy`) under one lock, so each
operation is atomic as the Redis scripts are, and offers the public methods of
:class:`~celery_fair.store.redis.RedisStore` that the dispatcher, worker, CLI and
``check`` use, with the same return types. Direct push is a Redis-only capability: the
memory store never pushes (everything comes back as :class:`Picked`). Wake-ups are a
:class:`threading.Condition`. Nothing survives the process: never a stand-in for an
end-to-end claim.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..envelope import due_of
from ..errors import GroupFull
from ..limits import APP_SCOPE
from ..names import validate_group
from ..policy import CLASSES, KEEP, FairQueue, Placement, QueueState
from ..policy.problems import queue_problems
from .audit import AuditEntry
from .base import (
    CANCELLED_SECONDS,
    QUARANTINE_MAX,
    TOMBSTONE_SECONDS,
    BeginAnswer,
    BeginResult,
    DispatcherBeat,
    GroupFigures,
    GroupHeads,
    Picked,
    Policy,
    QueueFigures,
    Store,
    busiest_first,
    check_hold,
    limited_by,
    snapshot_of,
)
from .bulk import Hold, check_holds
from .memory_reads import MemoryReads
from .memory_registry import MemoryRegistry, Registration
from .memory_routing import MemoryRouting
from .scope_check import scope_findings


def wall_ms() -> int:
    """The store's own clock, for what Redis times out by itself (tombstones' TTLs)."""
    return int(time.time() * 1000)


class MemoryStore(MemoryReads, MemoryRegistry, MemoryRouting, Store):
    """Fair queues of one namespace in this process (thread-safe: one lock)."""

    outlives_process = False  # gone with the process: no release to write ahead

    def __init__(self, namespace: str = "fair") -> None:
        self.namespace = namespace
        self.where = "memory"
        self._cond = threading.Condition(threading.Lock())
        self._queues: dict[str, FairQueue] = {}
        # singleton keys span the namespace's queues (policy/singletons.py): key -> owner,
        # key -> waiting refs, queue -> hold ids to admit, queues a hand-over woke
        self._sowner: dict[str, str] = {}
        self._swait: dict[str, deque[str]] = {}
        self._sadmit: dict[str, deque[str]] = {}
        self._swake: set[str] = set()
        self._scope_n: dict[str, int] = {}  # fair_scope 'app': group -> in flight
        #: fair_scope 'app' under wfq: (class, group) -> tag advances over the queues
        self._scope_charge: dict[tuple[str, str], float] = {}
        self._registered: set[str] = set()  # fair queues that have held a message
        self._workers: dict[str, dict[str, Registration]] = {}  # queue -> worker ->
        self._writers: dict[str, int] = {}  # queue -> until when its summary writer holds
        self._summaries: dict[str, tuple[int, str]] = {}  # queue -> (expires ms, document)
        self._beats: dict[str, tuple[DispatcherBeat, int]] = {}  # id -> (beat, expires ms)
        self._audit: deque[AuditEntry] = deque()  # newest last

    @contextmanager
    def _queue(self, queue: str) -> Iterator[FairQueue]:
        """The queue's state under the lock; a wake-up it asks for is signalled."""
        with self._cond:
            fq = self._queues.get(queue)
            if fq is None:
                fq = self._queues[queue] = FairQueue()
                fq.share_singletons(queue, self._sowner, self._swait, self._sadmit,
                                    self._swake)
                fq.share_scope(self._scope_n, self._queues, self._scope_charge)
            fq.expire(wall_ms())
            yield fq
            if fq.woken:
                self._cond.notify_all()

    # -- the atomic operations ---------------------------------------------------------

    def hold(self, queue: str, hold_id: str, value: bytes, placement: Placement, due_ms: int,
             now_ms: int) -> str:
        where = check_hold(hold_id, value, placement)  # before anything is written
        with self._queue(queue) as fq:
            try:
                held = fq.hold(hold_id, value, where, due_ms, now_ms)
            except GroupFull as full:
                raise full.in_queue(queue) from None
            self._registered.add(queue)
            return held

    def hold_many(self, queue: str, holds: Sequence[Hold], now_ms: int) -> list[str]:
        checked = check_holds(holds)  # before anything is written
        if not checked:
            return []
        with self._queue(queue) as fq:
            try:
                held = fq.hold_many([(h.hold_id, h.value, h.placement, h.due_ms)
                                     for h in checked], now_ms)
            except GroupFull as full:
                raise full.in_queue(queue) from None
            self._registered.add(queue)
            return held

    def pick(self, queue: str, limit: int, capacity: int | None, now_ms: int,
             lease_ms: int, *, token: str | None = None) -> list[Picked]:
        with self._queue(queue) as fq:
            return fq.pick(limit, capacity, now_ms, lease_ms, token or _token())

    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        with self._queue(queue) as fq:
            return fq.confirm(list(dispatch_ids), deadline_ms)

    def begin_run(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str = "") -> BeginAnswer:
        with self._queue(queue) as fq:
            return _begun(fq.begin(dispatch_id, deadline_ms, now_ms, run, acks_late, host))

    def take_over(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str, token: str) -> BeginAnswer:
        with self._queue(queue) as fq:
            return _begun(fq.begin(dispatch_id, deadline_ms, now_ms, run, acks_late, host,
                                   token))

    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        with self._queue(queue) as fq:
            return fq.renew(list(dispatch_ids), deadline_ms)

    def release(self, queue: str, dispatch_id: str, done_seconds: int = 0,
                run: str | None = None, runtime: float | None = None,
                now_ms: int | None = None) -> bool:
        until = wall_ms() + done_seconds * 1000 if done_seconds > 0 else None
        with self._queue(queue) as fq:
            return fq.release(dispatch_id, until, run or "", runtime,
                              wall_ms() if now_ms is None else now_ms)

    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        with self._queue(queue) as fq:
            return fq.reclaim(now_ms, limit, wall_ms() + TOMBSTONE_SECONDS * 1000)

    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        with self._queue(queue) as fq:
            return fq.promote(now_ms, limit)

    def configure(self, queue: str, policy: Policy) -> None:
        """Raises :class:`~celery_fair.errors.InvalidLimit` (nothing written) when a
        number of ``policy`` is out of range (:mod:`celery_fair.limits`)."""
        with self._queue(queue) as fq:
            fq.configure(policy)

    def cancel(self, queue: str, task_ids: Iterable[str], *, token: str | None = None,
               now_ms: int | None = None) -> list[tuple[str, bytes]]:
        """See :meth:`RedisStore.cancel`: the same ``token`` again gets the same answer."""
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        with self._queue(queue) as fq:
            return fq.cancel(ids, token or uuid.uuid4().hex,
                             wall_ms() + CANCELLED_SECONDS * 1000,
                             wall_ms() if now_ms is None else now_ms)

    def limit(self, queue: str, group: str, cap: int | str = KEEP,
              weight: float | str = KEEP) -> tuple[int | None, float]:
        """See :meth:`RedisStore.limit`."""
        group = validate_group(group)
        with self._queue(queue) as fq:
            cap_now, weight_now = fq.limit(group, cap, weight)
        return (None if cap_now < 0 else cap_now), weight_now

    def quarantine(self, queue: str, dispatch_id: str, value: bytes, reason: str) -> None:
        """Keep an undecodable message aside (never dropped) and free its slot."""
        with self._queue(queue) as fq:
            fq.set_aside(dispatch_id, value, reason)
        self.release(queue, dispatch_id)
        self.trim_quarantine(queue)

    def trim_quarantine(self, queue: str, keep: int = QUARANTINE_MAX) -> list[str]:
        """Keep the newest ``keep`` quarantined entries; returns the ids dropped."""
        with self._queue(queue) as fq:
            dropped = fq.quarantine_order[keep:][::-1]
            del fq.quarantine_order[keep:]
            for hold_id in dropped:
                del fq.quarantine[hold_id]
        return dropped

    # -- wake-ups -------------------------------------------------------------------

    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        """Block until one of ``queues`` is woken or ``timeout`` passes; returns (and
        takes) every woken queue of them, empty on timeout. Timeout 0 only looks."""
        names = list(queues)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                woken = {q for q in names if q in self._queues
                         and (self._queues[q].woken or q in self._swake)}
                left = deadline - time.monotonic()
                if woken or left <= 0:
                    break
                self._cond.wait(left)
            for q in woken:
                self._queues[q].woken = False
                self._swake.discard(q)
        return woken

    # -- reads --------------------------------------------------------------------

    def inspect(self, queue: str) -> QueueState:
        """The queue's scheduling state (:class:`~celery_fair.policy.QueueState`)."""
        with self._queue(queue) as fq:
            return fq.inspect()

    def dispatch_state(self, queue: str, dispatch_id: str) -> str | None:
        with self._queue(queue) as fq:
            return fq.dispatch_state(dispatch_id)

    def queues(self) -> list[str]:
        with self._cond:
            return sorted(self._registered)

    def forget_queue(self, queue: str) -> bool:
        with self._queue(queue) as fq:
            if not fq.empty() or queue not in self._registered:
                return False
            self._registered.discard(queue)
            return True

    def queue_figures(self, queue: str) -> QueueFigures:
        """See :meth:`RedisStore.queue_figures`."""
        with self._queue(queue) as fq:
            stat = fq.stat
            return QueueFigures(
                queue, inflight=stat.get("inflight", 0), delayed=len(fq.delayed),
                held_interactive=stat.get("held:i", 0),
                held_background=stat.get("held:b", 0), released=stat.get("released", 0),
                skipped=stat.get("skipped", 0), group_count=len(fq.groups),
                ready_interactive=len(fq.ready["i"]), ready_background=len(fq.ready["b"]))

    def snapshot(self, queue: str) -> dict[str, Any]:
        with self._queue(queue) as fq:
            groups = sorted(fq.groups)
        return snapshot_of(self.queue_figures(queue), self.group_figures(queue, groups))

    def top_groups(self, queue: str, limit: int) -> list[tuple[str, int]]:
        """The ``limit`` groups holding the most messages, most first (ties: the name,
        last first, as Redis's ZREVRANGE)."""
        with self._queue(queue) as fq:
            backlog: dict[str, int] = {}
            for (_, g), ids in fq.lists.items():
                backlog[g] = backlog.get(g, 0) + len(ids)
            for (_, g, _), ids in fq.parked.items():
                backlog[g] = backlog.get(g, 0) + len(ids)
        ranked = sorted(((n, g) for g, n in backlog.items() if n > 0), reverse=True)
        return [(g, n) for n, g in ranked[:max(limit, 0)]]

    def busiest_groups(self, queue: str, limit: int) -> list[GroupFigures]:
        """See :meth:`RedisStore.busiest_groups`."""
        names = [g for g, _ in self.top_groups(queue, limit)]
        with self._queue(queue) as fq:
            names += sorted(g for g in fq.groups if g not in names)[:max(limit - len(names), 0)]
        return busiest_first(self.group_figures(queue, names))

    def group_figures(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]:
        """See :meth:`RedisStore.group_figures`."""
        with self._queue(queue) as fq:
            out = []
            for g in groups:
                group = fq.groups.get(g)
                cap = fq.cap_of(g)
                out.append(GroupFigures(
                    g, held_interactive=len(fq.held_ids("i", g)),
                    held_background=len(fq.held_ids("b", g)),
                    delayed=group.delayed if group else 0,
                    inflight=group.inflight if group else 0,
                    cap=None if cap < 0 else cap, weight=fq.weight_of(g),
                    limited=limited_by(g in fq.limit_caps, g in fq.limit_weights)))
        return out

    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupHeads]:
        """Counts and head due times of ``groups`` (see :meth:`RedisStore.summarize`)."""
        out = []
        with self._queue(queue) as fq:
            for g in groups:
                group = fq.groups.get(g)
                heads = [fq.lists.get((k, g)) for k in CLASSES]
                due = [due_of(fq.msgs[h[0]].value) if h else None for h in heads]
                since = [group.since[k] / 1000 if h and group and k in group.since else None
                         for k, h in zip(CLASSES, heads)]
                out.append(GroupHeads(g, len(fq.held_ids("i", g)), len(fq.held_ids("b", g)),
                                      group.inflight if group else 0,
                                      group.delayed if group else 0, due[0], due[1],
                                      since[0], since[1]))
        return out

    def check(self, queue: str, repair: bool, now_ms: int, lease_ms: int, *,
              batch: int = 0, reads: list[int] | None = None
              ) -> list[tuple[str, str, str, str]]:
        """The invariants of ``queue`` that do not hold (none should: only the policy
        writes, one operation at a time); nothing to repair, so ``action`` is empty."""
        with self._queue(queue) as fq:
            return [(kind, subject, detail, "")
                    for kind, subject, detail in queue_problems(fq)]

    def check_scope(self, repair: bool, *, batch: int = 0
                    ) -> list[tuple[str, str, str, str]]:
        """fair_scope 'app': the shared counts against the queues' (none should differ:
        only the policy writes them, under the lock); nothing to repair."""
        with self._cond:
            scoped = {q: fq for q, fq in self._queues.items() if fq.scope == APP_SCOPE}
            flights = {q: {g: grp.inflight for g, grp in fq.groups.items()}
                       for q, fq in scoped.items()}
            known = {g for fq in scoped.values() for g in fq.groups}
            return scope_findings(self._scope_n, flights,
                                  {g for _, g in self._scope_charge}, known)

    def ping(self) -> None:
        """Always answers."""

    def flush(self) -> None:
        """Forget every fair queue (the workers' registrations and the dispatchers'
        heartbeats stay)."""
        with self._cond:
            self._queues.clear()
            for shared in (self._sowner, self._swait, self._sadmit, self._swake):
                shared.clear()
            self._registered.clear()
            self._writers.clear()
            self._summaries.clear()
            self._audit.clear()

    def advice(self) -> list[str]:
        """Nothing to advise: the memory store is for tests, and says so."""
        return []

    def close(self) -> None:
        """Nothing to close."""


def _begun(reply: BeginResult | str) -> BeginAnswer:
    """The policy's answer to ``begin``: a result, or the token of the run holding it."""
    return BeginAnswer(None, reply) if isinstance(reply, str) else BeginAnswer(reply)


def _token() -> str:
    return uuid.uuid4().hex[:12] + "."
