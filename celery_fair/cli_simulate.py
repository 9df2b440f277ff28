"""``celery -A proj fair simulate TRACE``: the policy simulator (``celery_fair.simulate``)
under the app's settings: its caps, weights, interactive reserve and rate limits."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand

from .simulate.command import options, run


@click.command(cls=CeleryCommand)
@options
@click.pass_context
def simulate(ctx: click.Context, trace: str, slots: int, policies: list[str],
             charges: list[str], plot_path: str | None, as_json: bool) -> None:
    """Replay a trace (CSV or JSON lines: at, group, cost, duration, interactive) through
    celery-fair's policy, under this app's caps, weights and rates, with a virtual clock
    and SLOTS workers, next to plain Celery's FIFO: per-group waits, shares of worker
    time, Jain index, utilization. Nothing is sent to a broker or a store."""
    from .config import get_config
    from .directory import policy_of

    app: Any = ctx.obj.app
    run(trace, slots, policies, charges, plot_path, as_json, policy_of(get_config(app)))
