"""Soft caps and the interactive share: the queue's cap mode and share (``fair_cap_mode``,
``fair_interactive_share``), and the over sets (groups at or over their cap with work
held, the pick's fallback under soft caps).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Double, String

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import name

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("cap_mode", String(8), nullable=False,
                                       server_default="hard"))
    op.add_column(f"{p}queues", Column("interactive_share", Double))
    op.create_table(
        f"{p}over",
        Column("ns", name(64), primary_key=True),
        Column("queue", name(200), primary_key=True),
        Column("klass", String(1), primary_key=True),
        Column("grp", name(200), primary_key=True),
        Column("tag", Double, nullable=False))
    op.create_index(f"{p}over_order", f"{p}over", ["ns", "queue", "klass", "tag", "grp"])


def downgrade() -> None:
    p = table_prefix()
    op.drop_index(f"{p}over_order", table_name=f"{p}over")
    op.drop_table(f"{p}over")
    op.drop_column(f"{p}queues", "interactive_share")
    op.drop_column(f"{p}queues", "cap_mode")
