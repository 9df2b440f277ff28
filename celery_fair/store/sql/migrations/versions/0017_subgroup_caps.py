"""Caps per subgroup (``fair_subgroup = "path"``, a cap keyed "<group>/<subgroup>";
``store/sql/subcaps.py``): a message parked while its subgroup is at its cap leaves its
group's list (``seq`` NULL) and names its subgroup (``messages.parked``), in the order
parked (``parked_seq``); a group counts its parked messages per class (``groups.parked_i``,
``parked_b``); a dispatch names the subgroup it counts against (``dispatches.subgroup``;
NULL: none), and a subgroup's dispatches in flight are counted from the live dispatch
rows (as 0013's targets: no counter row every release would write).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28

Frozen history, as 0001: the columns are written out here, not taken from ``Tables``.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Column, Integer

from celery_fair.store.sql.migrations.versions import table_prefix
from celery_fair.store.sql.schema import GROUP, name

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    p = table_prefix()
    op.add_column(f"{p}messages", Column("parked", name(GROUP)))
    op.add_column(f"{p}messages", Column("parked_seq", BigInteger))
    op.create_index(f"{p}messages_parked", f"{p}messages",
                    ["ns", "queue", "klass", "grp", "parked", "parked_seq"])
    for klass in ("i", "b"):
        op.add_column(f"{p}groups", Column(f"parked_{klass}", Integer, nullable=False,
                                           server_default="0"))
    op.add_column(f"{p}dispatches", Column("subgroup", name(GROUP)))
    op.create_index(f"{p}dispatches_subgroup", f"{p}dispatches",
                    ["ns", "queue", "grp", "subgroup"])


def downgrade() -> None:
    p = table_prefix()
    op.drop_index(f"{p}dispatches_subgroup", f"{p}dispatches")
    op.drop_column(f"{p}dispatches", "subgroup")
    for klass in ("i", "b"):
        op.drop_column(f"{p}groups", f"parked_{klass}")
    op.drop_index(f"{p}messages_parked", f"{p}messages")
    op.drop_column(f"{p}messages", "parked_seq")
    op.drop_column(f"{p}messages", "parked")
