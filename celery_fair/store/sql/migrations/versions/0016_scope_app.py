"""fair_scope 'app' (``store/sql/scoping.py``): the queue's setting (``queues.scope``;
None: 'queue'), a group's dispatches in flight over the namespace's app-scoped queues
(``scope_n``) and the groups each queue's next promote refreshes (``scope_refresh``).
A queue made before it is scope 'queue'; configuring it 'app' adds its in-flight counts.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
(Named 0016_scope_app; another branch may add a 0016 too: renumber on merge.)
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Integer, String

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import name

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}queues", Column("scope", String(8)))
    op.create_table(f"{p}scope_n", Column("ns", name(64), primary_key=True),
                    Column("grp", name(200), primary_key=True),
                    Column("n", Integer, nullable=False))
    op.create_table(f"{p}scope_refresh", Column("ns", name(64), primary_key=True),
                    Column("queue", name(200), primary_key=True),
                    Column("grp", name(200), primary_key=True))


def downgrade() -> None:
    p = table_prefix()
    op.drop_table(f"{p}scope_refresh")
    op.drop_table(f"{p}scope_n")
    op.drop_column(f"{p}queues", "scope")
