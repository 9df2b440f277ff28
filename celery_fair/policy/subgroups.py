"""Two-level fairness (``fair_subgroup = "path"``) in the shared Python policy:
``common.lua``'s ``subgroup_key`` and ``pop_held``'s counterparts. Inside a group's class
list the subgroups take turns by self-clocked fair queueing: a hold's key is the later of
the list's virtual time (the key last picked) and the key its subgroup's previous hold
got, plus its cost over the subgroup's weight; the list is kept in key order (the
'smallest' index, ``QueueData.keys``) and the pick takes its head."""

from __future__ import annotations

from collections import deque

from ..limits import NO_SUBGROUP, PATH_SUBGROUP
from ..store.base import Placement
from .decisions import subgroup_key

__all__ = ["NO_SUBGROUP", "PATH_SUBGROUP", "SUB_VT", "hold_key"]

#: The field of the list's virtual time among the subgroups' keys (no subgroup name has
#: a control character: names.py), as ``common.lua``'s SUB_VT.
SUB_VT = "\n"


def hold_key(subtags: dict[tuple[str, str], dict[str, float]], weights: dict[str, float],
             p: Placement, queue: deque[str]) -> float:
    """The key of a message held now (not at the front) in ``p``'s group and class list
    ``queue``, before it is placed; its subgroup's last key becomes it (in ``subtags``,
    ``QueueData.subtags``). An empty list starts afresh (every key it gave has left)."""
    where = (p.klass, p.group)
    if not queue:
        subtags.pop(where, None)
    tags = subtags.setdefault(where, {})
    sub = p.subgroup or ""
    weight = weights.get(f"{p.group}/{sub}", 1.0) if sub else 1.0
    key = subgroup_key(tags.get(SUB_VT), tags.get(sub), p.cost, weight)
    tags[sub] = key
    return key

