"""Smallest first with aging (``fair_policy = "smallest"``, ``fair_aging_seconds``): the
queue's aging, and a held message's sort key (``sort_key``) beside its place (``seq``) in its
group's list. Nullable: a message held before this revision, or under another policy, has
none and keeps its place by ``seq`` alone.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Double

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("aging", Double))
    op.add_column(f"{p}messages", Column("sort_key", Double))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}messages", "sort_key")
    op.drop_column(f"{p}queues", "aging")
