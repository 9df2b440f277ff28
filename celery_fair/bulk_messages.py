"""A bulk hold's messages made from one that Celery built (``bulk.py``'s fast way).

Calls of one task with the same options differ, in the message Celery builds, only in the
task id (headers ``id``, and ``root_id`` when the call has no parent; the property
``correlation_id``), the arguments (the body, headers ``argsrepr`` and ``kwargsrepr``)
and the fair headers (group, class, cost). So ``fair_bulk`` builds its first message
through ``apply_async`` (the template) and makes the others from it, as Celery would:
the same checks of the arguments, ``saferepr`` of them, serialization by the producer's
own ``_prepare``, the same placement rules, one ``AsyncResult`` each, the result
backend's ``on_task_call`` (on Redis, batched: one SUBSCRIBE for many tasks), the
parent's trail. Only where nothing else could make two messages differ
(:func:`templatable`): no ``before_task_publish``/``after_task_publish`` receiver, no
``task-sent`` event, no router that reads the arguments, no ``apply_async`` or
``shadow_name`` of the task's own, no pydantic arguments; elsewhere every item goes
through ``apply_async``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, Task
from celery._state import task_join_will_block
from celery.app.routes import MapRoute
from celery.signals import after_task_publish, before_task_publish
from celery.utils.saferepr import saferepr

from .config import FairConfig
from .envelope import Envelope
from .headers import CLASS_HEADER, COST_HEADER, GROUP_HEADER
from .holding import Built, Collected, placement_context
from .store.base import Placement
from .store.bulk import Hold

#: Options under which each call's message may differ otherwise: those items are built
#: through ``apply_async``.
_OWN_OPTIONS = frozenset({"task_id", "argsrepr", "kwargsrepr", "retries", "shadow"})
#: How many tasks one SUBSCRIBE of the result backend names.
_SUBSCRIBE_BATCH = 1000


#: A text whose ``repr`` is ``saferepr``'s: printable ASCII without quotes or backslashes.
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9 _.,:;@/+=%#&()<>?!*-]{0,100}")


def plain_repr(value: Any, maxsize: int) -> str:
    """``saferepr(value, maxsize)``, as ``repr`` when ``value`` is small and plain (a
    tuple of, or a dict of plain texts to, ints, None and plain texts: there the two
    agree and ``repr`` is 20x faster), else by ``saferepr``."""
    if isinstance(value, tuple):
        leaves: Any = value
    elif isinstance(value, dict) and all(type(k) is str and _PLAIN_TEXT.fullmatch(k)
                                         for k in value):
        leaves = value.values()
    else:
        return str(saferepr(value, maxsize))
    if len(value) <= 20 and all(
            v is None or type(v) is int or (type(v) is str and _PLAIN_TEXT.fullmatch(v))
            for v in leaves):
        text = repr(value)
        if len(text) <= min(maxsize, 1000):
            return text
    return str(saferepr(value, maxsize))


def templatable(app: Celery, task: Task, options: Mapping[str, Any]) -> bool:
    """Whether every call of ``task`` with ``options`` gets a message that differs from
    another's only in the id, the arguments and the fair headers."""
    return (_defined_by_fair_task(type(task), "apply_async")
            and type(task).shadow_name is Task.shadow_name
            and getattr(task, "_dump_pydantic_arguments", None) is None
            and getattr(task, "__self__", None) is None
            and not before_task_publish.receivers and not after_task_publish.receivers
            and not app.conf.task_send_sent_event
            and all(isinstance(route, MapRoute) for route in app.amqp.routes)
            and not _OWN_OPTIONS & set(options))


def _defined_by_fair_task(cls: type, name: str) -> bool:
    """Whether ``cls`` has ``name`` from FairTask itself (the class of its MRO that
    defines it is the one marking FairTask: ``is_fair_task``), not a subclass's own."""
    owner = next((c for c in cls.__mro__ if name in vars(c)), None)
    return owner is not None and "is_fair_task" in vars(owner)


