"""``celery -A proj fair ...`` subcommands, and the ``celery-fair`` script (demo)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from . import limits
from .cli_migrate import migrate
from .cli_render import render_groups, render_status, show
from .errors import FairError, InvalidLimit


@click.group(name="fair")
def fair() -> None:
    """Fair scheduling across groups (celery_fair)."""


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app


def _cap(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """--concurrency: an integer from 0 to limits.MAX_CAP, or 'none' (no cap, stored as -1)."""
    if value is None:
        return None
    if value.lower() == "none":
        return -1
    try:
        return limits.cap(int(value) if value.isdigit() else value,
                          "concurrency" + _for_group(ctx))
    except InvalidLimit as exc:
        raise click.BadParameter(f"{exc} (or 'none')", ctx, param) from None


def _for_group(ctx: click.Context) -> str:
    """" for group 'acme'" (GROUP is eager: read before the options)."""
    group = ctx.params.get("group")
    return f" for group {group!r}" if group is not None else ""


def _weight(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """--weight: a finite number from limits.MIN_WEIGHT to limits.MAX_WEIGHT."""
    if value is None:
        return None
    try:
        number: Any = float(value)
    except ValueError:
        number = value
    try:
        return limits.weight(number, "weight" + _for_group(ctx))
    except InvalidLimit as exc:  # named as typed (1e7, not 10000000.0)
        message = str(exc).rpartition(", got ")[0]
        raise click.BadParameter(f"{message}, got {value}", ctx, param) from None


@fair.command(cls=CeleryCommand)
@click.option("-Q", "--queues", default="", help="Comma-separated fair queues (default: all).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=None,
              help="Most messages per pick (default: fair_batch_size).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--once", is_flag=True, help="Do one step and exit.",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("-l", "--loglevel", default="INFO",
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port at /metrics (default: "
                   "fair_metrics_port; 0: any free port).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--metrics-address", default=None,
              help="Address of the metrics endpoint (default: fair_metrics_address).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.option("--wait-for-store", type=click.FloatRange(min=0), default=0, metavar="SECONDS",
              help="Wait up to SECONDS for the store to come up at start (default: exit "
                   "at once when it cannot be reached).",
              cls=CeleryOption, help_group="Dispatch Options")
@click.pass_context
def dispatch(ctx: click.Context, queues: str, batch_size: int | None, once: bool,
             loglevel: str, metrics_port: int | None, metrics_address: str | None,
             wait_for_store: float) -> None:
    """Feed the real worker queues from the holding queues, fairly."""
    from .dispatcher import Dispatcher
    from .errors import StoreConnectionError
    from .logtime import log_in_utc

    logging.basicConfig(level=loglevel.upper(),
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    names = [q.strip() for q in queues.split(",") if q.strip()] or None
    metrics = None
    try:
        dispatcher = Dispatcher(_app(ctx), queues=names, batch_size=batch_size)
        log_in_utc(dispatcher.config.log_utc)  # fair_log_utc (logtime.py)
        try:
            dispatcher.reach_store(wait_for_store)
        except StoreConnectionError as exc:
            hint = "" if wait_for_store else \
                "; to wait for it at start, pass --wait-for-store SECONDS"
            raise click.ClickException(f"{exc}{hint}") from None
        metrics = _serve_metrics(dispatcher, metrics_port, metrics_address)
        if once:
            result = dispatcher.step()
            click.echo(f"dispatched {result.dispatched}, promoted {result.promoted}, "
                       f"reclaimed {result.requeued + result.lost}")
        else:
            dispatcher.run()
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        if metrics is not None:
            metrics.close()


def _serve_metrics(dispatcher: Any, port: int | None, address: str | None) -> Any:
    """Start the dispatcher's /metrics endpoint when a port is given or configured."""
    config = dispatcher.config
    port = config.metrics_port if port is None else port
    if port is None:
        return None
    from .metrics import DispatcherMetrics

    metrics = DispatcherMetrics(dispatcher, config.metrics_groups).attach()
    try:
        metrics.serve(port, address or config.metrics_address)
    except OSError as exc:
        raise click.BadParameter(f"cannot listen on port {port}: {exc}",
                                 param_hint="'--metrics-port'") from None
    return metrics


@fair.command(cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.",
              cls=CeleryOption, help_group="Status Options")
@click.option("--watch", type=click.FloatRange(min=0.1), is_flag=False, flag_value=2.0,
              default=None, metavar="[SECONDS]",
              help="Refresh every SECONDS (default 2) until Ctrl-C.",
              cls=CeleryOption, help_group="Status Options")
@click.option("--top", type=click.IntRange(0, 10_000), default=10, show_default=True,
              help="Groups shown per queue (the ones holding the most tasks).",
              cls=CeleryOption, help_group="Status Options")
