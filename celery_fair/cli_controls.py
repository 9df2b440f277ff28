"""``celery -A proj fair pause|resume|boost|audit``: pauses, boosts and the audit log
of controls (``celery_fair.controls``, ``celery_fair.audit``). Registered on the ``fair`` group by
``cli.py``.

Grammar: ``fair pause GROUP [-Q QUEUE] [--for 1h] [--reason TEXT]`` pauses a group (in
every fair queue unless -Q names some); ``fair pause -Q QUEUE`` (no GROUP) pauses the
whole queue; ``fair resume`` takes the same GROUP / -Q. ``fair boost GROUP [-Q QUEUE]
--weight W [--for 1h] [--reason TEXT]`` boosts a group, ``fair boost GROUP --reset``
ends it, ``fair boost --task ID`` moves a held task to the front.
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


def _for_option(what: str, until: str, group: str) -> Any:
    """``--for DURATION``: the control ends by itself after it (``what``: "Resume")."""
    return click.option("--for", "for_seconds", default=None, callback=_duration,
                        metavar="DURATION", help=f"{what} by itself after this long: "
                        f"seconds, or 30m, 1h, 2d (default: until {until}).",
                        cls=CeleryOption, help_group=group)


_reason = click.option("--reason", default=None, help="Why, for the audit log (fair audit).",
                       cls=CeleryOption, help_group="Pause Options")


@click.command(cls=CeleryCommand)
@click.argument("group", required=False)
@queue_option("Pause Options", default="every fair queue in the store; without GROUP: "
              "required, the queues paused whole")
@_for_option("Resume", "fair resume", "Pause Options")
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
    """Mark a queue's document (``fair status``, ``fair groups``) with its pauses, boosts,
    rate limits and throttles: the queue's ``paused`` (its pause), each paused group's
    ``paused`` (true), each boosted group's ``boosted`` ({"weight", "until_ms"}: its
    ``weight`` stays the configured one), each group with a rate of its own its ``rate``
    ('10/s (burst 20)'), each throttled group its ``throttled_until_ms``; absent when
    not there, so the documents of a store without them stay as they were."""
    pauses, boosts = store.pauses(doc["queue"]), store.boosts(doc["queue"])
    rates, throttles = store.rates(doc["queue"]), store.throttles(doc["queue"])
    if WHOLE_QUEUE in pauses:
        doc["paused"] = {"until_ms": pauses[WHOLE_QUEUE]}
    for group in doc.get("groups", ()):
        if group["group"] in pauses:
            group["paused"] = True
        if group["group"] in boosts:
            weight, until = boosts[group["group"]]
            group["boosted"] = {"weight": weight, "until_ms": until}
        if rates.get(group["group"]) is not None:
            group["rate"] = str(rates[group["group"]])
        if group["group"] in throttles:
            group["throttled_until_ms"] = int(throttles[group["group"]])
    return doc


@click.command(cls=CeleryCommand)
@click.argument("group", required=False)
@queue_option("Boost Options", default="every fair queue in the store")
@click.option("--weight", default=None, metavar="WEIGHT",
              help="The weight the group is picked with while boosted.",
              cls=CeleryOption, help_group="Boost Options")
@_for_option("End", "fair boost GROUP --reset", "Boost Options")
@click.option("--reset", is_flag=True, help="End the group's boost now.",
              cls=CeleryOption, help_group="Boost Options")
@click.option("--task", "task_id", default=None, metavar="TASK_ID",
              help="Instead of a group: move this held task to the front of its group, "
                   "and its group to the front of the ready set once.",
              cls=CeleryOption, help_group="Boost Options")
@_reason
@click.pass_context
def boost(ctx: click.Context, group: str | None, queues: tuple[str, ...],
          weight: str | None, for_seconds: float | None, reset: bool, task_id: str | None,
          reason: str | None) -> None:
    """Boost a group: pick it with --weight (for --for), apart from its limits.

    When the boost ends (--for, or --reset) the group's configured weight (the settings
    or fair limit) is in force again. With --task ID, move a held task to the front
    instead. Recorded in the audit log (fair audit).
    """
    from . import controls

    app = ctx.obj.app
    if task_id is not None:
        if group is not None or weight is not None or for_seconds is not None or reset \
                or queues:
            raise click.UsageError("--task takes no GROUP, -Q, --weight, --for or --reset")
        click.echo(f"boosted {_run(lambda: controls.boost_task(app, task_id, reason=reason))}")
        return
    if group is None:
        raise click.UsageError("name a GROUP to boost (or --task ID)")
    if reset:
        if weight is not None or for_seconds is not None:
            raise click.UsageError("--reset takes no --weight or --for")
        done = _run(lambda: controls.unboost(app, group, queue=queues or None,
                                             reason=reason))
        for item in done:
            click.echo(f"boost ended: {item}")
        if not done:
            click.echo("nothing to end: not boosted")
        return
    if weight is None:
        raise click.UsageError("--weight is required (or --reset, or --task ID)")
    number = _run(lambda: controls.parse_weight(weight, "--weight"))
    for item in _run(lambda: controls.boost(app, group, weight=number, queue=queues or None,
                                            for_seconds=for_seconds, reason=reason)):
        click.echo(f"boosted {item}")
