"""Singleton keys (issue 14 item 4, ``store/sql/singletons.py``): the key of a held
message or a dispatch (``skeys``), each key's owner (``sowners``) and its waiting hold
ids in order (``swaits``), as Redis's ``skey``, ``sowner`` and ``sw:<key>``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import name

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _keys(*extra: Column) -> list[Column]:  # type: ignore[type-arg]
    return [Column("ns", name(64), primary_key=True),
            Column("queue", name(200), primary_key=True), *extra]


def upgrade() -> None:
    p = table_prefix()
    op.create_table(f"{p}skeys", *_keys(
        Column("ref", name(256), primary_key=True),
        Column("skey", name(200), nullable=False)))
    op.create_table(f"{p}sowners", *_keys(
        Column("skey", name(200), primary_key=True),
        Column("owner", name(256), nullable=False)))
    op.create_table(f"{p}swaits", *_keys(
        Column("skey", name(200), primary_key=True),
        Column("pos", BigInteger, primary_key=True, autoincrement=False),
        Column("hold_id", name(255), nullable=False)))
    op.create_index(f"{p}swaits_hold", f"{p}swaits", ["ns", "queue", "hold_id"])


def downgrade() -> None:
    p = table_prefix()
    op.drop_index(f"{p}swaits_hold", f"{p}swaits")
    op.drop_table(f"{p}swaits")
    op.drop_table(f"{p}sowners")
    op.drop_table(f"{p}skeys")
