"""Singleton keys on the SQL store (DESIGN.md "Singleton keys"): the memory store's
decisions (:class:`~celery_fair.policy.singletons.SingletonRules`) run over rows.

``skeys`` (ref 'h'<hold id> or 'd'<dispatch id> -> key, per queue), ``sowners`` (key ->
owner: 'h' or 'd' and its id, with its queue ``oqueue``) and ``swaits`` (a key's waiting
hold ids by ``pos``, with their queue ``wqueue``) behave as the dicts and deques the
rules expect, one statement per step; owners and waiters are the namespace's (rows of
queue :data:`SCOPE`: a key spans the app), and ``sadmits`` holds each queue's waiters
handed to it (its promote admits them). Every operation that reads or changes a key runs
with the queue's row locked (the lock pick, promote, reclaim and cancel take; keyed holds
and releases take it too), then the namespace's (:meth:`Unit.lock_scope`, the queue row
of :data:`SCOPE`), so the steps of the app's keys run one at a time, and a hold or
release without a key locks nothing more than before."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from ...errors import GroupFull, SingletonDropped
from ...policy import Placement
from ...policy.decisions import LIVE, copy_id
from ...policy.singletons import SingletonRules, ref, unref
from ..models import Picked
from .rows import chunks, upsert
from .unit import SCOPE, Unit, held_count


class _KeyRows:
    """``skeys`` of one kind ('h' held, 'd' dispatch): id -> key."""

    def __init__(self, u: Unit, kind: str) -> None:
        self.u, self.kind, self.t = u, kind, u.t.skeys
        self.known: dict[str, str | None] = {}  # read or written by this object

    def _mine(self, ident: str) -> Any:
        c = self.t.c
        return (c.ns == self.u.ns) & (c.queue == self.u.queue) & (c.ref == self.kind + ident)

    def __setitem__(self, ident: str, key: str) -> None:
        upsert(self.u.conn, self.t, [{**self.u.key, "ref": self.kind + ident, "skey": key}],
               ["skey"])
        self.known[ident] = key

    def get(self, ident: str, default: str | None = None) -> str | None:
        if ident not in self.known:
            found = self.u.conn.execute(select(self.t.c.skey).where(self._mine(ident))
                                        ).scalar()
            self.known[ident] = None if found is None else str(found)
        key = self.known[ident]
        return default if key is None else key

    def pop(self, ident: str, default: str | None = None) -> str | None:
        key = self.get(ident)
        if key is None:
            return default
        self.u.conn.execute(delete(self.t).where(self._mine(ident)))
        self.known[ident] = None
        return key

    def of(self, idents: Iterable[str]) -> dict[str, str]:
        """{id: key} of those of ``idents`` with a key (one query per 500)."""
        c, out, wanted = self.t.c, {}, list(idents)
        for chunk in chunks([self.kind + i for i in wanted], 500):
            for kref, key in self.u.conn.execute(select(c.ref, c.skey).where(
                    c.ns == self.u.ns, c.queue == self.u.queue, c.ref.in_(chunk))):
                out[kref[1:]] = key
        self.known.update((i, out.get(i)) for i in wanted)
        return out


class _Owners:
    """``sowner``: key -> 'h'<hold id> or 'd'<dispatch id>."""

    def __init__(self, u: Unit) -> None:
        self.u, self.t = u, u.t.sowners

    def _mine(self, key: str) -> Any:
        self.u.lock_scope()
        c = self.t.c
        return (c.ns == self.u.ns) & (c.queue == SCOPE) & (c.skey == key)

    def get(self, key: str, default: str | None = None) -> str | None:
        found = self.u.conn.execute(select(self.t.c.owner, self.t.c.oqueue).where(
            self._mine(key))).first()
        return default if found is None else found.owner[0] + ref(found.oqueue,
                                                                  found.owner[1:])

    def __contains__(self, key: object) -> bool:
        return self.get(str(key)) is not None

    def __setitem__(self, key: str, owner: str) -> None:
        self.u.lock_scope()
        queue, ident = unref(owner[1:])
        upsert(self.u.conn, self.t, [{"ns": self.u.ns, "queue": SCOPE, "skey": key,
                                      "owner": owner[0] + ident, "oqueue": queue}],
               ["owner", "oqueue"])

    def pop(self, key: str, default: str | None = None) -> str | None:
        owner = self.get(key)
        self.u.conn.execute(delete(self.t).where(self._mine(key)))
        return default if owner is None else owner


class _Waiting:
    """One key's waiting list (``sw:<key>``), oldest first: a deque over its rows."""

    def __init__(self, u: Unit, key: str) -> None:
        self.u, self.key, self.t = u, key, u.t.swaits
        c = self.t.c
        u.lock_scope()
        self.mine = (c.ns == u.ns) & (c.queue == SCOPE) & (c.skey == key)
        self._head: list[tuple[int, str]] | None = None  # its first rows, once read

    def _first(self) -> list[tuple[int, str]]:
        """The first two rows (pos, hold id): enough for a pop and "any left?"."""
        if not self._head:
            c = self.t.c
            self._head = [(int(p), ref(q, h)) for p, q, h in self.u.conn.execute(
                select(c.pos, c.wqueue, c.hold_id).where(self.mine).order_by(c.pos).limit(2))]
        return self._head

    def __bool__(self) -> bool:
        return bool(self._first())

    def _add(self, r: str, pos: Any, step: int) -> None:
        self._head = None
        at = self.u.conn.execute(select(pos).where(self.mine)).scalar()
        queue, hold_id = unref(r)
        self.u.conn.execute(insert(self.t).values(
            ns=self.u.ns, queue=SCOPE, skey=self.key, hold_id=hold_id, wqueue=queue,
            pos=0 if at is None else at + step))

    def append(self, hold_id: str) -> None:
        self._add(hold_id, func.max(self.t.c.pos), 1)

    def appendleft(self, hold_id: str) -> None:
        self._add(hold_id, func.min(self.t.c.pos), -1)

    def popleft(self) -> str:
        pos, hold_id = self._first().pop(0)
        self.u.conn.execute(delete(self.t).where(self.mine, self.t.c.pos == pos))
        return hold_id

    def _is(self, r: str) -> Any:
        queue, hold_id = unref(r)
        return (self.t.c.wqueue == queue) & (self.t.c.hold_id == hold_id)

    def __contains__(self, r: object) -> bool:
        return self.u.conn.execute(select(self.t.c.pos).where(self.mine, self._is(str(r)))
                                   ).first() is not None

    def remove(self, r: str) -> None:
        self._head = None
        self.u.conn.execute(delete(self.t).where(self.mine, self._is(r)))


