"""The SQL store's first schema: every table and index.

Revision ID: 0001
Revises:
Create Date: 2026-11-25

Frozen history: the tables are written out here, not taken from
``celery_fair.store.sql.schema.Tables`` (which will change with later revisions); only
the column types ``name()`` and ``blob()`` (byte-wise names, LONGBLOB on MySQL) come from
there. Tables are named with the prefix the caller passed (``table_prefix()``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy import BigInteger, Boolean, Column, Double, Integer, SmallInteger, String, Text

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import blob, name

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TABLES = ("queues", "limits", "groups", "ready", "messages", "dispatches", "counters",
          "cancels", "quarantine", "workers", "summaries")


def _table(table: str, *columns: sa.Column) -> None:  # type: ignore[type-arg]
    """A table of the store: keyed by namespace and queue first, as every table is."""
    op.create_table(f"{table_prefix()}{table}",
                    Column("ns", name(64), primary_key=True),
                    Column("queue", name(200), primary_key=True), *columns)


def _index(index: str, table: str, *columns: str, where: str | None = None) -> None:
    p = table_prefix()
    partial: dict[str, Any] = {} if where is None else {
        "postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}
    op.create_index(f"{p}{index}", f"{p}{table}", ["ns", "queue", *columns], **partial)


def upgrade() -> None:
    _table("queues",
           Column("registered", Boolean, nullable=False),
           Column("vt_i", Double), Column("vt_b", Double),
           Column("default_cap", Integer, nullable=False),
           Column("reserve", Integer, nullable=False),
           Column("default_weight", Double, nullable=False),
           Column("picks", BigInteger, nullable=False),
           Column("dups", BigInteger, nullable=False))
    _table("limits",
           Column("grp", name(200), primary_key=True),
           Column("conf_cap", Integer), Column("conf_weight", Double),
           Column("limit_cap", Integer), Column("limit_weight", Double))
    _table("groups",
           Column("grp", name(200), primary_key=True),
           Column("inflight", Integer, nullable=False),
           Column("delayed", Integer, nullable=False),
           Column("held_i", Integer, nullable=False),
           Column("held_b", Integer, nullable=False),
           Column("tag_i", Double), Column("tag_b", Double),
           Column("head", BigInteger, nullable=False),
           Column("tail", BigInteger, nullable=False))
    _table("ready",
           Column("klass", String(1), primary_key=True),
           Column("grp", name(200), primary_key=True),
           Column("tag", Double, nullable=False))
    _index("ready_order", "ready", "klass", "tag", "grp")
    _messages()
    _dispatches()
    _table("counters",
           Column("name", String(16), primary_key=True),
           Column("shard", SmallInteger, primary_key=True, autoincrement=False),
           Column("n", BigInteger, nullable=False))
    _table("cancels",
           Column("token", name(64), primary_key=True),
           Column("expires_ms", BigInteger, nullable=False),
           Column("answer", blob(), nullable=False))
    _table("quarantine",
           Column("hold_id", name(160), primary_key=True),
           Column("value", blob(), nullable=False),
           Column("reason", Text, nullable=False),
           Column("at_ns", BigInteger, nullable=False))
    _table("workers",
           Column("worker", name(255), primary_key=True),
           Column("concurrency", Integer, nullable=False),
           Column("expires_ms", BigInteger, nullable=False))
    _table("summaries",
           Column("doc", Text),
           Column("expires_ms", BigInteger, nullable=False),
           Column("writer_until", BigInteger, nullable=False))


def _task() -> list[sa.Column]:  # type: ignore[type-arg]
    """The columns a held message and its dispatch share: which task, where, how."""
    return [Column("task_id", name(255), nullable=False),
            Column("grp", name(200), nullable=False),
            Column("klass", String(1), nullable=False),
            Column("cost", Double, nullable=False),
            Column("front", Boolean, nullable=False)]


def _messages() -> None:
    _table("messages",
           Column("hold_id", name(255), primary_key=True), *_task(),
           Column("seq", BigInteger), Column("due_ms", BigInteger),
           Column("value", blob(), nullable=False))
    _index("messages_list", "messages", "klass", "grp", "seq")
    # Partial where the database can: only delayed messages, so PostgreSQL's planner never
    # prefers it to messages_list for a group's head on stale statistics.
    _index("messages_due", "messages", "due_ms", where="due_ms IS NOT NULL")
    _index("messages_task", "messages", "task_id")


def _dispatches() -> None:
    _table("dispatches",
           Column("did", name(160), primary_key=True),
           Column("state", String(12), nullable=False),
           Column("hold_id", name(255), nullable=False), *_task(),
           Column("value", blob()),
           Column("kept", Boolean, nullable=False),
           Column("runner", name(255), nullable=False),
           Column("lease_ms", BigInteger), Column("expires_ms", BigInteger))
    for index, column in (("lease", "lease_ms"), ("state", "state"), ("task", "task_id"),
                          ("expiry", "expires_ms")):
        _index(f"dispatches_{index}", "dispatches", column)


def downgrade() -> None:
    p = table_prefix()
    for table in reversed(TABLES):
        op.drop_table(f"{p}{table}")
