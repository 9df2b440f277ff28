"""``-Q/--queue``, the one way every ``fair`` subcommand names fair queues, and what a
known fair queue is.

The option means what ``celery worker -Q`` means: repeatable, and each value may list
several queues separated by commas (``-Q a -Q b`` is ``-Q a,b``). The old ``--queues``
spelling (``dispatch`` and ``check`` had it) still works, unlisted, so deploys that use it
keep running.

A fair queue is **known** when the store has it (a fair task was held for it and no
dispatcher has pruned it since: :meth:`Store.queues <celery_fair.store.base.Store.queues>`)
or the app declares it: ``task_default_queue``, ``task_queues``, or a queue named in the
``task_routes`` mappings. A subcommand given any other queue refuses it and lists the
known ones; ``fair limit --create`` stores limits for such a queue all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryOption

F = TypeVar("F", bound=Callable[..., Any])

#: Spellings accepted and not shown in --help (the old option of dispatch and check).
HIDDEN_NAMES = ("--queues",)


class QueueOption(CeleryOption):
    """``-Q/--queue``, also parsed as the :data:`HIDDEN_NAMES` that --help leaves out."""

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        shown: list[str] = self.opts  # type: ignore[has-type]  # click sets it untyped
        self.opts = [*shown, *HIDDEN_NAMES]
        try:
            super().add_to_parser(parser, ctx)
        finally:
            self.opts = shown


def split_queues(ctx: click.Context, param: click.Parameter,
                 values: Sequence[str]) -> tuple[str, ...]:
    """Every queue of the repeated, comma-separated values, in order, once each."""
    names = [name.strip() for value in values for name in value.split(",")]
    return tuple(dict.fromkeys(name for name in names if name))


def queue_option(help_group: str, default: str = "every known fair queue") -> Callable[[F], F]:
    """The ``-Q/--queue`` option of a subcommand (value: a tuple of queue names)."""
    return click.option(
        "-Q", "--queue", "queues", multiple=True, callback=split_queues, metavar="QUEUE",
        help=f"Fair queue; repeatable, or comma-separated as for celery worker -Q "
             f"(default: {default}).",
        cls=QueueOption, help_group=help_group)


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


def require_known(queues: Iterable[str], known: Sequence[str], hint: str = "") -> None:
    """Raise a usage error naming the ``queues`` that are not ``known``, and the known."""
    unknown = [q for q in queues if q not in known]
    if unknown:
        raise click.BadParameter(
            f"no fair queue named {', '.join(unknown)}; known fair queues: "
            f"{', '.join(known) or 'none'} (the store's, and the app's declared queues)"
            f"{hint}", param_hint="'-Q' / '--queue'")
