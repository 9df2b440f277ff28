"""FairTask: Celery builds and routes the message as usual; only the final publish is held.

``apply_async`` works out the group, class and cost, writes them into the message headers,
and hands Celery a :class:`HoldingProducer`. Celery then does everything it always does —
routing, serialization, canvas links, ``before_task_publish`` — and the holding producer
keeps the finished message in the store instead of sending it to the broker. The dispatcher
later publishes it verbatim.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Callable

from celery import Celery, Task, shared_task
from celery.app.task import Context
from celery.exceptions import Ignore

from .brokers import check_app, real_destination
from .config import FairConfig, get_config
from .envelope import BACKGROUND, INTERACTIVE, Envelope
from .errors import FairError, InvalidOption, StoreFull, StoreUnreachable
from .groups import GroupResolver, GroupRule, current_scope
from .host import identity, pid_alive
from .names import validate_cost, validate_group
from .options import TASK_OPTIONS, class_options, reject_misspelt
from .outage import Outage
from .spool import spool_for
from .store.base import BeginResult
from .store.redis import Bounds, RedisStore, store_for_url

logger = logging.getLogger(__name__)

#: Headers celery_fair adds to a held message.
GROUP_HEADER, CLASS_HEADER, COST_HEADER = "fair_group", "fair_class", "fair_cost"
#: Headers the dispatcher adds to a dispatched message.
DISPATCH_HEADER, QUEUE_HEADER = "fair_dispatch_id", "fair_queue"


def store_for(app: Celery) -> RedisStore:
    """The store of ``app``'s fair queues in this process."""
    config = get_config(app)
    return store_for_url(config.store_url, config.key_prefix, bounds_of(config))


def bounds_of(config: FairConfig) -> Bounds:
    """How long the store's commands may block, from the ``fair_store_*`` settings."""
    return Bounds(config.store_socket_timeout, config.store_connect_timeout,
                  config.store_retries)


