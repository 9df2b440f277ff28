"""The lifecycle operations of the SQL store, each one transaction over a
:class:`~.unit.Unit`: the same decisions as the memory store's policy
(``celery_fair/policy``), step for step, over locked rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, and_, func, select, update

from ...envelope import subgroup_of
from ...errors import GroupFull
from ...limits import SMALLEST
from ...policy import Placement
from ...policy.decisions import (
    LIVE,
    LOST,
    PICKED,
    QUEUED,
    RUNNING,
    SUPERSEDED,
    copy_id,
    corrected,
    may_release,
    mean_runtime,
    requeues,
    runtime_of,
    skip_copy,
    task_of,
)
from ..models import BeginAnswer, BeginResult, Picked
from . import singletons, subcaps
from .heads import stamp_head, stamp_keyed_head
from .metering import lift_throttles
from .picking import Picking
from .statements import Statements
from .subgrouping import keyed, sort_key
from .unit import Unit, held_count

_LIVE = list(LIVE)


class Lifecycle:
    """The lifecycle steps, for one store's tables and namespace."""

    def __init__(self, s: Statements, ns: str, notify: str | None = None) -> None:
        self.s, self.t, self.ns, self.notify = s, s.t, ns, notify

    def unit(self, conn: Connection, queue: str, lock_queue: bool = False) -> Unit:
        return Unit(conn, self.s, self.ns, queue, lock_queue, self.notify)

    # -- messages ------------------------------------------------------------------------

    def _message(self, conn: Connection, queue: str, hold_id: str) -> dict[str, Any] | None:
        row = self.s.run(conn, "message", {"ns": self.ns, "queue": queue, "hold_id": hold_id}
                         ).mappings().first()
        return None if row is None else dict(row)

    def place(self, u: Unit, g: str, front: bool) -> int:
        """The next place at the head or tail of group ``g``'s lists; under 'smallest' a
        tail hold shares the tail's place, not taking it (its sort key orders it there)."""
        row = u.groups[g]
        assert row is not None
        if front:
            row["head"] -= 1
            return int(row["head"])
        if u.q.get("policy") == SMALLEST or keyed(u):
            return int(row["tail"])
        row["tail"] += 1
        return int(row["tail"]) - 1

    def _insert_message(self, u: Unit, hold_id: str, value: bytes, p: Placement,
                        seq: int | None, due_ms: int | None,
                        sort_key: float | None = None) -> bool:
        """Insert a message; False (nothing written) when one is held under that id."""
        result = self.s.run(u.conn, "message_new", {
            **u.key, "hold_id": hold_id, "task_id": task_of(hold_id), "grp": p.group,
            "klass": p.klass, "cost": p.cost, "front": p.front, "seq": seq, "due_ms": due_ms,
            "value": value, "sort_key": sort_key})
        return (len(result.all()) if result.returns_rows else result.rowcount) == 1

    def _enqueue(self, u: Unit, hold_id: str, p: Placement, now_ms: int,
                 sub: str | None) -> bool:
        """Move a delayed message (of subgroup ``sub``) into its group's list."""
        key = sort_key(u, p, now_ms, sub)
        if key is None:
            stamp_head(u, p, now_ms)
        seq = self.place(u, p.group, p.front)
        m = self.t.messages.c
        u.conn.execute(update(self.t.messages).where(
            m.ns == self.ns, m.queue == u.queue, m.hold_id == hold_id
        ).values(seq=seq, due_ms=None, sort_key=key))
        if key is not None:
            stamp_keyed_head(u, p, [hold_id], now_ms)
        u.groups[p.group][f"held_{p.klass}"] += 1  # type: ignore[index]
        return u.refresh(p.group)

    # -- hold -----------------------------------------------------------------------------

    def hold(self, conn: Connection, queue: str, hold_id: str, value: bytes, p: Placement,
             due_ms: int, now_ms: int) -> tuple[str, bool]:
        """See ``FairQueue.hold``; returns the hold id used and whether to wake. The
        group's row is locked; the message is inserted unless one is held under its id
        (the same value: a resend, held once; another: a copy under a new id)."""
        u = self.unit(conn, queue)
        u.group(p.group, create=True)
        if p.max_held is not None:
            return self._hold_if_room(u, hold_id, value, p, due_ms, now_ms)
        delayed = due_ms > now_ms
        seq = None if delayed else self.place(u, p.group, p.front)
        due = due_ms if delayed else None
        key = None if delayed else sort_key(u, p, now_ms, p.subgroup)
        if not self._insert_message(u, hold_id, value, p, seq, due, key):
            if u.resent(hold_id, value):
                return hold_id, False
            hold_id = copy_id(hold_id, self._next_dup(conn, queue))
            self._insert_message(u, hold_id, value, p, seq, due, key)
        row = u.groups[p.group]
        assert row is not None
        if delayed:
            row["delayed"] += 1
            u.woken = self.first_due(conn, queue) == hold_id
        else:
            if key is None:
                stamp_head(u, p, now_ms)
            else:
                stamp_keyed_head(u, p, [hold_id], now_ms)
            row[f"held_{p.klass}"] += 1
            u.woken = u.refresh(p.group)
        u.flush()
        return hold_id, u.woken

    def _hold_if_room(self, u: Unit, hold_id: str, value: bytes, p: Placement,
                      due_ms: int, now_ms: int) -> tuple[str, bool]:
        """``hold`` under backpressure, the group's row locked: a resend is held once
        (never refused), anything else only while the group holds fewer than
        ``p.max_held`` messages; GroupFull rolls the transaction back."""
        if u.resent(hold_id, value):
            return hold_id, False
        row = u.groups[p.group]
        assert row is not None and p.max_held is not None
        count = held_count(row)
        if count >= p.max_held:
            raise GroupFull(queue=u.queue, group=p.group, count=count, limit=p.max_held)
        return self.hold(u.conn, u.queue, hold_id, value, replace(p, max_held=None),
                         due_ms, now_ms)

    def _next_dup(self, conn: Connection, queue: str) -> int:
        q = self.t.queues.c
        conn.execute(update(self.t.queues).where(q.ns == self.ns, q.queue == queue)
                     .values(dups=q.dups + 1))
        return int(conn.execute(select(q.dups).where(q.ns == self.ns, q.queue == queue))
                   .scalar_one())

    def first_due(self, conn: Connection, queue: str) -> str | None:
        first: str | None = self.s.run(conn, "first_due", {"ns": self.ns, "queue": queue}
                                       ).scalar()
        return first

    # -- pick -----------------------------------------------------------------------------

    def pick(self, conn: Connection, queue: str, want: int, capacity: int | None,
             now_ms: int, lease_ms: int, token: str, make: Any = Picking) -> list[Picked]:
        """See ``FairQueue.pick``: the queue's row locked, so picks of a queue run one at
        a time and never overshoot ``capacity``. ``make``: the pick's class (routing:
        ``sql/routing.py``'s)."""
        u = self.unit(conn, queue, lock_queue=True)
        u.q["picks"] += 1
        u.queue_changed = True
        if capacity is not None:
            want = min(want, capacity - self.inflight(conn, queue))
        if u.paused(""):  # the whole queue is paused
            want = 0
        out: list[Picked] = []
        if want > 0:
            shared = u.q.get("interactive_share") is not None and capacity is not None
            out = make(self.s, u, want, now_ms, now_ms + lease_ms, token, capacity,
                       self.inflight_interactive(conn, queue) if shared else 0).run()
            singletons.take_keys(u, out)
        u.flush()
        return out

    def inflight(self, conn: Connection, queue: str) -> int:
        return int(self.s.run(conn, "inflight", {"ns": self.ns, "queue": queue}).scalar_one())

    def inflight_interactive(self, conn: Connection, queue: str) -> int:
        """The queue's interactive dispatches in flight (the interactive share): its
        live dispatch rows of class 'i', at most its capacity."""
        return int(self.s.run(conn, "inflight_interactive",
                              {"ns": self.ns, "queue": queue}).scalar_one())

    # -- confirm, begin, renew, release ---------------------------------------------------

    def confirm(self, conn: Connection, queue: str, ids: list[str], deadline_ms: int
                ) -> list[str]:
        d = self.t.dispatches.c
        mine = and_(d.ns == self.ns, d.queue == queue, d.did.in_(ids))
        conn.execute(update(self.t.dispatches).where(mine, d.state == PICKED)
                     .values(state=QUEUED, lease_ms=deadline_ms))
        stale = set(conn.execute(select(d.did).where(mine, d.state == SUPERSEDED)).scalars())
        return [did for did in ids if did in stale]

    def dispatch(self, u: Unit, did: str, wall_ms: int) -> dict[str, Any] | None:
        """The record of ``did``, locked (a dispatch's row before its group's: the order
        every transaction takes them in); an expired tombstone reads as none."""
        row = self.s.run(u.conn, "dispatch_lock", {**u.key, "did": did}).mappings().first()
        if row is None or (row["expires_ms"] is not None and row["expires_ms"] <= wall_ms):
            return None
        return dict(row)

    def _set(self, u: Unit, did: str, **values: Any) -> None:
        self.s.dispatch_set(u.conn, {**u.key, "did": did, **values})

    def _hold_lease(self, u: Unit, rec: dict[str, Any], deadline_ms: int) -> str | None:
        """``common._hold_lease``: a worker holds the dispatch; a lost one takes a slot
        again. Returns the state it was in."""
        state: str = rec["state"]
        if state in (SUPERSEDED, "released"):
            return state
        values: dict[str, Any] = {"lease_ms": deadline_ms}
        if state == LOST:
            row = u.group(rec["grp"], create=True)
            assert row is not None
            row["inflight"] += 1
            u.scope_add(rec["grp"], 1)  # fair_scope 'app': the app's count too
            values.update(state=RUNNING, expires_ms=None)
            rec["state"] = RUNNING
            u.refresh(rec["grp"])
        self._set(u, rec["did"], **values)
        return state

    def begin(self, conn: Connection, queue: str, did: str, deadline_ms: int, now_ms: int,
              wall_ms: int, run: str, acks_late: bool, host: str, taken_over: str
              ) -> BeginAnswer:
        u = self.unit(conn, queue)
        rec = self.dispatch(u, did, wall_ms)
        if rec is None:
            return BeginAnswer(BeginResult.RUN_UNKNOWN)
        verdict = skip_copy(rec["state"], rec["runner"], rec["kept"], rec["value"] is not None,
                            rec["lease_ms"], now_ms, run, taken_over, host)
        if isinstance(verdict, str):
            return BeginAnswer(None, verdict)
        if verdict is not None:
            u.count("skipped")
            u.flush()
            return BeginAnswer(verdict)
        state = self._hold_lease(u, rec, deadline_ms)
        self._set(u, did, state=RUNNING, runner=run, kept=acks_late,
                  **({} if acks_late else {"value": None}))
        u.flush()
        return BeginAnswer(BeginResult.RUN_REACQUIRED if state == LOST else BeginResult.RUN)

    def renew(self, conn: Connection, queue: str, ids: list[str], deadline_ms: int,
              wall_ms: int) -> int:
        """Extend the live leases in one statement; a lost dispatch takes a slot again
        (its group's row locked, in name order)."""
        d = self.t.dispatches.c
        mine = and_(d.ns == self.ns, d.queue == queue, d.did.in_(ids))
        renewed = conn.execute(update(self.t.dispatches).where(mine, d.state.in_(_LIVE))
                               .values(lease_ms=deadline_ms)).rowcount
        lost = list(conn.execute(select(d.did, d.grp).where(
            mine, d.state == LOST, (d.expires_ms.is_(None)) | (d.expires_ms > wall_ms))))
        if lost:
            u = self.unit(conn, queue)
            for did, _ in sorted(lost):
                rec = self._locked(u, did)
                if rec is not None and rec["state"] == LOST:
                    self._hold_lease(u, rec, deadline_ms)
                    renewed += 1
            u.flush()
        return int(renewed)

    def release(self, conn: Connection, queue: str, did: str, done_until_ms: int | None,
                run: str, wall_ms: int, runtime: float | None = None, now_ms: int = 0) -> bool:
        u, key = singletons.release_unit(self, conn, queue, did)  # a key: the queue's row first
        rec = self.dispatch(u, did, wall_ms)
        if rec is None or rec["state"] in (SUPERSEDED, "released") \
                or not may_release(rec["runner"], run):
            return False
        freed = rec["state"] != LOST
        sub = subcaps.leaving(u, rec) if freed else ""  # before its row changes
        if done_until_ms is None:
            self.s.run(conn, "dispatch_drop", {**u.key, "did": did})
        else:
            self._set(u, did, state="released", value=None, lease_ms=None,
                      expires_ms=done_until_ms)
        u.count("released")
        if freed:
            self._correct(u, rec, runtime_of(runtime))
            self.free_slot(u, rec["grp"])
        if sub:  # what its subgroup has room for now (FairQueue.release)
            subcaps.unpark(u, rec["grp"], sub)
        singletons.released(u, key, did, now_ms or wall_ms, freed)  # a waiter's head time
        u.flush()
        return bool(freed)

    def _correct(self, u: Unit, rec: dict[str, Any], runtime: float | None) -> None:
        """``FairQueue._correct``: a dispatch charged an estimate corrects its group's
        tag by the runtime it ran, which goes into the group's mean (not under Harmony)."""
        if runtime is None or rec["estimate"] is None or u.harmony():
            return
        g, klass = rec["grp"], rec["klass"]
        row = u.group(g)
        if row is not None:
            row["runtime"] = mean_runtime(row["runtime"], runtime)
        if row is not None and row[f"tag_{klass}"] is not None:
            weight = u.pick_weight(g)
            u.retag(g, klass, corrected(row[f"tag_{klass}"], runtime, rec["estimate"], weight))
            u.scope_charged(klass, g, (runtime - rec["estimate"]) / weight)

    def free_slot(self, u: Unit, g: str) -> None:
        row = u.group(g)
        assert row is not None
        row["inflight"] -= 1
        u.scope_add(g, -1)  # fair_scope 'app': the app's count, and its other queues
        u.refresh(g)
        u.scope_freed(g)
        u.forget_if_idle(g)
        u.woken = True

    # -- reclaim and promote --------------------------------------------------------------

    def reclaim(self, conn: Connection, queue: str, now_ms: int, limit: int,
                tombstone_until_ms: int) -> tuple[int, int]:
        """See ``FairQueue.reclaim``. A dispatch a worker is beginning or releasing right
        now (its row locked) is skipped: its lease is being renewed or ended."""
        u = self.unit(conn, queue, lock_queue=True)
        d = self.t.dispatches.c
        due = [dict(r) for r in conn.execute(select(self.t.dispatches).where(
            d.ns == self.ns, d.queue == queue, d.lease_ms <= now_ms
        ).order_by(d.lease_ms, d.did).limit(limit).with_for_update(skip_locked=True)
        ).mappings()]
        u.lock_groups(r["grp"] for r in due if r["state"] in LIVE)
        requeued = lost = 0
        keys = singletons.SqlKeys(u).dkeys.of(r["did"] for r in due if r["state"] in LIVE)
        for rec in due:
            did = rec["did"]
            if rec["state"] not in LIVE:
                self._set(u, did, lease_ms=None)
                continue
            subcaps.freed(u, rec)  # first: what it unparks goes behind the retry held
            if requeues(rec["state"], rec["kept"], rec["value"] is not None):
                singletons.hold_again(self, u, rec, keys.get(did), now_ms)  # its key, if any
                self._set(u, did, state=SUPERSEDED, value=None, kept=False, lease_ms=None,
                          expires_ms=tombstone_until_ms)
                requeued += 1
            else:
                self._set(u, did, state=LOST, lease_ms=None, expires_ms=tombstone_until_ms)
                lost += 1
                singletons.lost(u, keys.get(did), did, now_ms)
            self.free_slot(u, rec["grp"])
        u.woken = requeued + lost > 0
        u.flush()
        return requeued, lost

    def _locked(self, u: Unit, did: str) -> dict[str, Any] | None:
        row = self.s.run(u.conn, "dispatch_lock", {**u.key, "did": did}).mappings().first()
        return None if row is None else dict(row)

    def _hold_again(self, u: Unit, rec: dict[str, Any], now_ms: int) -> None:
        hold_id = rec["hold_id"]
        if self._message(u.conn, u.queue, hold_id) is not None:
            hold_id = copy_id(hold_id, rec["did"])
        p = Placement(rec["grp"], rec["klass"], rec["cost"], True)
        seq = self.place(u, p.group, True)
        self._insert_message(u, hold_id, bytes(rec["value"]),
                             Placement(p.group, p.klass, p.cost, bool(rec["front"])), seq, None)
        u.groups[p.group][f"held_{p.klass}"] += 1  # type: ignore[index]
        u.groups[p.group][f"since_{p.klass}"] = now_ms  # type: ignore[index]

    def promote(self, conn: Connection, queue: str, now_ms: int, limit: int
                ) -> tuple[int, int | None]:
        """See ``FairQueue.promote``: due delayed messages, then the throttles due."""
        u = self.unit(conn, queue, lock_queue=True)
        admitted = singletons.admitted(u, now_ms)  # waiters other queues handed it
        u.woken = u.scope_admit() or u.woken  # fair_scope 'app': another queue freed a slot
        m = self.t.messages.c
        due = list(conn.execute(select(m.hold_id, m.grp, m.klass, m.cost, m.front,
                                       m.value).where(
            m.ns == self.ns, m.queue == queue, m.due_ms.is_not(None), m.due_ms <= now_ms
        ).order_by(m.due_ms, m.hold_id).limit(limit)))
        u.lock_groups(r.grp for r in due)
        keys = singletons.promoted_keys(u, [r.hold_id for r in due])
        for r in due:
            u.groups[r.grp]["delayed"] -= 1  # type: ignore[index]
            if singletons.waits_when_due(u, r.hold_id, keys, bool(r.front)):
                u.forget_if_idle(r.grp)  # in no group now: its group may have nothing else
            else:
                self._enqueue(u, r.hold_id, Placement(r.grp, r.klass, r.cost, bool(r.front)),
                              now_ms, subgroup_of(bytes(r.value)))
        nxt = conn.execute(select(func.min(m.due_ms)).where(
            m.ns == self.ns, m.queue == queue, m.due_ms.is_not(None))).scalar()
        lift = lift_throttles(u, now_ms, limit)
        u.flush()
        if lift is not None and (nxt is None or lift <= nxt):
            return admitted + len(due), lift
        return admitted + len(due), None if nxt is None else int(nxt)

