"""One pick of the SQL store (``FairQueue.pick``): the loop over the heads of the ready
sets it read, the messages of the groups it reaches read in one query, and what it took
written back in a few multi-row statements."""

from __future__ import annotations

import collections
import heapq
from typing import Any

from sqlalchemy import delete, select, text, tuple_

from ...envelope import subgroup_of
from ...limits import COST, PATH_SUBGROUP, RUNTIME
from ...policy.decisions import (
    PICKED,
    advance,
    background_first,
    charged,
    dispatch_id,
    task_of,
)
from ..models import Picked
from . import subcaps
from .metering import Meter
from .statements import LAST_KEY, Statements
from .subgrouping import picked
from .unit import Unit

#: Ready rows read at once past the first ``want`` (``Picking._page``).
PAGE = 32

class Picking:
    """One pick's loop (``FairQueue.pick``) over the ready sets' heads it read."""

    def __init__(self, s: Statements, u: Unit, want: int, now_ms: int, deadline_ms: int,
                 token: str, capacity: int | None = None, inflight_i: int = 0) -> None:
        self.s, self.u, self.want, self.deadline = s, u, want, deadline_ms
        self.token = token
        self.meter = Meter(u, now_ms)
        self.now_ms = now_ms
        self.capacity, self.inflight_i = capacity, inflight_i  # the interactive share's
        self.synced: set[tuple[str, str]] = set()  # wfq shares: heads looked at (scoping)
        # Groups past the first `want` of a ready set cannot be reached by `want` picks:
        # each pick moves one group back, and an untouched group read stays ahead. The
        # same holds for the over sets (soft caps), which a group may also enter during
        # the pick (at its cap now): it is known then, and joins the heap.
        kinds = ("ready", "over") if u.soft() else ("ready",)
        self.heads = {(kind, k): dict(u.head_of_ready(k, want) if kind == "ready"
                                      else u.head_of_over(k, want))
                      for kind in kinds for k in ("i", "b")}
        self.order = {key: [(t, g.encode(), g) for g, t in heads.items()]
                      for key, heads in self.heads.items()}  # heaps of (tag, name bytes, name)
        for heap in self.order.values():
            heapq.heapify(heap)
        self.lists: dict[tuple[str, str], collections.deque[Any]] = {}
        self.records: list[dict[str, Any]] = []
        #: the place of the last message taken: (seq, sort key or LAST_KEY, hold id)
        self.last: dict[tuple[str, str], tuple[int, float, str]] = {}
        self.per = want + 1  # messages read at once from one group
        self.charge = u.q["charge"] or COST  # fair_charge (None: configured before it)
        self.harmony = u.harmony()
        self.path = u.q.get("subgroup") == PATH_SUBGROUP  # caps per subgroup may bind
        #: (kind, class) -> the last (tag, name) read, None when no bound holds (the whole
        #: set read, or the `want` rule above holds). Under fair_scope 'app' a head may be
        #: moved back without a pick (stale, behind: scoping.py), so the rule does not hold
        #: there: a head read is the set's only while it is within the rows read, and the
        #: set is read further (``_page``) when none is.
        self.bound: dict[tuple[str, str], tuple[float, bytes] | None] = {
            key: (max((t, g.encode()) for g, t in heads.items())
                  if self._bounded() and len(heads) >= want else None)
            for key, heads in self.heads.items()}

    def _bounded(self) -> bool:
        return self.u.app_scoped()

    def _known(self, kind: str) -> dict[tuple[str, str], float | None]:
        return self.u.ready if kind == "ready" else self.u.over

    def _top(self, kind: str, klass: str) -> tuple[str, str, float] | None:
        """The lowest (tag, name) of a set's groups read, its stale entries (a group
        whose tag moved or that left) dropped when they come up; within the rows read
        (``bound``), reading further while none is."""
        heap = self.order.get((kind, klass), [])
        known = self._known(kind)
        while True:
            while heap and known.get((klass, heap[0][2])) != heap[0][0]:
                heapq.heappop(heap)
            bound = self.bound.get((kind, klass))
            if bound is None or (heap and heap[0][:2] <= bound):
                return (klass, heap[0][2], heap[0][0]) if heap else None
            self._page(kind, klass, bound)

    def _page(self, kind: str, klass: str, bound: tuple[float, bytes]) -> None:
        """Read the next rows of a set after ``bound``; lock and load their groups."""
        u = self.u
        table = u.t.ready if kind == "ready" else u.t.over
        c = table.c
        rows = [(g, t) for g, t in u.conn.execute(
            select(c.grp, c.tag).where(
                c.ns == u.ns, c.queue == u.queue, c.klass == klass,
                tuple_(c.tag, c.grp) > tuple_(bound[0], bound[1].decode()))
            .order_by(c.tag, c.grp).limit(PAGE))]
        fresh = [(g, t) for g, t in rows if (klass, g) not in self._known(kind)]
        for g, t in fresh:
            (u._know if kind == "ready" else u._know_over)((klass, g), t)
        self.bound[(kind, klass)] = (rows[-1][1], rows[-1][0].encode()) \
            if len(rows) >= PAGE else None
        names = sorted({g for g, _ in fresh})
        self.heads[(kind, klass)].update(fresh)
        u.lock_groups(names)
        u.load_limits(names)
        u.know_throttled(names, False)
        self.meter.load(names)
        self._loaded(set(names))
        for g, t in fresh:
            if self._known(kind).get((klass, g)) == t:
                heapq.heappush(self.order[(kind, klass)], (t, g.encode(), g))

    def _loaded(self, groups: set[str]) -> None:
        """Groups just read past the first rows (a hook: routing reads their owners)."""

    def _head(self) -> tuple[str, str, float] | None:
        """The head of the ready sets read, else (soft caps) of the over sets
        (``FairQueue._head``): interactive first under wfq; under Harmony the lower
        (rank, name) of both classes' heads, interactive on a tie; background first while
        interactive holds its share (``decisions.background_first``)."""
        first_b = background_first(self.inflight_i, self.u.q.get("interactive_share"),
                                   self.capacity)
        for kind in ("ready", "over"):
            if (kind, "i") not in self.order:
                break
            i, b = self._top(kind, "i"), self._top(kind, "b")
            if first_b and b is not None:
                return b
            if self.harmony and i is not None and b is not None:
                return min(i, b, key=lambda h: (h[2], h[1].encode(), h[0] != "i"))
            head = i or b
            if head is not None:
                return head
        return None

    def _requeue(self, g: str) -> None:
        """Put g back in the heaps at its tags now (after a pick moved it): in a ready
        set it was read from, or in an over set (read from, or entered now)."""
        for (kind, klass), heap in self.order.items():
            tag = self._known(kind).get((klass, g))
            if tag is not None and (kind == "over" or g in self.heads[(kind, klass)]):
                heapq.heappush(heap, (tag, g.encode(), g))

    def run(self) -> list[Picked]:
        u = self.u
        out: list[Picked] = []
        taken: list[str] = []
        reachable = sorted({g for heads in self.heads.values() for g in heads})
        u.lock_groups(reachable)
        u.load_limits(reachable)
        u.know_throttled(reachable, False)  # in a ready set: not throttled
        self.meter.load(reachable)
        reached = sum(len(heads) for heads in self.heads.values())
        self.per = -(-self.want // max(reached, 1)) + 1  # an even share, and one more
        for klass in ("i", "b"):
            self._prefetch(klass, sorted({g for (_, k), heads in self.heads.items()
                                          if k == klass for g in heads}))
        while len(out) < self.want and self._open() and (head := self._head()) is not None:
            klass, g, tag = head
            if u.scope_stale(klass, g):  # fair_scope 'app': at its cap across queues
                u.refresh(g)
                self._requeue(g)
                continue
            if (behind := u.scope_behind(klass, g, self.synced)) is not None:
                u.retag(g, klass, tag + behind)  # charged by other queues: look again
                u.refresh(g)
                self._requeue(g)
                continue
            msg = self._pop(klass, g)
            row = u.groups[g]
            assert row is not None
            sub = (subgroup_of(bytes(msg.value)) or "") if self.path else ""
            if sub and subcaps.room(u, g, sub) == 0:  # its subgroup at its cap: parked
                subcaps.park(u, row, klass, msg, sub, self.now_ms)
                continue  # its head changed, it may have left: look again
            estimate = None  # what a 'runtime' charge corrects at release
            if self.harmony:  # served now; a jump (boost_task) is spent
                u.q["served"] = (u.q["served"] or 0) + 1
                u.queue_changed = True
                row["served"], row["jump"] = u.q["served"], None
            else:
                u.set_vt(klass, tag)
                spent = charged(self.charge, msg.cost, row["runtime"])
                weight = u.pick_weight(g)
                row[f"tag_{klass}"] = advance(tag, spent, weight)
                u.scope_charged(klass, g, spent / weight)
                estimate = spent if self.charge == RUNTIME else None
            row["inflight"] += 1
            u.scope_add(g, 1)
            if sub:
                subcaps.count_picked(u, g, sub)
            self.inflight_i += klass == "i"
            row[f"held_{klass}"] -= 1
            picked(u, row, klass, msg)  # fair_subgroup: the list's virtual time
            row[f"since_{klass}"] = self.now_ms  # the next one is the head now
            did = dispatch_id(self.token, u.q["picks"], len(out) + 1)
            taken.append(msg.hold_id)
            out.append(Picked(did, msg.hold_id, bytes(msg.value)))
            self._record(did, msg, klass, g, estimate, sub)
            u.refresh(g)  # under Harmony its rank moved, in both classes
            self.meter(g)  # after the re-ranking, as FairQueue.pick
            self._requeue(g)
        self._write(taken)
        self.meter.write()
        return out

    def _prefetch(self, klass: str, groups: list[str]) -> None:
        """On PostgreSQL, the first messages of every group read from the ready set in one
        query (an index range per group, each with its LIMIT, through LATERAL): as many per
        group as an even share of the pick, and one more; a group that gives more is read
        again after its last message. Elsewhere each group is read when first reached
        (MariaDB has no LATERAL; SQLite has no round trips to save)."""
        if not groups or self.u.conn.dialect.name != "postgresql":
            return
        found: dict[str, list[Any]] = {}
        for row in self.u.conn.execute(self._lateral(), {
                **self.u.key, "klass": klass, "groups": groups, "per": self.per}):
            found.setdefault(row.grp, []).append(row)
        for g in groups:
            self.lists[(klass, g)] = collections.deque(found.get(g, ()))

    def _lateral(self) -> Any:
        table = self.s.t.messages.name  # a validated prefix and a fixed name
        return text(
            "SELECT h.grp, h.hold_id, h.cost, h.front, h.value, h.seq, h.sort_key "
            "FROM unnest(CAST(:groups AS text[])) AS g(grp) CROSS JOIN LATERAL ("
            "SELECT m.grp, m.hold_id, m.cost, m.front, m.value, m.seq, m.sort_key "
            f"FROM {table} m "
            "WHERE m.ns = :ns AND m.queue = :queue AND m.klass = :klass "
            'AND m.grp = g.grp COLLATE "C" AND m.seq IS NOT NULL '
            f"ORDER BY m.seq, COALESCE(m.sort_key, {LAST_KEY!r}), m.hold_id LIMIT :per) AS h "
            f"ORDER BY h.grp, h.seq, COALESCE(h.sort_key, {LAST_KEY!r}), h.hold_id")

    def _pop(self, klass: str, g: str) -> Any:
        key = (klass, g)
        queue = self.lists.setdefault(key, collections.deque())
        if not queue:
            after, after_key, after_id = self.last.get(key, (-(2 ** 62), -LAST_KEY, ""))
            queue.extend(self.s.run(self.u.conn, "message_heads", {
                **self.u.key, "klass": klass, "grp": g, "n": self.per, "after": after,
                "after_key": after_key, "after_id": after_id}))
        msg = queue.popleft()
        self.last[key] = (msg.seq, LAST_KEY if msg.sort_key is None else msg.sort_key,
                          msg.hold_id)
        return msg

    def _record(self, did: str, msg: Any, klass: str, g: str,
                estimate: float | None, sub: str) -> None:
        self.records.append({**self.u.key, "did": did, "state": PICKED, "hold_id": msg.hold_id,
                             "task_id": task_of(msg.hold_id), "grp": g, "klass": klass,
                             "cost": msg.cost, "front": msg.front, "value": msg.value,
                             "kept": False, "runner": "", "lease_ms": self.deadline,
                             "expires_ms": None,
                             "estimate": estimate, "target": self._target(klass),
                             "subgroup": sub or None})

    def _open(self) -> bool:
        """Whether the pick may go on (routing: while a target has room)."""
        return True

    def _target(self, klass: str) -> str | None:
        """The target of the message of ``klass`` just taken (routing; None: not routed)."""
        return None

    def _write(self, taken: list[str]) -> None:
        if taken:
            m = self.s.t.messages
            for i in range(0, len(taken), 500):  # one statement: no row-by-row executemany
                self.u.conn.execute(delete(m).where(
                    m.c.ns == self.u.ns, m.c.queue == self.u.queue,
                    m.c.hold_id.in_(taken[i:i + 500])))
            self.s.many(self.u.conn, "dispatch_new", self.records)
