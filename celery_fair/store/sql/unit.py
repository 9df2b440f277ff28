"""One transaction's view of one fair queue: the rows it locked, changed in memory and
written back at the end (a small unit of work).

The operations (``lifecycle.py``) read and change a queue through a :class:`Unit`, as
the memory store's policy changes its dicts, and make the same decisions
(:mod:`celery_fair.policy.decisions`). Locks are always taken in one order, so two
transactions never wait for each other in a circle: the queue's row (pick, promote,
reclaim, configure, cancel), then group rows, then dispatch rows. Hold, release and
begin lock only their group's row: groups never wait for each other, and no single row
is written by every release (the counters are sharded).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, and_, bindparam, delete, func, insert, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite

from ...policy.decisions import CLASSES, entry_tag, in_force
from ...policy.decisions import eligible as _eligible
from .schema import Tables

COUNTER_SHARDS = 16
_GROUP_COLUMNS = ("inflight", "delayed", "held_i", "held_b", "tag_i", "tag_b", "head", "tail")


def insert_ignore(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows``, leaving any whose key exists alone."""
    if not rows:
        return
    name = conn.dialect.name
    if name == "postgresql":
        conn.execute(postgresql.insert(table).on_conflict_do_nothing(), rows)
    elif name == "sqlite":
        conn.execute(sqlite.insert(table).on_conflict_do_nothing(), rows)
    else:
        conn.execute(insert(table).prefix_with("IGNORE"), rows)


def upsert(conn: Connection, table: Table, rows: list[dict[str, Any]],
           columns: Iterable[str]) -> None:
    """Insert ``rows``, or set ``columns`` of those whose key exists."""
    if not rows:
        return
    cols = list(columns)
    name = conn.dialect.name
    keys = [c.name for c in table.primary_key.columns]
    if name in ("postgresql", "sqlite"):
        stmt: Any = (postgresql.insert(table) if name == "postgresql" else sqlite.insert(table))
        stmt = stmt.on_conflict_do_update(index_elements=keys,
                                          set_={c: stmt.excluded[c] for c in cols})
    else:
        stmt = mysql.insert(table)
        stmt = stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in cols})
    conn.execute(stmt, rows)


