"""``celery -A proj fair ...`` subcommands, and the ``celery-fair`` script (demo)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .cli_backlog import held, purge
from .cli_controls import audit, boost, mark_pauses, pause, resume
from .cli_dispatch import dispatch
from .cli_migrate import migrate
from .cli_queues import known_queues, queue_option, require_known
from .cli_render import render_groups, render_status, show, view_options
from .cli_simulate import simulate
from .cli_workers import workers
from .errors import FairError, InvalidLimit, UnknownQueue


@click.group(name="fair")
def fair() -> None:
    """Fair scheduling across groups (celery_fair)."""


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app


def _typed_option(parse_name: str, what: str) -> Any:
    """A click callback: the option's text through ``controls.<parse_name>`` (the Django
    admin's form reads it the same way), None given as UNCHANGED, an InvalidLimit as a
    BadParameter naming the group."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        from . import controls

        if value is None:
            return controls.UNCHANGED
        try:
            return getattr(controls, parse_name)(value, what + _for_group(ctx))
        except InvalidLimit as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return callback


#: --concurrency: an integer from 0 to limits.MAX_CAP, or 'none' (no cap); --rate:
#: '10/s', '100/m', '5/h' or 'none'; --weight: a finite number from limits.MIN_WEIGHT to
#: limits.MAX_WEIGHT.
_cap = _typed_option("parse_concurrency", "concurrency")
_rate = _typed_option("parse_rate", "rate limit")
_weight = _typed_option("parse_weight", "weight")


def _for_group(ctx: click.Context) -> str:
    """" for group 'acme'" (GROUP is eager: read before the options)."""
    group = ctx.params.get("group")
    return f" for group {group!r}" if group is not None else ""


@fair.command(cls=CeleryCommand)
@view_options("Status Options")
@click.option("--top", type=click.IntRange(0, 10_000), default=10, show_default=True,
              help="Groups shown per queue (the ones holding the most tasks).",
              cls=CeleryOption, help_group="Status Options")
@queue_option("Status Options")
@click.pass_context
def status(ctx: click.Context, as_json: bool, watch: float | None, top: int,
           queues: tuple[str, ...]) -> None:
    """Show per fair queue: held, delayed, in flight against capacity (+ dispatch-ahead),
    the oldest wait, and its busiest groups."""
    from .config import get_config
    from .store import store_for
    from .summary import queue_status

    app = _app(ctx)
    with _errors():
        store, config = store_for(app), get_config(app)
        _known(app, store, queues)

    def read() -> list[dict[str, Any]]:
        from .liveness import app_name, read_liveness

        with _errors():
            names = list(queues) or store.queues()
            live = read_liveness(store, app_name(app), names)  # who dispatches them
            return [mark_pauses(store, {**queue_status(store, config, q, top),
                                        **live.of_queue(q)}) for q in names]

    show(ctx, read, as_json, watch, render_status)


@fair.command(cls=CeleryCommand)
@queue_option("Groups Options")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="Most groups listed per queue.",
              cls=CeleryOption, help_group="Groups Options")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.",
              cls=CeleryOption, help_group="Groups Options")
