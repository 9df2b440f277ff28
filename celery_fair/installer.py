"""``celery_fair.install(app)``: hold tasks published by name, app-wide.

Every task message Celery publishes — ``send_task("name")``, beat, canvas, retries —
passes through ``app.amqp.send_task_message``. :func:`install` wraps it: a message whose
task name matches the ``fair_tasks`` setting gets the fair headers (group, class, cost)
and goes to a :class:`~celery_fair.holding.HoldingProducer`, exactly as a
:class:`~celery_fair.FairTask`'s does. Any other message is published untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from celery import Celery
from celery.app.amqp import AMQP
from celery.utils.imports import symbol_by_name

from .canvas import patch_groups
from .config import get_config
from .headers import DISPATCH_HEADERS
from .holding import HoldingProducer, placement
from .revoke import FairControlMixin
from .rules import TaskRules
from .store import store_for

#: ``send_task`` options naming the placement of one message (like ``apply_async``'s).
FAIR_OPTIONS = ("fair_group", "fair_interactive", "fair_cost")
#: Celery's built-in tasks that run another task over a list of items in one message.
MAP_TASKS = ("celery.starmap", "celery.map")

Sender = Callable[..., Any]


def install(app: Celery) -> Celery:
    """Hold the messages of the tasks named in ``app.conf.fair_tasks``, whoever sends them.

    Call it where the app is created, so every process using the app (web, beat,
    workers) has it; binding a :class:`~celery_fair.FairTask` to an app does it too.
    Idempotent; reads no setting until the first publish. Also holds a ``starmap`` or
    ``chunks`` of a fair task, holds a ``group``'s fair members in batches (canvas.py),
    and makes ``revoke()`` remove held tasks. Returns ``app``.
    """
    extend(app, "amqp", FairAMQPMixin)
    amqp = vars(app).get("amqp")
    if amqp is not None:
        vars(amqp).pop("send_task_message", None)  # rebuilt through the mixin
    extend(app, "control", FairControlMixin)  # revoke() also cancels held tasks
    patch_groups()  # a group's fair members held in batches (canvas.py)
    return app


def extend(app: Celery, name: str, mixin: type) -> None:
    """Mix ``mixin`` into the class of ``app.<name>`` (``control``, ``amqp``).

    The app's ``<name>_cls`` becomes the mixed class, so the object is made with it (no
    configuration is read early); an object the app already made has its class swapped.
    """
    base = symbol_by_name(getattr(app, f"{name}_cls"))
    if not issubclass(base, mixin):
        setattr(app, f"{name}_cls", mixed(mixin, base))  # also what a pickled app keeps
    current = vars(app).get(name)
    if current is not None and not isinstance(current, mixin):
        current.__class__ = mixed(mixin, type(current))


def mixed(mixin: type, base: type) -> type:
    """The subclass of ``base`` with ``mixin`` first in its MRO.

    A subclass defined in celery_fair (``FairControl``, ``FairAMQP``) is used for
    Celery's own classes, so an app that is pickled still unpickles; others are made once.
    """
    subclass: type
    for subclass in mixin.__subclasses__():
        if subclass.__bases__ == (mixin, base):
            return subclass
    return type(f"Fair{base.__name__}", (mixin, base), {})


class FairAMQPMixin:
    """Mixed into the app's AMQP class: its task sender holds fair tasks' messages."""

    app: Celery
    #: Marks an app's AMQP with celery_fair installed (canvas.py tests it).
    holds_fair_tasks: ClassVar[bool] = True

    def _create_task_sender(self) -> Sender:
        send = super()._create_task_sender()  # type: ignore[misc]
        return held_sender(self.app, send)


class FairAMQP(FairAMQPMixin, AMQP):
    """Celery's AMQP whose task sender holds the messages of ``fair_tasks``."""


