"""The dispatcher: feeds each real queue from its holding queues, as fast as workers free up.

One :meth:`Dispatcher.step` promotes due delayed messages, reclaims expired leases, picks
as many messages as the queue has free capacity (one atomic store call per batch),
publishes them verbatim with kombu and confirms them. :meth:`Dispatcher.run` repeats steps
and, when there is nothing to do, blocks on the store's wake markers (pushed by holds and
releases) instead of polling.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from celery import Celery
from kombu.entity import Queue

from .config import FairConfig, get_config
from .envelope import Envelope
from .errors import CorruptMessage, FairError
from .store.base import Picked, Policy
from .store.redis import RedisStore
from .task import DISPATCH_HEADER, QUEUE_HEADER, store_for

logger = logging.getLogger(__name__)

#: How long a dispatcher may take from pick to the broker's acceptance of a message.
PICK_LEASE_MS = 10_000
#: Longest sleep between steps when idle (also bounds shutdown and discovery delays).
MAX_IDLE_SECONDS = 1.0
#: How often the set of fair queues and the live workers' capacity are re-read.
REFRESH_SECONDS = 1.0


@dataclass
class StepResult:
    """What one step did, per fair queue summed."""

    dispatched: int = 0
    promoted: int = 0
    requeued: int = 0
    lost: int = 0
    stale: int = 0
    saturated: bool = False  # a queue took a full batch: step again at once
    next_due_ms: int | None = None
    by_queue: dict[str, int] = field(default_factory=dict)


class Dispatcher:
    """Dispatches the fair queues of ``app`` (all of them, or ``queues``)."""

    def __init__(self, app: Celery, queues: Iterable[str] | None = None,
                 batch_size: int | None = None) -> None:
        self.app = app
        self.config: FairConfig = get_config(app)  # fails here on bad settings
        self.store: RedisStore = store_for(app)
        self.batch_size = batch_size or self.config.batch_size
        self.fixed_queues = sorted(set(queues)) if queues else None
        self.stopping = threading.Event()
        self._queues: list[str] = []
        self._configured: set[str] = set()
        self._capacity: dict[str, int | None] = {}
        self._refreshed = 0.0
        self._declared: dict[str, Queue] = {}

    # -- one iteration ----------------------------------------------------------------

    def step(self, now_ms: int | None = None) -> StepResult:
        """Do one round over every fair queue; returns what was done."""
        self._refresh()
        result = StepResult()
        for queue in self._queues:
            self._step_queue(queue, result, now_ms)
        return result

    def _step_queue(self, queue: str, result: StepResult, now_ms: int | None) -> None:
        now = _now_ms() if now_ms is None else now_ms
        store = self.store
        promoted, next_due = store.promote(queue, now, 1000)
        requeued, lost = store.reclaim(queue, now, 1000)
        if requeued or lost:
            logger.warning("queue %s: reclaimed %d slots whose lease ran out "
                           "(%d held again, %d lost with their worker)",
                           queue, requeued + lost, requeued, lost)
        capacity = self._capacity.get(queue, 0)
        picked = store.pick(queue, self.batch_size, capacity, now, PICK_LEASE_MS)
        stale = self._publish(queue, picked)
        result.dispatched += len(picked)
        result.by_queue[queue] = len(picked)
        result.promoted += promoted
        result.requeued += requeued
        result.lost += lost
        result.stale += stale
        result.saturated |= len(picked) >= self.batch_size
        # Expired leases need no wake-up of their own: an idle dispatcher steps at least
        # every MAX_IDLE_SECONDS, well within any lease.
        if next_due is not None and (result.next_due_ms is None or next_due < result.next_due_ms):
            result.next_due_ms = next_due

    def _publish(self, queue: str, picked: list[Picked]) -> int:
        if not picked:
            return 0
        sent: list[str] = []
        try:
            with self.app.producer_or_acquire() as producer:
                for item in picked:
                    if self._publish_one(producer, queue, item):
                        sent.append(item.dispatch_id)
        finally:
            # Whatever reached the broker is confirmed even if a later publish failed;
            # the rest stays 'picked' and is held again when its short lease runs out.
            deadline = _now_ms() + int(self.config.lease_seconds * 1000)
            stale = self.store.confirm(queue, sent, deadline)
        if stale:
            logger.warning("queue %s: %d dispatches were published after their lease ran "
                           "out; workers will skip those copies", queue, len(stale))
        return len(stale)

    def _publish_one(self, producer: Any, queue: str, item: Picked) -> bool:
        try:
            _, _, envelope = Envelope.decode(item.value)
        except CorruptMessage as exc:
            self.store.quarantine(queue, item.dispatch_id, item.value, str(exc))
            logger.error("queue %s: held message %s could not be decoded and was "
                         "quarantined: %s", queue, item.hold_id, exc)
            return False
        headers = dict(envelope.headers)
        headers[DISPATCH_HEADER] = item.dispatch_id
        headers[QUEUE_HEADER] = queue
        producer.publish(
            envelope.body, exchange=envelope.exchange, routing_key=envelope.routing_key,
            content_type=envelope.content_type, content_encoding=envelope.content_encoding,
            headers=headers, priority=envelope.priority, delivery_mode=envelope.delivery_mode,
            declare=[self._queue_entity(envelope.queue)] if envelope.queue else None,
            expiration=_remaining_seconds(headers.get("expires")),
            retry=True, retry_policy=self.app.conf.task_publish_retry_policy,
            **envelope.properties)
        return True

    def _queue_entity(self, name: str) -> Queue:
        entity = self._declared.get(name)
        if entity is None:
            entity = self.app.amqp.queues[name] if name in self.app.amqp.queues \
                else Queue(name)
            self._declared[name] = entity
        return entity

    # -- queues, policy and capacity ----------------------------------------------------

    def _refresh(self) -> None:
        if time.monotonic() - self._refreshed < REFRESH_SECONDS:
            # Between full refreshes only a queue without capacity is re-read: a worker
            # that just came up wakes us and should get work at once.
            for queue in self._queues:
                if self._capacity.get(queue) == 0:
                    self._set_capacity(queue)
            return
        self._refreshed = time.monotonic()
        self._queues = self.fixed_queues or self.store.queues()
        for queue in self._queues:
            if queue not in self._configured:
                self.store.configure(queue, self._policy())
                self._configured.add(queue)
                logger.info("serving fair queue %s", queue)
            self._set_capacity(queue)

    def _policy(self) -> Policy:
        c = self.config
        return Policy(c.default_concurrency, c.interactive_reserve, 1.0,
                      c.group_concurrency, c.group_weights)

    def _set_capacity(self, queue: str) -> None:
        if self.config.max_inflight is not None:
            capacity: int | None = self.config.max_inflight
        else:
            capacity = self.store.worker_capacity(queue, _now_ms())
        previous = self._capacity.get(queue, -1)
        if capacity != previous:
            if capacity == 0:
                logger.warning("queue %s: no live worker consumes it; holding its tasks",
                               queue)
            else:
                logger.info("queue %s: capacity %s tasks in flight", queue, capacity)
            self._capacity[queue] = capacity

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Step until :meth:`stop` (or SIGTERM/SIGINT in the main thread)."""
        self._install_signal_handlers()
        logger.info("celery_fair dispatcher started (store %s, namespace %r)",
                    _redact(self.config.store_url), self.config.key_prefix)
        backoff = 0.0
        while not self.stopping.is_set():
            try:
                result = self.step()
                backoff = 0.0
            except FairError as exc:
                backoff = min(max(backoff * 2, 0.1), 5.0)
                logger.warning("dispatcher step failed (retrying in %.1fs): %s", backoff, exc)
                self.stopping.wait(backoff)
                continue
            except Exception:  # noqa: BLE001 - the loop must survive broker hiccups
                backoff = min(max(backoff * 2, 0.1), 5.0)
                logger.exception("dispatcher step failed (retrying in %.1fs)", backoff)
                self.stopping.wait(backoff)
                continue
            if not result.saturated:
                self._sleep(result)
        logger.info("celery_fair dispatcher stopped")

    def _sleep(self, result: StepResult) -> None:
        timeout = MAX_IDLE_SECONDS
        if result.next_due_ms is not None:
            timeout = min(timeout, max((result.next_due_ms - _now_ms()) / 1000, 0.001))
        try:
            self.store.wait(self._queues, timeout)
        except FairError as exc:
            logger.warning("dispatcher wait failed: %s", exc)
            self.stopping.wait(1.0)

    def stop(self) -> None:
        self.stopping.set()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.stop())


def _now_ms() -> int:
    return int(time.time() * 1000)


def _remaining_seconds(expires: Any) -> float | None:
    if not expires:
        return None
    when = datetime.fromisoformat(str(expires))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max((when - datetime.now(timezone.utc)).total_seconds(), 0.001)


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest
