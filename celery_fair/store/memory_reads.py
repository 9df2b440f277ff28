"""The memory store's reads that need no policy: where a task stands (``fair inspect``,
its share of :class:`~celery_fair.store.locating.Locating`), the summaries and the
dispatchers' heartbeats."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import cast

from .. import limits
from ..names import validate_group
from ..policy import CLASSES, FairQueue
from . import audit
from .audit import AuditEntry
from .base import PRUNE_GRACE_MS, DispatcherBeat, Location, now_ms
from .base import now_ms as _now
from .held import HeldMessage
from .locating import CLASS_NAMES, Locating, PlaceReads, place_of
from .pausing import WHOLE_QUEUE
from .throttling import check_rate_arg, check_until


class MemoryReads(Locating):
    """A mixin of :class:`~celery_fair.store.memory.MemoryStore` (it gives the lock, the
    queues' state and the summaries)."""

    _cond: threading.Condition
    _writers: dict[str, int]  # queue -> until when its summary writer holds the claim
    _summaries: dict[str, tuple[int, str]]  # queue -> (expires ms, document)
    _audit: deque[AuditEntry]
    _queues: dict[str, FairQueue]
    _beats: dict[str, tuple[DispatcherBeat, int]]  # dispatcher id -> (beat, expires ms)

    def _queue(self, queue: str) -> AbstractContextManager[FairQueue]:
        raise NotImplementedError

    # -- where a task stands (``fair inspect``) --------------------------------------

    def _held_at(self, queue: str, task_id: str) -> Location | None:
        with self._queue(queue) as fq:
            held = fq.msgs.get(task_id)
            if held is None:
                return None
            group, klass = held.placement.group, held.placement.klass
            where = Location(task_id, queue, group, CLASS_NAMES[klass], "held")
            if task_id in fq.delayed:
                return dataclasses.replace(where, state="delayed", due_ms=fq.delayed[task_id])
            ids = fq.held_ids(klass, group)
        position = ids.index(task_id) if task_id in ids else None
        return dataclasses.replace(where, place=place_of(
            cast(PlaceReads, self), queue, klass, group, position))  # MemoryStore has the reads

    def _copies_at(self, queue: str, task_id: str) -> list[str]:
        with self._queue(queue) as fq:
            return sorted(fq.copies.get(task_id, ()))

    def held_messages(self, queue: str, group: str, limit: int,
                      klass: str | None = None) -> list[HeldMessage]:
        with self._queue(queue) as fq:
            ids = [(c, i) for c in ([klass] if klass else CLASSES)
                   for i in fq.held_ids(c, group)]
            return [HeldMessage(i, c, fq.msgs[i].value) for c, i in ids[:limit]]

    def _dispatched_at(self, queue: str, task_id: str) -> Location | None:
        with self._queue(queue) as fq:
            for did in sorted(fq.leases, key=lambda d: (fq.leases[d], d)):
                record = fq.records.get(did)
                if record is not None and record.hold_id.split("~")[0] == task_id:
                    return Location(task_id, queue, record.group, CLASS_NAMES[record.klass],
                                    record.state, dispatch_id=did)
        return None

    def ready_rank(self, queue: str, klass: str, group: str) -> tuple[int | None, float]:
        """See :meth:`~celery_fair.store.locating.PlaceReads.ready_rank`."""
        with self._queue(queue) as fq:
            ready = fq.ready[klass]
            known = fq.groups.get(group)
            tag = known.tags.get(klass, 0.0) if known else 0.0
            if group not in ready:  # it re-enters the ready set at the virtual time
                return None, max(tag, fq.vt.get(klass, 0.0))
            rank = sorted((t, g) for g, t in ready.items()).index((ready[group], group))
            return rank, tag

    def ready_before(self, queue: str, klass: str, start: float,
                     limit: int) -> list[tuple[str, float]]:
        """See :meth:`~celery_fair.store.locating.PlaceReads.ready_before`."""
        with self._queue(queue) as fq:
            ranked = sorted((t, g) for g, t in fq.ready[klass].items() if t < start)
        return [(g, t) for t, g in ranked[:limit]]

    def claim_writer(self, queue: str, ms: int) -> bool:
        with self._cond:
            now = now_ms()
            if self._writers.get(queue, 0) > now:
                return False
            self._writers[queue] = now + ms
            return True

    def put_summary(self, queue: str, doc: str, ttl_seconds: int) -> None:
        with self._cond:
            self._summaries[queue] = (now_ms() + ttl_seconds * 1000, doc)

    def summaries(self, queues: Sequence[str]) -> dict[str, str | None]:
        with self._cond:
            now = now_ms()
            live = {q: doc for q, (expires, doc) in self._summaries.items() if expires > now}
        return {q: live.get(q) for q in queues}

    def beat(self, dispatcher: DispatcherBeat, now_ms: int, ttl_ms: int) -> None:
        with self._cond:
            self._beats[dispatcher.id] = (dispatcher, now_ms + ttl_ms)
            for gone in [i for i, (_, expires) in self._beats.items()
                         if expires < now_ms - PRUNE_GRACE_MS]:
                del self._beats[gone]

    def dispatchers(self, now_ms: int) -> list[DispatcherBeat]:
        with self._cond:
            return [beat for i, (beat, expires) in sorted(self._beats.items())
                    if expires >= now_ms]

    def forget_dispatcher(self, dispatcher_id: str) -> None:
        with self._cond:
            self._beats.pop(dispatcher_id, None)

    def audit_append(self, entry: AuditEntry) -> None:
        with self._cond:
            self._audit.append(entry)
            while len(self._audit) > audit.AUDIT_MAX:
                self._audit.popleft()

    def audit_read(self, limit: int = 100, since_ms: int | None = None) -> list[AuditEntry]:
        with self._cond:
            newest = list(reversed(self._audit))[:max(limit, 0)]
        return [e for e in newest if since_ms is None or e.at_ms >= since_ms]

    def pause(self, queue: str, group: str, until_ms: int | None) -> None:
        if group != WHOLE_QUEUE:
            group = validate_group(group)
        with self._queue(queue) as fq:
            fq.pause(group, math.inf if until_ms is None else until_ms)

    def resume(self, queue: str, group: str) -> bool:
        with self._queue(queue) as fq:
            return fq.resume(group)

    def pauses(self, queue: str) -> dict[str, int | None]:
        with self._cond:
            fq = self._queues.get(queue)
            found = dict(fq.pauses) if fq is not None else {}
        return {g: None if math.isinf(until) else int(until) for g, until in found.items()}

    def expire_pauses(self, queue: str, now_ms: int) -> list[str]:
        with self._queue(queue) as fq:
            return fq.expire_pauses(now_ms)

    def boost(self, queue: str, group: str, weight: float, until_ms: int | None) -> None:
        group = validate_group(group)
        weight = limits.weight(weight, f"boost weight for group {group!r}")
        with self._queue(queue) as fq:
            fq.boost(group, weight, math.inf if until_ms is None else until_ms)

    def unboost(self, queue: str, group: str) -> bool:
        with self._queue(queue) as fq:
            return fq.unboost(group)

    def boosts(self, queue: str) -> dict[str, tuple[float, int | None]]:
        with self._cond:
            fq = self._queues.get(queue)
            found = dict(fq.boosts) if fq is not None else {}
        return {g: (w, None if math.isinf(until) else int(until))
                for g, (w, until) in found.items()}

    def boost_task(self, queue: str, hold_id: str, *, now_ms: int | None = None) -> str | None:
        with self._queue(queue) as fq:
            return fq.boost_task(hold_id, now_ms if now_ms is not None else _now())

    def expire_boosts(self, queue: str, now_ms: int) -> list[str]:
        with self._queue(queue) as fq:
            return fq.expire_boosts(now_ms)

    def set_rate(self, queue: str, group: str, rate: limits.Rate | str | None) -> \
            limits.Rate | None:
        group = validate_group(group)
        rate = check_rate_arg(rate, group)
        with self._queue(queue) as fq:
            return fq.set_rate(group, rate)

    def throttle(self, queue: str, group: str, until_ms: float) -> float:
        group = validate_group(group)
        until = check_until(until_ms)
        with self._queue(queue) as fq:
            return fq.throttle(group, until)

    def throttles(self, queue: str) -> dict[str, float]:
        with self._cond:
            fq = self._queues.get(queue)
            return dict(fq.throttled) if fq is not None else {}

    def rates(self, queue: str) -> dict[str, limits.Rate | None]:
        with self._cond:
            fq = self._queues.get(queue)
            return dict(fq.rates) if fq is not None else {}