class Stamper:
    """Makes the messages of other calls from ``built`` (the template's)."""

    def __init__(self, task: Task, built: Built, config: FairConfig,
                 headers: Mapping[str, Any], explicit: tuple[Any, Any, Any]) -> None:
        self.task, self.built, self.config = task, built, config
        self.headers, self.explicit = headers, explicit
        template = built.envelope.headers
        self.own_root = template.get("root_id") == template.get("id")
        self.amqp = task._get_app().amqp
        self.meta = built.envelope.meta()  # the same for every call: due, destination
        self.context = placement_context(task._get_app())  # likewise

    def make(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Collected]:
        """The task id and hold of the call ``task(*args, **kwargs)``."""
        task, built = self.task, self.built
        if task.typing:
            task.__header__(*args, **kwargs)  # Celery's check of the arguments
        task_id = str(uuid.uuid4())
        fair = task._placement(args, kwargs, self.headers, self.explicit,
                               self.config.default_group, self.context)
        headers = {**built.envelope.headers, **fair, "id": task_id,
                   "argsrepr": plain_repr(args, self.amqp.argsrepr_maxsize),
                   "kwargsrepr": plain_repr(kwargs, self.amqp.kwargsrepr_maxsize)}
        if self.own_root:
            headers["root_id"] = task_id
        serializer, content_type, content_encoding, compression = built.prepare
        raw, ctype, cenc = built.producer._prepare(
            (args, kwargs, built.body[2]), serializer, content_type, content_encoding,
            compression, headers)
        if isinstance(raw, str):
            raw = raw.encode(cenc or "utf-8")
        t = built.envelope
        envelope = Envelope(raw, ctype, cenc, headers, t.exchange, t.routing_key, t.queue,
                            t.delivery_mode, t.priority,
                            {**t.properties, "correlation_id": task_id}, t.due_at)
        group = fair[GROUP_HEADER]
        where = Placement(group, fair[CLASS_HEADER], fair[COST_HEADER], False,
                          self.config.max_held_of(group))
        same = (ctype, cenc) == (t.content_type, t.content_encoding)
        value = envelope.encode(where.group, where.klass, where.cost, where.front,
                                meta=self.meta if same else None)
        template = built.collected
        return task_id, Collected(template.store, template.queue,
                                  Hold(task_id, value, where, template.hold.due_ms))


def results(app: Celery, task: Task, producer: Any, ids: Sequence[str],
            ignore_result: bool) -> list[Any]:
    """What ``send_task`` does after publishing, for each of ``ids``: the result backend's
    ``on_task_call`` (batched on Redis), an ``AsyncResult``, the parent's trail."""
    if not ignore_result:
        _announce(app.backend, producer, ids)
    parent = app.current_worker_task
    out = []
    for task_id in ids:
        result = task.AsyncResult(task_id)
        result.ignored = ignore_result
        if parent:
            parent.add_trail(result)
        out.append(result)
    return out


def _announce(backend: Any, producer: Any, ids: Sequence[str]) -> None:
    """``backend.on_task_call`` for each id: on Celery's Redis backend, the first call
    (which starts its result consumer when need be) and then one SUBSCRIBE per
    :data:`_SUBSCRIBE_BATCH` ids, as its ``_consume_from`` would subscribe each."""
    if not ids:
        return
    backend.on_task_call(producer, ids[0])
    consumer: Any = getattr(backend, "result_consumer", None)
    pubsub = getattr(consumer, "_pubsub", None)
    if task_join_will_block() or pubsub is None or not all(
            hasattr(consumer, name) for name in ("subscribed_to", "_get_key_for_task",
                                                 "_pending_unsubscribe", "_locked")):
        for task_id in ids[1:]:  # what it does is not known here: one call each
            backend.on_task_call(producer, task_id)
        return
    with consumer._locked():
        keys = [consumer._get_key_for_task(i) for i in ids[1:]]
        consumer._pending_unsubscribe.difference_update(keys)
        new = [k for k in keys if k not in consumer.subscribed_to]
        consumer.subscribed_to.update(new)
        for start in range(0, len(new), _SUBSCRIBE_BATCH):
            with consumer.reconnect_on_error():
                pubsub.subscribe(*new[start:start + _SUBSCRIBE_BATCH])
