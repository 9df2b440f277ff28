"""Two-level fairness (``fair_subgroup = "path"``) on the SQL store: ``common.lua``'s
``subgroup_key``, ``pop_held`` and ``unlist_held`` over a group's row (revision 0012:
``groups.subtags``, JSON {class: {subgroup: the key of its last hold, "\\n": the key
picked last}}). The keys go in ``messages.sort_key`` and a keyed hold shares its group's
tail as under 'smallest' (``Lifecycle.place``), so a list's order (seq, sort_key,
hold_id) is key order after what was held before."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from ...limits import PATH_SUBGROUP, SMALLEST
from ...policy.decisions import in_force, subgroup_key
from ...policy.subgroups import SUB_VT
from ..models import Placement
from .unit import Unit

__all__ = ["emptied", "keyed", "picked", "sort_key"]


def keyed(u: Unit) -> bool:
    """Whether the queue keeps its lists in subgroup key order."""
    return u.q.get("subgroup") == PATH_SUBGROUP and u.q.get("policy") != SMALLEST


def sort_key(u: Unit, p: Placement, now_ms: int, sub: str | None) -> float | None:
    """The sort key of a message of subgroup ``sub`` entering ``p``'s list now, before
    it is counted there: its subgroup key under 'path', else 'smallest''s (None: none)."""
    if p.front or not keyed(u):
        return u.sort_key(p.cost, p.front, now_ms)
    row = u.groups[p.group]
    assert row is not None
    tags = _tags(row)
    if not row[f"held_{p.klass}"]:  # an empty list starts afresh
        tags.pop(p.klass, None)
    mine = tags.setdefault(p.klass, {})
    name = sub or ""
    key = subgroup_key(mine.get(SUB_VT), mine.get(name), p.cost,
                       _weight(u, f"{p.group}/{name}") if name else 1.0)
    mine[name] = key
    _save(row, tags)
    return key


def picked(u: Unit, row: dict[str, Any], klass: str, msg: Any) -> None:
    """``msg``, the head of ``row``'s ``klass`` list, was picked (counted off already):
    its key is the list's virtual time now; the list empty, its tags go.

    Only a key given under the keys in force counts: those messages share the group's
    tail (``Lifecycle.place``). One held before a configure that dropped the keys
    (``configure.lua``; here the tail moved past it) keeps its old key for its place in
    the list only, as the other stores keep none."""
    if not keyed(u):
        return
    key = msg.sort_key if msg.seq == row["tail"] else None
    tags = _tags(row)
    if not row[f"held_{klass}"]:
        tags.pop(klass, None)
    elif key is not None:
        tags.setdefault(klass, {})[SUB_VT] = key
    _save(row, tags)


def emptied(row: dict[str, Any], klass: str) -> None:
    """A message left ``row``'s ``klass`` list (cancel, ``boost --task``; counted off):
    the list empty, its tags go (``unlist_held``)."""
    if not row[f"held_{klass}"] and row.get("subtags"):
        tags = _tags(row)
        tags.pop(klass, None)
        _save(row, tags)


def _weight(u: Unit, path: str) -> float:
    """The weight in force of subgroup ``path`` ("<group>/<subgroup>"), 1 by default (not
    the queue's default weight: ``common.lua``'s ``subgroup_key``)."""
    t = u.t.limits.c
    row = u.conn.execute(select(t.limit_weight, t.conf_weight).where(
        t.ns == u.ns, t.queue == u.queue, t.grp == path)).first()
    return float(in_force(row.limit_weight, row.conf_weight, 1.0) if row else 1.0)


def _tags(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    return json.loads(row["subtags"]) if row.get("subtags") else {}


def _save(row: dict[str, Any], tags: dict[str, dict[str, float]]) -> None:
    kept = {klass: mine for klass, mine in tags.items() if mine}
    row["subtags"] = json.dumps(kept, sort_keys=True) if kept else None
