"""The holding producer: where a fair task's message is kept instead of sent.

``FairTask.apply_async`` (task.py) and ``send_task``/``fair_tasks`` of an installed app
(installer.py) work out the group, class and cost of a publication (:func:`placement`) and
hand Celery a :class:`HoldingProducer`. Celery builds the message as usual; the holding
producer keeps it in the store, and the dispatcher later publishes it verbatim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from celery import Celery

from .brokers import check_app, real_destination
from .config import get_config
from .envelope import BACKGROUND, INTERACTIVE, Envelope
from .errors import FairError, InvalidOption, SingletonDropped, StoreFull, StoreUnreachable
from .events import HOLD, enabled, log_event
from .groups import current_scope, split_path
from .headers import CLASS_HEADER, COST_HEADER, GROUP_HEADER, request_headers
from .names import validate_cost, validate_group
from .outage import Outage
from .revoke import mark_revoked
from .singleton import DROP, SINGLETON_HEADER, SINGLETON_MODE_HEADER
from .store.base import Placement, Store
from .store.bulk import Hold

# The name this log has always had (the code lived in task.py): users filter on it.
logger = logging.getLogger("celery_fair.task")


@dataclass(frozen=True)
class Collected:
    """What a bulk hold (``bulk.py``) collected for one fair queue of one store instead of
    writing it: its holds, in order."""

    store: Store
    queue: str
    holds: list[Hold] = field(default_factory=list)


@dataclass(frozen=True)
class Built:
    """The last message a collector took, with what built it: what ``bulk_messages.py``
    makes the other calls' messages from (the Python body, ``_prepare``'s arguments, the
    real producer), its hold and the list it went into."""

    envelope: Envelope
    body: Any
    prepare: tuple[Any, ...]  # serializer, content type, content encoding, compression
    producer: Any
    hold: Hold
    holds: list[Hold]


class Collector:
    """Where the holding producer puts its holds while a bulk hold collects."""

    def __init__(self) -> None:
        self.queues: dict[tuple[int, str], Collected] = {}
        self.last: Built | None = None

    def holds_of(self, store: Store, queue: str) -> list[Hold]:
        """The list the holds of ``queue`` in ``store`` are collected in."""
        key = (id(store), queue)
        collected = self.queues.get(key)
        if collected is None:
            collected = self.queues[key] = Collected(store, queue)
        return collected.holds


#: While a bulk hold collects in this context (``bulk.py``), the holding producer hands
#: each finished message to it instead of writing it to the store.
COLLECTING: ContextVar[Collector | None] = ContextVar("celery_fair_collecting", default=None)


def placement(app: Celery, headers: Mapping[str, Any], explicit: tuple[Any, Any, Any],
              rule_group: Callable[[], Any], rule_interactive: bool | None,
              rule_cost: float, default_group: str,
              context: tuple[Any, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Group, class and cost of one publication, as message headers.

    Precedence, most specific first: the call's ``fair_*`` options (``explicit``), the
    message's own fair headers (a retry), the task's rule, :func:`fair_context`, the
    parent task's headers (a continuation published by a worker), the default group.
    ``context``: :func:`placement_context` when the caller has it (many publications).
    """
    group, interactive, cost = explicit
    scope, parent = context or placement_context(app)
    if group is None:
        group = headers.get(GROUP_HEADER)
    if group is None:
        group = rule_group()
    if group is None:
        group = unruled_group(scope, parent)
    klass = klass_of(interactive, headers.get(CLASS_HEADER), rule_interactive,
                   scope.interactive if scope else None, parent.get(CLASS_HEADER))
    return {
        GROUP_HEADER: validate_group(default_group if group is None else group),
        CLASS_HEADER: klass,
        COST_HEADER: validate_cost(rule_cost if cost is None else cost),
    }


def unruled_group(scope: Any, parent: Mapping[str, Any]) -> Any:
    """The group of a publication that neither its call, its headers nor its task's rule
    place: :func:`fair_context`'s, else the parent task's (None: the default group)."""
    group = scope.group if scope is not None else None
    return parent.get(GROUP_HEADER) if group is None else group


def placement_context(app: Celery) -> tuple[Any, Mapping[str, Any]]:
    """What a placement reads from where it is published: :func:`fair_context`'s scope
    and the parent task's fair headers."""
    return current_scope(), _parent_headers(app)


def klass_of(*choices: Any) -> str:
    """The first class stated, from the most to the least specific source."""
    for choice in choices:
        if choice is None:
            continue
        if choice in (INTERACTIVE, BACKGROUND):
            return str(choice)
        if not isinstance(choice, bool):
            raise InvalidOption(
                f"fair_interactive={choice!r} is invalid: expected True, False or None")
        return INTERACTIVE if choice else BACKGROUND
    return BACKGROUND


def _parent_headers(app: Celery) -> Mapping[str, Any]:
    """Fair headers of the task this worker is running, so continuations inherit them."""
    parent = app.current_worker_task
    if parent is None:
        return {}
    return request_headers(parent.request)


