"""The dispatcher: feeds each real queue from its holding queues, as fast as workers free up.

One :meth:`Dispatcher.step` promotes due delayed messages, reclaims expired leases, picks
as many messages as the queue has free capacity (one atomic store call per batch),
publishes them verbatim with kombu and confirms them. :meth:`Dispatcher.run` repeats steps
and, when there is nothing to do, blocks on the store's wake markers (pushed by holds and
releases) instead of polling.
"""

from __future__ import annotations

import inspect
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from amqp.exceptions import MessageNacked
from celery import Celery
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.exceptions import OperationalError
from kombu.messaging import Producer

from .brokers import AMQP, REDIS, check_app, publish_connection
from .capacity import room, sharing
from .config import FairConfig, get_config
from .direct import direct_push
from .envelope import Envelope, placement_of
from .errors import CorruptMessage, FairError, StoreConnectionError
from .headers import DISPATCH_HEADER, QUEUE_HEADER
from .outage import Backoff, Outage
from .redact import safe_url
from .schedule import PRUNE_SECONDS, StepSchedule
from .store import store_for
from .store.base import DirectPush, Picked, Policy
from .store.redis import RedisStore
from .store.redis import now_ms as _now_ms
from .store.safety import warn_unsafe_settings
from .summary import SummaryWriter

logger = logging.getLogger(__name__)

#: How long a dispatcher may take from pick to the broker's acceptance of a message.
PICK_LEASE_MS = 10_000
#: How often a busy dispatcher looks for expired leases (seconds). A step per release
#: would otherwise run the reclaim script each time; leases last seconds, so a few tenths
#: of a second later changes nothing.
RECLAIM_SECONDS = 0.2
#: Longest sleep between steps when idle (also bounds shutdown and discovery delays).
MAX_IDLE_SECONDS = 1.0
#: How often the set of fair queues and the live workers' capacity are re-read.
REFRESH_SECONDS = 1.0
#: Longest wait for the broker's confirm of one publish (RabbitMQ); then it counts as
#: failed and the message is held again when its pick lease runs out.
CONFIRM_TIMEOUT_SECONDS = 5.0
#: Longest wait between steps while the store or the broker fails.
MAX_BACKOFF_SECONDS = 5.0


