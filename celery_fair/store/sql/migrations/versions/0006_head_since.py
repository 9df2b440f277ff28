"""Head times: when each class's head of a group's list became the head (ms), on the
group's row, for the tip-of-queue waits. Nullable: a group held before this revision has
none until its head next changes, and the readers count its head's wait from its due
time meanwhile.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}groups", Column("since_i", BigInteger))
    op.add_column(f"{p}groups", Column("since_b", BigInteger))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}groups", "since_b")
    op.drop_column(f"{p}groups", "since_i")
