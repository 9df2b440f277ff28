"""The invariants of one fair queue's state (``check.lua`` checks the same ones in
Redis), for the memory store's ``check`` and ``fair check``."""

from __future__ import annotations

from ..limits import APP_SCOPE
from .common import QueueData
from .decisions import CLASSES, LIVE
from .routing import routing_problems
from .singletons import unref


def queue_problems(q: QueueData) -> list[tuple[str, str, str]]:
    """``(kind, subject, detail)`` of every invariant of ``q`` that does not hold."""
    counted = q.stat.get("inflight", 0)
    in_groups = sum(g.inflight for g in q.groups.values())
    live = sum(1 for r in q.records.values() if r.state in LIVE)
    out = []
    if not counted == in_groups == live:
        out.append(("inflight", "queue",
                    f"counted {counted}, in groups {in_groups}, live dispatches {live}"))
    interactive = sum(1 for r in q.records.values()
                      if r.state in LIVE and r.klass == "i")
    if q.stat.get("inflight:i", 0) != interactive:
        out.append(("inflight", "interactive", f"counted {q.stat.get('inflight:i', 0)}"
                    f", live interactive dispatches {interactive}"))
    for klass in CLASSES:
        held = sum(len(ids) for (k, _), ids in q.lists.items() if k == klass) + sum(
            len(ids) for (k, _, _), ids in q.parked.items() if k == klass)
        if held != q.stat.get("held:" + klass, 0):
            out.append(("held", klass, f"counted {q.stat.get('held:' + klass, 0)}, "
                        f"listed {held}"))
    if len(q.msgs) != sum(map(len, q.lists.values())) + len(q.delayed) \
            + sum(map(len, q.parked.values())) \
            + sum(1 for w in q.swait.values() for r in w if unref(r)[0] == q.squeue) \
            + len(q.sadmit.get(q.squeue, ())):
        out.append(("messages", "queue", "a message neither held nor delayed"))
    out += _subgroup_flights(q)
    if set(q.leases) != {d for d, r in q.records.items() if r.state in LIVE}:
        out.append(("leases", "queue", "a lease without a live dispatch, or the reverse"))
    for g in set(q.groups).union(*q.ready.values(), *q.over.values()):
        group = q.groups.get(g)
        # fair_scope 'app': another queue freed a slot of g, which the next promote here
        # refreshes (scope.py): its sets may not say so yet
        marked = q.scope == APP_SCOPE and g in q.scope_refresh
        for klass in CLASSES:
            eligible = group is not None and q._eligible(klass, g, group.inflight)
            # fair_scope 'app': another queue's picks may have taken g to its cap since
            # it was ranked here; the pick passes such a member over (scope.py)
            lazy = marked or q.scope == APP_SCOPE and g in q.ready[klass] \
                and q._held(klass, g) > 0
            if eligible != (g in q.ready[klass]) and not lazy:
                out.append(("ready", f"{klass}:{g}", "ready set and eligibility differ"))
            over = group is not None and q._standing(klass, g, group.inflight) == "over"
            # a stale ready member (above) stands over before it leaves the ready set
            stale = lazy and over and g in q.ready[klass] and g not in q.over[klass]
            if over != (g in q.over[klass]) and not (marked or stale):
                out.append(("over", f"{klass}:{g}", "over set and standing differ"))
    return out + routing_problems(q.records.values(), q.wflight)


def _subgroup_flights(q: QueueData) -> list[tuple[str, str, str]]:
    """Each subgroup's in-flight count (caps per subgroup) against its live dispatches."""
    flights: dict[str, int] = {}
    for r in q.records.values():
        if r.state in LIVE and r.subgroup:
            path = f"{r.group}/{r.subgroup}"
            flights[path] = flights.get(path, 0) + 1
    if flights == q.sflight:
        return []
    return [("inflight", "subgroups", f"counted {q.sflight}, live dispatches {flights}")]