class _WaitLists:
    """``swait``: key -> its waiting list (present while it has rows)."""

    def __init__(self, u: Unit) -> None:
        self.u = u

    def __getitem__(self, key: str) -> _Waiting:
        return _Waiting(self.u, key)

    def get(self, key: str, default: Any = None) -> Any:
        waiting = _Waiting(self.u, key)
        return waiting if waiting else default

    def setdefault(self, key: str, _default: Any = None) -> _Waiting:
        return _Waiting(self.u, key)

    def __delitem__(self, key: str) -> None:
        self.u.conn.execute(delete(self.u.t.swaits).where(_Waiting(self.u, key).mine))

    def pop(self, key: str, default: Any = None) -> Any:
        del self[key]
        return default


class SqlKeys(SingletonRules):
    """The singleton rules over one unit's rows (the queue's row locked)."""

    def __init__(self, u: Unit) -> None:
        self.u, self.squeue = u, u.queue
        self.skeys = _KeyRows(u, "h")
        self.dkeys = _KeyRows(u, "d")  # a dispatch's key (Redis: the record's 'k')
        self.sowner = _Owners(u)
        self.swait = _WaitLists(u)

    def _row(self, hold_id: str) -> Any:
        m = self.u.t.messages.c
        return self.u.conn.execute(select(m.grp, m.klass).where(
            m.ns == self.u.ns, m.queue == self.u.queue, m.hold_id == hold_id)).first()

    def _singleton_held(self, hold_id: str) -> bool:
        return self._row(hold_id) is not None

    def _singleton_admit(self, hold_id: str, now_ms: int) -> None:
        """At the head of its class (``push_held`` front): it waited its turn already."""
        u, msg = self.u, self._row(hold_id)
        row = u.group(msg.grp, create=True)
        assert row is not None
        row["head"] -= 1
        m = u.t.messages.c
        u.conn.execute(update(u.t.messages).where(
            m.ns == u.ns, m.queue == u.queue, m.hold_id == hold_id).values(
            seq=row["head"], due_ms=None, sort_key=None))
        row[f"since_{msg.klass}"] = now_ms
        row[f"held_{msg.klass}"] += 1
        u.woken = u.refresh(msg.grp) or u.woken

    def _singleton_hand(self, queue: str, hold_id: str) -> None:
        u = self.u
        upsert(u.conn, u.t.sadmits, [{"ns": u.ns, "queue": queue, "hold_id": hold_id}],
               ["hold_id"])
        u.handed.add(queue)  # its dispatchers are woken (Unit.flush)

    def _admits(self) -> Any:
        a = self.u.t.sadmits.c
        return (a.ns == self.u.ns) & (a.queue == self.u.queue)

    def _singleton_unhand(self, hold_id: str) -> None:
        self.u.conn.execute(delete(self.u.t.sadmits).where(
            self._admits(), self.u.t.sadmits.c.hold_id == hold_id))

    def _singleton_handed(self) -> list[str]:
        """Under the namespace's lock: a hand-over committing between the read and the
        delete would otherwise be deleted unread (READ COMMITTED), its key stuck."""
        self.u.lock_scope()
        a = self.u.t.sadmits.c
        found = [str(h) for h in self.u.conn.execute(
            select(a.hold_id).where(self._admits()).order_by(a.hold_id)).scalars()]
        for chunk in chunks(found, 500):
            self.u.conn.execute(delete(self.u.t.sadmits).where(
                self._admits(), a.hold_id.in_(chunk)))
        return found


