"""The SQL store's revisions: frozen history, each naming its tables explicitly."""

from __future__ import annotations

from alembic import op


def table_prefix() -> str:
    """The table name prefix the revisions' tables get (the caller's)."""
    config = op.get_context().config  # celery_fair.store.sql.migrate passes the prefix
    assert config is not None, "run by celery_fair.store.sql.migrate, not the alembic CLI"
    return str(config.attributes["table_prefix"])
