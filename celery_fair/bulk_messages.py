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

import functools
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from celery import Celery, Task
from celery._state import task_join_will_block
from celery.app.routes import MapRoute
from celery.signals import after_task_publish, before_task_publish
from celery.utils.saferepr import saferepr
from kombu.exceptions import EncodeError
from kombu.utils.json import dumps

from .config import FairConfig
from .envelope import Envelope, value_prefix
from .groups import split_path
from .headers import CLASS_HEADER, COST_HEADER, GROUP_HEADER
from .holding import Built, placement_context, unruled_group
from .json_text import ENCODER, body_tail, json_format, quoted
from .names import validate_group
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


#: The RFC 4122 variant digit of a version-4 uuid from any hex digit (its bits 10xx).
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def task_ids() -> Iterator[str]:
    """Task ids as Celery makes them (``str(uuid.uuid4())``: 122 random bits, version 4,
    RFC 4122 variant), from one ``os.urandom`` call per 1,024 (a call and a ``UUID``
    each cost more than the rest of a made message's id)."""
    while True:
        chunk = os.urandom(16 * 1024).hex()
        for i in range(0, len(chunk), 32):
            h = chunk[i:i + 32]
            yield f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


class _Group(NamedTuple):
    """What the messages of one group share: their placement and fair headers, the start
    of their stored value (prefix and meta) and the group's JSON."""

    placement: Placement
    fair: dict[str, Any]
    head: bytes
    quoted: str


