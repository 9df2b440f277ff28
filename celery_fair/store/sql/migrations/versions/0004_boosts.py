"""Boosts (``fair boost``): a group's boost weight and its end, on its limits row, kept
apart from the settings and the runtime limit.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column, Double

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}limits", Column("boost_weight", Double))
    op.add_column(f"{p}limits", Column("boost_until_ms", BigInteger))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}limits", "boost_until_ms")
    op.drop_column(f"{p}limits", "boost_weight")
