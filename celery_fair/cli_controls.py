"""``celery -A proj fair pause|resume|audit``: pauses and the audit log of controls
(``celery_fair.controls``, ``celery_fair.audit``). Registered on the ``fair`` group by
``cli.py``.

Grammar: ``fair pause GROUP [-Q QUEUE] [--for 1h] [--reason TEXT]`` pauses a group (in
every fair queue unless -Q names some); ``fair pause -Q QUEUE`` (no GROUP) pauses the
whole queue; ``fair resume`` takes the same GROUP / -Q.
"""

from __future__ import annotations

import json
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .audit import utc_text
from .cli_queues import queue_option
from .errors import FairError, InvalidControl, InvalidGroup, UnknownQueue
from .store.audit import AUDIT_MAX, AuditEntry
from .store.pausing import WHOLE_QUEUE


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    from .controls import parse_duration

    try:
        return None if value is None else parse_duration(value)
    except InvalidControl as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


_reason = click.option("--reason", default=None, help="Why, for the audit log (fair audit).",
                       cls=CeleryOption, help_group="Pause Options")


@click.command(cls=CeleryCommand)
@click.argument("group", required=False)
@queue_option("Pause Options", default="every fair queue in the store; without GROUP: "
              "required, the queues paused whole")
@click.option("--for", "for_seconds", default=None, callback=_duration, metavar="DURATION",
              help="Resume by itself after this long: seconds, or 30m, 1h, 2d "
                   "(default: until fair resume).",
              cls=CeleryOption, help_group="Pause Options")
@_reason
@click.pass_context
def pause(ctx: click.Context, group: str | None, queues: tuple[str, ...],
          for_seconds: float | None, reason: str | None) -> None:
    """Pause a group (every class) or, without GROUP, the whole -Q queue.

    Running tasks finish; held and newly held tasks wait until fair resume (or --for).
    The pause lives in the store: it reaches every dispatcher at its next step and
    survives restarts. Recorded in the audit log (fair audit).
    """
    from . import controls

    for item in _run(lambda: controls.pause(ctx.obj.app, group, queue=queues or None,
                                            for_seconds=for_seconds, reason=reason)):
        click.echo(f"paused {item}")


@click.command(cls=CeleryCommand)
@click.argument("group", required=False)
@queue_option("Pause Options", default="every fair queue in the store; without GROUP: "
              "required, the queues resumed whole")
@_reason
@click.pass_context
def resume(ctx: click.Context, group: str | None, queues: tuple[str, ...],
           reason: str | None) -> None:
    """Lift fair pause of a group or, without GROUP, of the whole -Q queue."""
    from . import controls

    done = _run(lambda: controls.resume(ctx.obj.app, group, queue=queues or None,
                                        reason=reason))
    for item in done:
        click.echo(f"resumed {item}")
    if not done:
        click.echo("nothing to resume: not paused")


def _run(call: Any) -> Any:
    """The control's errors as the CLI's: a bad group or queue is a usage error."""
    try:
        return call()
    except InvalidGroup as exc:
        raise click.BadParameter(str(exc), param_hint="'GROUP'") from None
    except UnknownQueue as exc:
        raise click.BadParameter(str(exc), param_hint="'-Q' / '--queue'") from None
    except FairError as exc:
        raise click.ClickException(str(exc)) from None


@click.command(cls=CeleryCommand)
@click.option("--limit", type=click.IntRange(1, AUDIT_MAX), default=50, show_default=True,
              help="Most entries shown, newest first.",
              cls=CeleryOption, help_group="Audit Options")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a list, newest first).",
              cls=CeleryOption, help_group="Audit Options")
@click.pass_context
def audit(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Show the audit log: who changed what (limits, pauses), when, why, until when.

    The store keeps the last 10000 entries of the app's namespace.
    """
    from . import audit as log

    try:
        entries = log.read(ctx.obj.app, limit)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps([e.as_json() for e in entries], indent=2))
    elif not entries:
        click.echo("no control recorded yet")
    for entry in [] if as_json else entries:
        click.echo(audit_line(entry))


def audit_line(entry: AuditEntry) -> str:
    """One entry as a line: when (UTC), who, what with its arguments, until, why."""
    args = " ".join(f"{k}={_value(v)}" for k, v in entry.args.items())
    line = f"{utc_text(entry.at_ms)}  {entry.actor}  {entry.action} {args}"
    if entry.until_ms is not None:
        line += f"  until {utc_text(entry.until_ms)}"
    if entry.reason:
        line += f"  reason: {entry.reason}"
    return line


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{_value(v)}" for k, v in value.items())
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def mark_pauses(store: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """Mark a queue's document (``fair status``, ``fair groups``) with its pauses: the
    queue's ``paused`` (its pause), each paused group's ``paused`` (true); absent when
    not paused, so the documents of a store without pauses stay as they were."""
    pauses = store.pauses(doc["queue"])
    if WHOLE_QUEUE in pauses:
        doc["paused"] = {"until_ms": pauses[WHOLE_QUEUE]}
    for group in doc.get("groups", ()):
        if group["group"] in pauses:
            group["paused"] = True
    return doc