def admitted(u: Unit, now_ms: int) -> int:
    """Promote: the waiters other queues handed this one enter their groups (nothing
    locked more when none was handed)."""
    a = u.t.sadmits.c
    if u.conn.execute(select(a.hold_id).where(a.ns == u.ns, a.queue == u.queue).limit(1)
                      ).first() is None:
        return 0
    return SqlKeys(u)._singleton_admitted(now_ms)


def hold_keyed(life: Any, conn: Any, queue: str, hold_id: str, value: bytes, p: Placement,
               due_ms: int, now_ms: int) -> tuple[str, bool]:
    """``FairQueue.hold`` of a message with a key (``Lifecycle.hold``'s steps, the
    queue's row locked first): it enters its group when it takes the key, else waits
    in the key's list; 'drop' refuses before any write."""
    u: Unit = life.unit(conn, queue, lock_queue=True)
    row = u.group(p.group, create=True)
    assert row is not None and p.singleton is not None
    held = life._message(conn, queue, hold_id)
    if held is not None and bytes(held["value"]) == value:
        u.flush()  # it changed nothing: its count rows made at 0 go (scoping.py)
        return hold_id, False  # the same publication, resent
    count = held_count(row)
    if p.max_held is not None and count >= p.max_held:
        raise GroupFull(queue=queue, group=p.group, count=count, limit=p.max_held)
    keys, key = SqlKeys(u), p.singleton
    if p.drop and keys._singleton_drops(key):
        raise SingletonDropped(hold_id, key)
    if held is not None:
        hold_id = copy_id(hold_id, life._next_dup(conn, queue))
    plain = replace(p, max_held=None, singleton=None, drop=False)
    delayed = due_ms > now_ms
    life._insert_message(u, hold_id, value, plain, None, due_ms if delayed else None)
    if delayed:  # its key's turn is taken at promote
        keys.skeys[hold_id] = key
        row["delayed"] += 1
        u.woken = life.first_due(conn, queue) == hold_id
    elif keys._singleton_enter(hold_id, key, p.front):
        u.woken = life._enqueue(u, hold_id, plain, now_ms, p.subgroup) or u.woken
    else:
        u.forget_if_idle(p.group)  # it waits, its group untouched
    u.flush()
    return hold_id, u.woken


def take_keys(u: Unit, picked: list[Picked]) -> None:
    """The pick: each picked message with a key hands it to its dispatch (one query
    when none has a key)."""
    if not picked:
        return
    keys = SqlKeys(u)
    found = keys.skeys.of(p.hold_id for p in picked)
    for p in picked:
        if p.hold_id in found:
            key = keys._singleton_picked(p.hold_id, p.dispatch_id)
            assert key is not None
            keys.dkeys[p.dispatch_id] = key


