"""What a **known** fair queue is, for every entry point that names queues (the CLI's
``-Q/--queue``, :mod:`celery_fair.controls`, the admin page).

A fair queue is known when the store has it (a fair task was held for it and no
dispatcher has pruned it since: :meth:`Store.queues <celery_fair.store.base.Store.queues>`)
or the app declares it: ``task_default_queue``, ``task_queues``, or a queue named in the
``task_routes`` mappings. Both count, so a queue can be named before its first task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import UnknownQueue


def declared_queues(app: Any) -> set[str]:
    """The queues the app declares: task_default_queue, task_queues, and the queues
    named in the task_routes mappings (a router function names none in advance)."""
    from celery.app.routes import MapRoute, prepare

    names = {str(app.conf.task_default_queue)}
    names.update(str(q.name) for q in app.conf.task_queues or ())
    for router in prepare(app.conf.task_routes):
        if isinstance(router, MapRoute):
            routes = [*router.map.values(), *router.patterns.values()]
            names.update(name for name in map(_queue_name, routes) if name)
    return names


def _queue_name(route: Any) -> str:
    """The queue of one task_routes value: {"queue": name or Queue} or the name itself."""
    queue = route.get("queue") if isinstance(route, Mapping) else route
    return str(getattr(queue, "name", queue) or "")


def known_queues(app: Any, store: Any) -> list[str]:
    """Every known fair queue (see the module docstring), sorted."""
    return sorted(set(store.queues()) | declared_queues(app))


def unknown_queues_message(unknown: list[str], known: list[str], hint: str = "") -> str:
    """The one wording of "these queues are not known" (the CLI's usage error, the
    control API's UnknownQueue)."""
    return (f"no fair queue named {', '.join(unknown)}; known fair queues: "
            f"{', '.join(known) or 'none'} (the store's, and the app's declared queues)"
            f"{hint}")


def checked_queues(app: Any, store: Any, queue: str | Sequence[str] | None, create: bool,
            hint: str = "; to set limits before its first task, add --create") -> list[str]:
    """The queues a control names, checked against the known ones (UnknownQueue, before
    anything is written; ``create``: any name goes); when none is named, every queue that
    has held a task."""
    if queue is None:
        every: list[str] = store.queues()
        if not every:
            raise UnknownQueue("no fair queue has held a task yet: name the queue to set "
                               "limits ahead of its first task")
        return every
    known = known_queues(app, store)
    names = [queue] if isinstance(queue, str) else list(queue)
    if not names:
        raise UnknownQueue("no fair queue named: name one, or none for all of them")
    unknown = [name for name in names if name not in known]
    if unknown and not create:
        raise UnknownQueue(unknown_queues_message(unknown, known, hint))
    return names
