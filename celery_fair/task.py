"""FairTask: Celery builds and routes the message as usual; only the final publish is held.

``apply_async`` works out the group, class and cost, writes them into the message headers,
and hands Celery a :class:`HoldingProducer`. Celery then does everything it always does —
routing, serialization, canvas links, ``before_task_publish`` — and the holding producer
keeps the finished message in the store instead of sending it to the broker. The dispatcher
later publishes it verbatim.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable, ClassVar

from celery import Celery, Task, shared_task
from celery.app.task import Context
from celery.exceptions import Ignore

from .brokers import check_app
from .config import get_config
from .errors import FairError, InvalidControl, InvalidOption
from .groups import GroupResolver, GroupRule, split_path
from .headers import (
    CLASS_HEADER,
    COST_HEADER,
    DISPATCH_HEADER,
    DISPATCH_HEADERS,
    GROUP_HEADER,
    QUEUE_HEADER,
    request_headers,
)
from .holding import HoldingProducer, klass_of, placement
from .lifecycle import begin_dispatch, new_run, release_dispatch, run_gone, starts_quickly
from .names import validate_cost
from .options import TASK_OPTIONS, class_options, reject_misspelt
from .outage import Outage
from .singleton import WAIT, singleton_headers, validate_mode
from .store import bounds_of, store_for
from .store.base import BeginResult
from .store.bulk import HOLD_BATCH

logger = logging.getLogger(__name__)

# The names that lived here before headers.py, holding.py, lifecycle.py and the store
# factory took them; kept importable from here for code that imports them from here.
__all__ = ["CLASS_HEADER", "COST_HEADER", "DISPATCH_HEADER", "FAIR_TASK_OPTIONS",
           "GROUP_HEADER", "QUEUE_HEADER", "FairTask", "HoldingProducer", "begin_dispatch",
           "bounds_of", "fair_task", "new_run", "placement", "request_headers",
           "run_gone", "store_for"]


class FairTask(Task):
    """A Celery task whose publications are held and dispatched fairly across groups.

    Set ``fair_group`` (an argument name or a callable ``(args, kwargs) -> group``),
    ``fair_interactive`` and ``fair_cost`` as task options, or use :func:`fair_task`.
    """

    fair_group: GroupRule = None
    fair_interactive: bool | None = None
    fair_cost: float = 1
    #: the singleton key's rule (as ``fair_group``'s) and mode (singleton.py)
    fair_singleton: GroupRule = None
    fair_singleton_mode: str | None = None
    #: Marks a FairTask for the modules this one imports (installer, worker), which test
    #: it without importing this module.
    is_fair_task: ClassVar[bool] = True
    _fair_resolver: GroupResolver | None = None
    _fair_singleton_resolver: GroupResolver | None = None

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
        single = (options.pop("fair_singleton", None), options.pop("fair_singleton_mode", None))
        app = self._get_app()
        headers = dict(options.get("headers") or {})
        for stale in DISPATCH_HEADERS:  # a previous dispatch's (Task.retry)
            headers.pop(stale, None)
        if app.conf.task_always_eager:
            # Run directly, as Celery does; still reject a bad group or cost at call time
            # (without needing a store, so eager tests run on any broker).
            self._placement(args or (), kwargs or {}, headers, explicit,
                            app.conf.get("fair_default_group", "default"))
            self._singleton(args or (), kwargs or {}, headers, single)
            return super().apply_async(args, kwargs, task_id=task_id, producer=producer,
                                       link=link, link_error=link_error, shadow=shadow,
                                       **options)
        check_app(app)  # task protocol 1 or a broker celery_fair can't publish to
        config = get_config(app)
        headers.update(self._placement(args or (), kwargs or {}, headers, explicit,
                                       config.default_group))
        headers.update(self._singleton(args or (), kwargs or {}, headers, single))
        options["headers"] = headers
        front = bool(options.get("retries"))  # only Task.retry() passes it
        with app.producer_or_acquire(producer) as real:
            holder = HoldingProducer(real, store_for(app), front, app, checked=True)
            return super().apply_async(args, kwargs, task_id=task_id, producer=holder,
                                       link=link, link_error=link_error, shadow=shadow,
                                       **options)

    def fair_bulk(self, items: Iterable[Any], *, group: GroupRule = None,
                  interactive: bool | None = None, cost: float | None = None,
                  batch_size: int = HOLD_BATCH, **options: Any) -> list[Any]:
        """Hold many calls of this task at once: ``apply_async`` for each item, with the
        store written in batches of ``batch_size`` (one round trip each) once every
        message is built.

        Parameters:
            items: each a tuple (or list) of positional arguments, or a signature of this
                task (``task.s(1, tenant="acme").set(countdown=10)``) for keyword
                arguments and options of its own.
            group, interactive, cost: ``fair_group``, ``fair_interactive`` and
                ``fair_cost`` for every item (an item's own options win); without them
                the task's rules decide, as for ``delay()``.
            batch_size: messages per round trip to the store (default 500).
            options: any ``apply_async`` option for every item (``countdown``, ``eta``,
                ``expires``, ``queue``, ``priority``, ``headers``...).

        Returns:
            The ``AsyncResult`` of each item, in order.

        Raises:
            InvalidOption, InvalidGroup, InvalidCost, kombu's EncodeError...: an item
                that cannot be built, its index in the message; nothing was held.
            GroupFull: a group's ``fair_group_max_held`` has no room for all of its new
                items; nothing was held (checked again per batch as it is held: a race
                with other holds may refuse a later batch, raised as BulkHoldFailed).
            BulkHoldFailed: the store failed part way; the batches before are held, and
                ``retry()`` holds the rest (each message once).

        ``fair_on_store_error = "publish"`` does not apply: a bulk hold is never sent
        straight to the broker. Runs each item eagerly under ``task_always_eager``.
        """
        from .bulk import fair_bulk  # bulk.py imports holding.py, as this module does

        return fair_bulk(self, items, group=group, interactive=interactive, cost=cost,
                         batch_size=batch_size, **options)

    def _placement(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                   headers: Mapping[str, Any], explicit: tuple[Any, Any, Any],
                   default_group: str,
                   context: tuple[Any, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """Group, class and cost of one call, as message headers."""
        return placement(self.app, headers, explicit,
                         lambda: self._resolver()(args, kwargs), self.fair_interactive,
                         self.fair_cost, default_group, context)

    def _resolver(self) -> GroupResolver:
        rule = self.fair_group
        if inspect.ismethod(rule) and rule.__self__ is self:  # a function set as option
            rule = rule.__func__
        resolver = self._fair_resolver
        if resolver is None or resolver.rule is not rule:
            resolver = GroupResolver(rule, self.run, self.name)
            type(self)._fair_resolver = resolver
        return resolver

    def _singleton(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                   headers: Mapping[str, Any], explicit: tuple[Any, Any]) -> dict[str, str]:
        """The singleton key and mode of one call, as message headers (none: no key)."""
        rule = self.fair_singleton
        if inspect.ismethod(rule) and rule.__self__ is self:
            rule = rule.__func__
        resolver = self._fair_singleton_resolver
        if resolver is None or resolver.rule is not rule:
            resolver = GroupResolver(rule, self.run, self.name, "singleton", InvalidOption)
            type(self)._fair_singleton_resolver = resolver
        return singleton_headers(explicit, headers, lambda: resolver(args, kwargs),
                                 self.fair_singleton_mode)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.is_eager:
            return super().__call__(*args, **kwargs)
        # In a worker: a stale duplicate of a dispatch that was held again is skipped.
        if self._begin() is BeginResult.SKIP:
            raise Ignore()
        # the body's wall time (fair_charge 'runtime'); task_postrun reads it on a failure
        self.request.fair_started = started = time.monotonic()
        result = super().__call__(*args, **kwargs)
        # The body ran to its end: say so now rather than at task_postrun, after the
        # result is stored. A worker killed in between would leave the dispatch running,
        # and the copy the broker redelivers (acks_late) would run the task again.
        release_dispatch(self.app, request_headers(self.request), "returned", done=True,
                         run=getattr(self.request, "fair_run", None), task_id=self.request.id,
                         runtime=time.monotonic() - started)
        self.request.fair_released = True  # task_postrun has nothing left to do
        return result

    def fair_throttle(self, seconds: float, *, reason: str | None = None) -> float | None:
        """Hold this task's group back in its fair queue for ``seconds``, as after an
        HTTP 429: the dispatchers pick nothing of the group until then (a longer
        throttle already in force is kept); running tasks go on. Recorded in the audit
        log under this task's name and id. Returns when the throttle ends (ms since the
        epoch); None when the task runs eagerly (nothing is held, nothing to throttle).

        Raises:
            InvalidControl: ``seconds`` is not above 0 and at most a year, or the task
                was not dispatched by celery_fair (no group or fair queue to throttle).
            StoreError: the store failed.
        """
        from .throttles import throttle, throttle_seconds

        if self.request.is_eager:  # nothing to throttle, but a bad value fails here too
            throttle_seconds(seconds)
            return None
        headers = request_headers(self.request)
        group, queue = headers.get(GROUP_HEADER), headers.get(QUEUE_HEADER)
        if not group or not queue:
            raise InvalidControl(f"fair_throttle in task {self.name}[{self.request.id}]: "
                                 "it was not dispatched by celery_fair, so it has no group "
                                 "or fair queue to throttle")
        # fair_subgroup 'path': "acme/alice" is held in, and throttles, the group "acme"
        group = split_path(group, get_config(self.app).policy_for(queue).subgroup)[0]
        done = throttle(self.app, group, seconds, queue=queue, reason=reason,
                        actor=f"task {self.name}[{self.request.id}]")
        return done[0].until_ms

    def _begin(self) -> BeginResult:
        try:
            run = new_run()
            self.request.fair_run = run  # its releases name it
            if starts_quickly(self.app, self.request, acks_late=bool(self.acks_late)):
                return BeginResult.RUN  # fair_quick_start: its lease says it is current
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


_begin_outage = Outage(logger, "celery_fair: marking dispatches running", expected=(FairError,))


#: The celery_fair keywords of :func:`fair_task`.
FAIR_TASK_OPTIONS = ("group", "interactive", "cost", "singleton", "singleton_mode")


def fair_task(*args: Any, group: GroupRule = None, interactive: bool | None = None,
              cost: float = 1, singleton: GroupRule = None, singleton_mode: str = WAIT,
              **options: Any) -> Any:
    """Declare a fair task: ``shared_task`` with ``base=FairTask``.

    Parameters:
        group: the argument naming the task's group (``"tenant_id"``), or a callable
            ``(args, kwargs) -> group``; without it the group comes from
            :func:`fair_context`, the parent task, then ``fair_default_group``.
        interactive: run ahead of background tasks (and within the interactive reserve).
        cost: how much of its group's share one run uses (default 1).
        singleton: the argument naming the task's singleton key (``"doc_id"``), or a
            callable ``(args, kwargs) -> key``: at most one task per key in flight at a
            time, the others wait their turn in order (DESIGN.md, "Singleton keys").
        singleton_mode: ``"wait"`` (default), or ``"drop"``: a task whose key already
            has one waiting is not held but marked REVOKED (one log line).
        options: any ``shared_task`` option (``bind``, ``acks_late``, ``base``...).

    Raises:
        InvalidOption: an option that looks like a misspelt ``group``, ``interactive`` or
            ``cost``, or starts with ``fair_`` (the rule is in ``celery_fair.options``).
        InvalidGroup: ``group`` names no argument of the function.
        InvalidCost: ``cost`` is not a positive number.
        InvalidOption: ``singleton`` names no argument, or ``singleton_mode`` is not
            ``"wait"`` or ``"drop"``.
    """
    reject_misspelt(options, FAIR_TASK_OPTIONS, "fair_task()")
    validate_cost(cost)
    klass_of(interactive)
    validate_mode(singleton_mode)
    base = options.pop("base", None) or FairTask
    if not issubclass(base, FairTask):
        base = type(f"Fair{base.__name__}", (FairTask, base), {})

    def create(fn: Callable[..., Any]) -> Any:
        run = fn if not options.get("bind") else _drop_first(fn)
        name = getattr(fn, "__name__", "task")
        GroupResolver(group, run if isinstance(group, str) else fn, name)
        GroupResolver(singleton, run if isinstance(singleton, str) else fn, name,
                      "singleton", InvalidOption)
        return shared_task(base=base, fair_group=group, fair_interactive=interactive,
                           fair_cost=cost, fair_singleton=singleton,
                           fair_singleton_mode=singleton_mode, **options)(fn)

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
