"""``celery -A proj fair workers``: the live workers of each fair queue, their start times
and slots (``store/registry.py``), and how many groups :mod:`celery_fair.affinity`'s hash
would give each. Registered on the ``fair`` group by ``cli.py``."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import click
from celery.bin.base import CeleryCommand

from .affinity import owner
from .cli_queues import known_queues, queue_option, require_known
from .cli_render import show, view_options
from .errors import FairError
from .store import store_for
from .store.base import Store
from .store.registry import slot_table

#: Most groups with work read per queue to count the hash's assignment.
MAX_GROUPS = 100_000


def iso(ms: int | None) -> str | None:
    """``ms`` since the epoch as an ISO 8601 UTC time (None stays None)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")


def read_workers(store: Store, queues: list[str], now_ms: int) -> list[dict[str, Any]]:
    """Per queue: its live workers by slot, each with the fair queues it is registered
    in (among ``queues``) and the number of the queue's groups with work that the hash
    over the live slots assigns to it."""
    live = {q: store.live_workers(q, now_ms) for q in queues}
    member: dict[str, list[str]] = {}
    for q, workers in live.items():
        for w in workers:
            member.setdefault(w.hostname, []).append(q)
    found = []
    for q, workers in live.items():
        table = slot_table(workers)
        groups = [g.group for g in store.busiest_groups(q, MAX_GROUPS)] if table else []
        counts: dict[str, int] = {}
        for group in groups:
            hostname = owner(group, table)
            if hostname is not None:
                counts[hostname] = counts.get(hostname, 0) + 1
        found.append({"queue": q, "groups": len(groups), "workers": [
            {"hostname": w.hostname, "started_at": iso(w.started_ms),
             "started_ms": w.started_ms, "slot": w.slot, "pool": w.pool,
             "queues": member[w.hostname], "groups_hash": counts.get(w.hostname, 0)}
            for w in workers]})
    return found


def render_workers(queues: list[dict[str, Any]]) -> Any:
    """One table of every queue's live workers (a queue without any: a line)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not queues:
        return Text("no fair queues yet")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("queue", "slot", "worker", "started at", "pool", "queues", "groups (hash)"):
        table.add_column(name, justify="right" if name in ("slot", "pool", "groups (hash)")
                         else "left")
    idle = []
    for q in queues:
        if not q["workers"]:
            idle.append(q["queue"])
        for w in q["workers"]:
            table.add_row(q["queue"], "-" if w["slot"] is None else str(w["slot"]),
                          w["hostname"], w["started_at"] or "-", str(w["pool"]),
                          ",".join(w["queues"]), f"{w['groups_hash']}/{q['groups']}")
    parts: list[Any] = [table] if len(idle) < len(queues) else []
    if idle:
        parts.append(Text(f"no live worker: {', '.join(idle)}"))
    return Group(*parts)


@click.command(cls=CeleryCommand)
@queue_option("Workers Options")
@view_options("Workers Options")
@click.pass_context
def workers(ctx: click.Context, queues: tuple[str, ...], as_json: bool,
            watch: float | None) -> None:
    """List the live workers of each fair queue: slot, hostname, start time, pool, the
    fair queues each consumes, and "groups (hash)": how many of the queue's groups with
    work the hash assigns it (fair_affinity="hash" routes them there, unless fair_assign
    chooses otherwise)."""
    app = ctx.obj.app
    try:
        store = store_for(app)
        known = known_queues(app, store)
        require_known(queues, known)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    names = list(queues) or known

    def read() -> list[dict[str, Any]]:
        try:
            return read_workers(store, names, int(time.time() * 1000))
        except FairError as exc:
            raise click.ClickException(str(exc)) from None

    show(ctx, read, as_json, watch, render_workers)
