"""Two-level fairness (``fair_subgroup = "path"``): the queue's setting, and each group's
subgroup tags (``subtags``: JSON {class: {subgroup: the key of its last hold, "\\n": the
key picked last}}, ``common.lua``'s ``sg:<class>:<group>``). Nullable: none yet, or
'none'. The keys themselves go in ``messages.sort_key`` (0011).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
(Named 0012_subgroup; another branch may add a 0012 too: renumber on merge.)
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, String, Text

from celery_fair.store.sql.migrations.versions import table_prefix

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("subgroup", String(8)))
    op.add_column(f"{p}groups", Column("subtags", Text))


def downgrade() -> None:
    p = table_prefix()
    op.drop_column(f"{p}groups", "subtags")
    op.drop_column(f"{p}queues", "subgroup")