class Stamper:
    """Makes the messages of other calls from ``built`` (the template's) and collects
    their holds where the template's went."""

    def __init__(self, task: Task, built: Built, config: FairConfig,
                 headers: Mapping[str, Any], explicit: tuple[Any, Any, Any]) -> None:
        self.task, self.built, self.config = task, built, config
        template = built.envelope.headers
        self.own_root = template.get("root_id") == template.get("id")
        amqp = task._get_app().amqp
        self.sizes = (amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize)
        self.check = task.__header__ if task.typing else None  # Celery's argument check
        self.meta = built.envelope.meta()  # the same for every call: due, destination
        self.holds, self.due = built.holds, built.hold.due_ms
        # Only the group differs between calls' placements (fair_bulk's options, the
        # headers, fair_context and the parent are the call's): holding.placement's
        # order, the task's rule asked only when neither the options nor headers say.
        self.fixed = explicit[0] if explicit[0] is not None else headers.get(GROUP_HEADER)
        scope, parent = placement_context(task._get_app())
        fallback = unruled_group(scope, parent)
        self.fallback = config.default_group if fallback is None else fallback
        self.rule = task._resolver()
        self.klass, self.cost = template[CLASS_HEADER], template[COST_HEADER]
        self.groups: dict[tuple[type, Any], _Group] = {}
        self.quick = _quick_format(built, self.own_root)
        self.ids = task_ids()

    def make(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Collect the hold of the call ``task(*args, **kwargs)``; its task id."""
        if self.check is not None:
            self.check(*args, **kwargs)
        task_id = next(self.ids)
        group = self._group(args, kwargs)
        argsrepr = plain_repr(args, self.sizes[0])
        kwargsrepr = plain_repr(kwargs, self.sizes[1]) if kwargs else "{}"  # saferepr's
        if self.quick is None:
            value = self._made_by_producer(task_id, args, kwargs, argsrepr, kwargsrepr,
                                           group)
        else:
            form, tail = self.quick
            try:
                body = ENCODER.encode((args, kwargs))
            except Exception as exc:  # what kombu's dumps raises for it (_reraise_errors)
                raise EncodeError(exc) from exc
            value = b"".join((group.head, form.format(
                quoted(task_id), quoted(argsrepr), quoted(kwargsrepr), group.quoted).encode(),
                body[:-1].encode(), tail))
        self.holds.append(Hold(task_id, value, group.placement, self.due))
        return task_id

    def _group(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Group:
        raw = self.fixed
        if raw is None:
            raw = self.rule(args, kwargs)
            if raw is None:
                raw = self.fallback
        try:
            return self.groups[(type(raw), raw)]
        except KeyError:
            group = self.groups[(type(raw), raw)] = self._new_group(raw)
            return group
        except TypeError:  # not hashable: validate_group refuses it
            return self._new_group(raw)

    def _new_group(self, raw: Any) -> _Group:
        name, klass, cost = validate_group(raw), self.klass, self.cost
        envelope = self.built.envelope  # fair_subgroup 'path': held in the path's head
        held, sub = split_path(name, self.config.policy_for(envelope.queue).subgroup)
        meta = replace(envelope, subgroup=sub).meta() if sub or envelope.subgroup \
            else self.meta
        return _Group(Placement(held, klass, cost, False, self.config.max_held_of(held),
                                subgroup=sub),
                      {GROUP_HEADER: name, CLASS_HEADER: klass, COST_HEADER: cost},
                      value_prefix(held, klass, cost, False) + meta + b"\n",
                      quoted(name))

    def _made_by_producer(self, task_id: str, args: tuple[Any, ...],
                          kwargs: dict[str, Any], argsrepr: str, kwargsrepr: str,
                          group: _Group) -> bytes:
        """The stored value serialized by the producer's ``_prepare`` (another
        serializer than kombu's JSON, a compression)."""
        built, t = self.built, self.built.envelope
        headers = {**t.headers, **group.fair, "id": task_id, "argsrepr": argsrepr,
                   "kwargsrepr": kwargsrepr}
        if self.own_root:
            headers["root_id"] = task_id
        raw, ctype, cenc = built.producer._prepare((args, kwargs, built.body[2]),
                                                   *built.prepare, headers)
        if isinstance(raw, str):
            raw = raw.encode(cenc or "utf-8")
        envelope = Envelope(raw, ctype, cenc, headers, t.exchange, t.routing_key, t.queue,
                            t.delivery_mode, t.priority,
                            {**t.properties, "correlation_id": task_id}, t.due_at,
                            group.placement.subgroup)
        p = group.placement
        same = (ctype, cenc) == (t.content_type, t.content_encoding) \
            and p.subgroup == t.subgroup
        return envelope.encode(p.group, p.klass, p.cost, p.front,
                               meta=self.meta if same else None)


def _quick_format(built: Built, own_root: bool) -> tuple[str, bytes] | None:
    """The headers and properties of a made message as one format (task id, argsrepr,
    kwargsrepr, group JSON), and its body's tail after ``[args, kwargs`` (json_text.py);
    None unless the template, made again so, is the very one Celery built."""
    t = built.envelope
    tail = body_tail(built.producer, built.prepare, built.body[2])
    texts = (t.task_id, t.headers.get("argsrepr"), t.headers.get("kwargsrepr"),
             t.headers.get(GROUP_HEADER))
    if tail is None or not all(isinstance(text, str) for text in texts):
        return None
    fields = {"id": 0, "argsrepr": 1, "kwargsrepr": 2, GROUP_HEADER: 3}
    if own_root:
        fields["root_id"] = 0
    try:
        form = f"{json_format(t.headers, fields)}\n" \
            f"{json_format(t.properties, {'correlation_id': 0})}\n"
        again = form.format(*(quoted(str(text)) for text in texts)) + \
            ENCODER.encode((built.body[0], built.body[1]))[:-1] + tail
    except (ValueError, TypeError):
        return None
    made = f"{dumps(t.headers)}\n{dumps(t.properties)}\n".encode() + t.body
    return (form, tail.encode()) if again.encode() == made else None


def results(app: Celery, task: Task, producer: Any, ids: Sequence[str],
            ignore_result: bool) -> list[Any]:
    """What ``send_task`` does after publishing, for each of ``ids``: the result backend's
    ``on_task_call`` (batched on Redis), an ``AsyncResult``, the parent's trail."""
    if not ignore_result:
        _announce(app.backend, producer, ids)
    parent = app.current_worker_task
    out = []
    # Task.AsyncResult's own making, its lookups done once (unless the task has its own)
    make = functools.partial(app.AsyncResult, backend=task.backend, task_name=task.name) \
        if type(task).AsyncResult is Task.AsyncResult else task.AsyncResult
    for task_id in ids:
        result = make(task_id)
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
