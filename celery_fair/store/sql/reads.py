"""The SQL store's reads, summaries and maintenance: plain queries (not atomic across
calls; for status, metrics, dashboards and ``fair inspect``). The worker registry is
``registry.py``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Callable, TypeVar

from sqlalchemy import Connection, Engine, and_, delete, func, select, update

from ...envelope import due_of
from ...policy import CLASSES, QueueState
from ...policy.decisions import LIVE, in_force
from ..base import (
    PRUNE_GRACE_MS,
    DispatcherBeat,
    GroupFigures,
    GroupHeads,
    Location,
    QueueFigures,
    busiest_first,
    limited_by,
    snapshot_of,
)
from ..held import HeldMessage
from .engine import transaction
from .migrate import check_schema
from .rows import counter_totals, insert_ignore, upsert
from .schema import Tables
from .statements import Statements, list_order

T = TypeVar("T")
_LIVE = list(LIVE)


def _now() -> int:
    return int(time.time() * 1000)



#: Serializes the first schema check of every SQL store in the process (require_schema).
_SCHEMA_CHECK = threading.Lock()

class SqlReads:
    """A mixin of :class:`~celery_fair.store.sql.store.SqlStore` (it gives the engine,
    tables, namespace and wake-ups)."""

    engine: Engine
    t: Tables
    s: Statements
    namespace: str
    where: str
    wakes: Any
    retries: int
    timeout: float

    def _read(self, what: str, work: Callable[[Connection], T]) -> T:
        self.require_schema()
        return transaction(self.engine, f"{self.where}: {what}", work, self.retries,
                           self.timeout)

    _schema_ok = False

    def require_schema(self) -> None:
        """Refuse to work on a missing or out-of-date schema (checked once per store).

        Raises:
            SchemaOutOfDate: naming the database and ``celery -A proj fair migrate``.
        """
        if self._schema_ok:
            return
        # Once, by one thread: threads of a web server each making their first read at
        # once raced through SQLAlchemy's lazy imports inside the check (a partially
        # initialized sqlalchemy.orm.exc, seen as a 500 from the example's page).
        with _SCHEMA_CHECK:
            if not self._schema_ok:
                check_schema(self.engine, self.t.prefix, "store")
                self._schema_ok = True

    def _q(self, table: Any, queue: str) -> Any:
        return and_(table.c.ns == self.namespace, table.c.queue == queue)

    def held_messages(self, queue: str, group: str, limit: int,
                      klass: str | None = None) -> list[HeldMessage]:
        m = self.t.messages.c
        # messages_list's order: (klass, grp, seq); 'b' < 'i', so interactive is sorted
        # first by descending class; a class's list, then its parked messages (caps per
        # subgroup) by subgroup and order (``SubgroupCaps.held_ids``)
        where = [self._q(self.t.messages, queue), m.grp == group,
                 m.seq.is_not(None) | m.parked.is_not(None)]
        if klass:
            where.append(m.klass == klass)
        rows = self._read("held messages", lambda c: c.execute(
            select(m.hold_id, m.klass, m.value).where(*where)
            .order_by(m.klass.desc(), m.parked.is_not(None), *list_order(m), m.parked,
                      m.parked_seq).limit(limit)).all())
        return [HeldMessage(r.hold_id, r.klass, bytes(r.value)) for r in rows]

    # -- queues and workers ------------------------------------------------------------

    def queues(self) -> list[str]:
        q = self.t.queues.c
        names = self._read("queues", lambda c: list(c.execute(select(q.queue).where(
            q.ns == self.namespace, q.registered.is_(True))).scalars()))
        return sorted(names)

    def forget_queue(self, queue: str) -> bool:
        def work(c: Connection) -> bool:
            q = self.t.queues
            row = c.execute(select(q.c.registered).where(self._q(q, queue))
                            .with_for_update()).first()
            if row is None or not row.registered or not self._empty(c, queue):
                return False
            c.execute(update(q).where(self._q(q, queue)).values(registered=False))
            return True
        return self._read("forget queue", work)

    def _empty(self, c: Connection, queue: str) -> bool:
        t = self.t
        for table, extra in ((t.messages, None), (t.quarantine, None),
                             (t.dispatches, t.dispatches.c.lease_ms.is_not(None)),
                             (t.groups, t.groups.c.inflight > 0)):
            where = self._q(table, queue) if extra is None else and_(self._q(table, queue), extra)
            if c.execute(select(func.count()).select_from(table).where(where)).scalar_one():
                return False
        return True

    def beat(self, dispatcher: DispatcherBeat, now_ms: int, ttl_ms: int) -> None:
        t = self.t.dispatchers
        doc = {**dispatcher.as_json(), "queues": json.dumps(list(dispatcher.queues))}

        def work(c: Connection) -> None:
            upsert(c, t, [{**doc, "ns": self.namespace, "expires_ms": now_ms + ttl_ms}],
                   [k for k in doc if k != "id"] + ["expires_ms"])
            c.execute(delete(t).where(t.c.ns == self.namespace,
                                      t.c.expires_ms < now_ms - PRUNE_GRACE_MS))
        self._read("dispatcher beat", work)

    def dispatchers(self, now_ms: int) -> list[DispatcherBeat]:
        t = self.t.dispatchers
        rows = self._read("dispatchers", lambda c: list(c.execute(
            select(t).where(t.c.ns == self.namespace, t.c.expires_ms >= now_ms)
            .order_by(t.c.id)).mappings()))
        return [DispatcherBeat.from_json({**row, "queues": json.loads(row["queues"])})
                for row in rows]

    def forget_dispatcher(self, dispatcher_id: str) -> None:
        t = self.t.dispatchers
        self._read("forget dispatcher", lambda c: c.execute(delete(t).where(
            t.c.ns == self.namespace, t.c.id == dispatcher_id)))

    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        return self.wakes.wait(queues, timeout)  # type: ignore[no-any-return]

    # -- figures ------------------------------------------------------------------------

    def queue_figures(self, queue: str) -> QueueFigures:
        """Totals of ``queue``: sums over its groups and counters (O(groups))."""
        def work(c: Connection) -> QueueFigures:
            g, r, m = self.t.groups.c, self.t.ready.c, self.t.messages.c
            inflight, held_i, held_b, count = c.execute(select(
                func.sum(g.inflight), func.sum(g.held_i + g.parked_i),
                func.sum(g.held_b + g.parked_b), func.count()
            ).where(self._q(self.t.groups, queue))).one()
            ready: dict[str, int] = dict(c.execute(select(r.klass, func.count()).where(
                self._q(self.t.ready, queue)).group_by(r.klass)).tuples().all())
            delayed = c.execute(select(func.count()).where(
                self._q(self.t.messages, queue), m.due_ms.is_not(None))).scalar_one()
            counters = counter_totals(c, self.t, self.namespace, queue)
            return QueueFigures(queue, inflight=int(inflight or 0), delayed=int(delayed),
                                held_interactive=int(held_i or 0),
                                held_background=int(held_b or 0),
                                released=counters.get("released", 0),
                                skipped=counters.get("skipped", 0), group_count=int(count),
                                ready_interactive=int(ready.get("i", 0)),
                                ready_background=int(ready.get("b", 0)))
        return self._read("queue figures", work)

    def group_figures(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]:
        def work(c: Connection) -> list[GroupFigures]:
            names = list(groups)
            rows = {r["grp"]: r for r in c.execute(select(self.t.groups).where(
                self._q(self.t.groups, queue), self.t.groups.c.grp.in_(names))).mappings()}
            lims = {r["grp"]: r for r in c.execute(select(self.t.limits).where(
                self._q(self.t.limits, queue), self.t.limits.c.grp.in_(names))).mappings()}
            q = self._queue_defaults(c, queue)
            return [_figures(g, rows.get(g), lims.get(g), q) for g in names]
        return self._read("group figures", work) if groups else []

    def _queue_defaults(self, c: Connection, queue: str) -> dict[str, Any]:
        q = self.t.queues
        row = c.execute(select(q).where(self._q(q, queue))).mappings().first()
        return dict(row) if row else {"default_cap": -1, "default_weight": 1.0, "reserve": 0,
                                      "vt_i": None, "vt_b": None}

    def top_groups(self, queue: str, limit: int) -> list[tuple[str, int]]:
        g = self.t.groups.c
        backlog = (g.held_i + g.held_b + g.parked_i + g.parked_b).label("n")
        rows = self._read("top groups", lambda c: list(c.execute(select(g.grp, backlog).where(
            self._q(self.t.groups, queue), backlog > 0))))
        ranked = sorted(((int(n), name) for name, n in rows), reverse=True)
        return [(name, n) for n, name in ranked[:max(limit, 0)]]

    def busiest_groups(self, queue: str, limit: int) -> list[GroupFigures]:
        names = [g for g, _ in self.top_groups(queue, limit)]
        if len(names) < limit:
            g = self.t.groups.c
            others = self._read("groups", lambda c: list(c.execute(select(g.grp).where(
                self._q(self.t.groups, queue),
                g.held_i + g.held_b + g.parked_i + g.parked_b == 0)).scalars()))
            names += sorted(others)[:limit - len(names)]
        return busiest_first(self.group_figures(queue, names))

    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupHeads]:
        figures = {f.group: f for f in self.group_figures(queue, groups)}

        def head_due(c: Connection, klass: str, g: str) -> float | None:
            m = self.t.messages.c
            value = c.execute(select(m.value).where(
                self._q(self.t.messages, queue), m.klass == klass, m.grp == g,
                m.seq.is_not(None)).order_by(*list_order(m)).limit(1)).scalar()
            return None if value is None else due_of(bytes(value))

        def work(c: Connection) -> list[GroupHeads]:
            gc = self.t.groups.c
            rows = {r.grp: r for r in c.execute(
                select(gc.grp, gc.since_i, gc.since_b, gc.held_i, gc.held_b).where(
                    self._q(self.t.groups, queue), gc.grp.in_(list(groups))))}
            since = {g: (r.since_i, r.since_b) for g, r in rows.items()}
            out = []
            for g in groups:
                f = figures[g]
                row = rows.get(g)  # its lists (parked work has no head)
                held = (row.held_i, row.held_b) if row else (0, 0)
                due = [head_due(c, k, g) if n else None for k, n in zip(CLASSES, held)]
                head = [ms / 1000 if n and ms is not None else None
                        for n, ms in zip(held, since.get(g, (None, None)))]
                out.append(GroupHeads(g, f.held_interactive, f.held_background, f.inflight,
                                      f.delayed, due[0], due[1], head[0], head[1]))
            return out
        return self._read("summarize", work)

    def snapshot(self, queue: str) -> dict[str, Any]:
        g = self.t.groups.c
        names = self._read("groups", lambda c: list(c.execute(select(g.grp).where(
            self._q(self.t.groups, queue))).scalars()))
        return snapshot_of(self.queue_figures(queue), self.group_figures(queue, sorted(names)))

    def dispatch_state(self, queue: str, dispatch_id: str) -> str | None:
        d = self.t.dispatches.c
        row = self._read("dispatch state", lambda c: c.execute(select(d.state, d.expires_ms)
                         .where(self._q(self.t.dispatches, queue), d.did == dispatch_id)).first())
        if row is None or (row.expires_ms is not None and row.expires_ms <= _now()):
            return None
        return str(row.state)

    # -- the summaries dashboards read ---------------------------------------------------

    def claim_writer(self, queue: str, ms: int) -> bool:
        s = self.t.summaries

        def work(c: Connection) -> bool:
            now = _now()
            insert_ignore(c, s, [{"ns": self.namespace, "queue": queue, "expires_ms": 0,
                                  "writer_until": 0}])
            return bool(c.execute(update(s).where(self._q(s, queue), s.c.writer_until <= now)
                                  .values(writer_until=now + ms)).rowcount)
        return self._read("claim writer", work)

    def put_summary(self, queue: str, doc: str, ttl_seconds: int) -> None:
        s = self.t.summaries
        self._read("put summary", lambda c: upsert(c, s, [{
            "ns": self.namespace, "queue": queue, "doc": doc,
            "expires_ms": _now() + ttl_seconds * 1000, "writer_until": 0}],
            ["doc", "expires_ms"]))

    def summaries(self, queues: Sequence[str]) -> dict[str, str | None]:
        s = self.t.summaries.c
        now = _now()
        rows = self._read("summaries", lambda c: dict(c.execute(select(s.queue, s.doc).where(
            s.ns == self.namespace, s.queue.in_(list(queues)), s.expires_ms > now)).tuples()
            .all())) if queues else {}
        return {q: rows.get(q) for q in queues}

    # -- maintenance --------------------------------------------------------------------

    def flush(self) -> None:
        def work(c: Connection) -> None:
            for table in self.t.metadata.sorted_tables:
                if table not in (self.t.workers, self.t.dispatchers):
                    c.execute(delete(table).where(table.c.ns == self.namespace))
        self._read("flush", work)

    def advice(self) -> list[str]:
        """SQLite in a shared or temporary place loses nothing by itself; nothing known."""
        return []

    def ping(self) -> None:
        """Raise StoreConnectionError unless the database answers, SchemaOutOfDate
        unless its schema is current."""
        self._schema_ok = False
        self._read("ping", lambda c: c.execute(select(1)).scalar_one())

    def inspect(self, queue: str) -> QueueState:
        """The queue's scheduling state (:class:`~celery_fair.policy.QueueState`)."""
        def work(c: Connection) -> QueueState:
            t = self.t
            q = self._queue_defaults(c, queue)
            ready: dict[str, dict[str, float]] = {k: {} for k in CLASSES}
            for klass, g, tag in c.execute(select(t.ready.c.klass, t.ready.c.grp, t.ready.c.tag)
                                           .where(self._q(t.ready, queue))):
                ready[klass][g] = tag
            over: dict[str, dict[str, float]] = {k: {} for k in CLASSES}
            for klass, g, tag in c.execute(select(t.over.c.klass, t.over.c.grp, t.over.c.tag)
                                           .where(self._q(t.over, queue))):
                over[klass][g] = tag
            groups = list(c.execute(select(t.groups).where(self._q(t.groups, queue)))
                          .mappings())
            m = t.messages.c
            held: dict[tuple[str, str], list[str]] = {}
            for klass, g, hold_id in c.execute(select(m.klass, m.grp, m.hold_id).where(
                    self._q(t.messages, queue), m.seq.is_not(None)).order_by(*list_order(m))):
                held.setdefault((klass, g), []).append(hold_id)
            d = t.dispatches.c
            interactive = c.execute(select(func.count()).where(
                self._q(t.dispatches, queue), d.klass == "i", d.state.in_(_LIVE))).scalar()
            return QueueState(
                ready=ready, vt={k: q[f"vt_{k}"] for k in CLASSES if q[f"vt_{k}"] is not None},
                tags={(k, r["grp"]): r[f"tag_{k}"] for r in groups for k in CLASSES
                      if r[f"tag_{k}"] is not None},
                inflight={r["grp"]: r["inflight"] for r in groups if r["inflight"]},
                delayed={r["grp"]: r["delayed"] for r in groups if r["delayed"]},
                held=held, total_inflight=sum(r["inflight"] for r in groups),
                since={(k, r["grp"]): r[f"since_{k}"] for r in groups for k in CLASSES
                       if (k, r["grp"]) in held},
                over=over, inflight_interactive=int(interactive or 0))
        return self._read("inspect", work)


def _figures(g: str, row: Any, lim: Any, q: dict[str, Any]) -> GroupFigures:
    cap = int(in_force(lim and lim["limit_cap"], lim and lim["conf_cap"], q["default_cap"]))
    weight = float(in_force(lim and lim["limit_weight"], lim and lim["conf_weight"],
                            q["default_weight"]))
    return GroupFigures(
        g, held_interactive=row["held_i"] + row["parked_i"] if row else 0,
        held_background=row["held_b"] + row["parked_b"] if row else 0,
        delayed=row["delayed"] if row else 0,
        inflight=row["inflight"] if row else 0, cap=None if cap < 0 else cap, weight=weight,
        limited=limited_by(lim is not None and lim["limit_cap"] is not None,
                           lim is not None and lim["limit_weight"] is not None))


__all__ = ["Location", "SqlReads"]
