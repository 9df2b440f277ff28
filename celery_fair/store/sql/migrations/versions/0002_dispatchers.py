"""The dispatchers' heartbeats: one row per live dispatcher process.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26

Frozen history, as 0001: the table is written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Boolean, Column, Integer, Text

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import name

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(f"{table_prefix()}dispatchers",
                    Column("ns", name(64), primary_key=True),
                    Column("id", name(255), primary_key=True),
                    Column("host", name(255), nullable=False),
                    Column("pid", Integer, nullable=False),
                    Column("started_ms", BigInteger, nullable=False),
                    Column("last_step_ms", BigInteger, nullable=False),
                    Column("queues", Text, nullable=False),
                    Column("every_queue", Boolean, nullable=False),
                    Column("app", name(255), nullable=False),
                    Column("expires_ms", BigInteger, nullable=False))


def downgrade() -> None:
    op.drop_table(f"{table_prefix()}dispatchers")
