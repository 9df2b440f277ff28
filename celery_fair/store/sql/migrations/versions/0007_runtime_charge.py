"""Charging by measured runtime (``fair_charge``): the queue's charge, the estimate a
dispatch was charged at pick under 'runtime' (for its release to correct) and a group's
mean runtime (the estimate of its next dispatches). Nullable: a queue configured before
this revision charges its costs ('cost', as before), a dispatch picked before it
corrects nothing, a group without a mean is charged its tasks' costs.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Double, String

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("charge", String(8)))
    op.add_column(f"{p}dispatches", Column("estimate", Double))
    op.add_column(f"{p}groups", Column("runtime", Double))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}groups", "runtime")
    op.drop_column(f"{p}dispatches", "estimate")
    op.drop_column(f"{p}queues", "charge")
