"""The memory store's affinity routing (see ``routing.py``): :class:`FairQueue`'s map,
per-target in-flight counts and routed pick (``policy/routing.py``), under the store's
lock, as ``pick.lua`` and ``assign.lua`` do them in one script."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..policy import FairQueue
from ..policy.routing import RouteCall
from .routing import Routed

__all__ = ["MemoryRouting"]


class MemoryRouting:
    """Routes groups to targets (a mixin of :class:`~celery_fair.store.memory.MemoryStore`)."""

    _cond: threading.Condition
    _queues: dict[str, FairQueue]
    supports_affinity = True

    def _queue(self, queue: str) -> AbstractContextManager[Any]:
        raise NotImplementedError  # MemoryStore gives it

    def pick_routed(self, queue: str, limit: int, capacity: int | None, now_ms: int,
                    lease_ms: int, workers: Mapping[str, int], spill_ms: int | None, *,
                    promote: bool = False, token: str | None = None) -> Routed:
        with self._queue(queue) as fq:
            promoted = fq.promote(now_ms, 1000) if promote else (0, None)
            if not workers:  # no live target: nothing goes, no pick counted
                return Routed(promoted=promoted)
            call = RouteCall.of(workers, fq.wflight, spill_ms, now_ms)
            picked = fq.pick(limit, capacity, now_ms, lease_ms,
                             token or uuid.uuid4().hex[:12] + ".", call)
            return Routed(picked, list(call.targets), sorted(call.unassigned), promoted)

    def assign(self, queue: str, changes: Sequence[tuple[str, str | None, str]]) -> int:
        with self._queue(queue) as fq:
            return int(fq.assign(changes))

    def _read(self, queue: str) -> FairQueue | None:
        return self._queues.get(queue)

    def assignments(self, queue: str) -> dict[str, str]:
        with self._cond:
            fq = self._read(queue)
            return dict(fq.aff) if fq else {}

    def worker_inflight(self, queue: str) -> dict[str, int]:
        with self._cond:
            fq = self._read(queue)
            return dict(fq.wflight) if fq else {}

    def affinity_moves(self, queue: str) -> int:
        with self._cond:
            fq = self._read(queue)
            return fq.stat.get("moves", 0) if fq else 0
