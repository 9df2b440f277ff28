"""A dispatch's life in a worker: begin (the task starts) and release (its slot is free).

The two halves of one lifecycle, kept together: a run is named when it begins
(:func:`new_run`) and that name travels with its release; before taking over a run that
died (:func:`run_gone`), begin lands what the dead process could not release. Releases
that fail while the store is unreachable are kept and retried (:class:`PendingReleases`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from celery import Celery

from .config import get_config
from .errors import FairError, ReplicationTimeout
from .events import BEGIN_SKIP, RELEASE, log_event
from .headers import DISPATCH_HEADER, GROUP_HEADER, LEASE_HEADER, QUEUE_HEADER, request_headers
from .host import identity, pid_alive
from .outage import Backoff, Outage
from .spool import Spool, spool_for
from .store import store_for
from .store.base import BeginResult, Store

# The name this log has always had (releases lived in worker.py): users filter on it.
logger = logging.getLogger("celery_fair.worker")


def begin_dispatch(app: Celery, request: Any, acks_late: bool = False,
                   run: str | None = None) -> BeginResult:
    """Tell the store a worker starts the dispatch carried by ``request``, as ``run``
    (:func:`new_run`). ``acks_late``: the message stays with the record while it runs
    (see ``begin.lua``)."""
    headers = request_headers(request)
    did, queue = headers.get(DISPATCH_HEADER), headers.get(QUEUE_HEADER)
    if not did or not queue:
        return BeginResult.RUN_UNKNOWN
    now = time.time()
    deadline = int((now + get_config(app).lease_seconds) * 1000)
    store = store_for(app)

    def gone(other: str) -> bool:
        # Before taking a dead run over, land what its process could not tell the store
        # (a release that failed in an outage): if the task had ended, this copy skips.
        if not run_gone(other):
            return False
        with contextlib.suppress(ValueError):
            spool_for(store, get_config(app).spool_dir).replay(int(other.rsplit(":", 3)[1]))
        return True

    result = store.begin(queue, did, deadline, now_ms=int(now * 1000),
                         run=run or new_run(), acks_late=acks_late, host=_HOST, gone=gone)
    if result is BeginResult.SKIP:
        log_event(logger, BEGIN_SKIP, _task_id(request, headers), headers.get(GROUP_HEADER),
                  queue, dispatch=did)
    return result


def starts_quickly(app: Celery, request: Any, acks_late: bool) -> bool:
    """``fair_quick_start``: whether the run of ``request`` may start without begin's
    round trip. Only for a task that acks early, on the first delivery of a message the
    pick script pushed itself, while half its lease is still ahead: that copy is the
    current one (only a lease that ran out has its dispatch held again, and the worker's
    lease keeper renews it long before), and nothing ran it before (acks-early: a copy
    the broker redelivers says so). DESIGN.md "Quick start" states the trade-off: the
    record keeps the message, so should the worker die mid-task, the task runs again
    after the lease (at least once) instead of being lost (at most once)."""
    config = get_config(app)
    if acks_late or not config.quick_start:
        return False
    headers = request_headers(request)
    until = headers.get(LEASE_HEADER)
    if not isinstance(until, int) or headers.get("redelivered"):
        return False
    delivery = getattr(request, "delivery_info", None) or {}
    if delivery.get("redelivered"):
        return False
    return until - time.time() * 1000 > config.lease_seconds * 500


def _task_id(request: Any, headers: Mapping[str, Any]) -> Any:
    return headers.get("id") or getattr(request, "id", None)


#: The prefix of this process's runs: host, boot and PID namespace (see host.py). A run of
#: another prefix is never judged gone here, whatever its pid means in this namespace.
_HOST = f"{identity()}:"


def new_run() -> str:
    """A name for one run of a task: ``host/boot/pidns:pid:thread:nonce``."""
    return f"{_HOST}{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:12]}"


def run_gone(run: str) -> bool:
    """Whether the run named ``run`` ended without a word: a run of this host, boot and
    PID namespace whose process is gone (a pool process killed mid-task, whose message
    Celery requeued), or this very thread's, which runs one task at a time. A run of any
    other is never concluded gone: its pid means nothing here."""
    if not run.startswith(_HOST):
        return False
    try:
        _, pid, thread, _ = run.rsplit(":", 3)
        pid_number = int(pid)
    except ValueError:
        return False
    if pid_number == os.getpid():
        return thread == str(threading.get_ident())
    return not pid_alive(pid_number)


class PendingReleases:
    """Releases that failed while the store was unreachable, kept to retry on reconnect:
    by a thread of the process that kept them, with backoff, and before the next release
    in the process. Soon, because a release marks the task done: until it lands, a copy
    the broker redelivers would run it again. Should the process end first, the
    dispatch's lease, no longer renewed, returns the slot after ``fair_lease_seconds``.
    Bounded: past ``limit`` the oldest are left to their leases."""

    def __init__(self, limit: int = 10_000, backoff: tuple[float, float] = (0.05, 0.25)) -> None:
        self.limit = limit
        self.backoff = backoff
        self._lock = threading.Lock()
        # (queue, dispatch id) -> (seconds to keep its 'released' tombstone (0: none), run)
        self._items: dict[Store, dict[tuple[str, str], tuple[int, str]]] = {}
        # Releases a flush took out of _items and has not settled yet: the spool file
        # holds them until then, so nobody may clear it meanwhile.
        self._in_flight: dict[Store, int] = {}
        self._spools: dict[Store, Spool] = {}
        self._retrier: threading.Thread | None = None
        self._retrier_pid = 0

    def add(self, store: Store, queue: str, did: str, done_seconds: int = 0,
            run: str = "", spool: Spool | None = None, spooled: bool = False) -> None:
        """Keep a failed release to retry; ``spooled``: already written ahead (ahead)."""
        spool = spool or spool_for(store)
        with self._lock:
            self._spools[store] = spool
            items = self._items.setdefault(store, {})
            done_seconds = max(done_seconds, items.get((queue, did), (0, ""))[0])
            items[(queue, did)] = (done_seconds, run)
            while len(items) > self.limit:
                del items[next(iter(items))]
            self._start_retrier()
        if not spooled:
            spool.add(queue, did, done_seconds, run)  # should this process die

    def ahead(self, store: Store, queue: str, did: str, done_seconds: int, run: str,
              spool: Spool) -> None:
        """Spool a release before it is sent: a process killed while the call is on its
        way (or blocked on a store that is down) leaves it for the lease keepers of this
        host to land before the dispatch's lease runs out. Call :meth:`sent` after."""
        with self._lock:
            self._spools[store] = spool
            self._in_flight[store] = self._in_flight.get(store, 0) + 1
        spool.add(queue, did, done_seconds, run)

    def sent(self, store: Store) -> None:
        """A release spooled :meth:`ahead` landed, or is kept pending (:meth:`add`)."""
        with self._lock:
            self._in_flight[store] -= 1
            if not self._items.get(store) and not self._in_flight[store]:
                self._spools[store].landed()

    def _start_retrier(self) -> None:
        # With the lock held. One thread per process: a forked pool process has a copy of
        # the parent's object but none of its threads.
        alive = self._retrier is not None and self._retrier.is_alive()
        if alive and self._retrier_pid == os.getpid():
            return
        self._retrier_pid = os.getpid()
        self._retrier = threading.Thread(target=self._retry_until_done, daemon=True,
                                         name="celery-fair-releases")
        self._retrier.start()

    def _retry_until_done(self) -> None:
        backoff, wait = Backoff(*self.backoff), threading.Event()
        while True:
            wait.wait(backoff.next())
            for store in list(self._items):
                try:
                    retry_pending_releases(store)
                except FairError:
                    pass  # still down (the first failure was logged)
            with self._lock:
                if not any(self._items.values()):
                    self._retrier = None
                    return

    def __len__(self) -> int:
        return sum(len(items) for items in self._items.values())

    def flush(self, store: Store) -> int:
        """Retry every pending release of ``store``; raises FairError (keeping the rest)
        when the store still fails. Returns how many were retried."""
        with self._lock:
            items = self._items.pop(store, {})
            self._in_flight[store] = self._in_flight.get(store, 0) + len(items)
        taken, done = len(items), 0
        try:
            for (queue, did), (done_seconds, run) in list(items.items()):
                try:
                    store.release(queue, did, done_seconds, run=run or None)
                except ReplicationTimeout as exc:  # applied on the master: done
                    _not_replicated(exc)
                else:
                    _replication_outage.ok()
                del items[(queue, did)]
                done += 1
        finally:
            with self._lock:
                self._in_flight[store] -= taken
                if items:
                    self._items.setdefault(store, {}).update(items)
                elif not self._items.get(store) and not self._in_flight[store] \
                        and store in self._spools:
                    # Only now is nothing of this process's file still needed.
                    self._spools[store].clear()
        return done