#: kombu 5.4+ takes a publish confirm timeout; older kombu would send it along as a
#: message property.
_CONFIRM_TIMEOUT: dict[str, float] = (
    {"confirm_timeout": CONFIRM_TIMEOUT_SECONDS}
    if "confirm_timeout" in inspect.signature(Producer.publish).parameters else {})


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
    """Dispatches the fair queues of ``app`` (all of them, or ``queues``)."""

    def __init__(self, app: Celery, queues: Iterable[str] | None = None,
                 batch_size: int | None = None) -> None:
        self.app = app
        # Fails here on bad settings, eager mode, task protocol 1 or an unsupported broker.
        self.broker = check_app(app, dispatching=True)
        self.config: FairConfig = get_config(app)
        self.store: RedisStore = store_for(app)
        self.batch_size = batch_size or self.config.batch_size
        self.fixed_queues = sorted(set(queues)) if queues else None
        self.stopping = threading.Event()
        self._queues: list[str] = []
        #: Monotonic seconds for everything time-driven in the loop (refreshes, periodic
        #: steps, pruning); tests may replace it to move time by hand.
        self.clock: Callable[[], float] = time.monotonic
        self._schedule = StepSchedule(lambda: self.clock())  # what to step next
        self._configured: set[str] = set()
        self._capacity: dict[str, int | None] = {}
        self._pools: dict[str, dict[str, int]] = {}  # queue -> {live worker: pool size}
        self._reclaim_after = 0.0  # monotonic; no reclaim before (see run)
        self._refreshed = 0.0
        self._declared: dict[str, Queue | None] = {}
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        self._returned: set[str] = set()
        self._broker_failed = False
        self._push: dict[str, DirectPush | None] = {}
        self._clock_ms: int | None = None  # the step's "now", for expiry
        self._reclaimed: dict[str, float] = {}  # queue -> when its leases were last checked
        self._counts: Counter[str] = Counter()  # expired / refused in this batch
        # Store or broker down: back off (capped) and log the outage's start and end once.
        self._backoff = Backoff(0.1, MAX_BACKOFF_SECONDS)
        self._outage = Outage(logger, "dispatcher step",
                              expected=(FairError, OperationalError, OSError))
        self._summary = SummaryWriter(self.store)  # for dashboards; about once a second
        self.observer: DispatchObserver | None = None
        # Its failures never fail a step (see _notify): one warning per burst of them.
        self._observer_outage = Outage(logger, "dispatch observer (metrics)")

    # -- one iteration ----------------------------------------------------------------

    def step(self, now_ms: int | None = None, *, due_only: bool = False) -> StepResult:
        """Do one round over every fair queue (with ``due_only``, over those woken or due:
        see ``schedule.py``); returns what was done."""
        started = time.monotonic()
        refreshed = self._refresh()
        if self._broker_failed:
            # Reconnect before picking: while the broker is down nothing is picked only
            # to wait out its pick lease (and the step keeps failing, so the outage shows).
            self._get_producer()
            assert self._connection is not None
            self._connection.ensure_connection(max_retries=1, interval_start=0,
                                               interval_step=0)
            self._broker_failed = False
        result = StepResult()
        queues = self._schedule.take(self._queues) if due_only else self._queues
        if not refreshed:
            # Between full refreshes only a queue without capacity is re-read: a worker
            # that just came up wakes us and should get work at once.
            for queue in queues:
                if self._capacity.get(queue) == 0:
                    self._set_capacity(queue)
        for queue in queues:
            self._step_queue(queue, result, now_ms)
        self._summary.maybe_write(self._queues, self._capacity)
        self._notify("on_step", time.monotonic() - started)
        return result

    def _step_queue(self, queue: str, result: StepResult, now_ms: int | None) -> None:
        now = _now_ms() if now_ms is None else now_ms
        store = self.store
        capacity = self._room(queue)
        (promoted, next_due), (requeued, lost), (pushed, picked) = \
            store.promote_reclaim_pick(queue, now, self.batch_size, capacity, PICK_LEASE_MS,
                                       self._push_for(queue),
                                       now + int(self.config.lease_seconds * 1000),
                                       reclaim=self._reclaim_due(queue, now_ms))
        if requeued or lost:
            logger.warning("queue %s: reclaimed %d slots whose lease ran out "
                           "(%d held again, %d lost with their worker)",
                           queue, requeued + lost, requeued, lost)
            self._notify("on_reclaim", queue, requeued, lost)
        for push in pushed:
            self._notify("on_dispatch", queue, push.group, push.klass, push.due_at)
        self._publish(queue, picked, now, result)
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
                               next_due_in=None if next_due is None else (next_due - now) / 1000)

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
                 result: StepResult) -> None:
        if not picked:
            return
        sent: list[str] = []
        self._clock_ms, self._counts = now, Counter()
        try:
            producer = self._get_producer()
            batch = _batch(producer, len(picked))
            buffered: list[str] = sent if batch is None else []
            with batch or nullcontext():
                for item in picked:
                    if self._publish_one(producer, queue, item):
                        buffered.append(item.dispatch_id)
            # Leaving the batch flushed it in one round trip: all of it reached the broker.
            if batch is not None:
                sent = buffered
        except Exception:
            self._reset_producer()  # a fresh connection and channel next time
            self._broker_failed = True
            raise
        finally:
            self._clock_ms = None
            result.expired += self._counts["expired"]
            result.refused += self._counts["refused"]
            # Whatever the broker accepted is confirmed even if a later publish failed;
            # the rest stays 'picked' and is held again when its short lease runs out
            # (a failed batch flush counts as not accepted: if some of it did arrive,
            # workers skip those copies as stale duplicates).
            deadline = _now_ms() + int(self.config.lease_seconds * 1000)
            stale = self.store.confirm(queue, sent, deadline)
        if stale:
            logger.warning("queue %s: %d dispatches were published after their lease ran "
                           "out; workers will skip those copies", queue, len(stale))
        result.stale += len(stale)

    def _publish_one(self, producer: Producer, queue: str, item: Picked) -> bool:
        """Publish one picked message; True once the broker accepted it."""
        envelope = self._decode(queue, item)
        if envelope is None:
            return False
        headers = dict(envelope.headers)
        expires = _epoch_ms(headers.get("expires"))
        if expires is not None and expires <= (self._clock_ms or _now_ms()):
            self._expire(queue, item, envelope)
            return False
        headers[DISPATCH_HEADER] = item.dispatch_id
        headers[QUEUE_HEADER] = queue
        # No `expiration` (RabbitMQ TTL): a message the broker dropped unseen would hold its
        # slot until the lease ran out and leave its result PENDING; the worker revokes an
        # expired task on receipt instead (REVOKED, and the slot is released at once).
        try:
            producer.publish(
                envelope.body, exchange=envelope.exchange, routing_key=envelope.routing_key,
                content_type=envelope.content_type, content_encoding=envelope.content_encoding,
                headers=headers, priority=envelope.priority,
                delivery_mode=envelope.delivery_mode, declare=self._declare(envelope),
                mandatory=self.broker == AMQP, retry=True,
                retry_policy=self.app.conf.task_publish_retry_policy,
                **_CONFIRM_TIMEOUT, **envelope.properties)
        except (MessageNacked, OperationalError) as exc:
            if not _nacked(exc):
                raise
            return self._refused(queue, item, "the broker refused it (nack)")
        if item.dispatch_id in self._returned:
            self._returned.discard(item.dispatch_id)
            return self._refused(queue, item, "no queue is bound to its exchange and "
                                 f"routing key ({envelope.exchange!r}, "
                                 f"{envelope.routing_key!r})")
        if self.observer is not None:
            group, klass = placement_of(item.value)
            self._notify("on_dispatch", queue, group, klass, envelope.due_at)
        return True

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

    def _decode(self, queue: str, item: Picked) -> Envelope | None:
        try:
            return Envelope.decode(item.value)[2]
        except CorruptMessage as exc:
            self.store.quarantine(queue, item.dispatch_id, item.value, str(exc))
            logger.error("queue %s: held message %s could not be decoded and was "
                         "quarantined: %s", queue, item.hold_id, exc)
            return None

    def _expire(self, queue: str, item: Picked, envelope: Envelope) -> None:
        """Celery's way with an expired task: REVOKED with reason 'expired', never run."""
        task = self.app.tasks.get(envelope.task_name)
        ignored = bool(envelope.headers.get("ignore_result")) or \
            bool(task is not None and task.ignore_result)
        store_errors = not ignored or bool(task is not None
                                           and task.store_errors_even_if_ignored)
        self.app.backend.mark_as_revoked(envelope.task_id, reason="expired",
                                         store_result=store_errors)
        self.store.release(queue, item.dispatch_id)
        self._counts["expired"] += 1
        logger.info("queue %s: task %s[%s] expired while held; marked REVOKED",
                    queue, envelope.task_name, envelope.task_id)

    def _refused(self, queue: str, item: Picked, why: str) -> bool:
        self._counts["refused"] += 1
        logger.warning("queue %s: dispatch of task %s not accepted: %s; it is held again "
                       "when its pick lease runs out", queue, item.hold_id, why)
        return False

    def _declare(self, envelope: Envelope) -> list[Queue] | None:
        """The app's definition of the target queue (quorum, priority... arguments).

        A queue the app does not know is declared only when the message goes to it by
        name (the default exchange), as Celery's ``task_create_missing_queues`` does.
        """
        name = envelope.queue
        if not name:
            return None
        if name not in self._declared:
            queues = self.app.amqp.queues
            self._declared[name] = queues[name] if name in queues \
                else Queue(name) if not envelope.exchange else None
        entity = self._declared[name]
        if entity is None or self._already_declared(entity):
            return None
        return [entity]

    def _already_declared(self, entity: Queue) -> bool:
        """kombu's own cache check, without the entity copy its ``maybe_declare`` makes on
        every publish (a third of a dispatch's cost); the cache empties on reconnect."""
        declared = getattr(self._connection, "declared_entities", None)
        return bool(entity.can_cache_declaration and declared is not None
                    and hash(entity) in declared)

    # -- the broker connection -----------------------------------------------------------

    def _push_for(self, queue: str) -> DirectPush | None:
        """Whether the pick script may push ``queue``'s messages itself (``direct.py``)."""
        if not self.config.direct_push or self.broker != REDIS:
            return None
        if queue not in self._push:
            connection = self._get_producer().connection
            self._push[queue] = direct_push(self.app, self.store, connection, queue)
        return self._push[queue]

    def _get_producer(self) -> Producer:
        """The dispatcher's own producer (publisher confirms on RabbitMQ)."""
        if self._producer is None:
            self._connection = publish_connection(self.app)
            on_return = self._on_return if self.broker == AMQP else None
            self._producer = Producer(self._connection, on_return=on_return)
        return self._producer

    def _on_return(self, exc: Any, exchange: Any, routing_key: Any, message: Any) -> None:
        # An unroutable message published with `mandatory` comes back before its ack.
        headers = getattr(message, "headers", None) or {}
        if headers.get(DISPATCH_HEADER):
            self._returned.add(str(headers[DISPATCH_HEADER]))

    def _reset_producer(self) -> None:
        connection, self._connection, self._producer = self._connection, None, None
        self._returned.clear()
        self._push.clear()
        if connection is not None:
            try:
                connection.release()
            except Exception:  # noqa: BLE001 - it is being thrown away
                logger.debug("closing the broker connection failed", exc_info=True)

    def close(self) -> None:
        """Close the dispatcher's broker connection and let its summary thread end
        (``run`` does on exit)."""
        self._reset_producer()
        self._summary.stop()

    # -- queues, policy and capacity ----------------------------------------------------

    def _refresh(self) -> bool:
        """Re-read the set of fair queues and their capacity if REFRESH_SECONDS passed;
        True when it did."""
        if self.clock() - self._refreshed < REFRESH_SECONDS:
            return False
        self._queues = self.fixed_queues or self.store.queues()
        self._schedule.track(self._queues)
        for queue in self._queues:
            if queue not in self._configured:
                self.store.configure(queue, self._policy())
                self._configured.add(queue)
                logger.info("serving fair queue %s", queue)
            self._set_capacity(queue)
        self._prune()
        # Only a refresh that worked counts: otherwise, with no queue known yet, the steps
        # in between would do nothing, "work" and end the outage every second.
        self._refreshed = self.clock()
        return True

    def _prune(self) -> None:
        """Stop serving the queues in which nothing happened for PRUNE_SECONDS, if the
        store finds nothing left in them (atomically; a later hold adds one back): each
        known queue costs a step per sweep and a key in every wait."""
        if self.fixed_queues:
            return
        for queue in self._schedule.idle():
            if not self.store.forget_queue(queue):
                self._schedule.touch(queue)  # not empty: look again a horizon later
                continue
            logger.info("queue %s: nothing held, delayed or in flight for %.0fs; no longer "
                        "served (a new hold brings it back)", queue, PRUNE_SECONDS)
            self._queues.remove(queue)
            self._schedule.drop(queue)
            self._configured.discard(queue)
            for known in (self._capacity, self._reclaimed):
                known.pop(queue, None)

    def _policy(self) -> Policy:
        c = self.config
        return Policy(c.default_concurrency, c.interactive_reserve, 1.0,
                      c.group_concurrency, c.group_weights)

    def capacity(self, queue: str) -> int | None:
        """Tasks in flight ``queue`` may have, as last read (None: not read yet)."""
        return self._capacity.get(queue)

    def _room(self, queue: str) -> int | None:
        """What ``queue`` may have in flight in this step. When its workers consume other
        fair queues too, their pools are shared (capacity.py): what those queues hold
        now is read first (one round trip), so together they stay within the pools."""
        capacity = self._capacity.get(queue, 0)
        others = sharing(queue, self._pools) if capacity else []
        if not others:
            return capacity
        loads = self.store.loads(others)
        return room(queue, self._pools, loads, self.config.dispatch_ahead)

    def _set_capacity(self, queue: str) -> None:
        if self.config.max_inflight is not None:
            capacity: int | None = self.config.max_inflight
        else:
            self._pools[queue] = self.store.worker_pools(queue, _now_ms())
            capacity = sum(self._pools[queue].values())
            if capacity:  # a few ready in the real queue: no slot idles until we step
                capacity += self.config.dispatch_ahead
        previous = self._capacity.get(queue, -1)
        if capacity != previous:
            if capacity == 0:
                logger.warning("queue %s: no live worker consumes it; holding its tasks",
                               queue)
            else:
                logger.info("queue %s: capacity %s tasks in flight", queue, capacity)
            self._capacity[queue] = capacity
            self._schedule.due_now(queue)

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
                    raise StoreConnectionError(
                        f"cannot reach the celery_fair store at {where} ({cause}); start "
                        "Redis there, or set fair_store_url (default: the broker URL) to "
                        "where it runs") from None
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
        logger.info("celery_fair dispatcher started (store %s, namespace %r)",
                    safe_url(self.config.store_url), self.config.key_prefix)
        warn_unsafe_settings(self.store.client, safe_url(self.config.store_url))
        while not self.stopping.is_set():
            try:
                self.step(due_only=True)
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any outage
                self._failed(exc)
                continue
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
        self._outage.failed(exc, f"retrying with backoff (now {delay:.1f}s, growing up "
                                 f"to {MAX_BACKOFF_SECONDS:.0f}s)")
        self.stopping.wait(delay)

    def _sleep(self) -> None:
        """Wait for a wake-up until a queue is due (just a look when one is already:
        wake-ups of other queues are taken while one queue keeps the dispatcher busy)."""
        timeout = self._schedule.timeout(self._queues, MAX_IDLE_SECONDS)
        try:
            self._schedule.woken(self.store.wait(self._queues, timeout))
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


def _batch(producer: Producer, count: int) -> Any:
    """A kombu publish batch for ``count`` messages, or None where kombu has none.

    kombu 5.7's ``Producer.batch()`` buffers the Redis ``LPUSH`` of every publish and sends
    them in one pipeline when the block ends (about 10x the rate of one round trip per
    message). Older kombu, and transports that cannot batch (py-amqp: each publish waits
    for its publisher confirm), publish message by message.
    """
    if not getattr(producer, "supports_batch_publish", False):
        return None
    # Room for every command of every message (a queue with `x-expires` adds a PEXPIRE
    # per priority step), so the whole step is one flush.
    return producer.batch(max_size=max(count, 1) * 16)


def _nacked(exc: BaseException | None) -> bool:
    """The broker nacked the publish (kombu retries a nack, then raises it wrapped)."""
    while exc is not None:
        if isinstance(exc, MessageNacked):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _epoch_ms(value: Any) -> int | None:
    """An ISO 8601 header (``eta``, ``expires``) in ms since the epoch; naive means UTC."""
    if not value:
        return None
    try:
        when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)

