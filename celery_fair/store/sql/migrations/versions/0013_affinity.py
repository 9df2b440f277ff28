"""Affinity routing (``fair_affinity``, ``fair_group_queues``): the map of each group's
target (``assignments``: a worker's hostname, or ``queue:<name>`` for a dedicated queue)
and the target a routed dispatch was sent to (``dispatches.target``; NULL: not routed).
A target's routed dispatches in flight are counted from the live dispatch rows through
the ``dispatches_state`` index (no counter row every release would write), and the
moves in ``counters`` (name ``moves``): neither needs a table of its own.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import GROUP, NS, QUEUE, name

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

#: A target: a worker's hostname, or 'queue:' and a real queue's name (frozen here).
TARGET = 255


def upgrade() -> None:
    p = table_prefix()
    op.create_table(f"{p}assignments",
                    Column("ns", name(NS), primary_key=True),
                    Column("queue", name(QUEUE), primary_key=True),
                    Column("grp", name(GROUP), primary_key=True),
                    Column("target", name(TARGET), nullable=False))
    op.add_column(f"{p}dispatches", Column("target", name(TARGET)))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}dispatches", "target")
    op.drop_table(f"{p}assignments")