class HoldingProducer:
    """Stands in for a kombu Producer inside ``send_task``; holds task messages.

    Anything that is not a task message (the ``task-sent`` event) goes to the real producer.
    """

    def __init__(self, producer: Any, store: Store, front: bool, app: Celery,
                 checked: bool = False) -> None:
        if not checked:  # FairTask.apply_async checked it already
            check_app(app)
        self._producer = producer
        self._store = store
        self._front = front
        self._app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def publish(self, body: Any, routing_key: str | None = None, delivery_mode: Any = None,
                mandatory: bool = False, immediate: bool = False, priority: int | None = 0,
                content_type: str | None = None, content_encoding: str | None = None,
                serializer: str | None = None, headers: dict[str, Any] | None = None,
                compression: str | None = None, exchange: Any = None, retry: bool = False,
                retry_policy: Any = None, declare: Any = None, expiration: Any = None,
                timeout: Any = None, confirm_timeout: Any = None, **properties: Any) -> None:
        def send() -> None:
            self._producer.publish(
                body, routing_key=routing_key, delivery_mode=delivery_mode,
                mandatory=mandatory, immediate=immediate, priority=priority,
                content_type=content_type, content_encoding=content_encoding,
                serializer=serializer, headers=headers, compression=compression,
                exchange=exchange, retry=retry, retry_policy=retry_policy, declare=declare,
                expiration=expiration, timeout=timeout, confirm_timeout=confirm_timeout,
                **properties)

        if not headers or "task" not in headers or GROUP_HEADER not in headers:
            return send()
        try:
            self._hold(body, routing_key, delivery_mode, priority, content_type,
                       content_encoding, serializer, headers, compression, exchange,
                       declare, properties)
        except (StoreUnreachable, StoreFull) as exc:
            if get_config(self._app).on_store_error != "publish":
                raise
            # fair_on_store_error = "publish": the task is kept, fairness is not. Only when
            # it was certainly not held: any other StoreError (a reply lost) may have held
            # it, and publishing as well would run it twice; that one is raised.
            _publish_outage.failed(exc, "publishing fair tasks straight to the broker "
                                   "(fair_on_store_error='publish')")
            return send()
        _publish_outage.ok()
        return None

    def _hold(self, body: Any, routing_key: str | None, delivery_mode: Any,
              priority: int | None, content_type: str | None, content_encoding: str | None,
              serializer: str | None, headers: dict[str, Any], compression: str | None,
              exchange: Any, declare: Any, properties: dict[str, Any]) -> None:
        raw, ctype, cenc = self._producer._prepare(
            body, serializer, content_type, content_encoding, compression, headers)
        if isinstance(raw, str):
            raw = raw.encode(cenc or "utf-8")
        exchange, routing_key, queue = real_destination(
            self._app, getattr(exchange, "name", exchange) or "", routing_key or "",
            list(declare or ()))
        now = int(time.time() * 1000)
        due = _due_ms(headers.get("eta"), self._app, now)
        config = get_config(self._app)
        # fair_subgroup 'path': "acme/alice" is held in 'acme' as its subgroup 'alice'
        group, subgroup = split_path(headers[GROUP_HEADER], config.policy_for(queue).subgroup)
        envelope = Envelope(
            body=raw, content_type=ctype, content_encoding=cenc, headers=headers,
            exchange=exchange, routing_key=routing_key, queue=queue,
            delivery_mode=delivery_mode, priority=priority, properties=properties,
            due_at=max(now, due) / 1000, subgroup=subgroup)
        # A retry (front) is work already taken in: backpressure refuses only new work.
        where = Placement(group, headers[CLASS_HEADER], headers[COST_HEADER], self._front,
                          None if self._front else config.max_held_of(group),
                          headers.get(SINGLETON_HEADER),
                          headers.get(SINGLETON_MODE_HEADER) == DROP, subgroup=subgroup)
        value = envelope.encode(where.group, where.klass, where.cost, where.front)
        collector = COLLECTING.get()
        if collector is not None:
            if where.drop:  # hold_many holds all or nothing: it cannot drop one
                raise InvalidOption(f"task {envelope.task_id}: singleton_mode='drop' "
                                    "cannot be held in bulk (fair_bulk, bulk_holds, a "
                                    "group): publish it on its own")
            hold = Hold(envelope.task_id, value, where, due)
            holds = collector.holds_of(self._store, envelope.queue)
            holds.append(hold)
            collector.last = Built(envelope, body, (serializer, content_type,
                                                    content_encoding, compression),
                                   self._producer, hold, holds)
            return
        try:
            self._store.hold(envelope.queue, envelope.task_id, value, where, due, now)
        except SingletonDropped as dropped:
            logger.info("celery_fair: %s; marked REVOKED", dropped)
            mark_revoked(self._app, envelope.queue, envelope.task_id, value)
            return
        log_hold(envelope.queue, envelope.task_id, where, due, now)


def log_hold(queue: str, task_id: str, where: Placement, due: int, now: int) -> None:
    """The ``hold`` event line (when the log wants it)."""
    if enabled(logger):
        log_event(logger, HOLD, task_id, where.group, queue, **{"class": where.klass},
                  cost=where.cost, front=where.front or None,
                  due_in=f"{(due - now) / 1000:.3f}s" if due > now else None)


_publish_outage = Outage(logger, "celery_fair: holding fair tasks", expected=(FairError,))


def _due_ms(eta: Any, app: Celery, now: int) -> int:
    if not eta:
        return 0
    when = eta if isinstance(eta, datetime) else datetime.fromisoformat(str(eta))
    if when.tzinfo is None:
        # Celery's worker reads a naive ETA as UTC whatever the app's timezone
        # (celery.utils.time.maybe_make_aware); the delayed set must agree with it.
        when = when.replace(tzinfo=timezone.utc)
    due = int(when.timestamp() * 1000)
    return due if due > now else 0
