"""The audit log of operator controls (one row per entry), and pauses (``fair pause``):
a table of paused groups and the queue's count of them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26

Frozen history, as 0001: the table is written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column, Integer, Text

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import GROUP, NS, QUEUE, name

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.create_table(f"{p}audit",
                    Column("seq", BigInteger().with_variant(Integer, "sqlite"),
                           primary_key=True, autoincrement=True),
                    Column("ns", name(NS), nullable=False),
                    Column("at_ms", BigInteger, nullable=False),
                    Column("doc", Text, nullable=False))
    op.create_index(f"{p}audit_ns_seq", f"{p}audit", ["ns", "seq"])
    op.create_table(f"{p}pauses",
                    Column("ns", name(NS), primary_key=True),
                    Column("queue", name(QUEUE), primary_key=True),
                    Column("grp", name(GROUP), primary_key=True),
                    Column("until_ms", BigInteger))
    op.add_column(f"{p}queues", Column("pauses", Integer, nullable=False,
                                       server_default="0"))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}queues", "pauses")
    op.drop_table(f"{p}pauses")
    op.drop_index(f"{p}audit_ns_seq", f"{p}audit")
    op.drop_table(f"{p}audit")