def release_unit(life: Any, conn: Any, queue: str, did: str) -> tuple[Unit, str | None]:
    """Release's unit and the key of dispatch ``did`` (read before any lock: it never
    changes): with a key the unit locks the queue's row, before the dispatch's."""
    key = _KeyRows(life.unit(conn, queue), "d").get(did)
    return life.unit(conn, queue, lock_queue=key is not None), key


def released(u: Unit, key: str | None, did: str, now_ms: int, freed: bool) -> None:
    """A dispatch of ``key`` (None: none) was released: the key passes on (unless it
    did when the dispatch was lost), and the dispatch's key row goes."""
    if key is None:
        return
    keys = SqlKeys(u)
    if freed:
        keys._singleton_ended(key, did, now_ms)
    keys.dkeys.pop(did)


def lost(u: Unit, key: str | None, did: str, now_ms: int) -> None:
    """Reclaim made dispatch ``did`` lost: its key passes on (its key row stays: a run
    that comes back and is reclaimed again holds it with its key)."""
    if key is not None:
        SqlKeys(u)._singleton_ended(key, did, now_ms)


def hold_again(life: Any, u: Unit, rec: dict[str, Any], key: str | None,
               now_ms: int) -> None:
    """Reclaim holds dispatch ``rec`` again (``Lifecycle._hold_again``); with a key it
    keeps it and enters its list first, or waits first in the key's list (it passed
    on)."""
    if key is None:
        life._hold_again(u, rec, now_ms)
        return
    keys, did, hold_id = SqlKeys(u), rec["did"], rec["hold_id"]
    if life._message(u.conn, u.queue, hold_id) is not None:
        hold_id = copy_id(hold_id, did)
    enters = keys._singleton_requeued(key, did, hold_id)
    keys.dkeys.pop(did)
    if enters:
        life._hold_again(u, rec, now_ms)
    else:
        life._insert_message(u, hold_id, bytes(rec["value"]), Placement(
            rec["grp"], rec["klass"], rec["cost"], bool(rec["front"])), None, None)


def promoted_keys(u: Unit, hold_ids: list[str]) -> dict[str, str]:
    """{hold id: key} of the delayed messages promote moves that have one."""
    return SqlKeys(u).skeys.of(hold_ids) if hold_ids else {}


def waits_when_due(u: Unit, hold_id: str, keys: dict[str, str], front: bool) -> bool:
    """Delayed ``hold_id`` is due: with a key (in ``keys``) it waits in the key's list
    (True, no longer delayed) unless it takes the key (False: it enters its group)."""
    key = keys.get(hold_id)
    if key is None or SqlKeys(u)._singleton_enter(hold_id, key, front):
        return False
    m = u.t.messages.c
    u.conn.execute(update(u.t.messages).where(
        m.ns == u.ns, m.queue == u.queue, m.hold_id == hold_id).values(due_ms=None))
    return True


def removed(u: Unit, hold_id: str, now_ms: int) -> None:
    """Cancel removed ``hold_id``: out of its key's list, or the key passes on."""
    SqlKeys(u)._singleton_removed(hold_id, now_ms)


def check_owners(u: Unit, repair: bool, now_ms: int) -> list[tuple[str, str, str, str]]:
    """``fair check`` (``check.lua``'s ``check_singletons``): each key's owner must be a
    held message or a live dispatch, else its waiters would wait for ever (damage);
    the repair passes the key on."""
    o, m, d = u.t.sowners.c, u.t.messages.c, u.t.dispatches.c
    out = []
    u.lock_scope()
    for key, owner in list(u.conn.execute(select(o.skey, o.owner).where(
            o.ns == u.ns, o.queue == SCOPE, o.oqueue == u.queue).order_by(o.skey))):
        ident = owner[1:]
        found = select(m.hold_id).where(m.ns == u.ns, m.queue == u.queue, m.hold_id == ident) \
            if owner[0] == "h" else select(d.did).where(
                d.ns == u.ns, d.queue == u.queue, d.did == ident, d.state.in_(list(LIVE)))
        if u.conn.execute(found).first() is None:
            out.append(("singleton_owner", key, f"owned by {owner}, which is neither held "
                        "nor in flight", "passed to its next waiting message" if repair else ""))
            if repair:
                SqlKeys(u)._singleton_next(key, now_ms)
    return out