class FairTask(Task):
    """A Celery task whose publications are held and dispatched fairly across groups.

    Set ``fair_group`` (an argument name or a callable ``(args, kwargs) -> group``),
    ``fair_interactive`` and ``fair_cost`` as task options, or use :func:`fair_task`.
    """

    fair_group: GroupRule = None
    fair_interactive: bool | None = None
    fair_cost: float = 1
    _fair_resolver: GroupResolver | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # ``@app.task(base=FairTask, fair_grup=...)`` creates a subclass whose attributes
        # are the task's options: a misspelt fair option raises here (options.py's rule).
        super().__init_subclass__(**kwargs)
        reject_misspelt(class_options(vars(cls)), TASK_OPTIONS, f"task class {cls.__name__}")

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Bound to an app: install celery_fair there (``revoke`` cancels held tasks,
        ``fair_tasks`` and starmaps of fair tasks are held; see installer.py)."""
        super().on_bound(app)
        from .installer import install  # installer.py imports this module

        install(app)

    def apply_async(self, args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None, task_id: str | None = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> Any:
        reject_misspelt(options, TASK_OPTIONS, f"{self.name}.apply_async()")
        explicit = (options.pop("fair_group", None), options.pop("fair_interactive", None),
                    options.pop("fair_cost", None))
        app = self._get_app()
        headers = dict(options.get("headers") or {})
        headers.pop(DISPATCH_HEADER, None)
        headers.pop(QUEUE_HEADER, None)
        if app.conf.task_always_eager:
            # Run directly, as Celery does; still reject a bad group or cost at call time
            # (without needing a store, so eager tests run on any broker).
            self._placement(args or (), kwargs or {}, headers, explicit,
                            app.conf.get("fair_default_group", "default"))
            return super().apply_async(args, kwargs, task_id=task_id, producer=producer,
                                       link=link, link_error=link_error, shadow=shadow,
                                       **options)
        check_app(app)  # task protocol 1 or a broker celery_fair can't publish to
        config = get_config(app)
        headers.update(self._placement(args or (), kwargs or {}, headers, explicit,
                                       config.default_group))
        options["headers"] = headers
        front = bool(options.get("retries"))  # only Task.retry() passes it
        with app.producer_or_acquire(producer) as real:
            holder = HoldingProducer(real, store_for(app), front, app)
            return super().apply_async(args, kwargs, task_id=task_id, producer=holder,
                                       link=link, link_error=link_error, shadow=shadow,
                                       **options)

    def _placement(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                   headers: Mapping[str, Any], explicit: tuple[Any, Any, Any],
                   default_group: str) -> dict[str, Any]:
        """Group, class and cost of one call, as message headers."""
        return placement(self.app, headers, explicit,
                         lambda: self._resolver()(args, kwargs), self.fair_interactive,
                         self.fair_cost, default_group)

    def _resolver(self) -> GroupResolver:
        rule = self.fair_group
        if inspect.ismethod(rule) and rule.__self__ is self:  # a function set as option
            rule = rule.__func__
        resolver = self._fair_resolver
        if resolver is None or resolver.rule is not rule:
            resolver = GroupResolver(rule, self.run, self.name)
            type(self)._fair_resolver = resolver
        return resolver

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.is_eager:
            return super().__call__(*args, **kwargs)
        # In a worker: a stale duplicate of a dispatch that was held again is skipped.
        if self._begin() is BeginResult.SKIP:
            raise Ignore()
        result = super().__call__(*args, **kwargs)
        # The body ran to its end: say so now rather than at task_postrun, after the
        # result is stored. A worker killed in between would leave the dispatch running,
        # and the copy the broker redelivers (acks_late) would run the task again.
        from .worker import release_dispatch  # worker.py imports this module

        release_dispatch(self.app, request_headers(self.request), "returned", done=True,
                         run=getattr(self.request, "fair_run", None))
        self.request.fair_released = True  # task_postrun has nothing left to do
        return result

    def _begin(self) -> BeginResult:
        try:
            run = new_run()
            self.request.fair_run = run  # its releases name it
            result = begin_dispatch(self.app, self.request, acks_late=bool(self.acks_late),
                                    run=run)
        except FairError as exc:
            # The store is down: run (a stale duplicate might run too, as without
            # celery_fair); the lease keeper marks it running once the store is back.
            _begin_outage.failed(exc, "running tasks without checking their dispatch")
            return BeginResult.RUN_UNKNOWN
        _begin_outage.ok()
        return result

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        # Task.__call__ pushes a request. Celery before 5.5 pushed a bare one, so a task
        # class with its own __call__ (this one) lost the worker's request (id, retries,
        # delivery_info...) wherever Celery's stack protection is not installed (workers
        # embedded with celery.contrib.testing). Keep the current request's fields, as
        # Celery 5.5+ does.
        self.request_stack.push(Context(*args, **{**self.request.__dict__, **kwargs}))


def placement(app: Celery, headers: Mapping[str, Any], explicit: tuple[Any, Any, Any],
              rule_group: Callable[[], Any], rule_interactive: bool | None,
              rule_cost: float, default_group: str) -> dict[str, Any]:
    """Group, class and cost of one publication, as message headers.

    Precedence, most specific first: the call's ``fair_*`` options (``explicit``), the
    message's own fair headers (a retry), the task's rule, :func:`fair_context`, the
    parent task's headers (a continuation published by a worker), the default group.
    """
    group, interactive, cost = explicit
    scope = current_scope()
    parent = _parent_headers(app)
    if group is None:
        group = headers.get(GROUP_HEADER)
    if group is None:
        group = rule_group()
    if group is None and scope is not None:
        group = scope.group
    if group is None:
        group = parent.get(GROUP_HEADER)
    klass = _klass(interactive, headers.get(CLASS_HEADER), rule_interactive,
                   scope.interactive if scope else None, parent.get(CLASS_HEADER))
    return {
        GROUP_HEADER: validate_group(default_group if group is None else group),
        CLASS_HEADER: klass,
        COST_HEADER: validate_cost(rule_cost if cost is None else cost),
    }


def _klass(*choices: Any) -> str:
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


def request_headers(request: Any) -> Mapping[str, Any]:
    """The celery_fair headers of a task request (a Context, a Request, or a dict)."""
    if isinstance(request, Mapping):
        return request
    headers = getattr(request, "headers", None)
    if isinstance(headers, Mapping) and DISPATCH_HEADER in headers:
        return headers
    source = getattr(request, "request_dict", None)
    if isinstance(source, Mapping):
        return source
    return {name: getattr(request, name, None)
            for name in (GROUP_HEADER, CLASS_HEADER, DISPATCH_HEADER, QUEUE_HEADER)
            if getattr(request, name, None) is not None}


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

    return store.begin(queue, did, deadline, now_ms=int(now * 1000), run=run or new_run(),
                       acks_late=acks_late, host=_HOST, gone=gone)


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


class HoldingProducer:
    """Stands in for a kombu Producer inside ``send_task``; holds task messages.

    Anything that is not a task message (the ``task-sent`` event) goes to the real producer.
    """

    def __init__(self, producer: Any, store: RedisStore, front: bool, app: Celery) -> None:
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
        envelope = Envelope(
            body=raw, content_type=ctype, content_encoding=cenc, headers=headers,
            exchange=exchange, routing_key=routing_key, queue=queue,
            delivery_mode=delivery_mode, priority=priority, properties=properties,
            due_at=max(now, due) / 1000)
        group = headers[GROUP_HEADER]
        value = envelope.encode(group, headers[CLASS_HEADER], headers[COST_HEADER], self._front)
        self._store.hold(envelope.queue, envelope.task_id, value, due, now)


_publish_outage = Outage(logger, "celery_fair: holding fair tasks", expected=(FairError,))
_begin_outage = Outage(logger, "celery_fair: marking dispatches running", expected=(FairError,))


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


#: The celery_fair keywords of :func:`fair_task`.
FAIR_TASK_OPTIONS = ("group", "interactive", "cost")


def fair_task(*args: Any, group: GroupRule = None, interactive: bool | None = None,
              cost: float = 1, **options: Any) -> Any:
    """Declare a fair task: ``shared_task`` with ``base=FairTask``.

    Parameters:
        group: the argument naming the task's group (``"tenant_id"``), or a callable
            ``(args, kwargs) -> group``; without it the group comes from
            :func:`fair_context`, the parent task, then ``fair_default_group``.
        interactive: run ahead of background tasks (and within the interactive reserve).
        cost: how much of its group's share one run uses (default 1).
        options: any ``shared_task`` option (``bind``, ``acks_late``, ``base``...).

    Raises:
        InvalidOption: an option that looks like a misspelt ``group``, ``interactive`` or
            ``cost``, or starts with ``fair_`` (the rule is in ``celery_fair.options``).
        InvalidGroup: ``group`` names no argument of the function.
        InvalidCost: ``cost`` is not a positive number.
    """
    reject_misspelt(options, FAIR_TASK_OPTIONS, "fair_task()")
    validate_cost(cost)
    _klass(interactive)
    base = options.pop("base", None) or FairTask
    if not issubclass(base, FairTask):
        base = type(f"Fair{base.__name__}", (FairTask, base), {})

    def create(fn: Callable[..., Any]) -> Any:
        if isinstance(group, str):
            run = fn if not options.get("bind") else _drop_first(fn)
            GroupResolver(group, run, getattr(fn, "__name__", "task"))
        else:
            GroupResolver(group, fn, getattr(fn, "__name__", "task"))
        return shared_task(base=base, fair_group=group, fair_interactive=interactive,
                           fair_cost=cost, **options)(fn)

    if len(args) == 1 and callable(args[0]) and not options:
        return create(args[0])
    if args:
        raise TypeError("fair_task takes keyword arguments only: @fair_task(group='tenant_id')")
    return create


def _drop_first(fn: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)
    wrapper = functools.partial(fn, None)
    wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=list(sig.parameters.values())[1:])
    return wrapper
