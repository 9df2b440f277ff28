"""``celery -A proj fair held`` and ``fair purge``: list and drop one group's held tasks,
through :mod:`celery_fair.controls`. Registered on the ``fair`` group by ``cli.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryCommand, CeleryOption

from . import controls
from .cli_queues import known_queues, queue_option, require_known
from .errors import FairError
from .store import store_for

_CLASS = click.Choice(sorted(controls.CLASSES))
F = TypeVar("F", bound=Callable[..., Any])


def _checked(ctx: click.Context, queues: tuple[str, ...]) -> Any:
    """The app, once the queues named are known ones (a usage error otherwise)."""
    app = ctx.obj.app
    if queues:
        require_known(queues, known_queues(app, store_for(app)))
    return app


def _selection(help_group: str) -> Callable[[F], F]:
    """GROUP, ``-Q/--queue`` and ``--class``: which held tasks a command is about."""
    def apply(command: F) -> F:
        command = click.option("--class", "klass", type=_CLASS, default=None,
                               help="Only this class (default: both).", cls=CeleryOption,
                               help_group=help_group)(command)
        return click.argument("group")(queue_option(help_group)(command))
    return apply


@click.command(cls=CeleryCommand)
@_selection("Held Options")
@click.option("--limit", type=click.IntRange(1, controls.MAX_LISTED), default=50,
              show_default=True, help="Most tasks listed.", cls=CeleryOption,
              help_group="Held Options")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.",
              cls=CeleryOption, help_group="Held Options")
@click.pass_context
def held(ctx: click.Context, group: str, queues: tuple[str, ...], klass: str | None,
         limit: int, as_json: bool) -> None:
    """List GROUP's held tasks (id, name, class, age), the next to run first."""
    try:
        app = _checked(ctx, queues)
        tasks = controls.held(app, group, queue=list(queues) or None, klass=klass,
                              limit=limit)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps([t.as_json() for t in tasks], indent=2))
        return
    if not tasks:
        click.echo(f"group {group} holds no task")
        return
    click.echo(f"{'task id':<38} {'class':<11} {'age':>9}  {'queue':<16} name")
    for t in tasks:
        age = "?" if t.age is None else f"{t.age:.1f}s"
        click.echo(f"{t.hold_id:<38} {t.klass:<11} {age:>9}  {t.queue:<16} {t.name}")


@click.command(cls=CeleryCommand)
@_selection("Purge Options")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.", cls=CeleryOption,
              help_group="Purge Options")
@click.option("--reason", default=None, help="Why, for the audit log (fair audit).",
              cls=CeleryOption, help_group="Purge Options")
@click.pass_context
def purge(ctx: click.Context, group: str, queues: tuple[str, ...], klass: str | None,
          yes: bool, reason: str | None) -> None:
    """Remove GROUP's held tasks and mark each REVOKED (running tasks are left alone)."""
    try:
        app = _checked(ctx, queues)
        named = list(queues) or None
        count = controls.held_count(app, group, queue=named, klass=klass)
        if count == 0:
            click.echo(f"group {group} holds no task: nothing to purge")
            return
        if not yes:
            click.confirm(f"Purge {count} held {klass or ''}{' ' if klass else ''}tasks of "
                          f"group {group} (each becomes REVOKED)?", abort=True)
        done = controls.purge(app, group, queue=named, klass=klass, reason=reason)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"purged {len(done)} held tasks of group {group}: they will not run; "
               "their results are REVOKED")
