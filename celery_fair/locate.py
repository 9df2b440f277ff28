"""Where a task stands (``celery -A proj fair inspect TASK_ID``).

A held task: its fair queue, group and class, its place in its group, the groups ahead of
its group and an estimate of how many dispatches come before it. A dispatched one: its
dispatch state. Reads only; bounded by :data:`MAX_GROUPS_READ` groups per estimate and by
the number of tasks in flight.
"""

from __future__ import annotations

import math
from typing import Any

from .envelope import INTERACTIVE, placement_of
from .store.redis import RedisStore

#: Most ready groups read to estimate the dispatches ahead (beyond: a lower bound).
MAX_GROUPS_READ = 1000
CLASS_NAMES = {INTERACTIVE: "interactive", "b": "background"}


def locate(store: RedisStore, task_id: str) -> dict[str, Any] | None:
    """Where ``task_id`` stands in any fair queue, or None when celery_fair does not hold
    or track it (never published fair, or finished)."""
    for queue in store.queues():
        found = _held(store, queue, task_id) or _dispatched(store, queue, task_id)
        if found is not None:
            return found
    return None


def _held(store: RedisStore, queue: str, task_id: str) -> dict[str, Any] | None:
    k = store.keys(queue)
    client: Any = store.client
    value = client.hget(k.msg, task_id)
    if value is None:
        return None
    group, klass = placement_of(value)
    where: dict[str, Any] = {"task_id": task_id, "queue": queue, "group": group,
                             "class": CLASS_NAMES.get(klass, klass)}
    due = client.zscore(k.delayed, task_id)
    if due is not None:
        return {**where, "state": "delayed", "due_ms": int(due)}
    position = client.lpos(k.held(klass, group), task_id)
    [row] = store.group_figures(queue, [group])
    where.update(state="held", position=None if position is None else int(position) + 1,
                 group_held=row[f"held_{where['class']}"], inflight=row["inflight"],
                 cap=row["cap"], weight=row["weight"])
    where.update(_ahead(store, queue, klass, group, int(position or 0), row))
    return where


def _ahead(store: RedisStore, queue: str, klass: str, group: str, position: int,
           row: dict[str, Any]) -> dict[str, Any]:
    """Groups ahead of ``group`` in its ready set and the dispatches expected before the
    message at ``position`` (0-based) of it: start-time fair queueing with unit costs,
    the current backlog and no new arrivals. Interactive work goes first."""
    k = store.keys(queue)
    client: Any = store.client
    rank = client.zrank(k.ready(klass), group)
    tag = float(client.hget(k.group(group), "t" + klass) or 0)
    if rank is None:  # it re-enters the ready set at the virtual time at the earliest
        tag = max(tag, float(client.hget(k.vt, klass) or 0))
    start = tag + position / row["weight"]  # the virtual start tag of this message
    ahead = client.zrangebyscore(k.ready(klass), "-inf", f"({start}", start=0,
                                 num=MAX_GROUPS_READ, withscores=True)
    others = [(g.decode(), float(t)) for g, t in ahead if g.decode() != group]
    figures = {r["group"]: r for r in store.group_figures(queue, [g for g, _ in others])}
    before = position
    for name, other_tag in others:
        other = figures[name]
        before += min(other[f"held_{CLASS_NAMES[klass]}"],
                      math.ceil((start - other_tag) * other["weight"]))
    if klass != INTERACTIVE:
        before += store.queue_figures(queue)["held_interactive"]
    return {"ready": rank is not None, "groups_ahead": None if rank is None else int(rank),
            "dispatches_before": before, "estimate_is_lower_bound":
            len(ahead) >= MAX_GROUPS_READ}


def _dispatched(store: RedisStore, queue: str, task_id: str) -> dict[str, Any] | None:
    """A picked, queued or running dispatch of ``task_id`` (read through the leases:
    one per task in flight)."""
    k = store.keys(queue)
    client: Any = store.client
    dispatch_ids = [d.decode() for d in client.zrange(k.leases, 0, -1)]
    pipe = client.pipeline(transaction=False)
    for did in dispatch_ids:
        pipe.hmget(k.dispatch(did), "id", "s", "g", "c")
    for did, (hold_id, state, group, klass) in zip(dispatch_ids, pipe.execute()):
        if hold_id is not None and hold_id.decode().split("~")[0] == task_id:
            return {"task_id": task_id, "queue": queue, "group": group.decode(),
                    "class": CLASS_NAMES.get(klass.decode(), klass.decode()),
                    "state": state.decode(), "dispatch_id": did}
    return None


def describe(where: dict[str, Any]) -> str:
    """``locate``'s answer as a few lines of text."""
    head = (f"task {where['task_id']}: {where['state']} in fair queue {where['queue']}, "
            f"group {where['group']} ({where['class']})")
    if where["state"] == "delayed":
        return f"{head}\n  due at {where['due_ms'] / 1000:.3f} (epoch seconds)"
    if where["state"] != "held":
        return f"{head}\n  dispatch {where['dispatch_id']}"
    cap = "no cap" if where["cap"] is None else f"cap {where['cap']}"
    lines = [head, f"  position {where['position']} of {where['group_held']} held in its group "
                   f"({where['inflight']} in flight, {cap}, weight {where['weight']:g})"]
    if where["ready"]:
        lines.append(f"  {where['groups_ahead']} groups ahead of its group in the ready set")
    else:
        lines.append("  its group waits for a free slot (at its cap) before it is ready")
    bound = "at least " if where["estimate_is_lower_bound"] else "about "
    lines.append(f"  {bound}{where['dispatches_before']} dispatches before it "
                 "(current backlog, unit costs, no new arrivals)")
    return "\n".join(lines)
