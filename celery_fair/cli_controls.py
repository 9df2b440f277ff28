"""``celery -A proj fair audit``: the audit log of controls (``celery_fair.audit``).
Registered on the ``fair`` group by ``cli.py``."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .errors import FairError
from .store.audit import AUDIT_MAX, AuditEntry


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
    line = f"{_utc(entry.at_ms)}  {entry.actor}  {entry.action} {args}"
    if entry.until_ms is not None:
        line += f"  until {_utc(entry.until_ms)}"
    if entry.reason:
        line += f"  reason: {entry.reason}"
    return line


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{_value(v)}" for k, v in value.items())
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
