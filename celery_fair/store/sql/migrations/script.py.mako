"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Frozen history: name tables with the prefix from ``table_prefix()``, never from
``celery_fair.store.sql.schema.Tables`` (which changes with later revisions).
"""

from __future__ import annotations

from alembic import op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def table_prefix() -> str:
    config = op.get_context().config  # celery_fair.store.sql.migrate passes the prefix
    assert config is not None, "run by celery_fair.store.sql.migrate, not the alembic CLI"
    return str(config.attributes["table_prefix"])


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
