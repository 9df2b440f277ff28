"""The dispatcher: feeds each real queue from its holding queues, as fast as workers free up.

One :meth:`Dispatcher.step` promotes due delayed messages, reclaims expired leases, picks
as many messages as the queue has free capacity (one atomic store call per batch),
publishes them verbatim with kombu and confirms them. :meth:`Dispatcher.run` repeats steps
and, when there is nothing to do, blocks on the store's wake markers (pushed by holds and
releases) instead of polling.

The parts: ``directory.py`` (which queues are served, their capacity), ``publisher.py``
(the kombu side: batching, declares, returns and nacks, expiry, reconnects).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery import Celery
from kombu.exceptions import OperationalError

from .brokers import check_app
from .config import FairConfig, get_config
from .directory import QueueDirectory
from .errors import FairError, SlotMigrating, StoreConnectionError
from .events import DISPATCH, enabled, log_event
from .heartbeat import Heartbeat
from .liveness import app_name
from .outage import Backoff, Outage
from .pauses import PauseExpiry
from .publisher import KombuPublisher
from .redact import safe_url
from .refill import Refill
from .reporting import Reporter, log_start
from .routing import Router
from .schedule import StepSchedule
from .shards import Shard
from .store import store_for
from .store.base import Picked, Pushed, Store
from .store.base import now_ms as _now_ms
from .summary import SummaryWriter
from .urls import CLUSTER_SCHEMES, REDIS_SCHEMES, SENTINEL_SCHEMES, scheme_of

logger = logging.getLogger(__name__)

#: How long a dispatcher may take from pick to the broker's acceptance of a message.
PICK_LEASE_MS = 10_000
#: How often a busy dispatcher looks for expired leases (seconds). A step per release
#: would otherwise run the reclaim script each time; leases last seconds, so a few tenths
#: of a second later changes nothing.
RECLAIM_SECONDS = 0.2
#: Longest sleep between steps when idle (also bounds shutdown and discovery delays).
MAX_IDLE_SECONDS = 1.0
#: Longest wait between steps while the store or the broker fails.
MAX_BACKOFF_SECONDS = 5.0


@dataclass
class StepResult:
    """What one step did, per fair queue summed."""

    dispatched: int = 0
    promoted: int = 0
    requeued: int = 0
    lost: int = 0
    stale: int = 0
    expired: int = 0  # held past their `expires`: marked REVOKED, never published
    refused: int = 0  # the broker refused or could not route them: held again later
    saturated: bool = False  # a queue took a full batch: step again at once
    next_due_ms: int | None = None
    by_queue: dict[str, int] = field(default_factory=dict)


class DispatchObserver(Protocol):
    """What a dispatcher reports as it works (``metrics.DispatcherMetrics``)."""

    def on_dispatch(self, queue: str, group: str, klass: str, due_at: float | None) -> None:
        """One message handed to the broker: its group, class and when it became due."""

    def on_reclaim(self, queue: str, requeued: int, lost: int) -> None: ...

    def on_step(self, seconds: float) -> None: ...


class Dispatcher:
    """Dispatches the fair queues of ``app`` (all of them, or ``queues``; with ``shard``,
    only those of that shard: shards.py)."""

    def __init__(self, app: Celery, queues: Iterable[str] | None = None,
                 batch_size: int | None = None, shard: Shard | None = None) -> None:
        self.app = app
        # Fails here on bad settings, eager mode, task protocol 1 or an unsupported broker.
        self.broker = check_app(app, dispatching=True)
        self.config: FairConfig = get_config(app)
        store = store_for(app)
        self.batch_size = batch_size or self.config.batch_size
        self.stopping = threading.Event()
        #: Monotonic seconds for everything time-driven in the loop (refreshes, periodic
        #: steps, pruning); tests may replace it to move time by hand.
        self.clock: Callable[[], float] = time.monotonic
        self._schedule = StepSchedule(lambda: self.clock())  # what to step next
        self._reclaim_after = 0.0  # monotonic; no reclaim before (see run)
        self._reclaimed: dict[str, float] = {}  # queue -> when its leases were last checked
        self._moving: set[str] = set()  # queues whose cluster slot is migrating
        self.directory = QueueDirectory(
            store, self.config, sorted(set(queues)) if queues else None, self._schedule,
            lambda: self.clock(), self._forget, shard)
        self.publisher = KombuPublisher(app, self.broker, store, self.config, self._notify,
                                        lambda: self.observer is not None)
        self._store = store
        #: refill in release (refill.py): run() turns it on (``refill.live``)
        self.refill = Refill(self.publisher.push_for, self.directory.shares_pools)
        # fair_affinity: which worker each group goes to (refuses a store without it)
        self.router = Router(lambda: self.store, self.config, lambda: self.clock())
        self.directory.refills = lambda q: not self.router.routes(q) and self.refill.refills(q)
        # Store or broker down: back off (capped) and log the outage's start and end once.
        self._backoff = Backoff(0.1, MAX_BACKOFF_SECONDS)
        self._outage = Outage(logger, "dispatcher step",
                              expected=(FairError, OperationalError, OSError))
        self._summary = SummaryWriter(store)  # for dashboards; about once a second
        self._pauses = PauseExpiry(lambda: self.store, lambda: self.clock())
        self._reporter = Reporter(lambda: self.store, self.config)  # fair_report_interval
        self.observer: DispatchObserver | None = None
        # Its failures never fail a step (see _notify): one warning per burst of them.
        self._observer_outage = Outage(logger, "dispatch observer (metrics)")
        # What status, Flower, /metrics and check read to tell this dispatcher is alive.
        self.heartbeat = Heartbeat(lambda: self.store, lambda: (
            self.directory.fixed_queues or self.directory.queues,
            self.directory.fixed_queues is None), app_name(app))

    @property
    def store(self) -> Store:
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        # Tests (and tools) may put another store in; the parts use the same one.
        self._store = self.directory.store = self.publisher.store = store

    def _forget(self, queue: str) -> None:
        """``queue`` is no longer served (the directory pruned it)."""
        self._reclaimed.pop(queue, None)
        self.router.forget(queue)

    @property
    def fixed_queues(self) -> list[str] | None:
        return self.directory.fixed_queues

    # -- one iteration ----------------------------------------------------------------

    def step(self, now_ms: int | None = None, *, due_only: bool = False) -> StepResult:
        """Do one round over every fair queue (with ``due_only``, over those woken or due:
        see ``schedule.py``); returns what was done."""
        started = time.monotonic()
        refreshed = self.directory.refresh()
        # Reconnect before picking (and the step keeps failing, so the outage shows).
        self.publisher.reconnect()
        result = StepResult()
        served = self.directory.queues
        queues = self._schedule.take(served) if due_only else served
        if not refreshed:
            self.directory.recheck_empty(queues)
        # before the picks, so a pause that ended lets this step dispatch
        self._pauses.maybe_expire(served, _now_ms() if now_ms is None else now_ms)
        for queue in queues:
            try:
                self._step_queue(queue, result, now_ms)
            except SlotMigrating as exc:  # only this queue waits (resharding)
                self._migrating(queue, exc)
            else:
                self._migrated(queue)
        self._summary.maybe_write(served, self.directory.capacities())
        self._reporter.stepped(result.by_queue, served, self.directory.capacities())
        self._notify("on_step", time.monotonic() - started)
        return result

    def _step_queue(self, queue: str, result: StepResult, now_ms: int | None, *,
                    last: bool = False) -> None:
        """Step ``queue``; the ``last`` step (the dispatcher stops) takes nothing new."""
        now = _now_ms() if now_ms is None else now_ms
        store = self.store
        capacity = self.directory.room(queue)
        workers: list[str] | None = None  # with affinity: each pick's worker
        if self.router.routes(queue):
            (promoted, next_due), (requeued, lost), picked, workers = \
                self._take_routed(queue, now, capacity, now_ms)
            pushed: list[Pushed] = []
        else:
            (promoted, next_due), (requeued, lost), (pushed, picked) = \
                store.promote_reclaim_pick(queue, now, 0 if last else self.batch_size,
                                           capacity, PICK_LEASE_MS,
                                           self.refill.push_for(queue, refill=not last),
                                           now + int(self.config.lease_seconds * 1000),
                                           reclaim=self._reclaim_due(queue, now_ms))
        if requeued or lost:
            logger.warning("queue %s: reclaimed %d slots whose lease ran out "
                           "(%d held again, %d lost with their worker)",
                           queue, requeued + lost, requeued, lost)
            self._notify("on_reclaim", queue, requeued, lost)
        for push in pushed:
            self._notify("on_dispatch", queue, push.group, push.klass, push.due_at)
            if enabled(logger):
                log_event(logger, DISPATCH, push.hold_id, push.group, queue,
                          dispatch=push.dispatch_id, **{"class": push.klass}, via="push")
        self._publish(queue, picked, now, result, workers)
        taken = len(pushed) + len(picked)
        result.dispatched += taken
        result.by_queue[queue] = taken
        result.promoted += promoted
        result.requeued += requeued
        result.lost += lost
        result.saturated |= taken >= self.batch_size
        # Expired leases need no wake-up of their own: every queue is stepped at least
        # every SWEEP_SECONDS, well within any lease.
        if next_due is not None and (result.next_due_ms is None or next_due < result.next_due_ms):
            result.next_due_ms = next_due
        self._schedule.stepped(queue, busy=bool(taken or promoted or requeued or lost),
                               more=taken >= self.batch_size,
                               # from the clock now, not the step's start: a token due
                               # (a rate's throttle) must not wait the step's length more
                               next_due_in=None if next_due is None else
                               (next_due - _now_ms()) / 1000)

    def _take_routed(self, queue: str, now: int, capacity: int | None, now_ms: int | None
                     ) -> tuple[tuple[int, int | None], tuple[int, int], list[Picked],
                                list[str]]:
        """Reclaim (when due), promote and pick ``queue`` with affinity (routing.py): the
        reclaim goes first, on its own, so that the workers are read again after it and
        a dead worker's messages, held again, go to their groups' new workers."""
        requeued = lost = 0
        if self._reclaim_due(queue, now_ms):
            requeued, lost = self.store.reclaim(queue, now, 1000)
        routed = self.router.pick(queue, now, self.batch_size, capacity, PICK_LEASE_MS,
                                  reclaimed=bool(requeued or lost))
        return routed.promoted, (requeued, lost), routed.picked, routed.workers

    def _migrating(self, queue: str, exc: SlotMigrating) -> None:
        """``queue``'s slot is moving to another node: its scripts cannot run until the
        move ends; the other queues go on. Looked at again every SWEEP_SECONDS. Workers
        cannot renew its leases meanwhile: as after an outage (_hold_reclaim), its
        reclaim waits half a lease after the move for their lease keepers."""
        if queue not in self._moving:
            self._moving.add(queue)
            logger.warning("queue %s: not dispatched while its slot migrates: %s", queue, exc)
        self._schedule.stepped(queue, busy=False, more=False, next_due_in=None)
        self._reclaimed[queue] = self.clock() + self.config.lease_seconds / 2

    def _migrated(self, queue: str) -> None:
        if queue in self._moving:
            self._moving.discard(queue)
            logger.warning("queue %s: its slot migrated, dispatched again", queue)

    def _reclaim_due(self, queue: str, now_ms: int | None) -> bool:
        """Whether this step checks ``queue``'s leases: every RECLAIM_SECONDS, and on
        every step given its own clock (tests move time)."""
        clock = self.clock()
        if now_ms is None and (clock < self._reclaim_after or clock - self._reclaimed.get(
                queue, -RECLAIM_SECONDS) < RECLAIM_SECONDS):
            return False
        self._reclaimed[queue] = clock
        return True

    def _publish(self, queue: str, picked: list[Picked], now: int,
                 result: StepResult, workers: list[str] | None = None) -> None:
        stale, counts = self.publisher.publish(queue, picked, now, workers)
        result.expired += counts["expired"]
        result.refused += counts["refused"]
        if stale:
            logger.warning("queue %s: %d dispatches were published after their lease ran "
                           "out; workers will skip those copies", queue, len(stale))
        result.stale += len(stale)

    def capacity(self, queue: str) -> int | None:
        """``queue``'s capacity as last read, without the dispatch-ahead allowance
        (summary.Capacity; None: not read yet)."""
        capacity = self.directory.capacity(queue)
        return None if capacity is None else capacity.capacity

    def _notify(self, hook: str, *args: Any) -> None:
        """Call the observer's ``hook``. Its failure (metrics reading Redis) is logged,
        once per burst, and goes no further: by now the messages are with the broker and
        must still be confirmed, and the store is not what failed, so no backoff."""
        if self.observer is None:
            return
        try:
            getattr(self.observer, hook)(*args)
        except Exception as exc:  # noqa: BLE001 - an observer must not stop dispatching
            self._observer_outage.failed(exc, "dispatching goes on")
        else:
            self._observer_outage.ok()

    def close(self) -> None:
        """Close the dispatcher's broker connection and let its summary thread end
        (``run`` does on exit)."""
        # a last step reports what releases refilled and publishes what they handed off
        self.refill.end(self.store, lambda q: self._step_queue(q, StepResult(), None,
                                                                last=True))
        self.publisher.reset()
        self._summary.stop()
        self.heartbeat.forget()

    # -- the loop ----------------------------------------------------------------------

    def reach_store(self, wait_seconds: float = 0.0) -> None:
        """Check that the store answers, waiting up to ``wait_seconds`` for it to come up.

        Raises StoreConnectionError naming the store's URL (password masked) and what to
        do when it cannot be reached: a wrong URL fails at start, not in a retry loop.
        """
        where = safe_url(self.config.store_url)
        deadline = time.monotonic() + wait_seconds
        backoff, waited = Backoff(0.1, 1.0), False
        while True:
            try:
                self.store.ping()
            except StoreConnectionError as exc:
                cause, left = exc.__cause__ or exc, deadline - time.monotonic()
                if left <= 0 or self.stopping.is_set():
                    server = ("Redis" if scheme_of(self.config.store_url) in REDIS_SCHEMES
                              + SENTINEL_SCHEMES + CLUSTER_SCHEMES
                              else "the database")  # a SQL store's URL is no Redis
                    raise StoreConnectionError(
                        f"cannot reach the celery_fair store at {where} ({cause}); start "
                        f"{server} there, or set fair_store_url (default: the broker URL) "
                        "to where it runs") from None
                if not waited:
                    logger.warning("celery_fair store %s not reachable yet (%s); waiting up "
                                   "to %.0fs for it", where, cause, left)
                    waited = True
                self.stopping.wait(min(backoff.next(), left))
                continue
            if waited:
                logger.info("celery_fair store %s is reachable", where)
            return

    def run(self) -> None:
        """Step until :meth:`stop` (or SIGTERM/SIGINT in the main thread)."""
        self._install_signal_handlers()
        log_start(self.store, self.config, self.fixed_queues, self.directory.shard)
        for sentence in self.store.advice():  # settings that can lose held tasks
            logger.warning("celery_fair store %s: %s", safe_url(self.config.store_url),
                           sentence)
        self.refill.live = True
        while not self.stopping.is_set():
            self.heartbeat.maybe_beat()  # at most once a second; idle or failing too
            try:
                self.step(due_only=True)
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any outage
                self._failed(exc)
                continue
            self.heartbeat.stepped()
            self._backoff.reset()
            self._outage.ok()
            self._sleep()
        self.close()
        logger.info("celery_fair dispatcher stopped")

    def _failed(self, exc: BaseException) -> None:
        """A step (or the wait between steps) failed: wait out the next backoff delay,
        which doubles up to MAX_BACKOFF_SECONDS while the failures go on."""
        self._hold_reclaim()
        self._schedule.everything_due()  # wake-ups may have been lost meanwhile
        delay = self._backoff.next()
        # The wait is in every failure's line (DEBUG after the first), so that a log
        # shows the backoff growing.
        self._outage.failed(exc, f"retrying with backoff (now {delay:.1f}s, growing up "
                                 f"to {MAX_BACKOFF_SECONDS:.0f}s)")
        self.stopping.wait(delay)

    def _sleep(self) -> None:
        """Wait for a wake-up until a queue is due (just a look when one is already:
        wake-ups of other queues are taken while one queue keeps the dispatcher busy)."""
        served = self.directory.queues
        timeout = self._reporter.due_in(self._schedule.timeout(served, MAX_IDLE_SECONDS))
        try:
            self._schedule.woken(self.store.wait(served, timeout))
        except FairError as exc:
            self._failed(exc)  # never spin here; the next step meets the same outage

    def _hold_reclaim(self) -> None:
        # Leases ran on while the store may have been out of reach for workers too: give
        # their lease keepers (which retry every third of a lease) time to renew before a
        # lease that lapsed meanwhile counts as a dead worker.
        self._reclaim_after = self.clock() + self.config.lease_seconds / 2

    def stop(self) -> None:
        self.stopping.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop())
