"""Row helpers the SQL store's modules share: inserts that leave or update rows whose
key exists, the sharded counters summed, and lists cut into chunks for ``IN``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, func, select

from .schema import Tables
from .statements import insert_ignoring, upserting


def insert_ignore(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> int:
    """Insert ``rows``, leaving any whose key exists alone; returns how many were new."""
    if not rows:
        return 0
    stmt = insert_ignoring(conn.dialect.name, table)
    if conn.dialect.name == "postgresql" and len(rows) == 1:  # psycopg's rowcount: -1 here
        return len(conn.execute(stmt.returning(table.c.ns), rows[0]).all())
    return int(conn.execute(stmt, rows[0] if len(rows) == 1 else rows).rowcount)


def upsert(conn: Connection, table: Table, rows: list[dict[str, Any]],
           columns: Iterable[str]) -> None:
    """Insert ``rows``, or set ``columns`` of those whose key exists."""
    if rows:
        cols = list(columns)
        conn.execute(upserting(conn.dialect.name, table,
                               lambda new: {c: new[c] for c in cols}), rows)


def counter_totals(conn: Connection, t: Tables, ns: str, queue: str) -> dict[str, int]:
    """The counters of ``queue``, summed over their shards."""
    c = t.counters.c
    rows = conn.execute(select(c.name, func.sum(c.n)).where(c.ns == ns, c.queue == queue)
                        .group_by(c.name))
    return {name: int(n or 0) for name, n in rows}


def chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
