"""One pick of the SQL store (``FairQueue.pick``): the loop over the heads of the ready
sets it read, the messages of the groups it reaches read in one query, and what it took
written back in a few multi-row statements."""

from __future__ import annotations

import collections
import heapq
from typing import Any

from sqlalchemy import delete, text

from ...limits import COST, RUNTIME
from ...policy.decisions import PICKED, advance, charged, dispatch_id, task_of
from ..models import Picked
from .metering import Meter
from .statements import Statements
from .unit import Unit


class Picking:
    """One pick's loop (``FairQueue.pick``) over the ready sets' heads it read."""

    def __init__(self, s: Statements, u: Unit, want: int, now_ms: int, deadline_ms: int,
                 token: str) -> None:
        self.s, self.u, self.want, self.deadline = s, u, want, deadline_ms
        self.token = token
        self.meter = Meter(u, now_ms)
        self.now_ms = now_ms
        # Groups past the first `want` of a ready set cannot be reached by `want` picks:
        # each pick moves one group back, and an untouched group read stays ahead.
        self.heads = {k: dict(u.head_of_ready(k, want)) for k in ("i", "b")}
        self.order = {k: [(t, g.encode(), g) for g, t in self.heads[k].items()]
                      for k in ("i", "b")}  # heaps of (tag, name bytes, name)
        for heap in self.order.values():
            heapq.heapify(heap)
        self.lists: dict[tuple[str, str], collections.deque[Any]] = {}
        self.records: list[dict[str, Any]] = []
        self.last: dict[tuple[str, str], int] = {}  # the place of the last message taken
        self.per = want + 1  # messages read at once from one group
        self.charge = u.q["charge"] or COST  # fair_charge (None: configured before it)
        self.harmony = u.harmony()

    def _head(self) -> tuple[str, str, float] | None:
        """The lowest (tag, name) of the ready groups read, interactive first; under
        Harmony the lower (rank, name) of both classes' heads, interactive on a tie
        (``FairQueue._head``). A heap per class, whose stale entries (a group whose tag
        moved or that left) are dropped when they come up."""
        heads = []
        for i, klass in enumerate(("i", "b")):
            heap = self.order[klass]
            while heap and self.u.ready.get((klass, heap[0][2])) != heap[0][0]:
                heapq.heappop(heap)
            if heap:
                tag, name, g = heap[0]
                heads.append((tag, name, i, klass, g))
                if not self.harmony:
                    break
        if not heads:
            return None
        tag, _, _, klass, g = min(heads)
        return klass, g, tag

    def _requeue(self, g: str) -> None:
        """Put g back in the heaps at its tags now (after a pick moved it)."""
        for klass in ("i", "b"):
            tag = self.u.ready.get((klass, g))
            if g in self.heads[klass] and tag is not None:
                heapq.heappush(self.order[klass], (tag, g.encode(), g))

    def run(self) -> list[Picked]:
        u = self.u
        out: list[Picked] = []
        taken: list[str] = []
        reachable = sorted({g for k in self.heads for g in self.heads[k]})
        u.lock_groups(reachable)
        u.load_limits(reachable)
        u.know_throttled(reachable, False)  # in a ready set: not throttled
        self.meter.load(reachable)
        reached = sum(len(heads) for heads in self.heads.values())
        self.per = -(-self.want // max(reached, 1)) + 1  # an even share, and one more
        for klass in ("i", "b"):
            self._prefetch(klass, sorted(self.heads[klass]))
        while len(out) < self.want and (head := self._head()) is not None:
            klass, g, tag = head
            msg = self._pop(klass, g)
            row = u.groups[g]
            assert row is not None
            estimate = None  # what a 'runtime' charge corrects at release
            if self.harmony:  # served now; a jump (boost_task) is spent
                u.q["served"] = (u.q["served"] or 0) + 1
                u.queue_changed = True
                row["served"], row["jump"] = u.q["served"], None
            else:
                u.set_vt(klass, tag)
                spent = charged(self.charge, msg.cost, row["runtime"])
                row[f"tag_{klass}"] = advance(tag, spent, u.pick_weight(g))
                estimate = spent if self.charge == RUNTIME else None
            row["inflight"] += 1
            row[f"held_{klass}"] -= 1
            row[f"since_{klass}"] = self.now_ms  # the next one is the head now
            did = dispatch_id(self.token, u.q["picks"], len(out) + 1)
            taken.append(msg.hold_id)
            out.append(Picked(did, msg.hold_id, bytes(msg.value)))
            self._record(did, msg, klass, g, estimate)
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
            "SELECT h.grp, h.hold_id, h.cost, h.front, h.value, h.seq "
            "FROM unnest(CAST(:groups AS text[])) AS g(grp) CROSS JOIN LATERAL ("
            f"SELECT m.grp, m.hold_id, m.cost, m.front, m.value, m.seq FROM {table} m "
            "WHERE m.ns = :ns AND m.queue = :queue AND m.klass = :klass "
            'AND m.grp = g.grp COLLATE "C" AND m.seq IS NOT NULL '
            "ORDER BY m.seq LIMIT :per) AS h ORDER BY h.grp, h.seq")

    def _pop(self, klass: str, g: str) -> Any:
        key = (klass, g)
        queue = self.lists.setdefault(key, collections.deque())
        if not queue:
            after = self.last.get(key, -(2 ** 62))
            queue.extend(self.s.run(self.u.conn, "message_heads", {
                **self.u.key, "klass": klass, "grp": g, "n": self.per, "after": after}))
        msg = queue.popleft()
        self.last[key] = msg.seq
        return msg

    def _record(self, did: str, msg: Any, klass: str, g: str,
                estimate: float | None) -> None:
        self.records.append({**self.u.key, "did": did, "state": PICKED, "hold_id": msg.hold_id,
                             "task_id": task_of(msg.hold_id), "grp": g, "klass": klass,
                             "cost": msg.cost, "front": msg.front, "value": msg.value,
                             "kept": False, "runner": "", "lease_ms": self.deadline,
                             "expires_ms": None,
                             "estimate": estimate})

    def _write(self, taken: list[str]) -> None:
        if taken:
            m = self.s.t.messages
            for i in range(0, len(taken), 500):  # one statement: no row-by-row executemany
                self.u.conn.execute(delete(m).where(
                    m.c.ns == self.u.ns, m.c.queue == self.u.queue,
                    m.c.hold_id.in_(taken[i:i + 500])))
            self.s.many(self.u.conn, "dispatch_new", self.records)
