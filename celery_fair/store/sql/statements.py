"""The SQL store's hot statements, built once with SQLAlchemy Core and compiled once per
database, then run through the driver.

Building a Core statement and running it through SQLAlchemy's compile cache costs several
times the database's own round trip on loopback (measured: ~1.4 ms a statement built each
call, ~0.25 ms compiled once and run through the driver); a release makes six. Each
statement here has a name, binds every value by name, and is compiled by the dialect
(PostgreSQL's casts, MySQL's ``INSERT IGNORE``, SQLite's ``?``), so the SQL stays Core's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    CursorResult,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite

from ...policy.decisions import LIVE
from .schema import Tables

GROUP_COLUMNS = ("inflight", "delayed", "held_i", "held_b", "tag_i", "tag_b", "since_i",
                 "since_b", "head", "tail", "runtime", "served", "jump", "subtags",
                 "parked_i", "parked_b", "seen_i", "seen_b")
MESSAGE_COLUMNS = ("hold_id", "task_id", "grp", "klass", "cost", "front", "seq", "due_ms",
                   "value", "sort_key")
#: A NULL sort key sorts after every key (a message held at the tail under another
#: policy goes after the keyed ones of its place: list_order).
LAST_KEY = 1e300
DISPATCH_COLUMNS = ("did", "state", "hold_id", "task_id", "grp", "klass", "cost", "front",
                    "value", "kept", "runner", "lease_ms", "expires_ms")


def _mine(table: Table, *more: str) -> Any:
    """``ns = :ns AND queue = :queue`` and ``<column> = :<column>`` for each of ``more``."""
    c = table.c
    return and_(c.ns == bindparam("ns"), c.queue == bindparam("queue"),
                *(c[name] == bindparam(name) for name in more))


def list_order(m: Any) -> tuple[Any, Any, Any]:
    """The order of a group's list (``m``: the messages' columns): its place, then under
    'smallest' the sort key (none last), then the hold id (``common.lua``'s ties)."""
    return m.seq, func.coalesce(m.sort_key, LAST_KEY), m.hold_id


def after_place(m: Any) -> Any:
    """Messages after the place ``:after``, ``:after_key``, ``:after_id`` in list order."""
    seq, key, hold_id = list_order(m)
    after: Any = bindparam("after")
    after_key: Any = bindparam("after_key")
    return or_(seq > after, and_(seq == after, or_(
        key > after_key, and_(key == after_key, hold_id > bindparam("after_id")))))


def _values(columns: Sequence[str]) -> dict[str, Any]:
    return {name: bindparam(name) for name in columns}


def insert_ignoring(dialect: str, table: Table) -> Any:
    """``INSERT`` that leaves a row whose key exists alone, on ``dialect``."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    return insert(table).prefix_with("IGNORE")


def upserting(dialect: str, table: Table, set_: Callable[[Any], dict[str, Any]]) -> Any:
    """``INSERT`` that sets ``set_(new row)`` on a row whose key exists, on ``dialect``."""
    if dialect in ("postgresql", "sqlite"):
        stmt: Any = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
        return stmt.on_conflict_do_update(
            index_elements=[c.name for c in table.primary_key.columns], set_=set_(stmt.excluded))
    stmt = mysql.insert(table)
    return stmt.on_duplicate_key_update(set_(stmt.inserted))


class Statements:
    """The named statements of one table prefix (:meth:`run` compiles on first use)."""

    def __init__(self, t: Tables) -> None:
        self.t = t
        self._compiled: dict[tuple[str, str], tuple[str, tuple[str, ...] | None,
                                                    dict[str, Any]]] = {}
        self._core: dict[tuple[str, str], Any] = {}
        #: wakes this process's dispatchers of a queue a singleton key was handed to
        #: (``Unit.flush``; the store sets it)
        self.on_hand: Callable[[str], None] | None = None

    def many(self, conn: Connection, name: str, rows: list[dict[str, Any]]) -> None:
        """Run statement ``name`` (an INSERT) once for all ``rows``: through SQLAlchemy,
        whose "insertmanyvalues" sends them as one multi-row statement where the driver
        would send one statement a row."""
        if not rows:
            return
        key = (name, conn.dialect.name)
        stmt = self._core.get(key)
        if stmt is None:
            stmt = self._core[key] = getattr(self, "_" + name)(conn.dialect.name)
        conn.execute(stmt, rows)

    def run(self, conn: Connection, name: str, params: dict[str, Any] | list[dict[str, Any]]
            ) -> CursorResult[Any]:
        """Run statement ``name`` with ``params`` (a list: one execution per dict)."""
        dialect = conn.dialect.name
        entry = self._compiled.get((name, dialect))
        if entry is None:
            stmt: Any = getattr(self, "_" + name)(dialect)
            compiled = stmt.compile(dialect=conn.dialect)
            order = tuple(compiled.positiontup or ()) if compiled.positional else None
            entry = (str(compiled), order, dict(compiled.params))
            self._compiled[(name, dialect)] = entry
        sql, order, defaults = entry
        many = params if isinstance(params, list) else [params]
        args = [{**defaults, **p} for p in many]
        bound: Any = [tuple(a[n] for n in order) for a in args] if order is not None else args
        return conn.exec_driver_sql(sql, bound if isinstance(params, list) else bound[0])

    # -- queues --------------------------------------------------------------------------

    def _queue(self, _: str) -> Any:
        return select(self.t.queues).where(_mine(self.t.queues))

    def _queue_lock(self, d: str) -> Any:
        return self._queue(d).with_for_update()

    def _queue_new(self, d: str) -> Any:
        return insert_ignoring(d, self.t.queues).values(
            ns=bindparam("ns"), queue=bindparam("queue"), registered=False, default_cap=-1,
            reserve=0, default_weight=1.0, picks=0, dups=0, pauses=0, throttles=0,
            cap_mode="hard")

    def _queue_register(self, _: str) -> Any:
        return update(self.t.queues).where(_mine(self.t.queues)).values(registered=True)

    def _queue_save(self, _: str) -> Any:
        return update(self.t.queues).where(_mine(self.t.queues)).values(
            _values(("vt_i", "vt_b", "picks", "dups", "served")))

    def _queue_with_limits(self, _: str) -> Any:
        q, lt = self.t.queues, self.t.limits
        joined = q.outerjoin(lt, and_(lt.c.ns == q.c.ns, lt.c.queue == q.c.queue,
                                      lt.c.grp == bindparam("grp")))
        return select(q, lt.c.conf_cap, lt.c.conf_weight, lt.c.limit_cap,
                      lt.c.limit_weight, lt.c.boost_weight, lt.c.conf_rate,
                      lt.c.limit_rate).select_from(joined).where(_mine(q))

    # -- groups and ready sets -------------------------------------------------------------

    def _group_lock(self, _: str) -> Any:
        return select(self.t.groups).where(_mine(self.t.groups, "grp")).with_for_update()

    def _group_new(self, d: str) -> Any:
        return insert_ignoring(d, self.t.groups).values(
            ns=bindparam("ns"), queue=bindparam("queue"), grp=bindparam("grp"), inflight=0,
            delayed=0, held_i=0, held_b=0, tag_i=None, tag_b=None, since_i=None,
            since_b=None, head=0, tail=1, runtime=None, served=None, jump=None,
            subtags=None, parked_i=0, parked_b=0, seen_i=None, seen_b=None)

    def _group_save(self, _: str) -> Any:
        g = self.t.groups
        return update(g).where(g.c.ns == bindparam("ns"), g.c.queue == bindparam("queue"),
                               g.c.grp == bindparam("b_grp")).values(_values(GROUP_COLUMNS))

    def _groups_save(self, d: str) -> Any:
        """Many groups' rows at once: an upsert of rows that exist is an update."""
        return upserting(d, self.t.groups, lambda new: {c: new[c] for c in GROUP_COLUMNS})

    def _group_drop(self, _: str) -> Any:
        return delete(self.t.groups).where(_mine(self.t.groups, "grp"))

    def _ready_head(self, _: str) -> Any:
        r = self.t.ready
        return select(r.c.grp, r.c.tag).where(_mine(r, "klass")).order_by(
            r.c.tag, r.c.grp).limit(bindparam("n"))

    def _over_head(self, _: str) -> Any:
        r = self.t.over
        return select(r.c.grp, r.c.tag).where(_mine(r, "klass")).order_by(
            r.c.tag, r.c.grp).limit(bindparam("n"))

    def _over_put(self, d: str) -> Any:
        return upserting(d, self.t.over, lambda new: {"tag": new.tag})

    def _ready_drop(self, _: str) -> Any:
        return delete(self.t.ready).where(_mine(self.t.ready, "klass", "grp"))

    def _ready_put(self, d: str) -> Any:
        return upserting(d, self.t.ready, lambda new: {"tag": new.tag})

    def _count_add(self, d: str) -> Any:
        n = self.t.counters.c.n
        return upserting(d, self.t.counters, lambda new: {"n": n + new.n}).values(
            _values(("ns", "queue", "name", "shard", "n")))

    def _notify(self, _: str) -> Any:
        return select(func.pg_notify(bindparam("channel"), bindparam("payload")))

    # -- messages ------------------------------------------------------------------------

    def _message(self, _: str) -> Any:
        return select(self.t.messages).where(_mine(self.t.messages, "hold_id"))

    def _message_new(self, d: str) -> Any:
        stmt = insert_ignoring(d, self.t.messages).values(
            _values(("ns", "queue", *MESSAGE_COLUMNS)))
        # psycopg reports no rowcount for ON CONFLICT DO NOTHING: count a returned row
        return stmt.returning(self.t.messages.c.ns) if d == "postgresql" else stmt

    def _message_drop(self, _: str) -> Any:
        return delete(self.t.messages).where(_mine(self.t.messages, "hold_id"))

    def _message_heads(self, _: str) -> Any:
        m = self.t.messages.c
        return select(m.hold_id, m.cost, m.front, m.value, m.seq, m.sort_key).where(
            _mine(self.t.messages, "klass", "grp"), after_place(m)
        ).order_by(*list_order(m)).limit(bindparam("n"))

    def _first_due(self, _: str) -> Any:
        m = self.t.messages.c
        return select(m.hold_id).where(_mine(self.t.messages), m.due_ms.is_not(None)
                                       ).order_by(m.due_ms, m.hold_id).limit(1)

    # -- dispatches -----------------------------------------------------------------------

    def _dispatch_lock(self, _: str) -> Any:
        return select(self.t.dispatches).where(_mine(self.t.dispatches, "did")
                                               ).with_for_update()

    def _dispatch_new(self, _: str) -> Any:
        return insert(self.t.dispatches)

    def _dispatch_drop(self, _: str) -> Any:
        return delete(self.t.dispatches).where(_mine(self.t.dispatches, "did"))

    def _inflight(self, _: str) -> Any:
        d = self.t.dispatches
        live: list[Any] = [literal_column(f"'{state}'") for state in LIVE]  # no expanding IN
        return select(func.count()).select_from(d).where(_mine(d), d.c.state.in_(live))

    def _inflight_interactive(self, _: str) -> Any:
        d = self.t.dispatches
        live: list[Any] = [literal_column(f"'{state}'") for state in LIVE]
        return select(func.count()).select_from(d).where(
            _mine(d), d.c.state.in_(live), d.c.klass == literal_column("'i'"))

    def dispatch_set(self, conn: Connection, params: dict[str, Any]) -> None:
        """Set the columns of ``params`` (but its keys) of one dispatch."""
        columns = tuple(sorted(k for k in params if k not in ("ns", "queue", "did")))
        name = "dispatch_set:" + ",".join(columns)
        if not hasattr(self, "_" + name):
            setattr(self, "_" + name, lambda _: update(self.t.dispatches).where(
                _mine(self.t.dispatches, "did")).values(_values(columns)))
        self.run(conn, name, params)
