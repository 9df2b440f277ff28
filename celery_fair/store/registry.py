"""The worker registry, a family of the store contract (:class:`~celery_fair.store.base.
Store` inherits it): which workers consume a fair queue, their pools, when they started
and the slot each holds. The caller's clock, as for the heartbeats.

A worker registers per fair queue at start and again every lease beat
(``worker.LeaseKeeper``); its registration lasts until ``expires_ms``. At its first
registration (or its first after its last one expired: it is a newcomer again) it
records its start time and atomically takes the lowest **slot** number no live worker
holds, so slots are numbered in join order and a slot whose worker left (unregistered,
or its registration expired) stays empty until the next newcomer takes it: the slot
table :mod:`celery_fair.affinity` hashes groups over. A live worker registering again
keeps its start time and its slot.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from .models import PRUNE_GRACE_MS, LiveWorker

__all__ = ["PRUNE_GRACE_MS", "LiveWorker", "Registry", "by_slot", "lowest_free", "slot_table"]


def by_slot(worker: LiveWorker) -> tuple[int, int, str]:
    """Sort key of live workers: by slot, those without one last (by start, name)."""
    if worker.slot is not None:
        return (0, worker.slot, worker.hostname)
    return (1, worker.started_ms or 0, worker.hostname)


def lowest_free(taken: Iterable[int | None]) -> int:
    """The lowest slot number (from 0) not in ``taken``."""
    held = {slot for slot in taken if slot is not None}
    return next(n for n in range(len(held) + 1) if n not in held)


def slot_table(workers: Iterable[LiveWorker]) -> list[str | None]:
    """The :data:`celery_fair.affinity.Slots` table of ``workers``: each one's hostname at
    its slot, None at an empty slot (workers without a slot, registered by a version
    before slots, are left out)."""
    placed = {w.slot: w.hostname for w in workers if w.slot is not None}
    return [placed.get(n) for n in range(max(placed) + 1)] if placed else []


class Registry(abc.ABC):
    """The live workers of each fair queue of one namespace."""

    @abc.abstractmethod
    def register_worker(self, queue: str, worker: str, concurrency: int, expires_ms: int,
                        now_ms: int) -> None:
        """A worker consuming ``queue`` with ``concurrency`` slots is alive until
        ``expires_ms``. Idempotent. A new worker wakes the dispatchers (it brings
        capacity) and takes its start time and slot atomically (this module's
        docstring); entries expired :data:`PRUNE_GRACE_MS` before ``now_ms`` are
        dropped."""

    @abc.abstractmethod
    def unregister_worker(self, queue: str, worker: str) -> None:
        """The worker left (idempotent): its slot is free for the next newcomer."""

    @abc.abstractmethod
    def worker_pools(self, queue: str, now_ms: int) -> dict[str, int]:
        """The live workers consuming ``queue`` at ``now_ms``: {worker: pool size}."""

    def worker_capacity(self, queue: str, now_ms: int) -> int:
        """Sum of the pool sizes of the live workers consuming ``queue``."""
        return sum(self.worker_pools(queue, now_ms).values())

    @abc.abstractmethod
    def live_workers(self, queue: str, now_ms: int) -> list[LiveWorker]:
        """The live workers consuming ``queue`` at ``now_ms`` with their start times and
        slots, by slot (a worker without one, from a version before slots, last). Reads
        only."""