@click.pass_context
def groups(ctx: click.Context, queues: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List groups with held, in-flight, cap and weight; most held first."""
    from .store import store_for
    from .store.base import as_json as doc

    with _errors():
        store = store_for(_app(ctx))
        _known(_app(ctx), store, queues)
        data = [mark_pauses(store, {
            "queue": q, "groups": [doc(g) for g in store.busiest_groups(q, limit)],
            "group_count": store.queue_figures(q).group_count})
            for q in (queues or store.queues())]
    show(ctx, lambda: data, as_json, None, render_groups)


@fair.command(cls=CeleryCommand)
@click.argument("group", is_eager=True)  # read first: option errors name it
@queue_option("Limit Options", default="every fair queue in the store")
@click.option("--create", is_flag=True,
              help="Store the limits even for a queue not known yet (before its first "
                   "task); needs --queue.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--concurrency", default=None, callback=_cap, metavar="N|none",
              help="Most tasks of the group in flight: an integer from 0 (pauses it) to "
                   "1000000, or 'none'.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--weight", default=None, callback=_weight, metavar="W",
              help="Share of dispatches relative to other groups (default weight 1): a "
                   "finite number from 1e-6 to 1e6.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--rate", default=None, callback=_rate, metavar="N/s|N/m|N/h|none",
              help="Most dispatches of the group over time ('10/s', '100/m', '5/h'), or "
                   "'none' for no rate limit whatever the settings say.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--burst", default=None, type=click.IntRange(1, 1_000_000), metavar="N",
              help="With --rate: how many may go at once after a quiet spell (default 1).",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--reset", is_flag=True, help="Drop the runtime limits: the settings apply.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--reason", default=None, help="Why, for the audit log (fair audit).",
              cls=CeleryOption, help_group="Limit Options")
@click.pass_context
def limit(ctx: click.Context, group: str, queues: tuple[str, ...], create: bool,
          concurrency: Any, weight: Any, rate: Any, burst: int | None, reset: bool,
          reason: str | None) -> None:
    """Set a group's cap, weight and rate limit at runtime, for every dispatcher at once.

    Stored in the store, they take precedence over fair_group_concurrency,
    fair_group_weights and fair_group_rate_limits and survive dispatcher restarts.
    Without options: show them.
    A change is recorded in the audit log (fair audit) under the OS user.
    A queue must be known (in the store, or declared by the app) unless --create is
    given: then the limits wait in the store for the queue's first task.
    """
    from . import controls
    from .names import validate_group

    try:
        group = validate_group(group)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'GROUP'") from None
    if reset and (concurrency is not controls.UNCHANGED or weight is not controls.UNCHANGED
                  or rate is not controls.UNCHANGED or burst is not None):
        raise click.UsageError("--reset cannot be combined with --concurrency, --weight, "
                               "--rate or --burst")
    if burst is not None and rate in (controls.UNCHANGED, None):
        raise click.UsageError("--burst needs --rate (a rate, not 'none')")
    if create and not queues:
        raise click.UsageError("--create needs the queue to create: -Q/--queue QUEUE")
    with _errors():
        try:
            done = controls.limit(
                _app(ctx), group, queue=queues or None, reset=reset, create=create,
                concurrency=concurrency, weight=weight, rate=rate,
                burst=controls.UNCHANGED if burst is None else burst, reason=reason)
        except UnknownQueue as exc:
            raise click.BadParameter(str(exc), param_hint="'-Q' / '--queue'") from None
    for item in done:
        click.echo(str(item))


@fair.command(name="inspect", cls=CeleryCommand)
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.",
              cls=CeleryOption, help_group="Inspect Options")
@click.pass_context
def inspect_task(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Where a task stands: held (its place and what is ahead of it), or dispatched."""
    from .locate import describe, paused
    from .store import store_for

    app = _app(ctx)
    with _errors():
        found = store_for(app).locate(task_id)
    where = None if found is None else found.as_json()
    if where is None:
        where = {"task_id": task_id, "state": "not held",
                 "result_state": app.AsyncResult(task_id).state}
        text = (f"task {task_id}: not held by celery_fair (result state "
                f"{where['result_state']}: finished, never published as a fair task, or "
                "unknown)")
    else:
        if where["state"] in ("held", "delayed"):
            where["paused"] = paused(store_for(app), where)
            until = store_for(app).throttles(where["queue"]).get(where["group"])
            if until is not None:
                where["throttled_until_ms"] = int(until)
        text = describe(where)
    click.echo(json.dumps(where, indent=2) if as_json else text)


@contextmanager
def _errors() -> Iterator[None]:
    """celery_fair errors (the store wraps its own in them) end the command with their
    message."""
    try:
        yield
    except FairError as exc:
        raise click.ClickException(str(exc)) from None


def _known(app: Any, store: Any, queues: tuple[str, ...], hint: str = "") -> None:
    """A usage error unless each of ``queues`` is a known fair queue (cli_queues.py)."""
    if queues:
        require_known(queues, known_queues(app, store), hint)


@fair.command(cls=CeleryCommand)
@click.argument("task_ids", nargs=-1, required=True)
@click.pass_context
def cancel(ctx: click.Context, task_ids: tuple[str, ...]) -> None:
    """Remove held tasks by id before they run and mark them REVOKED."""
    from .revoke import cancel_held

    try:
        done = cancel_held(_app(ctx), task_ids)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    for item in done:
        click.echo(f"cancelled {item.task_id} (queue {item.queue}, group {item.group}): "
                   "it will not run; its result is REVOKED")
    missing = [t for t in task_ids if t not in {item.task_id for item in done}]
    if missing:
        raise click.ClickException(
            f"not held by celery_fair: {', '.join(missing)} — never published, already "
            "dispatched to a worker, or finished. To stop a dispatched task use "
            "`celery -A <app> control revoke <id>` (`control terminate SIGTERM <id>` for "
            "a running one).")


@fair.command(cls=CeleryCommand)
@click.option("--repair", is_flag=True, help="Fix what is found (each finding says how).",
              cls=CeleryOption, help_group="Check Options")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.",
              cls=CeleryOption, help_group="Check Options")
@queue_option("Check Options")
@click.option("--metrics-file", default=None, metavar="PATH", cls=CeleryOption,
              help_group="Check Options", help="Also write the findings as Prometheus "
              "metrics to PATH (for node_exporter's textfile collector).")
@click.pass_context
def check(ctx: click.Context, repair: bool, as_json: bool, queues: tuple[str, ...],
          metrics_file: str | None) -> None:
    """Check the store's invariants (exit 1 when something is wrong and left so)."""
    from .check import check as run_check
    from .check_export import write_metrics_file
    from .liveness import app_name
    from .store import store_for

    with _errors():
        _known(_app(ctx), store_for(_app(ctx)), queues)
        report = run_check(_app(ctx), repair=repair, queues=list(queues) or None,
                           app_name=app_name(_app(ctx)))
        if metrics_file:
            write_metrics_file(report, metrics_file)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else str(report))
    for sentence in store_for(_app(ctx)).advice():  # advice, not a finding
        click.echo(f"warning: {sentence}", err=True)
    if report.problems:
        ctx.exit(1)


fair.add_command(audit)
fair.add_command(pause)
fair.add_command(resume)
fair.add_command(boost)
fair.add_command(dispatch)
fair.add_command(migrate)
fair.add_command(held)
fair.add_command(purge)
fair.add_command(simulate)
fair.add_command(workers)


@click.group()
def main() -> None:
    """celery-fair: fair scheduling across tenants for Celery."""


@main.command()
@click.option("--redis", "redis_url", default=None,
              help="Use this Redis instead of an embedded one (redis://...).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--scale", type=click.FloatRange(0.05, 10), default=1.0,
              help="Multiply the workload size (1.0 runs in well under a minute).")
def demo(redis_url: str | None, as_json: bool, scale: float) -> None:
    """Run the same multi-tenant workload through plain Celery and celery-fair."""
    from .demo import run_demo

    run_demo(redis_url=redis_url, as_json=as_json, scale=scale)