class Unit:
    """Rows of one fair queue that one transaction reads and writes (see the module
    docstring). :meth:`flush` writes what changed."""

    def __init__(self, conn: Connection, t: Tables, ns: str, queue: str,
                 lock_queue: bool = False) -> None:
        self.conn, self.t, self.ns, self.queue = conn, t, ns, queue
        self.key = {"ns": ns, "queue": queue}
        self.q = self._queue_row(lock_queue)
        self.groups: dict[str, dict[str, Any] | None] = {}
        self._new_groups: set[str] = set()
        self.ready: dict[tuple[str, str], float | None] = {}  # (klass, g) -> tag / absent
        self._ready_loaded: dict[tuple[str, str], float | None] = {}
        self._limits: dict[str, tuple[int, float]] = {}
        self.counts: dict[str, int] = {}
        self.queue_changed = False
        self.woken = False

    # -- the queue's row ------------------------------------------------------------------

    def _queue_row(self, lock: bool) -> dict[str, Any]:
        t = self.t.queues
        where = and_(t.c.ns == self.ns, t.c.queue == self.queue)
        query = select(t).where(where)
        row = self.conn.execute(query.with_for_update() if lock else query).mappings().first()
        if row is None:
            insert_ignore(self.conn, t, [{**self.key, "registered": False, "default_cap": -1,
                                          "reserve": 0, "default_weight": 1.0, "picks": 0,
                                          "dups": 0}])
            row = self.conn.execute(query.with_for_update() if lock else query
                                    ).mappings().one()
        return dict(row)

    def register(self) -> None:
        """Make the queue one of ``queues()`` (a hold does; ``forget_queue`` undoes it)."""
        if not self.q["registered"]:
            self.q["registered"] = True
            t = self.t.queues
            self.conn.execute(update(t).where(t.c.ns == self.ns, t.c.queue == self.queue)
                              .values(registered=True))

    def vt(self, klass: str) -> float | None:
        return self.q[f"vt_{klass}"]  # type: ignore[no-any-return]

    def set_vt(self, klass: str, value: float) -> None:
        self.q[f"vt_{klass}"] = value
        self.queue_changed = True

    # -- groups ------------------------------------------------------------------------

    def lock_groups(self, names: Iterable[str]) -> None:
        """Load and lock the rows of ``names`` not loaded yet (one query)."""
        wanted = sorted({g for g in names if g not in self.groups})
        if not wanted:
            return
        t = self.t.groups
        for chunk in _chunks(wanted, 500):
            rows = self.conn.execute(select(t).where(
                t.c.ns == self.ns, t.c.queue == self.queue, t.c.grp.in_(chunk)
            ).order_by(t.c.grp).with_for_update()).mappings()
            for row in rows:
                self.groups[row["grp"]] = dict(row)
        for g in wanted:
            self.groups.setdefault(g, None)

    def group(self, g: str, create: bool = False) -> dict[str, Any] | None:
        """Group ``g``'s row, locked (None: no work; with ``create`` a new one)."""
        self.lock_groups([g])
        row = self.groups[g]
        if row is None and create:
            insert_ignore(self.conn, self.t.groups, [{**self.key, "grp": g, "inflight": 0,
                                                      "delayed": 0, "held_i": 0, "held_b": 0,
                                                      "head": 0, "tail": 1}])
            del self.groups[g]
            self.lock_groups([g])
            row = self.groups[g]
            self._new_groups.add(g)
        return row

    def forget_if_idle(self, g: str) -> None:
        row = self.groups.get(g)
        if row is not None and not (row["inflight"] > 0 or row["delayed"] > 0
                                    or row["held_i"] > 0 or row["held_b"] > 0):
            self.groups[g] = None
            t = self.t.groups
            self.conn.execute(delete(t).where(t.c.ns == self.ns, t.c.queue == self.queue,
                                              t.c.grp == g))

    # -- caps and weights ---------------------------------------------------------------

    def load_limits(self, names: Iterable[str]) -> None:
        wanted = sorted({g for g in names if g not in self._limits})
        t = self.t.limits
        found: dict[str, Any] = {}  # group -> its limits row
        for chunk in _chunks(wanted, 500):
            for found_row in self.conn.execute(select(t).where(
                    t.c.ns == self.ns, t.c.queue == self.queue, t.c.grp.in_(chunk))).mappings():
                found[found_row["grp"]] = found_row
        q = self.q
        for g in wanted:
            row: Any = found.get(g, {})
            cap = in_force(row.get("limit_cap"), row.get("conf_cap"), q["default_cap"])
            weight = in_force(row.get("limit_weight"), row.get("conf_weight"),
                              q["default_weight"])
            self._limits[g] = (int(cap), float(weight))

    def cap(self, g: str) -> int:
        self.load_limits([g])
        return self._limits[g][0]

    def weight(self, g: str) -> float:
        self.load_limits([g])
        return self._limits[g][1]

    def forget_limits(self, g: str) -> None:
        self._limits.pop(g, None)

    # -- ready sets ---------------------------------------------------------------------

    def load_ready(self, keys: Iterable[tuple[str, str]]) -> None:
        wanted = [k for k in keys if k not in self.ready]
        t = self.t.ready
        for klass in CLASSES:
            names = sorted({g for c, g in wanted if c == klass})
            for chunk in _chunks(names, 500):
                rows = self.conn.execute(select(t.c.grp, t.c.tag).where(
                    t.c.ns == self.ns, t.c.queue == self.queue, t.c.klass == klass,
                    t.c.grp.in_(chunk)))
                for g, tag in rows:
                    self._seen((klass, g), tag)
        for k in wanted:
            self._seen(k, None)

    def _seen(self, key: tuple[str, str], tag: float | None) -> None:
        if key not in self.ready:
            self.ready[key] = self._ready_loaded[key] = tag

    def head_of_ready(self, klass: str, limit: int) -> list[tuple[str, float]]:
        """The first ``limit`` groups of the class's ready set, (tag, name) order."""
        t = self.t.ready
        rows = list(self.conn.execute(select(t.c.grp, t.c.tag).where(
            t.c.ns == self.ns, t.c.queue == self.queue, t.c.klass == klass
        ).order_by(t.c.tag, t.c.grp).limit(limit)))
        for g, tag in rows:
            self._seen((klass, g), tag)
        return [(g, tag) for g, tag in rows]

    def refresh(self, g: str) -> bool:
        """Make g's ready-set membership match its eligibility (``common._refresh``);
        True when it entered a ready set."""
        row = self.groups.get(g)
        self.load_ready([(k, g) for k in CLASSES])
        entered = False
        reserve = self.q["reserve"]
        for klass in CLASSES:
            key = (klass, g)
            if row is not None and _eligible(klass, row[f"held_{klass}"], row["inflight"],
                                             self.cap(g), reserve):
                tag = entry_tag(row[f"tag_{klass}"], self.vt(klass))
                row[f"tag_{klass}"] = tag
                entered = entered or self.ready[key] is None
                self.ready[key] = tag or 0.0
            else:
                self.ready[key] = None
        return entered

    # -- counters -------------------------------------------------------------------------

    def count(self, name: str, delta: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + delta

    # -- writing back ---------------------------------------------------------------------

    def flush(self) -> None:
        """Write the groups, ready sets, counters and queue row this unit changed."""
        self._flush_groups()
        self._flush_ready()
        if self.counts:
            shard = random.randrange(COUNTER_SHARDS)
            self._add_counts(shard)
        if self.queue_changed:
            t = self.t.queues
            self.conn.execute(update(t).where(t.c.ns == self.ns, t.c.queue == self.queue)
                              .values(vt_i=self.q["vt_i"], vt_b=self.q["vt_b"],
                                      picks=self.q["picks"], dups=self.q["dups"]))

    def _flush_groups(self) -> None:
        rows = [{"b_grp": g, **{c: row[c] for c in _GROUP_COLUMNS}}
                for g, row in self.groups.items() if row is not None]
        if rows:
            t = self.t.groups
            self.conn.execute(update(t).where(
                t.c.ns == self.ns, t.c.queue == self.queue, t.c.grp == bindparam("b_grp")
            ).values({c: bindparam(c) for c in _GROUP_COLUMNS}), rows)

    def _flush_ready(self) -> None:
        t = self.t.ready
        gone: dict[str, list[str]] = {}
        put = []
        for (klass, g), tag in self.ready.items():
            before = self._ready_loaded.get((klass, g))
            if tag is None and before is not None:
                gone.setdefault(klass, []).append(g)
            elif tag is not None and tag != before:
                put.append({**self.key, "klass": klass, "grp": g, "tag": tag})
        for klass, names in gone.items():
            for chunk in _chunks(sorted(names), 500):
                self.conn.execute(delete(t).where(t.c.ns == self.ns, t.c.queue == self.queue,
                                                  t.c.klass == klass, t.c.grp.in_(chunk)))
        upsert(self.conn, t, put, ["tag"])

    def _add_counts(self, shard: int) -> None:
        t = self.t.counters
        rows = [{**self.key, "name": n, "shard": shard, "n": d} for n, d in self.counts.items()]
        insert_ignore(self.conn, t, [{**r, "n": 0} for r in rows])
        self.conn.execute(update(t).where(
            t.c.ns == self.ns, t.c.queue == self.queue, t.c.name == bindparam("b_name"),
            t.c.shard == shard).values(n=t.c.n + bindparam("b_n")),
            [{"b_name": r["name"], "b_n": r["n"]} for r in rows])


def counter_totals(conn: Connection, t: Tables, ns: str, queue: str) -> dict[str, int]:
    """The counters of ``queue``, summed over their shards."""
    c = t.counters.c
    rows = conn.execute(select(c.name, func.sum(c.n)).where(c.ns == ns, c.queue == queue)
                        .group_by(c.name))
    return {name: int(n or 0) for name, n in rows}


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
