"""``celery -A proj fair ...`` subcommands, and the ``celery-fair`` script (demo)."""

from __future__ import annotations

import json
import logging
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .errors import FairError


@click.group(name="fair")
def fair() -> None:
    """Fair scheduling across groups (celery_fair)."""


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app


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
@click.pass_context
def dispatch(ctx: click.Context, queues: str, batch_size: int | None, once: bool,
             loglevel: str) -> None:
    """Feed the real worker queues from the holding queues, fairly."""
    from .dispatcher import Dispatcher

    logging.basicConfig(level=loglevel.upper(),
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    names = [q.strip() for q in queues.split(",") if q.strip()] or None
    try:
        dispatcher = Dispatcher(_app(ctx), queues=names, batch_size=batch_size)
        if once:
            result = dispatcher.step()
            click.echo(f"dispatched {result.dispatched}, promoted {result.promoted}, "
                       f"reclaimed {result.requeued + result.lost}")
        else:
            dispatcher.run()
    except FairError as exc:
        raise click.ClickException(str(exc)) from None


@fair.command(cls=CeleryCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.",
              cls=CeleryOption, help_group="Status Options")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show held, delayed and in-flight tasks per fair queue and group."""
    from .task import store_for

    try:
        store = store_for(_app(ctx))
        snapshots = [store.snapshot(q) for q in store.queues()]
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"queues": snapshots}, indent=2))
        return
    click.echo(render_status(snapshots))


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


def render_status(snapshots: list[dict[str, Any]]) -> str:
    """Plain-text table of :meth:`RedisStore.snapshot` results."""
    if not snapshots:
        return "no fair queues yet (nothing has been held)"
    head = ("queue", "group", "held", "interactive", "delayed", "in flight", "cap", "weight")
    rows = [head]
    for snap in snapshots:
        for g in snap["groups"]:
            rows.append((snap["queue"], g["group"], str(g["held_background"]),
                         str(g["held_interactive"]), str(g["delayed"]), str(g["inflight"]),
                         "-" if g["cap"] is None else str(g["cap"]), f"{g['weight']:g}"))
        if not snap["groups"]:
            rows.append((snap["queue"], "(idle)", "0", "0", "0", "0", "-", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
