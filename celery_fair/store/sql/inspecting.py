"""Where a task stands in the SQL store (``fair inspect``) and its invariant check
(``fair check``), as a mixin of the store."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select, update

from ...policy.decisions import CLASSES, LIVE, OVER, READY, task_of
from ..base import Location
from ..locating import CLASS_NAMES, Locating, PlaceReads, place_of
from .reads import SqlReads
from .scope_checking import check_scope
from .singletons import check_owners
from .statements import LAST_KEY, after_place
from .unit import Unit


class SqlInspecting(SqlReads, Locating):
    """``locate``'s reads and ``check``, over the reads."""

    def _held_at(self, queue: str, task_id: str) -> Location | None:
        m = self.t.messages.c

        def work(c: Connection) -> tuple[Any, int | None] | None:
            row = c.execute(select(m.grp, m.klass, m.seq, m.due_ms, m.sort_key, m.parked,
                                   m.parked_seq).where(
                self._q(self.t.messages, queue), m.hold_id == task_id)).first()
            if row is not None and row.parked is not None:
                return row, self._parked_at(c, queue, row)
            if row is None or row.seq is None:
                return (row, None) if row is not None else None
            before = c.execute(select(func.count()).where(
                self._q(self.t.messages, queue), m.klass == row.klass, m.grp == row.grp,
                m.seq.is_not(None), ~after_place(m)).params(
                    after=row.seq, after_key=LAST_KEY if row.sort_key is None
                    else row.sort_key, after_id=task_id)).scalar_one() - 1
            return row, int(before)
        found = self._read("locate", work)
        if found is None:
            return None
        row, position = found
        where = Location(task_id, queue, row.grp, CLASS_NAMES[row.klass], "held")
        if row.due_ms is not None:
            return Location(task_id, queue, row.grp, CLASS_NAMES[row.klass], "delayed",
                            due_ms=int(row.due_ms))
        reads: PlaceReads = self
        return Location(where.task_id, queue, row.grp, where.klass, "held",
                        place=place_of(reads, queue, row.klass, row.grp, position))

    def _parked_at(self, c: Connection, queue: str, row: Any) -> int:
        """The place of a parked message (caps per subgroup) among what its group holds
        in its class: after the list, then by subgroup and order (``held_ids``)."""
        m, g = self.t.messages.c, self.t.groups.c
        listed = c.execute(select(g[f"held_{row.klass}"]).where(
            self._q(self.t.groups, queue), g.grp == row.grp)).scalar() or 0
        before = c.execute(select(func.count()).where(
            self._q(self.t.messages, queue), m.klass == row.klass, m.grp == row.grp,
            (m.parked < row.parked) | ((m.parked == row.parked)
                                       & (m.parked_seq < row.parked_seq)))).scalar_one()
        return int(listed) + int(before)

    def _copies_at(self, queue: str, task_id: str) -> list[str]:
        m = self.t.messages.c
        found = self._read("locate", lambda c: list(c.execute(select(m.hold_id).where(
            self._q(self.t.messages, queue), m.task_id == task_of(task_id))).scalars()))
        return sorted(h for h in found if h.startswith(task_id + "~"))

    def _dispatched_at(self, queue: str, task_id: str) -> Location | None:
        d = self.t.dispatches.c
        row = self._read("locate", lambda c: c.execute(
            select(d.did, d.state, d.grp, d.klass).where(
                self._q(self.t.dispatches, queue), d.task_id == task_of(task_id),
                d.state.in_(list(LIVE))).order_by(d.lease_ms, d.did).limit(1)).first())
        if row is None:
            return None
        return Location(task_id, queue, row.grp, CLASS_NAMES[row.klass], row.state,
                        dispatch_id=row.did)

    def ready_rank(self, queue: str, klass: str, group: str) -> tuple[int | None, float]:
        r, g, q = self.t.ready.c, self.t.groups.c, self.t.queues.c

        def work(c: Connection) -> tuple[int | None, float]:
            score = c.execute(select(r.tag).where(
                self._q(self.t.ready, queue), r.klass == klass, r.grp == group)).scalar()
            # the group's own tag, as Redis and memory answer (the score under wfq; under
            # Harmony the score is its rank and the tag the one it had under wfq)
            own = c.execute(select(getattr(g, f"tag_{klass}")).where(
                self._q(self.t.groups, queue), g.grp == group)).scalar()
            if score is None:
                vt = c.execute(select(getattr(q, f"vt_{klass}")).where(
                    self._q(self.t.queues, queue))).scalar()
                return None, max(own or 0.0, vt or 0.0)
            ahead = c.execute(select(func.count()).where(
                self._q(self.t.ready, queue), r.klass == klass,
                (r.tag < score) | ((r.tag == score) & (r.grp < group)))).scalar_one()
            return int(ahead), float(own or 0.0)
        return self._read("ready rank", work)

    def ready_before(self, queue: str, klass: str, start: float,
                     limit: int) -> list[tuple[str, float]]:
        r = self.t.ready.c
        rows = self._read("ready before", lambda c: list(c.execute(select(r.grp, r.tag).where(
            self._q(self.t.ready, queue), r.klass == klass, r.tag < start
        ).order_by(r.tag, r.grp).limit(limit))))
        return [(g, float(t)) for g, t in rows]

    def check_scope(self, repair: bool, *, batch: int = 0
                    ) -> list[tuple[str, str, str, str]]:
        """fair_scope 'app' (``scope_checking.py``): one transaction, the count rows of
        each batch of groups locked."""
        return self._read("check scope", lambda c: check_scope(c, self.t, self.namespace,
                                                               repair))

    def check(self, queue: str, repair: bool, now_ms: int, lease_ms: int, *,
              batch: int = 0) -> list[tuple[str, str, str, str]]:
        """Counts that disagree with the rows they count, and ready sets that disagree
        with eligibility; with ``repair`` each is set from the rows (one transaction, the
        queue's row locked, so beside running dispatchers and workers)."""
        return self._read("check", lambda c: self._check(c, queue, repair, now_ms))

    def _check(self, c: Connection, queue: str, repair: bool,
               now_ms: int) -> list[tuple[str, str, str, str]]:
        u = Unit(c, self.s, self.namespace, queue, lock_queue=True)
        m, d, g = self.t.messages.c, self.t.dispatches.c, self.t.groups.c
        counted: dict[str, dict[str, int]] = {}
        for grp, klass, seq_set, n in c.execute(select(
                m.grp, m.klass, m.seq.is_not(None), func.count()).where(
                self._q(self.t.messages, queue),  # not those waiting for their key
                m.seq.is_not(None) | m.due_ms.is_not(None)).group_by(
                m.grp, m.klass, m.seq.is_not(None))):
            key = f"held_{klass}" if seq_set else "delayed"
            counted.setdefault(grp, {})[key] = counted.get(grp, {}).get(key, 0) + int(n)
        for grp, klass, n in c.execute(select(m.grp, m.klass, func.count()).where(
                self._q(self.t.messages, queue), m.parked.is_not(None)).group_by(
                m.grp, m.klass)):  # parked (caps per subgroup)
            counted.setdefault(grp, {})[f"parked_{klass}"] = int(n)
        for grp, n in c.execute(select(d.grp, func.count()).where(
                self._q(self.t.dispatches, queue), d.state.in_(list(LIVE))).group_by(d.grp)):
            counted.setdefault(grp, {})["inflight"] = int(n)
        names = set(counted) | set(c.execute(select(g.grp).where(
            self._q(self.t.groups, queue))).scalars())
        u.lock_groups(names)
        out = self._check_throttles(u, repair)
        for name in sorted(names):
            out += self._check_group(u, name, counted.get(name, {}), repair)
        out += check_owners(u, repair, now_ms)  # after the counts: a repair admits a waiter
        u.flush()
        return out

    def _check_throttles(self, u: Unit, repair: bool) -> list[tuple[str, str, str, str]]:
        """The queue's count of throttles against its rows: a count of 0 over a throttle
        would let the group be picked (eligibility reads them only when counted)."""
        th, q = self.t.throttles.c, self.t.queues.c
        rows = int(u.conn.execute(select(func.count()).where(
            th.ns == u.ns, th.queue == u.queue)).scalar_one())
        have = u.q.get("throttles") or 0
        u.q["throttles"] = rows  # eligibility below is judged on the rows
        if have == rows:
            return []
        if repair:
            u.conn.execute(update(self.t.queues).where(q.ns == u.ns, q.queue == u.queue)
                           .values(throttles=rows))
        return [("count", "throttles", f"counted {have}, rows {rows}",
                 "set from the rows" if repair else "")]

    def _check_group(self, u: Unit, name: str, rows: dict[str, int],
                     repair: bool) -> list[tuple[str, str, str, str]]:
        out = []
        row = u.group(name, create=repair and any(rows.values()))
        for field in ("inflight", "delayed", "held_i", "held_b", "parked_i", "parked_b"):
            have = row[field] if row else 0
            if have != rows.get(field, 0):
                out.append(("count", f"{name}:{field}", f"counted {have}, rows "
                            f"{rows.get(field, 0)}", "set from the rows" if repair else ""))
                if repair and row is not None:
                    row[field] = rows.get(field, 0)
        u.load_ready([(k, name) for k in CLASSES])
        counts = None if row is None else (row["held_i"], row["held_b"], row["inflight"])
        # fair_scope 'app': another queue freed a slot of g, which the next promote here
        # refreshes (scoping.py): its sets may not say so yet
        marked = u.scope_marked(name)
        for klass in CLASSES:
            where = u.standing_of(klass, name, counts)
            # fair_scope 'app': another queue's picks may have taken g to its cap since
            # it was ranked here; the pick passes such a member over (scoping.py)
            lazy = marked or u.app_scoped() and u.ready[(klass, name)] is not None \
                and counts is not None and counts[0 if klass == "i" else 1] > 0
            if (where == READY) != (u.ready[(klass, name)] is not None) and not lazy:
                out.append(("ready", f"{klass}:{name}", "ready set and eligibility differ",
                            "re-ranked" if repair else ""))
            # a stale ready member (above) stands over before it leaves the ready set
            stale = lazy and where == OVER and u.ready[(klass, name)] is not None \
                and u.over[(klass, name)] is None
            if (where == OVER) != (u.over[(klass, name)] is not None) and not (marked or stale):
                out.append(("over", f"{klass}:{name}", "over set and standing differ",
                            "re-ranked" if repair else ""))
        if repair:
            u.refresh(name)
            u.forget_if_idle(name)
        return out
