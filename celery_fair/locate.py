"""Where a task stands (``celery -A proj fair inspect TASK_ID``), as text.

The store finds it (:meth:`~celery_fair.store.base.Store.locate`): a held task's fair
queue, group and class, its place in its group, the groups ahead of its group and an
estimate of how many dispatches come before it; a dispatched one's dispatch state.
"""

from __future__ import annotations

from typing import Any

from .audit import utc_text


def paused(store: Any, where: dict[str, Any]) -> dict[str, Any] | None:
    """The pause a held task waits on (its group's, else its queue's), as ``fair inspect
    --json`` shows it: {"what": "group" or "queue", "until_ms": ms or None}."""
    pauses = store.pauses(where["queue"])
    for what, key in (("group", where["group"]), ("queue", "")):
        if key in pauses:
            return {"what": what, "until_ms": pauses[key]}
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
    if where.get("paused"):  # no estimate: nothing is dispatched before the resume
        pause = where["paused"]
        until = "fair resume" if pause["until_ms"] is None else \
            f"{utc_text(pause['until_ms'])} (or fair resume)"
        lines.append(f"  paused ({pause['what']}): it waits until {until}")
        return "\n".join(lines)
    if where.get("throttled_until_ms"):
        lines.append(f"  its group is throttled (its rate, or a task's fair_throttle) until "
                     f"{utc_text(where['throttled_until_ms'])}")
    elif where["ready"]:
        lines.append(f"  {where['groups_ahead']} groups ahead of its group in the ready set")
    else:
        lines.append("  its group waits for a free slot (at its cap) before it is ready")
    bound = "at least " if where["estimate_is_lower_bound"] else "about "
    lines.append(f"  {bound}{where['dispatches_before']} dispatches before it "
                 "(current backlog, unit costs, no new arrivals)")
    return "\n".join(lines)
