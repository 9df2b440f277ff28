"""The head time of a group's list (``since_<class>``) on the SQL store: when a message
became the head of its class list, what the interactive share and the heads' ages read
(``hold.lua``'s and ``insert_held``'s stamps)."""

from __future__ import annotations

from ..models import Placement
from .unit import Unit

__all__ = ["stamp_head", "stamp_keyed_head"]


def stamp_keyed_head(u: Unit, p: Placement, held: list[str], now_ms: int) -> None:
    """'smallest': messages ``held`` just entered ``p``'s list by sort key; one of them
    is its head now, so it became the head (``insert_held``): the group's head time of
    that class is ``now_ms``. (Only an insert changes the head between two picks, so a
    head that is not new was the head before them.)"""
    if u.list_head(p.group, p.klass) in held:
        u.groups[p.group][f"since_{p.klass}"] = now_ms  # type: ignore[index]


def stamp_head(u: Unit, p: Placement, now_ms: int) -> None:
    """A message about to enter ``p``'s list becomes its head (to the front, or into an
    empty list): the group's head time of that class is ``now_ms`` (``hold.lua``)."""
    row = u.groups[p.group]
    assert row is not None
    if p.front or not row[f"held_{p.klass}"]:
        row[f"since_{p.klass}"] = now_ms
