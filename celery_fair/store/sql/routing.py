"""The SQL store's affinity routing (see ``store/routing.py``): the map in the
``assignments`` table, each routed dispatch's target in its row (``dispatches.target``),
and the routed pick (:class:`RoutedPicking`, the policy's ``RouteCall`` over the ready
rows it reads).

A target's routed dispatches in flight are counted from the live dispatch rows (state
picked, queued or running, through the ``dispatches_state`` index: O(the queue's
dispatches in flight)) once per pick, under the queue row's lock that serializes the
picks. No counter row: every release of a worker's task would write that worker's row
(one hot row per worker, and one more lock in every release), and a count kept apart
from the rows could drift from them; reading the rows, release, reclaim and a lost
dispatch's renewal give the slot back by changing the dispatch's state, as they already
do. A release committing while a pick counts is counted as still in flight: the pick
sees a little less room, never more than there is."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, func, literal_column, select

from ...policy.decisions import LIVE
from ...policy.routing import ROUTE_SCAN, RouteCall, assigned
from ..models import Picked
from ..routing import Routed
from .lifecycle import Lifecycle
from .picking import Picking
from .rows import chunks, counter_totals, upsert
from .schema import Tables
from .unit import Unit

T = TypeVar("T")



class RoutedPicking(Picking):
    """A pick with routing: a set's head is its first group that may go now
    (``RouteCall.top``, as ``FairQueue._top``). The rows past the first ``want`` of a
    set are read a page at a time, only while every group read so far is looked past:
    a set's groups up to the last row read (``bound``) are all known, so the first that
    may go among them is the set's."""

    def __init__(self, *args: Any, routing: RouteCall, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.routing = routing
        self.owner: dict[str, str] = {}
        self._read_owners({g for heads in self.heads.values() for g in heads})

    def _open(self) -> bool:
        return self.routing.open > 0

    def _target(self, klass: str) -> str | None:
        return self.routing.taken(klass)

    def _since(self, g: str, klass: str) -> int | None:
        row = self.u.groups.get(g)
        return None if row is None else row[f"since_{klass}"]

    def _top(self, kind: str, klass: str) -> tuple[str, str, float] | None:
        key, known = (kind, klass), self._known(kind)
        while True:
            bound = self.bound.get(key)
            entries = sorted({(t, b, g) for t, b, g in self.order.get(key, [])
                              if known.get((klass, g)) == t
                              and (bound is None or (t, b) <= bound)})
            found = self.routing.top(((g, t) for t, _, g in entries), klass,
                                     self.owner.get, self._since)
            if found is not None:
                return klass, found[0], found[1]
            if bound is None or len(entries) >= ROUTE_SCAN:
                return None
            self._page(kind, klass, bound)

    def _bounded(self) -> bool:
        return True  # a head may be looked past: read further while every one read is

    def _loaded(self, groups: set[str]) -> None:
        self._read_owners(groups)

    def _read_owners(self, groups: set[str]) -> None:
        c = self.u.t.assignments.c
        for chunk in chunks(sorted(groups - set(self.owner)), 500):
            self.owner.update(self.u.conn.execute(select(c.grp, c.target).where(
                c.ns == self.u.ns, c.queue == self.u.queue, c.grp.in_(chunk))).all())


def target_inflight(conn: Connection, t: Tables, ns: str, queue: str) -> dict[str, int]:
    """Each target's routed dispatches in flight, from the live dispatch rows."""
    d = t.dispatches.c
    live: list[Any] = [literal_column(f"'{state}'") for state in LIVE]
    return {w: int(n) for w, n in conn.execute(
        select(d.target, func.count()).where(
            d.ns == ns, d.queue == queue, d.state.in_(live), d.target.is_not(None))
        .group_by(d.target))}


class SqlRouting:
    """Routes groups to targets (a mixin of :class:`~celery_fair.store.sql.store.SqlStore`)."""

    t: Tables
    namespace: str
    life: Lifecycle
    supports_affinity = True

    def _do(self, name: str, queue: str, work: Callable[[Connection], T]) -> T:
        raise NotImplementedError  # SqlStore runs its transactions

    def pick_routed(self, queue: str, limit: int, capacity: int | None, now_ms: int,
                    lease_ms: int, workers: Mapping[str, int], spill_ms: int | None, *,
                    promote: bool = False, token: str | None = None) -> Routed:
        promoted: tuple[int, int | None] = (0, None)
        if promote:  # two transactions: the contract allows it (Redis: one round trip)
            promoted = self.promote(queue, now_ms, 1000)  # type: ignore[attr-defined]
        if not workers:  # no live target: nothing goes, no pick counted
            return Routed(promoted=promoted)

        def work(conn: Connection) -> tuple[list[Picked], RouteCall]:
            call = RouteCall.of(workers, target_inflight(conn, self.t, self.namespace,
                                                         queue), spill_ms, now_ms)
            return self.life.pick(conn, queue, limit, capacity, now_ms, lease_ms,
                                  token or uuid.uuid4().hex[:12] + ".",
                                  partial(RoutedPicking, routing=call)), call

        picked, call = self._do("pick", queue, work)
        return Routed(picked, list(call.targets), sorted(call.unassigned), promoted)

    def assign(self, queue: str, changes: Sequence[tuple[str, str | None, str]]) -> int:
        if not changes:
            return 0
        return self._do("assign", queue, lambda c: self._assign(c, queue, changes))

    def _assign(self, conn: Connection, queue: str,
                changes: Sequence[tuple[str, str | None, str]]) -> int:
        """Under the queue row's lock (one writer of the map at a time, and no pick
        between the reads and the writes)."""
        u = Unit(conn, self.life.s, self.namespace, queue, lock_queue=True)
        names = sorted({g for g, _, _ in changes})
        a, gr = self.t.assignments.c, self.t.groups.c
        current: dict[str, str] = {}
        known: set[str] = set()
        for chunk in chunks(names, 500):
            current.update(conn.execute(select(a.grp, a.target).where(
                a.ns == u.ns, a.queue == queue, a.grp.in_(chunk))).all())
            known.update(conn.execute(select(gr.grp).where(
                gr.ns == u.ns, gr.queue == queue, gr.grp.in_(chunk))).scalars())
        moves, put, drop = 0, {}, set()
        for g, old, new in changes:
            keep, moved = assigned(current.get(g, ""), old, new, g in known)
            if keep == "":
                drop.add(g)
                current.pop(g, None)
            elif keep is not None:
                put[g] = current[g] = keep
                drop.discard(g)
            moves += moved
        for chunk in chunks(sorted(drop), 500):
            conn.execute(delete(self.t.assignments).where(
                a.ns == u.ns, a.queue == queue, a.grp.in_(chunk)))
        upsert(conn, self.t.assignments, [{**u.key, "grp": g, "target": w}
                                          for g, w in put.items()], ["target"])
        if moves:
            u.count("moves", moves)
            u.flush()
        return moves

    def assignments(self, queue: str) -> dict[str, str]:
        a = self.t.assignments.c
        return self._do("assignments", queue, lambda c: dict(c.execute(
            select(a.grp, a.target).where(a.ns == self.namespace, a.queue == queue)
        ).all()))

    def worker_inflight(self, queue: str) -> dict[str, int]:
        return self._do("worker_inflight", queue, lambda c: target_inflight(
            c, self.t, self.namespace, queue))

    def affinity_moves(self, queue: str) -> int:
        return self._do("affinity_moves", queue, lambda c: counter_totals(
            c, self.t, self.namespace, queue).get("moves", 0))
