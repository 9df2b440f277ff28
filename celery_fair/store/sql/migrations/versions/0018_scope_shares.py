"""fair_scope 'app' under wfq (``store/sql/scoping.py``): the tag advances charged to a
group over the app-scoped queues (``scope_charge``), and per group row the total this
queue last took into its tag (``seen_i``, ``seen_b``). Nothing to fill: a group's first
look takes the total as seen.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Double, String

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import name

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}groups", Column("seen_i", Double))
    op.add_column(f"{p}groups", Column("seen_b", Double))
    op.create_table(f"{p}scope_charge", Column("ns", name(64), primary_key=True),
                    Column("klass", String(1), primary_key=True),
                    Column("grp", name(200), primary_key=True),
                    Column("total", Double, nullable=False))


def downgrade() -> None:
    p = table_prefix()
    op.drop_table(f"{p}scope_charge")
    op.drop_column(f"{p}groups", "seen_b")
    op.drop_column(f"{p}groups", "seen_i")
