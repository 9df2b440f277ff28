"""Holding many tasks in one call: ``FairTask.fair_bulk`` and :func:`bulk_holds`.

Each message is built exactly as ``apply_async`` builds it, by the same path (the
task's ``apply_async``, Celery's ``send_task``, the holding producer: headers, ids,
routing, serialization, ``before_task_publish``, the result backend's bookkeeping); only
the store write waits. The holding producer hands its holds to the bulk hold of its
context (``holding.COLLECTING``) instead of writing them, and when every message is
built the holds go to the store in batches (``Store.hold_many``, one round trip each).
Nothing is written before every message was built: a message that cannot be built (its
group, its arguments' serialization, an option) fails the call naming its item.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from celery import Celery, Task
from celery.canvas import Signature

from .bulk_messages import Stamper, results, templatable
from .config import get_config
from .errors import BulkHoldFailed, FairError, GroupFull, InvalidOption
from .events import enabled
from .headers import DISPATCH_HEADERS
from .holding import COLLECTING, Collected, Collector, log_hold, logger
from .store.base import Store, now_ms
from .store.bulk import HOLD_BATCH

#: The keywords of ``fair_bulk`` that are celery_fair's (``fair_group``... of
#: ``apply_async``, by their short names as in :func:`~celery_fair.fair_task`).
BULK_OPTIONS = ("group", "interactive", "cost")


@contextmanager
def bulk_holds(app: Celery, *, batch_size: int = HOLD_BATCH) -> Iterator[Collector]:
    """Hold the fair tasks published in the block in batches, when the block ends.

    Each ``delay()``/``apply_async()`` of a fair task holds its message in a round trip
    of its own (a ``group``'s members are held in batches by themselves: canvas.py);
    inside ``with bulk_holds(app):`` every fair message the block publishes is built as
    usual and held with the others when the block ends, ``batch_size`` per round trip.
    If the block raises, nothing it published fair is held (its ``AsyncResult`` stay
    PENDING).

    Raises:
        GroupFull: a group's ``fair_group_max_held`` has no room for the block's tasks
            (nothing held).
        BulkHoldFailed: the store failed after some batches were held (see there).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidOption(f"batch_size={batch_size!r} is invalid: expected an int >= 1")
    collector = Collector()
    token = COLLECTING.set(collector)
    try:
        yield collector
    finally:
        COLLECTING.reset(token)
    write(list(collector.queues.values()), batch_size)


def fair_bulk(task: Task, items: Iterable[Any], *, group: Any = None,
              interactive: bool | None = None, cost: float | None = None,
              batch_size: int = HOLD_BATCH, **options: Any) -> list[Any]:
    """``FairTask.fair_bulk``: see there."""
    from .options import reject_misspelt

    reject_misspelt(options, BULK_OPTIONS, f"{task.name}.fair_bulk()")
    explicit = {name: value for name, value in (
        ("fair_group", group), ("fair_interactive", interactive), ("fair_cost", cost))
        if value is not None}
    app = task._get_app()
    calls = (_call(task, index, item) for index, item in enumerate(items))
    if app.conf.task_always_eager:
        return [task.apply_async(args, kwargs, **{**options, **explicit, **own})
                for args, kwargs, own in calls]
    fast = templatable(app, task, options)
    headers = {k: v for k, v in dict(options.get("headers") or {}).items()
               if k not in DISPATCH_HEADERS}
    placed = (group, interactive, cost)
    made: list[Any] = []  # an AsyncResult, or the task id of a message made here
    with bulk_holds(app, batch_size=batch_size) as collector, \
            app.producer_or_acquire() as producer:
        stamper: Stamper | None = None
        for index, (args, kwargs, own) in enumerate(calls):
            try:
                if stamper is not None and not own:
                    made.append(stamper.make(args, kwargs))
                    continue
                collector.last = None
                made.append(task.apply_async(args, kwargs, producer=producer,
                                             **{**options, **explicit, **own}))
                if fast and not own and collector.last is not None:
                    stamper = Stamper(task, collector.last, get_config(app), headers, placed)
            except Exception as exc:
                raise _naming(task, index, exc) from exc
        ignored = bool(options.get("ignore_result", task.ignore_result))
        stamped = iter(results(app, task, producer, [m for m in made if isinstance(m, str)],
                               ignored))
    return [next(stamped) if isinstance(m, str) else m for m in made]


def _call(task: Task, index: int, item: Any) -> tuple[tuple[Any, ...], dict[str, Any],
                                                       dict[str, Any]]:
    """One item's positional arguments, keyword arguments and own options."""
    if isinstance(item, Signature):
        if item.task != task.name:
            raise InvalidOption(f"{task.name}.fair_bulk(): item {index} is a signature of "
                                f"{item.task!r}, not of this task")
        return tuple(item.args), dict(item.kwargs), dict(item.options)
    if isinstance(item, (tuple, list)):
        return tuple(item), {}, {}
    raise InvalidOption(f"{task.name}.fair_bulk(): item {index} is a "
                        f"{type(item).__name__}: expected a tuple of positional arguments "
                        "or a signature of this task (for keyword arguments and options)")


def _naming(task: Task, index: int, exc: Exception) -> Exception:
    """``exc`` with the item's index in front of its message, of the same type when it
    takes a message alone (FairError otherwise)."""
    message = f"{task.name}.fair_bulk(): item {index}: {exc}"
    try:
        return type(exc)(message)
    except Exception:  # noqa: BLE001 - a type that wants more than a message
        return FairError(message)


def write(collected: Sequence[Collected], batch_size: int) -> None:
    """Hold what a bulk hold collected: each fair queue's in batches, in order.

    Raises:
        GroupFull: a group has no room for its new tasks; nothing held.
        BulkHoldFailed: a batch failed; the ones before it are held.
    """
    _check_room(collected)
    batches = [Collected(c.store, c.queue, c.holds[i:i + batch_size]) for c in collected
               for i in range(0, len(c.holds), batch_size)]
    _hold_batches(batches, [])


def _hold_batches(batches: list[Collected], held: list[str]) -> None:
    for number, batch in enumerate(batches):
        store, queue = batch.store, batch.queue
        now = now_ms()
        try:
            store.hold_many(queue, batch.holds, now)
        except FairError as exc:
            rest = batches[number:]
            pending = [h.hold_id for b in rest for h in b.holds]
            raise BulkHoldFailed(
                f"bulk hold: {len(held)} tasks held, {len(pending)} not (or, after a lost "
                f"reply, maybe the first {len(batch.holds)} of them): {exc}; retry() holds "
                "them again (the same ids and messages: each is held once)",
                held=held, pending=pending,
                retry=functools.partial(_hold_batches, rest, list(held))) from exc
        if enabled(logger):
            for h in batch.holds:
                log_hold(queue, h.hold_id, h.placement, h.due_ms, now)
        held.extend(h.hold_id for h in batch.holds)


def _check_room(queues: Iterable[Collected]) -> None:
    """Refuse the whole bulk hold before anything is written when a group's
    ``fair_group_max_held`` has no room for its new tasks (each batch is checked again
    atomically as it is held: a race with other holds may still refuse a later batch)."""
    for collected in queues:
        wanted: dict[str, tuple[int, int]] = {}
        for h in collected.holds:
            p = h.placement
            if p.max_held is not None and not p.front:
                count, limit = wanted.get(p.group, (0, p.max_held))
                wanted[p.group] = (count + 1, limit)
        if wanted:
            _room_in(collected.store, collected.queue, wanted)


def _room_in(store: Store, queue: str, wanted: dict[str, tuple[int, int]]) -> None:
    groups = sorted(wanted)
    for figures in store.group_figures(queue, groups):
        held = figures.held_interactive + figures.held_background + figures.delayed
        new, limit = wanted[figures.group]
        if held + new > limit:
            raise GroupFull(
                f"group {figures.group!r} has no room for {new} tasks in fair queue "
                f"{queue!r}: it holds {held}, its limit is {limit} (fair_group_max_held); "
                "nothing was held", queue=queue, group=figures.group, count=held,
                limit=limit)
