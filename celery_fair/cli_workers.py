"""``celery -A proj fair workers``: the live workers of each fair queue, their start times
and slots (``store/registry.py``), and their groups. A queue routed by
``fair_affinity = "hash"`` shows the groups the store's map gives each worker and its free
slots (pool less its routed dispatches in flight, which only routing counts per worker); any
other queue, the groups :mod:`celery_fair.affinity`'s hash would give each, and no free
slots. Registered on the ``fair`` group by ``cli.py``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection
from datetime import datetime, timezone
from typing import Any

import click
from celery.bin.base import CeleryCommand

from .affinity import owner
from .cli_queues import known_queues, queue_option, require_known
from .cli_render import show, view_options
from .config import get_config
from .errors import FairError
from .policies import HASH_AFFINITY
from .store import store_for
from .store.base import Store
from .store.models import LiveWorker
from .store.registry import slot_table

#: Most groups with work read per unrouted queue to count the hash's assignment.
MAX_GROUPS = 100_000
#: A cell whose figure the store does not know (free slots of an unrouted queue).
UNKNOWN = "—"
#: The table's header of each group count: the store's map, or what the hash would give.
COLUMNS = {"groups_assigned": "groups assigned", "groups_hash": "groups (hash)"}


def iso(ms: int | None) -> str | None:
    """``ms`` since the epoch as an ISO 8601 UTC time (None stays None)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")


def read_workers(store: Store, queues: list[str], now_ms: int,
                 routed: Collection[str] = ()) -> list[dict[str, Any]]:
    """Per queue: its live workers by slot, each with the fair queues it is registered
    in (among ``queues``) and its groups: for the ``routed`` queues (fair_affinity 'hash'
    on a store that routes) the groups the store's map gives it and its free slots; for
    the others, the queue's groups with work that the hash over the live slots would give
    it, and free slots unknown (None)."""
    live = {q: store.live_workers(q, now_ms) for q in queues}
    member: dict[str, list[str]] = {}
    for q, workers in live.items():
        for w in workers:
            member.setdefault(w.hostname, []).append(q)
    return [_routed_queue(store, q, workers, member) if q in routed
            else _hashed_queue(store, q, workers, member) for q, workers in live.items()]


def _worker(w: LiveWorker, member: dict[str, list[str]], **figures: int | None
            ) -> dict[str, Any]:
    return {"hostname": w.hostname, "started_at": iso(w.started_ms),
            "started_ms": w.started_ms, "slot": w.slot, "pool": w.pool,
            "queues": member[w.hostname], **figures}


def _routed_queue(store: Store, queue: str, workers: list[LiveWorker],
                  member: dict[str, list[str]]) -> dict[str, Any]:
    """The map's groups per worker, and each worker's pool less its routed dispatches in
    flight (dispatch-ahead may put more in flight than the pool: never below 0)."""
    assigned = Counter(store.assignments(queue).values())
    inflight = store.worker_inflight(queue)
    return {"queue": queue, "routed": True, "groups": sum(assigned.values()),
            "workers": [_worker(w, member, groups_assigned=assigned[w.hostname],
                                groups_hash=None, inflight=inflight.get(w.hostname, 0),
                                free_slots=max(w.pool - inflight.get(w.hostname, 0), 0))
                        for w in workers]}


def _hashed_queue(store: Store, queue: str, workers: list[LiveWorker],
                  member: dict[str, list[str]]) -> dict[str, Any]:
    """What the hash would give each worker; free slots unknown: without routing the
    store counts a queue's dispatches in flight, not which worker runs them."""
    table = slot_table(workers)
    groups = [g.group for g in store.busiest_groups(queue, MAX_GROUPS)] if table else []
    counts = Counter(owner(group, table) for group in groups)
    return {"queue": queue, "routed": False, "groups": len(groups),
            "workers": [_worker(w, member, groups_assigned=None,
                                groups_hash=counts[w.hostname], inflight=None,
                                free_slots=None) for w in workers]}


def render_workers(queues: list[dict[str, Any]]) -> Any:
    """One table of every queue's live workers (a queue without any: a line); the
    "groups assigned" column for routed queues, "groups (hash)" for the others."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not queues:
        return Text("no fair queues yet")
    routed = any(q["routed"] and q["workers"] for q in queues)
    hashed = [q["queue"] for q in queues if not q["routed"] and q["workers"]]
    counts = ["groups_assigned"] * routed + ["groups_hash"] * bool(hashed)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("queue", "slot", "worker", "started at", "pool", "queues",
                 *(COLUMNS[key] for key in counts), "free slots"):
        table.add_column(name, justify="left" if name in ("queue", "worker", "started at",
                                                          "queues") else "right")
    for q in queues:
        for w in q["workers"]:
            table.add_row(*_row(q, w, counts))
    idle = [q["queue"] for q in queues if not q["workers"]]
    parts: list[Any] = [table] if len(idle) < len(queues) else []
    if hashed:
        parts.append(Text(f"free slots {UNKNOWN}: not routed ({', '.join(hashed)}), so "
                          "the store counts their tasks in flight per queue, not per "
                          "worker; groups (hash): what fair_affinity='hash' would give "
                          "each worker"))
    if idle:
        parts.append(Text(f"no live worker: {', '.join(idle)}"))
    return Group(*parts)


def _row(q: dict[str, Any], w: dict[str, Any], counts: list[str]) -> list[str]:
    """A worker's cells; of the group counts (``counts``), the one of its queue's kind."""
    groups = ["" if w[key] is None else f"{w[key]}/{q['groups']}" for key in counts]
    free = w["free_slots"]
    return [q["queue"], "-" if w["slot"] is None else str(w["slot"]), w["hostname"],
            w["started_at"] or "-", str(w["pool"]), ",".join(w["queues"]), *groups,
            UNKNOWN if free is None else str(free)]


@click.command(cls=CeleryCommand)
@queue_option("Workers Options")
@view_options("Workers Options")
@click.pass_context
def workers(ctx: click.Context, queues: tuple[str, ...], as_json: bool,
            watch: float | None) -> None:
    """List the live workers of each fair queue: slot, hostname, start time, pool, the
    fair queues each consumes, its groups and free slots. A queue routed by
    fair_affinity="hash": "groups assigned", the groups the store's map gives each
    worker, and "free slots", its pool less its routed tasks in flight. Any other queue:
    "groups (hash)", the groups the hash would give each worker, and free slots "—"
    (unknown: without routing, tasks in flight are counted per queue, not per worker)."""
    app = ctx.obj.app
    try:
        store, config = store_for(app), get_config(app)
        known = known_queues(app, store)
        require_known(queues, known)
    except FairError as exc:
        raise click.ClickException(str(exc)) from None
    names = list(queues) or known
    # routed: asks for it, on a store that routes (the others refuse it at dispatch)
    routed = {q for q in names if config.policy_for(q).affinity == HASH_AFFINITY
              and store.supports_affinity}

    def read() -> list[dict[str, Any]]:
        try:
            return read_workers(store, names, int(time.time() * 1000), routed)
        except FairError as exc:
            raise click.ClickException(str(exc)) from None

    show(ctx, read, as_json, watch, render_workers)