@click.pass_context
def status(ctx: click.Context, as_json: bool, watch: float | None, top: int) -> None:
    """Show held, delayed and in-flight tasks per fair queue and its busiest groups."""
    from .store import store_for

    app = _app(ctx)
    with _errors():
        store = store_for(app)

    def read() -> list[dict[str, Any]]:
        with _errors():
            return [_queue_status(app, store, q, top) for q in store.queues()]

    show(ctx, read, as_json, watch, render_status)


@fair.command(cls=CeleryCommand)
@click.option("-Q", "--queue", "queues", multiple=True,
              help="Only this fair queue (repeatable; default: all).",
              cls=CeleryOption, help_group="Groups Options")
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
        known = store.queues()
        _check_queues(queues, known)
        data = [{"queue": q, "groups": [doc(g) for g in store.busiest_groups(q, limit)],
                 "group_count": store.queue_figures(q).group_count}
                for q in (queues or known)]
    show(ctx, lambda: data, as_json, None, render_groups)


@fair.command(cls=CeleryCommand)
@click.argument("group", is_eager=True)  # read first: option errors name it
@click.option("-Q", "--queue", "queues", multiple=True,
              help="Fair queue (repeatable; default: every known fair queue).",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--concurrency", default=None, callback=_cap, metavar="N|none",
              help="Most tasks of the group in flight: an integer from 0 (pauses it) to "
                   "1000000, or 'none'.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--weight", default=None, callback=_weight, metavar="W",
              help="Share of dispatches relative to other groups (default weight 1): a "
                   "finite number from 1e-6 to 1e6.",
              cls=CeleryOption, help_group="Limit Options")
@click.option("--reset", is_flag=True, help="Drop the runtime limits: the settings apply.",
              cls=CeleryOption, help_group="Limit Options")
@click.pass_context
def limit(ctx: click.Context, group: str, queues: tuple[str, ...], concurrency: int | None,
          weight: float | None, reset: bool) -> None:
    """Set a group's cap and weight at runtime, for every dispatcher at once.

    Stored in Redis, they take precedence over fair_group_concurrency and
    fair_group_weights and survive dispatcher restarts. Without options: show them.
    """
    from .names import validate_group
    from .store import store_for
    from .store.base import KEEP, RESET

    try:
        group = validate_group(group)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'GROUP'") from None
    if reset and (concurrency is not None or weight is not None):
        raise click.UsageError("--reset cannot be combined with --concurrency or --weight")
    cap_arg: int | str = RESET if reset else KEEP if concurrency is None else concurrency
    weight_arg: float | str = RESET if reset else KEEP if weight is None else weight
    with _errors():
        store = store_for(_app(ctx))
        known = store.queues()  # a queue named with --queue may be new: limits ahead of work
        if not (queues or known):
            raise click.UsageError("no fair queue has held a task yet: name one with --queue")
        for queue in queues or known:
            cap, now_weight = store.limit(queue, group, cap_arg, weight_arg)
            click.echo(f"group {group} in queue {queue}: "
                       f"{'no cap' if cap is None else f'cap {cap}'}, weight {now_weight:g}")


@fair.command(name="inspect", cls=CeleryCommand)
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.",
              cls=CeleryOption, help_group="Inspect Options")
@click.pass_context
def inspect_task(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Where a task stands: held (its place and what is ahead of it), or dispatched."""
    from .locate import describe
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


def _check_queues(queues: tuple[str, ...], known: list[str]) -> None:
    unknown = [q for q in queues if q not in known]
    if unknown:
        raise click.BadParameter(
            f"no fair queue named {', '.join(unknown)} (known: {', '.join(known) or 'none'})",
            param_hint="'--queue'")


def _queue_status(app: Any, store: Any, queue: str, top: int) -> dict[str, Any]:
    from .config import get_config
    from .store.base import as_json, now_ms

    figures = store.queue_figures(queue)
    config = get_config(app)
    capacity, ahead = config.max_inflight, 0
    if capacity is None:
        # as the dispatcher counts: the live pools, plus dispatch-ahead when any
        capacity = store.worker_capacity(queue, now_ms())
        ahead = config.dispatch_ahead if capacity else 0
    rows = store.busiest_groups(queue, top) if top else []
    return {**as_json(figures), "capacity": capacity, "dispatch_ahead": ahead,
            "inflight_limit": capacity + ahead, "groups": [as_json(r) for r in rows],
            "more_groups": max(figures.group_count - len(rows), 0)}


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
@click.option("-Q", "--queues", default="", help="Comma-separated fair queues (default: all).",
              cls=CeleryOption, help_group="Check Options")
@click.pass_context
def check(ctx: click.Context, repair: bool, as_json: bool, queues: str) -> None:
    """Check the store's invariants (exit 1 when something is wrong and left so)."""
    from .check import check as run_check
    from .store import store_for

    names = [q.strip() for q in queues.split(",") if q.strip()] or None
    try:
        report = run_check(_app(ctx), repair=repair, queues=names)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else str(report))
    for sentence in store_for(_app(ctx)).advice():  # advice, not a finding
        click.echo(f"warning: {sentence}", err=True)
    if report.problems:
        ctx.exit(1)


fair.add_command(migrate)


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
