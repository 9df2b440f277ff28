"""``celery -A proj fair workers``: the live workers of each fair queue, their start times
and slots (``store/registry.py``), and their groups. A queue routed by
``fair_affinity = "hash"`` shows the groups the store's map gives each worker and its free
slots (pool less its routed dispatches in flight, which only routing counts per worker),
and a worker no longer live that still has routed dispatches in flight or groups in the
map ("gone": they come back through their leases); any other queue, the groups
:mod:`celery_fair.affinity`'s hash would give each, and no free slots. A queue with
``fair_group_queues`` also lists its dedicated real queues, their groups and their tasks
in flight. Registered on the ``fair`` group by ``cli.py``."""

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
from .group_queues import dedicated_queue
from .policies import HASH_AFFINITY, routes
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
                 routed: Collection[str] = (),
                 dedicated: Collection[str] = ()) -> list[dict[str, Any]]:
    """Per queue: its live workers by slot, each with the fair queues it is registered
    in (among ``queues``) and its groups: for the ``routed`` queues (fair_affinity 'hash'
    on a store that routes) the groups the store's map gives it and its free slots, then
    the gone workers the map or the in-flight counts still name; for the others, the
    queue's groups with work that the hash over the live slots would give it, and free
    slots unknown (None). Every queue has ``dedicated``: for the queues in ``dedicated``
    (fair_group_queues on a store that routes) each dedicated real queue's groups and
    tasks in flight, else empty."""
    live = {q: store.live_workers(q, now_ms) for q in queues}
    member: dict[str, list[str]] = {}
    for q, workers in live.items():
        for w in workers:
            member.setdefault(w.hostname, []).append(q)
    docs = []
    for q, workers in live.items():
        targets = _Targets(store, q) if q in routed or q in dedicated else None
        doc = (_routed_queue(q, workers, member, targets) if targets and q in routed
               else _hashed_queue(store, q, workers, member))
        doc["dedicated"] = targets.dedicated(q) if targets and q in dedicated else []
        docs.append(doc)
    return docs


class _Targets:
    """The store's map and routed in-flight counts of one queue, by target: a worker's
    hostname or a dedicated real queue (``queue:<name>``)."""

    def __init__(self, store: Store, queue: str) -> None:
        self.assigned = Counter(store.assignments(queue).values())
        self.inflight = store.worker_inflight(queue)

    def workers(self) -> set[str]:
        """Every worker (not queue) target named by the map or the in-flight counts."""
        return {t for t in (*self.assigned, *self.inflight)
                if t and dedicated_queue(t) is None}

    def dedicated(self, queue: str) -> list[dict[str, Any]]:
        """Each dedicated real queue of ``queue`` (not the queue itself, the target of
        the other groups) with its groups and tasks in flight, by name."""
        names = {t for t in (*self.assigned, *self.inflight)
                 if dedicated_queue(t) not in (None, queue)}
        return [{"queue": dedicated_queue(t), "groups": self.assigned[t],
                 "inflight": self.inflight.get(t, 0)} for t in sorted(names)]


def _worker(w: LiveWorker, member: dict[str, list[str]], **figures: int | None
            ) -> dict[str, Any]:
    return {"hostname": w.hostname, "started_at": iso(w.started_ms),
            "started_ms": w.started_ms, "slot": w.slot, "pool": w.pool,
            "queues": member[w.hostname], "gone": False, **figures}


def _gone(hostname: str, targets: _Targets) -> dict[str, Any]:
    """A worker the map or the in-flight counts name that is no longer live: its routed
    tasks come back through their leases, its groups move at the dispatcher's next look."""
    return {"hostname": hostname, "started_at": None, "started_ms": None, "slot": None,
            "pool": None, "queues": [], "gone": True,
            "groups_assigned": targets.assigned[hostname], "groups_hash": None,
            "inflight": targets.inflight.get(hostname, 0), "free_slots": None}


def _routed_queue(queue: str, workers: list[LiveWorker], member: dict[str, list[str]],
                  targets: _Targets) -> dict[str, Any]:
    """The map's groups per worker, and each worker's pool less its routed dispatches in
    flight (dispatch-ahead may put more in flight than the pool: never below 0); then
    the gone workers, by name."""
    assigned, inflight = targets.assigned, targets.inflight
    live = [_worker(w, member, groups_assigned=assigned[w.hostname], groups_hash=None,
                    inflight=inflight.get(w.hostname, 0),
                    free_slots=max(w.pool - inflight.get(w.hostname, 0), 0))
            for w in workers]
    gone = sorted(targets.workers() - {w.hostname for w in workers})
    return {"queue": queue, "routed": True,
            "groups": sum(n for t, n in assigned.items() if dedicated_queue(t) is None),
            "workers": live + [_gone(h, targets) for h in gone]}


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
    if any(w.get("gone") for q in queues for w in q["workers"]):
        parts.append(Text("(gone): no longer live; its routed tasks come back through "
                          "their leases and its groups move to a live worker"))
    parts += [Text(_dedicated_line(q)) for q in queues if q.get("dedicated")]
    if idle:
        parts.append(Text(f"no live worker: {', '.join(idle)}"))
    return Group(*parts)


def _dedicated_line(q: dict[str, Any]) -> str:
    """A queue's dedicated real queues (fair_group_queues), their groups and in flight."""
    return f"{q['queue']} sends groups to " + ", ".join(
        f"{d['queue']} ({d['groups']} group{'' if d['groups'] == 1 else 's'}, "
        f"{d['inflight']} in flight)"
        for d in q["dedicated"])


def _row(q: dict[str, Any], w: dict[str, Any], counts: list[str]) -> list[str]:
    """A worker's cells; of the group counts (``counts``), the one of its queue's kind."""
    groups = ["" if w[key] is None else f"{w[key]}/{q['groups']}" for key in counts]
    free = w["free_slots"]
    name = w["hostname"] + (" (gone)" if w.get("gone") else "")
    return [q["queue"], "-" if w["slot"] is None else str(w["slot"]), name,
            w["started_at"] or "-", "-" if w["pool"] is None else str(w["pool"]),
            ",".join(w["queues"]) or "-", *groups, UNKNOWN if free is None else str(free)]


@click.command(cls=CeleryCommand)
@queue_option("Workers Options")
@view_options("Workers Options")
@click.pass_context
def workers(ctx: click.Context, queues: tuple[str, ...], as_json: bool,
            watch: float | None) -> None:
    """List the live workers of each fair queue: slot, hostname, start time, pool, the
    fair queues each consumes, its groups and free slots. A queue routed by
    fair_affinity="hash": "groups assigned", the groups the store's map gives each
    worker, and "free slots", its pool less its routed tasks in flight; a worker no
    longer live that still has routed tasks in flight is listed "(gone)" until their
    leases bring them back. Any other queue: "groups (hash)", the groups the hash would
    give each worker, and free slots "—" (unknown: without routing, tasks in flight are
    counted per queue, not per worker). A queue with fair_group_queues: a line with each
    dedicated real queue, its groups and its tasks in flight."""
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
    dedicated = {q for q in names if config.policy_for(q).group_queues
                 and routes(config.policy_for(q)) and store.supports_affinity}

    def read() -> list[dict[str, Any]]:
        try:
            return read_workers(store, names, int(time.time() * 1000), routed, dedicated)
        except FairError as exc:
            raise click.ClickException(str(exc)) from None

    show(ctx, read, as_json, watch, render_workers)
