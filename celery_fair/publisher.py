"""The dispatcher's kombu side: publish picked messages verbatim to the real broker.

:class:`KombuPublisher` owns the dispatcher's broker connection and producer: it publishes a
step's picks in one kombu batch where kombu can, declares the target queue as the app
defines it (once per connection), takes RabbitMQ's mandatory returns and nacks as refusals,
marks an expired task REVOKED in the result backend instead of publishing it, confirms what
the broker accepted, and resets the connection after a failure. It also finds out whether
the pick script may push a queue's messages itself (``direct.py``).
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timezone
from typing import Any

from amqp.exceptions import MessageNacked
from celery import Celery
from celery.utils.nodenames import worker_direct
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.exceptions import OperationalError
from kombu.messaging import Producer

from .brokers import AMQP, REDIS, publish_connection
from .config import FairConfig
from .direct import direct_push
from .envelope import Envelope, placement_of
from .errors import CorruptMessage
from .events import DISPATCH, enabled, log_event
from .group_queues import dedicated_queue
from .headers import DISPATCH_HEADER, LEASE_HEADER, QUEUE_HEADER
from .store.base import DirectPush, Picked, Store
from .store.base import now_ms as _now_ms

# The name this log has always had (publishing lived in dispatcher.py): users filter on it.
logger = logging.getLogger("celery_fair.dispatcher")

#: Longest wait for the broker's confirm of one publish (RabbitMQ); then it counts as
#: failed and the message is held again when its pick lease runs out.
CONFIRM_TIMEOUT_SECONDS = 5.0

#: kombu 5.4+ takes a publish confirm timeout; older kombu would send it along as a
#: message property.
_CONFIRM_TIMEOUT: dict[str, float] = (
    {"confirm_timeout": CONFIRM_TIMEOUT_SECONDS}
    if "confirm_timeout" in inspect.signature(Producer.publish).parameters else {})

#: How a publisher reports one dispatch: ``(hook, *args)``, as ``Dispatcher._notify``.
Notify = Callable[..., None]


class KombuPublisher:
    """Publishes a dispatcher's picks on its own broker connection.

    ``notify`` reports each dispatch to the dispatcher's observer; ``observed`` says
    whether there is one (so the placement is decoded only then).
    """

    def __init__(self, app: Celery, broker: str, store: Store, config: FairConfig,
                 notify: Notify, observed: Callable[[], bool]) -> None:
        self.app = app
        self.broker = broker
        self.store = store
        self.config = config
        self._notify = notify
        self._observed = observed
        self._declared: dict[str, Queue | None] = {}
        self._connection: Connection | None = None
        self._producer: Producer | None = None
        self._returned: set[str] = set()
        self.failed = False  # the last publish failed: reconnect before the next pick
        self._push: dict[str, DirectPush | None] = {}
        self._clock_ms: int | None = None  # the step's "now", for expiry
        self._counts: Counter[str] = Counter()  # expired / refused in this batch

    def reconnect(self) -> None:
        """After a failed publish, reach the broker again (or raise) before picking:
        while the broker is down nothing is picked only to wait out its pick lease."""
        if not self.failed:
            return
        self._get_producer()
        assert self._connection is not None
        self._connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        self.failed = False

    def publish(self, queue: str, picked: list[Picked], now: int,
                workers: list[str] | None = None) -> tuple[list[str], Counter[str]]:
        """Publish ``picked`` and confirm what the broker accepted; returns the dispatch
        ids found stale at confirm and the counts of ``expired`` and ``refused``. With
        ``workers`` (fair_affinity), each message goes to its worker's own queue."""
        if not picked:
            return [], Counter()
        sent: list[str] = []
        self._clock_ms, self._counts = now, Counter()
        try:
            producer = self._get_producer()
            batch = _batch(producer, len(picked))
            buffered: list[str] = sent if batch is None else []
            with batch or nullcontext():
                for n, item in enumerate(picked):
                    # (the worker only when routed: wrappers of publish_one take three)
                    if (self.publish_one(producer, queue, item, workers[n]) if workers
                            else self.publish_one(producer, queue, item)):
                        buffered.append(item.dispatch_id)
            # Leaving the batch flushed it in one round trip: all of it reached the broker.
            if batch is not None:
                sent = buffered
        except Exception:
            self.reset()  # a fresh connection and channel next time
            self.failed = True
            raise
        finally:
            self._clock_ms = None
            # Whatever the broker accepted is confirmed even if a later publish failed;
            # the rest stays 'picked' and is held again when its short lease runs out
            # (a failed batch flush counts as not accepted: if some of it did arrive,
            # workers skip those copies as stale duplicates).
            deadline = _now_ms() + int(self.config.lease_seconds * 1000)
            stale = self.store.confirm(queue, sent, deadline)
        return stale, self._counts

    def publish_one(self, producer: Producer, queue: str, item: Picked,
                    worker: str | None = None) -> bool:
        """Publish one picked message (to ``worker``'s own queue, Celery's worker_direct
        one, when given; to a real queue by name when ``worker`` names one,
        ``queue:<name>``: fair_group_queues); True once the broker accepted it."""
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
        headers.pop(LEASE_HEADER, None)  # only a direct push's lease is known at receipt
        exchange, routing_key, declare = envelope.exchange, envelope.routing_key, None
        dedicated = dedicated_queue(worker)
        if dedicated == queue:
            worker = None  # fair_group_queues: a group of the queue's own workers
        elif dedicated is not None:  # fair_group_queues: that real queue, by its name
            declare = self._declare_named(dedicated)
            exchange, routing_key = "", dedicated
        elif worker is not None:
            # by the queue's name on the default exchange: the same queue as C.dq2 with
            # the hostname, without a binding lookup per publish (kombu's Redis transport
            # reads the exchange's binding set for each message sent through it)
            declare = self._declare_direct(worker)
            exchange, routing_key = "", declare_name(worker)
        # No `expiration` (RabbitMQ TTL): a message the broker dropped unseen would hold its
        # slot until the lease ran out and leave its result PENDING; the worker revokes an
        # expired task on receipt instead (REVOKED, and the slot is released at once).
        try:
            producer.publish(
                envelope.body, exchange=exchange, routing_key=routing_key,
                content_type=envelope.content_type, content_encoding=envelope.content_encoding,
                headers=headers, priority=envelope.priority,
                delivery_mode=envelope.delivery_mode,
                declare=declare if worker is not None else self._declare(envelope),
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
                                 f"routing key ({exchange!r}, {routing_key!r})")
        if self._observed() or enabled(logger):
            where = placement_of(item.value, item.hold_id)
            self._notify("on_dispatch", queue, where.group, where.klass, envelope.due_at)
            log_event(logger, DISPATCH, item.hold_id, where.group, queue,
                      dispatch=item.dispatch_id, **{"class": where.klass}, via="publish")
        return True

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

    def _declare_named(self, name: str) -> list[Queue] | None:
        """Real queue ``name`` (fair_group_queues), as the app defines it, else a plain
        queue of that name (what ``task_create_missing_queues`` declares)."""
        entity = self._declared.get(name)
        if entity is None:
            queues = self.app.amqp.queues
            entity = self._declared[name] = queues[name] if name in queues else Queue(name)
        return None if self._already_declared(entity) else [entity]

    def _declare_direct(self, worker: str) -> list[Queue] | None:
        """``worker``'s own queue (``<hostname>.dq2`` on Celery's ``C.dq2`` exchange), as
        the worker declares it, so that a message routed before the worker's consumer
        declared it is not dropped unroutable."""
        entity = worker_direct(worker)
        if entity.name not in self._declared:
            self._declared[entity.name] = entity
        entity = self._declared[entity.name]
        assert entity is not None
        return None if self._already_declared(entity) else [entity]

    def _already_declared(self, entity: Queue) -> bool:
        """kombu's own cache check, without the entity copy its ``maybe_declare`` makes on
        every publish (a third of a dispatch's cost); the cache empties on reconnect."""
        declared = getattr(self._connection, "declared_entities", None)
        return bool(entity.can_cache_declaration and declared is not None
                    and hash(entity) in declared)

    # -- the broker connection -----------------------------------------------------------

    def push_for(self, queue: str) -> DirectPush | None:
        """Whether the pick script may push ``queue``'s messages itself (``direct.py``)."""
        if not (self.config.direct_push and self.store.supports_direct_push
                and self.broker == REDIS):
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

    def reset(self) -> None:
        """Drop the connection (a fresh connection and channel next time)."""
        connection, self._connection, self._producer = self._connection, None, None
        self._returned.clear()
        self._push.clear()
        if connection is not None:
            try:
                connection.release()
            except Exception:  # noqa: BLE001 - it is being thrown away
                logger.debug("closing the broker connection failed", exc_info=True)


def declare_name(worker: str) -> str:
    """``worker``'s own queue (Celery's worker_direct queue, ``<hostname>.dq2``)."""
    return str(worker_direct(worker).name)


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
