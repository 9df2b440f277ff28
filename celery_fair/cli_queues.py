"""``-Q/--queue``, the one way every ``fair`` subcommand names fair queues.

The option means what ``celery worker -Q`` means: repeatable, and each value may list
several queues separated by commas (``-Q a -Q b`` is ``-Q a,b``). The old ``--queues``
spelling (``dispatch`` and ``check`` had it) still works, unlisted, so deploys that use it
keep running.

A subcommand given a queue that is not known (:mod:`celery_fair.queues`) refuses it and
lists the known ones; ``fair limit --create`` stores limits for such a queue all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryOption

from .queues import known_queues, unknown_queues_message

__all__ = ["known_queues", "queue_option", "require_known", "split_queues"]

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


def require_known(queues: Iterable[str], known: Sequence[str], hint: str = "") -> None:
    """Raise a usage error naming the ``queues`` that are not ``known``, and the known."""
    unknown = [q for q in queues if q not in known]
    if unknown:
        raise click.BadParameter(unknown_queues_message(unknown, list(known), hint),
                                 param_hint="'-Q' / '--queue'")
