"""The Harmony policy (``fair_policy = "harmony"``) on SQL: the queue's policy and its
pick sequence (Redis ``conf`` ``policy`` and ``stat`` ``served``), and a group's
sequence when it was last served and the rank ``fair boost --task`` set until its next
pick (``g:<group>`` ``s`` and ``j``). Nullable: a queue configured before this revision
runs 'wfq' (as before), a group never served under Harmony has no sequence (0).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column, Double, String

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("policy", String(8)))
    op.add_column(f"{p}queues", Column("served", BigInteger))
    op.add_column(f"{p}groups", Column("served", BigInteger))
    op.add_column(f"{p}groups", Column("jump", Double))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}groups", "jump")
    op.drop_column(f"{p}groups", "served")
    op.drop_column(f"{p}queues", "served")
    op.drop_column(f"{p}queues", "policy")
