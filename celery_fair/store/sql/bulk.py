"""``hold_many`` on SQL: one transaction per batch (``SqlStore.hold_many`` opens it).

The batch's group rows are locked in name order, its backpressure checked
(``batch_room``), then its messages inserted: by one executemany when every hold id is
new and unique in the batch (the usual case), else each by ``Lifecycle.hold`` (a resend
or a copy under a suffixed id, as a single hold decides it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, select

from ...errors import GroupFull
from ...policy import Placement
from ...policy.decisions import batch_room, task_of
from ..bulk import Hold
from .heads import stamp_head, stamp_keyed_head
from .lifecycle import Lifecycle
from .singletons import hold_keyed
from .subgrouping import sort_key
from .unit import Unit, held_count


def hold_many(life: Lifecycle, conn: Connection, queue: str, holds: Sequence[Hold],
              now_ms: int) -> tuple[list[str], bool]:
    """See ``FairQueue.hold_many``; returns the hold ids and whether to wake. GroupFull
    rolls the whole transaction back."""
    keyed = any(h.placement.singleton is not None for h in holds)
    u = life.unit(conn, queue, lock_queue=keyed)  # keys: the queue's row first
    for g in sorted({h.placement.group for h in holds}):
        u.group(g, create=True)
    held = _held_values(life, conn, queue, [h.hold_id for h in holds])

    def count(g: str) -> int:
        row = u.groups[g]
        assert row is not None
        return held_count(row)

    try:
        batch_room(((h.placement.group, h.placement.max_held,
                     held.get(h.hold_id) != h.value) for h in holds), count)
    except GroupFull as full:
        raise full.in_queue(queue) from None
    if keyed or held or len({h.hold_id for h in holds}) < len(holds):
        return _one_by_one(life, conn, queue, holds, now_ms)
    return [h.hold_id for h in holds], _insert_all(life, u, holds, now_ms)


def _held_values(life: Lifecycle, conn: Connection, queue: str,
                 ids: list[str]) -> dict[str, bytes]:
    """{hold id: value} of the messages held under any of ``ids``."""
    m = life.t.messages.c
    rows = conn.execute(select(m.hold_id, m.value).where(
        m.ns == life.ns, m.queue == queue, m.hold_id.in_(ids)))
    return {row.hold_id: bytes(row.value) for row in rows}


def _insert_all(life: Lifecycle, u: Unit, holds: Sequence[Hold], now_ms: int) -> bool:
    """Insert every message (new ids) in one executemany; returns whether to wake."""
    rows: list[dict[str, Any]] = []
    delayed: set[str] = set()
    keyed: dict[tuple[str, str], list[str]] = {}  # 'smallest': held by sort key
    for h in holds:
        p = h.placement
        later = h.due_ms > now_ms
        group = u.groups[p.group]
        assert group is not None
        key = None if later else sort_key(u, p, now_ms, p.subgroup)
        if later:
            delayed.add(h.hold_id)
            group["delayed"] += 1
        else:
            if key is None:
                stamp_head(u, p, now_ms)
            else:
                keyed.setdefault((p.group, p.klass), []).append(h.hold_id)
            group[f"held_{p.klass}"] += 1
        rows.append({**u.key, "hold_id": h.hold_id, "task_id": task_of(h.hold_id),
                     "grp": p.group, "klass": p.klass, "cost": p.cost, "front": p.front,
                     "seq": None if later else life.place(u, p.group, p.front),
                     "due_ms": h.due_ms if later else None, "value": h.value,
                     "sort_key": key})
    life.s.run(u.conn, "message_new", rows)
    for (g, klass), ids in keyed.items():
        stamp_keyed_head(u, Placement(g, klass, 1.0, False), ids, now_ms)
    woken = False
    for g in sorted({h.placement.group for h in holds}):
        woken = u.refresh(g) or woken
    if delayed:
        woken = life.first_due(u.conn, u.queue) in delayed or woken
    u.woken = woken
    u.flush()
    return woken


def _one_by_one(life: Lifecycle, conn: Connection, queue: str, holds: Sequence[Hold],
                now_ms: int) -> tuple[list[str], bool]:
    ids, woken = [], False
    for h in holds:
        p = h.placement
        held, wake = hold_one(life, conn, queue, h.hold_id, h.value,
                              replace(p, max_held=None), h.due_ms, now_ms)
        ids.append(held)
        woken = woken or wake
    return ids, woken


def hold_one(life: Lifecycle, conn: Connection, queue: str, hold_id: str, value: bytes,
             p: Placement, due_ms: int, now_ms: int) -> tuple[str, bool]:
    """One hold: ``Lifecycle.hold``, or with a singleton key ``singletons.hold_keyed``."""
    if p.singleton is not None:
        return hold_keyed(life, conn, queue, hold_id, value, p, due_ms, now_ms)
    return life.hold(conn, queue, hold_id, value, p, due_ms, now_ms)
