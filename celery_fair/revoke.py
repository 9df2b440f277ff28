"""Revoking a held task: it leaves its holding queue and becomes REVOKED, as in Celery.

Celery revokes by broadcasting the task id to the workers, which skip the message when it
arrives. A held message has not arrived anywhere yet, so for apps using celery_fair
(a :class:`~celery_fair.FairTask` bound to it, or :func:`celery_fair.install`),
``app.control.revoke`` — which ``AsyncResult.revoke()``, ``GroupResult.revoke()`` and
``celery -A proj control revoke`` use — first removes the held copies from the store and
marks them REVOKED in the result backend (the chord they belong to learns of it as it
would from a worker), then broadcasts as usual for copies already dispatched.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.app.control import Control
from celery.app.task import Context
from kombu import compression, serialization

from .envelope import Envelope
from .errors import CorruptMessage, FairError
from .groups import fair_context
from .store import store_for

logger = logging.getLogger(__name__)

#: The reason a cancelled task's result carries (what a worker stores for a revoke).
REASON = "revoked"


@dataclass(frozen=True)
class Cancelled:
    """A held message removed by :func:`cancel_held`."""

    task_id: str
    queue: str
    group: str


def cancel(app: Celery, task_id: str) -> bool:
    """Remove the held (or delayed) task ``task_id`` and mark it REVOKED.

    Returns False when celery_fair does not hold it: never published, already
    dispatched (stop it in the workers with ``revoke()``), or finished.
    """
    return bool(cancel_held(app, [task_id]))


def cancel_held(app: Celery, task_ids: Iterable[str]) -> list[Cancelled]:
    """Remove every held or delayed message of ``task_ids``; mark each task REVOKED."""
    ids = [str(t) for t in task_ids]
    store = store_for(app)
    done: list[Cancelled] = []
    for queue in store.queues() if ids else ():
        for hold_id, value in store.cancel(queue, ids):
            done.append(mark_revoked(app, queue, hold_id, value))
    return done


def mark_revoked(app: Celery, queue: str, hold_id: str, value: bytes) -> Cancelled:
    """A message removed from the store (by ``Store.cancel``): mark its task REVOKED as a
    worker would for a revoke (chords and errbacks learn of it)."""
    try:
        group, _, envelope = Envelope.decode(value)
    except CorruptMessage:
        logger.warning("celery_fair: cancelled held message %s could not be decoded; "
                       "marking it REVOKED without its request", hold_id)
        app.backend.mark_as_revoked(hold_id.split("~")[0], REASON)
        return Cancelled(hold_id.split("~")[0], queue, "?")
    request = revoked_request(app, envelope)
    # What the backend publishes now (a chord's body or errbacks, when this was its last
    # part) would have come from a worker running this task: same group.
    with fair_context(group=group):
        app.backend.mark_as_revoked(envelope.task_id, REASON, request=request,
                                    store_result=not envelope.headers.get("ignore_result"))
    return Cancelled(envelope.task_id, queue, group)


def revoked_request(app: Celery, envelope: Envelope) -> Context:
    """The request a worker would have built from the message (``Request._context``).

    The backend needs it to store the result like a worker would and, for a chord member,
    to count the part as done (``on_chord_part_return``).
    """
    fields: dict[str, Any] = dict(envelope.headers)
    fields.update(properties=dict(envelope.properties),
                  reply_to=envelope.properties.get("reply_to"),
                  correlation_id=envelope.properties.get("correlation_id"),
                  delivery_info={"exchange": envelope.exchange,
                                 "routing_key": envelope.routing_key})
    try:
        args, kwargs, embed = _payload(app, envelope)
    except Exception as exc:  # noqa: BLE001 - a body we cannot read still gets revoked
        logger.warning("celery_fair: body of cancelled task %s unreadable (%r); its "
                       "chord or callbacks are not informed", envelope.task_id, exc)
        args, kwargs, embed = (), {}, {}
    fields.update(args=args, kwargs=kwargs)
    fields.update(embed or {})
    return Context(fields)


def _payload(app: Celery, envelope: Envelope) -> tuple[Any, Any, Any]:
    body = envelope.body
    codec = envelope.headers.get("compression")
    if codec:
        body = compression.decompress(body, codec)
    accept = serialization.prepare_accept_content(app.conf.accept_content)
    payload = serialization.loads(body, envelope.content_type, envelope.content_encoding,
                                  accept=accept)
    if isinstance(payload, dict):  # task protocol 1
        return payload.get("args", ()), payload.get("kwargs", {}), {}
    args, kwargs, embed = payload
    return args, kwargs, embed


def cancel_quietly(app: Celery, task_id: Any) -> list[Cancelled]:
    """:func:`cancel_held` for ``revoke``: a store failure is logged, never raised (the
    broadcast still reaches the workers, which skip the task when it is dispatched)."""
    if app.conf.task_always_eager or not task_id:
        return []
    ids = [task_id] if isinstance(task_id, str) else list(task_id)
    try:
        return cancel_held(app, ids)
    except FairError as exc:
        logger.warning("celery_fair: could not remove revoked tasks from the holding "
                       "queues (workers will still skip them): %s", exc)
        return []


class FairControlMixin:
    """Mixed into the app's Control class: ``revoke`` also cancels held copies."""

    app: Celery

    def revoke(self, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        cancel_quietly(self.app, task_id)
        return super().revoke(task_id, *args, **kwargs)  # type: ignore[misc]


class FairControl(FairControlMixin, Control):
    """Celery's Control whose ``revoke`` also cancels held copies."""
