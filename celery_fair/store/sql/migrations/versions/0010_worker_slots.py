"""Worker slots: when each worker registered first and the slot it holds
(``celery_fair.store.registry``), on its ``workers`` row, with a unique index so that two
workers never hold one slot. Nullable: a worker of a version before this revision
registers without them (``fair workers`` shows it without a slot).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column, Integer

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}workers", Column("started_ms", BigInteger))
    op.add_column(f"{p}workers", Column("slot", Integer))
    op.create_index(f"{p}workers_slot", f"{p}workers", ["ns", "queue", "slot"], unique=True)


def downgrade() -> None:
    p = table_prefix()
    op.drop_index(f"{p}workers_slot", f"{p}workers")
    op.drop_column(f"{p}workers", "slot")
    op.drop_column(f"{p}workers", "started_ms")
