"""The SQL store's worker registry (see ``registry.py``): the ``workers`` table, a row
per worker and fair queue. A newcomer's slot is the lowest no live worker holds, read
and written in one transaction; the unique index on (ns, queue, slot) turns a slot two
transactions chose at once into an IntegrityError for the second, whose transaction is
run again from the start, seeing the first's slot (not in a savepoint: MariaDB's
deadlock rolls back the whole transaction, savepoints with it)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ...errors import StoreError
from ..models import PRUNE_GRACE_MS, LiveWorker
from ..registry import by_slot, lowest_free
from .schema import Tables

T = TypeVar("T")

#: Tries of a newcomer whose slot another registration took at the same instant.
SLOT_TRIES = 32


class SqlRegistry:
    """Registers workers (a mixin of :class:`~celery_fair.store.sql.store.SqlStore`)."""

    t: Tables
    namespace: str
    where: str
    wakes: Any

    def _read(self, what: str, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError  # SqlReads gives it

    def _q(self, table: Any, queue: str) -> Any:
        raise NotImplementedError  # SqlReads gives it

    def register_worker(self, queue: str, worker: str, concurrency: int, expires_ms: int,
                        now_ms: int) -> None:
        w = self.t.workers
        mine = (self._q(w, queue), w.c.worker == worker)

        def work(c: Connection) -> bool:
            # expired registrations free their slots (a live worker's slot is never freed)
            c.execute(update(w).where(self._q(w, queue), w.c.expires_ms < now_ms,
                                      w.c.slot.is_not(None)).values(slot=None))
            was = c.execute(select(w.c.expires_ms, w.c.slot)
                            .where(*mine).with_for_update()).first()
            values = {"concurrency": concurrency, "expires_ms": expires_ms}
            if was is None or was.slot is None or was.expires_ms < now_ms:
                taken = c.execute(select(w.c.slot).where(
                    self._q(w, queue), w.c.worker != worker, w.c.slot.is_not(None),
                    w.c.expires_ms >= now_ms)).scalars()
                values.update(started_ms=now_ms, slot=lowest_free(taken))
            if was is None:
                c.execute(insert(w).values(ns=self.namespace, queue=queue, worker=worker,
                                           **values))
            else:
                c.execute(update(w).where(*mine).values(**values))
            c.execute(delete(w).where(self._q(w, queue),
                                      w.c.expires_ms < now_ms - PRUNE_GRACE_MS))
            return was is None

        for _ in range(SLOT_TRIES):
            try:
                new = self._read("register worker", work)
            except StoreError as exc:
                if isinstance(exc.__cause__, IntegrityError):
                    continue  # its slot (or its row) was taken at the same instant: again
                raise
            if new:
                self.wakes.wake(queue)  # a new worker brings capacity
            return
        raise StoreError(f"store {self.where}: worker {worker!r} found no free slot in "
                         f"{SLOT_TRIES} tries")

    def unregister_worker(self, queue: str, worker: str) -> None:
        w = self.t.workers
        self._read("unregister worker", lambda c: c.execute(delete(w).where(
            self._q(w, queue), w.c.worker == worker)))

    def prune_workers(self, queue: str, before_ms: int) -> int:
        w = self.t.workers
        return int(self._read("prune workers", lambda c: c.execute(delete(w).where(
            self._q(w, queue), w.c.expires_ms < before_ms)).rowcount))

    def worker_pools(self, queue: str, now_ms: int) -> dict[str, int]:
        w = self.t.workers.c
        rows = self._read("worker pools", lambda c: list(c.execute(
            select(w.worker, w.concurrency).where(self._q(self.t.workers, queue),
                                                  w.expires_ms >= now_ms))))
        return {worker: int(n) for worker, n in rows}

    def live_workers(self, queue: str, now_ms: int) -> list[LiveWorker]:
        w = self.t.workers.c
        rows = self._read("live workers", lambda c: list(c.execute(
            select(w.worker, w.concurrency, w.started_ms, w.slot).where(
                self._q(self.t.workers, queue), w.expires_ms >= now_ms))))
        return sorted((LiveWorker(r.worker, int(r.concurrency), r.started_ms, r.slot)
                       for r in rows), key=by_slot)
