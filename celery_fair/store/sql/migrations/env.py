"""Alembic's environment for the SQL store, run by ``celery_fair.store.sql.migrate``.

The caller passes everything in ``config.attributes``: ``table_prefix`` (the revisions
name their tables with it) and, online, an open ``connection`` (in a transaction the
caller commits, holding the migration lock) or, offline (``--sql``), a ``dialect``.
Each prefix keeps its own version table, ``<prefix>alembic_version``, so several
prefixes share a database.
"""

from __future__ import annotations

from alembic import context

config = context.config
prefix = config.attributes["table_prefix"]
version_table = f"{prefix}alembic_version"

if context.is_offline_mode():
    context.configure(dialect_name=config.attributes["dialect"], literal_binds=True,
                      version_table=version_table)
else:
    context.configure(connection=config.attributes["connection"],
                      version_table=version_table)

with context.begin_transaction():
    context.run_migrations()
