"""The memory store's worker registry (see ``registry.py``): one dict per fair queue,
under the store's lock, so a slot is taken atomically as ``register.lua`` takes it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from .models import PRUNE_GRACE_MS, LiveWorker
from .registry import by_slot, lowest_free

__all__ = ["MemoryRegistry", "Registration"]


class Registration(NamedTuple):
    expires_ms: int
    concurrency: int
    started_ms: int
    slot: int


class MemoryRegistry:
    """Registers workers (a mixin of :class:`~celery_fair.store.memory.MemoryStore`)."""

    _cond: threading.Condition
    _workers: dict[str, dict[str, Registration]]

    def _queue(self, queue: str) -> AbstractContextManager[Any]:
        raise NotImplementedError  # MemoryStore gives it

    def register_worker(self, queue: str, worker: str, concurrency: int, expires_ms: int,
                        now_ms: int) -> None:
        with self._queue(queue) as fq:
            workers = self._workers.setdefault(queue, {})
            if worker not in workers:
                fq.woken = True  # a new worker brings capacity
            was = workers.get(worker)
            if was is not None and was.expires_ms >= now_ms:  # live: keeps start and slot
                started, slot = was.started_ms, was.slot
            else:
                started, slot = now_ms, lowest_free(
                    r.slot for w, r in workers.items() if w != worker and r.expires_ms >= now_ms)
            workers[worker] = Registration(expires_ms, concurrency, started, slot)
        self.prune_workers(queue, now_ms - PRUNE_GRACE_MS)

    def unregister_worker(self, queue: str, worker: str) -> None:
        with self._cond:
            self._workers.get(queue, {}).pop(worker, None)

    def prune_workers(self, queue: str, before_ms: int) -> int:
        with self._cond:
            workers = self._workers.get(queue, {})
            dead = [w for w, r in workers.items() if r.expires_ms < before_ms]
            for worker in dead:
                del workers[worker]
        return len(dead)

    def _live(self, queue: str, now_ms: int) -> Iterator[tuple[str, Registration]]:
        return ((w, r) for w, r in self._workers.get(queue, {}).items()
                if r.expires_ms >= now_ms)

    def worker_pools(self, queue: str, now_ms: int) -> dict[str, int]:
        with self._cond:
            return {w: r.concurrency for w, r in self._live(queue, now_ms)}

    def live_workers(self, queue: str, now_ms: int) -> list[LiveWorker]:
        with self._cond:
            found = [LiveWorker(w, r.concurrency, r.started_ms, r.slot)
                     for w, r in self._live(queue, now_ms)]
        return sorted(found, key=by_slot)