def held_sender(app: Celery, send: Sender) -> Sender:
    """Wrap Celery's ``send_task_message`` so messages of fair tasks are held."""

    def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> Any:
        if isinstance(producer, HoldingProducer):  # a FairTask's: already placed
            return send(producer, name, message, **options)
        spec = _spec(app, name, message.body)
        if spec is None:
            return send(producer, name, message, **options)
        explicit = tuple(options.pop(key, None) for key in FAIR_OPTIONS)
        options["headers"] = _fair_headers(app, spec, message, options, explicit)
        front = bool(message.headers.get("retries"))  # Task.retry(): head of its group
        holder = HoldingProducer(producer, store_for(app), front, app)
        return send(holder, name, message, **options)

    return send_task_message


@dataclass(frozen=True)
class _Spec:
    """How to place one message: its rule's group (given the headers), class and cost."""

    group: Callable[[Mapping[str, Any]], Any]
    interactive: bool | None
    cost: float
    explicit: Mapping[str, Any]  # fair_* options carried by the inner signature


def _spec(app: Celery, name: str, body: Any) -> _Spec | None:
    """How to hold a message of task ``name``, or None: publish it untouched."""
    if name in MAP_TASKS:
        return _map_spec(app, name, _call_args(body)[1])
    rule = _rules(app).match(name) if app.conf.get("fair_tasks") else None
    if rule is None:
        return None
    args, kwargs = _call_args(body)
    return _Spec(lambda headers: rule.group_of(args, kwargs, headers), rule.interactive,
                 rule.cost, {})


def _rules(app: Celery) -> TaskRules:
    return get_config(app).tasks


def _map_spec(app: Celery, name: str, kwargs: Mapping[str, Any]) -> _Spec | None:
    """A starmap/map (``task.starmap``, ``task.chunks``) of a fair task is held as one
    message: in the group its first item gives, costing the task's cost per item."""
    inner, items = kwargs.get("task"), list(kwargs.get("it") or ())
    if not isinstance(inner, Mapping):
        return None
    inner_name = str(inner.get("task"))
    first = (items[0] if name == "celery.starmap" else (items[0],)) if items else ()
    first_args = tuple(first) if isinstance(first, (list, tuple)) else (first,)
    task = app.tasks.get(inner_name)
    spec: _Spec | None = None
    if getattr(task, "is_fair_task", False) is True:  # a FairTask (task.py imports us)
        resolver = task._resolver()
        spec = _Spec(lambda _: resolver(first_args, {}), task.fair_interactive,
                     task.fair_cost, {})
    elif app.conf.get("fair_tasks"):
        rule = _rules(app).match(inner_name)
        if rule is not None:
            spec = _Spec(lambda headers: rule.group_of(first_args, {}, headers),
                         rule.interactive, rule.cost, {})
    if spec is None:
        return None
    options = inner.get("options") or {}
    return _Spec(spec.group, spec.interactive, min(spec.cost * max(len(items), 1), 1e9),
                 {key: options.get(key) for key in FAIR_OPTIONS})


def _fair_headers(app: Celery, spec: _Spec, message: Any, options: Mapping[str, Any],
                  explicit: tuple[Any, ...]) -> dict[str, Any]:
    """The call's headers, without a previous dispatch's, plus the fair placement."""
    headers = dict(options.get("headers") or {})
    for stale in (message.headers, headers):
        for name in DISPATCH_HEADERS:
            stale.pop(name, None)
    seen = {**message.headers, **headers}
    group, interactive, cost = (
        spec.explicit.get(key) if value is None else value
        for key, value in zip(FAIR_OPTIONS, explicit))
    headers.update(placement(app, seen, (group, interactive, cost), lambda: spec.group(seen),
                             spec.interactive, spec.cost, get_config(app).default_group))
    return headers


def _call_args(body: Any) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """Positional and keyword arguments of a task message body (protocol 2 or 1)."""
    if isinstance(body, (tuple, list)) and len(body) >= 2:
        return tuple(body[0] or ()), dict(body[1] or {})
    if isinstance(body, Mapping):
        return tuple(body.get("args") or ()), dict(body.get("kwargs") or {})
    return (), {}
