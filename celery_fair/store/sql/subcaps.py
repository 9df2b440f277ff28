"""Caps per subgroup (``fair_subgroup = "path"``, a cap keyed "<group>/<subgroup>") on
the SQL store: ``policy/subcaps.py`` over rows (revision 0017). A message parked while
its subgroup is at its cap leaves its group's list (``seq`` NULL, its sort key gone)
and names its subgroup in ``messages.parked``, in ``parked_seq`` order; the group
counts it in ``parked_i``/``parked_b`` (held still, not listed). A dispatch names the
subgroup it counts against (``dispatches.subgroup``); a subgroup's flight is counted
from the live dispatch rows under its group's lock, once per unit, then kept by the
unit as it picks and frees. Unparking puts as many parked messages as the room back at
the front of their list, in order (places at the group's head)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, literal_column, select, update

from ...limits import PATH_SUBGROUP
from ...policy.decisions import CLASSES, LIVE, in_force
from .subgrouping import picked
from .unit import Unit

__all__ = ["count_picked", "freed", "leaving", "park", "room", "unpark", "unpark_all",
           "unpark_path"]


def room(u: Unit, g: str, sub: str) -> int | None:
    """Room left under the cap of subgroup ``sub`` of g (None: no cap binds it now:
    none, or not under 'path'). ``_sub_room``'s counterpart."""
    if not sub or u.q.get("subgroup") != PATH_SUBGROUP:
        return None
    cap = _cap(u, f"{g}/{sub}")
    return None if cap < 0 else max(cap - _flight(u, g, sub), 0)


def _cap(u: Unit, path: str) -> int:
    """The cap of ``path`` from its own limits row only (-1: none; a subgroup never
    takes the queue's default cap), once per unit."""
    if path not in u.path_caps:
        t = u.t.limits.c
        row = u.conn.execute(select(t.limit_cap, t.conf_cap).where(
            t.ns == u.ns, t.queue == u.queue, t.grp == path)).first()
        u.path_caps[path] = int(in_force(row.limit_cap, row.conf_cap, -1) if row else -1)
    return u.path_caps[path]


def _flight(u: Unit, g: str, sub: str) -> int:
    """Subgroup ``sub`` of g's dispatches in flight: its live rows as the unit first read
    them (before it wrote any of its own), and the unit's changes since."""
    path = f"{g}/{sub}"
    if path not in u.sflight:
        d = u.t.dispatches.c
        live: list[Any] = [literal_column(f"'{state}'") for state in LIVE]
        u.sflight[path] = int(u.conn.execute(select(func.count()).where(
            d.ns == u.ns, d.queue == u.queue, d.grp == g, d.subgroup == sub,
            d.state.in_(live))).scalar_one())
    return u.sflight[path]


def count_picked(u: Unit, g: str, sub: str) -> None:
    """A dispatch of subgroup ``sub`` of g was picked (its row written at the pick's end)."""
    u.sflight[f"{g}/{sub}"] = _flight(u, g, sub) + 1


def leaving(u: Unit, rec: dict[str, Any]) -> str:
    """Live dispatch ``rec`` leaves the flight (release, reclaim; called before its row
    changes, which the count is read from): its subgroup's count goes down. Returns its
    subgroup ('' none), for :func:`unpark`."""
    sub: str = rec.get("subgroup") or ""
    if sub:
        u.sflight[f"{rec['grp']}/{sub}"] = _flight(u, rec["grp"], sub) - 1
    return sub


def freed(u: Unit, rec: dict[str, Any]) -> None:
    """Live dispatch ``rec`` leaves the flight (before its row changes): what its
    subgroup has room for now is unparked (``_unpark_freed``)."""
    sub = leaving(u, rec)
    if sub:
        unpark(u, rec["grp"], sub)


def park(u: Unit, row: dict[str, Any], klass: str, msg: Any, sub: str,
         now_ms: int) -> None:
    """The head ``msg`` of ``row``'s ``klass`` list (subgroup ``sub`` at its cap) out of
    the list, parked last of its subgroup's; passed in key order, as a pick."""
    m, g = u.t.messages.c, row["grp"]
    last = u.conn.execute(select(func.max(m.parked_seq)).where(
        m.ns == u.ns, m.queue == u.queue, m.klass == klass, m.grp == g,
        m.parked == sub)).scalar()
    u.conn.execute(update(u.t.messages).where(
        m.ns == u.ns, m.queue == u.queue, m.hold_id == msg.hold_id).values(
        seq=None, sort_key=None, parked=sub, parked_seq=0 if last is None else last + 1))
    row[f"held_{klass}"] -= 1
    row[f"parked_{klass}"] += 1
    picked(u, row, klass, msg)
    row[f"since_{klass}"] = now_ms
    u.refresh(g)


def unpark(u: Unit, g: str, sub: str) -> None:
    """Subgroup ``sub`` of g may have room: as many of its parked messages as the room
    (all when no cap binds it) back to the front of their list, in order; the list's
    head time is left as it is (``_unpark``)."""
    row = u.group(g)
    if row is None or not (row["parked_i"] or row["parked_b"]):
        return
    left = room(u, g, sub)
    m = u.t.messages.c
    moved = False
    for klass in CLASSES:
        if left == 0 or not row[f"parked_{klass}"]:
            continue
        query = select(m.hold_id).where(
            m.ns == u.ns, m.queue == u.queue, m.klass == klass, m.grp == g,
            m.parked == sub).order_by(m.parked_seq)
        ids = list(u.conn.execute(query if left is None else query.limit(left)).scalars())
        if not ids:
            continue
        head = int(row["head"])
        for i, hold_id in enumerate(ids):  # the first parked goes first
            u.conn.execute(update(u.t.messages).where(
                m.ns == u.ns, m.queue == u.queue, m.hold_id == hold_id).values(
                seq=head - len(ids) + i, parked=None, parked_seq=None))
        row["head"] = head - len(ids)
        row[f"held_{klass}"] += len(ids)
        row[f"parked_{klass}"] -= len(ids)
        left = None if left is None else left - len(ids)
        moved = True
    if moved and u.refresh(g):
        u.woken = True


def unpark_path(u: Unit, path: str) -> None:
    """``path``'s cap changed: unpark what it has room for."""
    g, _, sub = path.partition("/")
    u.path_caps.pop(path, None)
    unpark(u, g, sub)


def unpark_all(u: Unit) -> None:
    """The settings changed: every parked subgroup gets what its room allows (the groups'
    rows locked already)."""
    m = u.t.messages.c
    u.path_caps.clear()
    for g, sub in u.conn.execute(select(m.grp, m.parked).where(
            m.ns == u.ns, m.queue == u.queue, m.parked.is_not(None)).group_by(
            m.grp, m.parked).order_by(m.grp, m.parked)).all():
        unpark(u, g, sub)