pending_releases = PendingReleases()
_release_outage = Outage(logger, "celery_fair: releasing slots", expected=(FairError,))
#: fair_store_replicas not acknowledging releases in time: each is applied on the master
#: all the same (its script ran), so it is neither kept nor retried; said once.
_replication_outage = Outage(logger, "celery_fair: replicating releases",
                             expected=(FairError,))


def _not_replicated(exc: ReplicationTimeout) -> None:
    _replication_outage.failed(exc, "the releases are applied on the master, not retried "
                                    "(a failover before the replicas catch up may undo them)")


def release_dispatch(app: Celery, headers: Mapping[str, Any], reason: str,
                     done: bool = False, run: str | None = None,
                     task_id: str | None = None, runtime: float | None = None) -> None:
    """Free the slot of the dispatch named in ``headers`` (idempotent). ``done``: the task
    ran to its end in the pool, so its record stays ``fair_done_ttl`` seconds as a
    tombstone and a copy the broker redelivers later is skipped. ``runtime``: the
    seconds it ran (``fair_charge`` 'runtime' corrects its group's share by it). When the
    store is unreachable the release is kept and retried on reconnect
    (:class:`PendingReleases`), without its runtime: a late correction would charge a
    share that has moved on, and the estimate stands.
    ``task_id`` names the task in the DEBUG release line (events.py)."""
    did, queue = headers.get(DISPATCH_HEADER), headers.get(QUEUE_HEADER)
    if not did or not queue:
        return
    store, config = store_for(app), get_config(app)
    done_seconds = config.done_ttl if done else 0
    spool = spool_for(store, config.spool_dir)
    ahead = done and store.outlives_process
    if ahead:
        # The body ran to its end: until the store records that, a SIGKILL would leave
        # the dispatch running and its lease would run the task again. A local append
        # outlives the process at once; the store call may take a while (DESIGN.md).
        pending_releases.ahead(store, queue, did, done_seconds, run or "", spool)
    try:
        retry_pending_releases(store)
        try:
            store.release(queue, did, done_seconds, run=run, runtime=runtime)
        except ReplicationTimeout as exc:  # its script ran: released, not pending
            _not_replicated(exc)
        else:
            _replication_outage.ok()
    except FairError as exc:
        pending_releases.add(store, queue, did, done_seconds, run or "", spool,
                             spooled=ahead)
        _release_outage.failed(exc, "keeping them to retry when the store is back (or "
                               "their leases return the slots)")
        return
    finally:
        if ahead:
            pending_releases.sent(store)
    _release_outage.ok()
    log_event(logger, RELEASE, task_id or headers.get("id"), headers.get(GROUP_HEADER),
              queue, dispatch=did, reason=reason, done=done or None)


def retry_pending_releases(store: Store) -> None:
    """Retry the releases that failed in this process; FairError if the store still fails."""
    if len(pending_releases):
        flushed = pending_releases.flush(store)
        _release_outage.ok(f"; {flushed} pending releases done")
