"""Singleton keys span the app (``store/sql/singletons.py``): a key's owner and waiting
list are the namespace's (rows of queue ''), each naming its queue (``oqueue``,
``wqueue``); ``sadmits`` holds the waiters another queue handed a queue, which its
promote admits. The rows of 0014 (one scope per queue) move to the namespace's: a key
owned in two queues at the upgrade keeps the first queue's owner (by name); the other
owners (listed in their group, or in flight) keep running, the one moment two of a key
may overlap; the waiting lists join, queue by queue.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, MetaData, Table, select

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import name

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}sowners", Column("oqueue", name(200), nullable=False,
                                        server_default=""))
    op.add_column(f"{p}swaits", Column("wqueue", name(200), nullable=False,
                                       server_default=""))
    op.drop_index(f"{p}swaits_hold", f"{p}swaits")
    op.create_index(f"{p}swaits_wait", f"{p}swaits", ["ns", "wqueue", "hold_id"])
    op.create_table(f"{p}sadmits", Column("ns", name(64), primary_key=True),
                    Column("queue", name(200), primary_key=True),
                    Column("hold_id", name(255), primary_key=True))
    _move_rows(p)


def _move_rows(p: str) -> None:
    """0014's per-queue rows become the namespace's (see the module docstring). Not in
    ``fair migrate --sql`` (no rows to read): upgrade a schema holding tasks with keys
    online, or with none waiting."""
    if op.get_context().as_sql:
        return
    conn = op.get_bind()
    md = MetaData()
    owners = Table(f"{p}sowners", md, autoload_with=conn)
    waits = Table(f"{p}swaits", md, autoload_with=conn)
    o, w = owners.c, waits.c
    old_owners = list(conn.execute(select(o.ns, o.queue, o.skey, o.owner).where(
        o.queue != "").order_by(o.ns, o.skey, o.queue)))
    old_waits = list(conn.execute(select(w.ns, w.queue, w.skey, w.pos, w.hold_id).where(
        w.queue != "").order_by(w.ns, w.skey, w.queue, w.pos)))
    if not old_owners and not old_waits:
        return
    conn.execute(owners.delete().where(o.queue != ""))
    conn.execute(waits.delete().where(w.queue != ""))
    new_owners: dict[tuple[str, str], dict[str, str]] = {}
    lists: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for ns, queue, key, owner in old_owners:
        new_owners.setdefault((ns, key), {"ns": ns, "queue": "", "skey": key,
                                           "owner": owner, "oqueue": queue})
    for ns, queue, key, _pos, hold_id in old_waits:
        lists.setdefault((ns, key), []).append((queue, hold_id))
    if new_owners:
        conn.execute(owners.insert(), list(new_owners.values()))
    rows = [{"ns": ns, "queue": "", "skey": key, "pos": pos, "hold_id": hold_id,
             "wqueue": queue}
            for (ns, key), entries in lists.items()
            for pos, (queue, hold_id) in enumerate(entries)]
    if rows:
        conn.execute(waits.insert(), rows)


def downgrade() -> None:
    p = table_prefix()
    op.drop_table(f"{p}sadmits")
    op.drop_index(f"{p}swaits_wait", f"{p}swaits")
    op.create_index(f"{p}swaits_hold", f"{p}swaits", ["ns", "queue", "hold_id"])
    op.drop_column(f"{p}swaits", "wqueue")
    op.drop_column(f"{p}sowners", "oqueue")
