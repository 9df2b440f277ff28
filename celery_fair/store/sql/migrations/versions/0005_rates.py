"""Rate limits and throttles (``store/throttling.py``): the default rate on the queue's
row with its count of throttles, a setting's and a runtime rate on a group's limits row,
and tables of throttled groups and of rate buckets (theoretical arrival times).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26

Frozen history, as 0001: the columns and tables are written out here, not taken from
``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Double, Integer, String

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import GROUP, NS, QUEUE, name

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_RATE = 64


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("throttles", Integer, nullable=False,
                                       server_default="0"))
    op.add_column(f"{p}queues", Column("default_rate", String(_RATE)))
    op.add_column(f"{p}limits", Column("conf_rate", String(_RATE)))
    op.add_column(f"{p}limits", Column("limit_rate", String(_RATE)))
    op.create_table(f"{p}throttles",
                    Column("ns", name(NS), primary_key=True),
                    Column("queue", name(QUEUE), primary_key=True),
                    Column("grp", name(GROUP), primary_key=True),
                    Column("until_ms", Double, nullable=False))
    op.create_index(f"{p}throttles_until", f"{p}throttles",
                    ["ns", "queue", "until_ms", "grp"])
    op.create_table(f"{p}tats",
                    Column("ns", name(NS), primary_key=True),
                    Column("queue", name(QUEUE), primary_key=True),
                    Column("grp", name(GROUP), primary_key=True),
                    Column("tat", Double, nullable=False))
    op.create_index(f"{p}tats_tat", f"{p}tats", ["ns", "queue", "tat"])


def downgrade() -> None:
    p = table_prefix()
    op.drop_index(f"{p}tats_tat", f"{p}tats")
    op.drop_table(f"{p}tats")
    op.drop_index(f"{p}throttles_until", f"{p}throttles")
    op.drop_table(f"{p}throttles")
    op.drop_column(f"{p}limits", "limit_rate")
    op.drop_column(f"{p}limits", "conf_rate")
    op.drop_column(f"{p}queues", "default_rate")
    op.drop_column(f"{p}queues", "throttles")
