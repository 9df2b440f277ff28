"""The SQL store's schema: upgrade it (``fair migrate``), read its revision, and refuse
to run on a schema the code does not expect.

Alembic runs from code: the environment ships in ``migrations/`` and gets its
connection and table prefix through ``Config.attributes``. Each prefix has its own
version table, ``<prefix>alembic_version``. Two processes migrating at once are
serialized by a lock the database holds for the migration's connection (PostgreSQL: an
advisory lock for the transaction, which also holds the DDL; MariaDB/MySQL: ``GET_LOCK``;
SQLite: the write lock ``BEGIN IMMEDIATE`` takes), so the second finds the schema current.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy.orm  # noqa: F401 - imported here, once: the schema check reaches it
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from ...config_keys import check_table_prefix
from ...errors import SchemaOutOfDate, StoreConnectionError, StoreError
from ...redact import safe_url
from ..connection import Bounds
from .engine import make_engine, sql_url
from .schema import DEFAULT_PREFIX, SCHEMA_VERSION

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: The command that brings a schema up to date, as errors name it.
MIGRATE_COMMAND = "celery -A proj fair migrate"
#: Seconds a migration waits for another one of the same prefix and database to finish.
LOCK_WAIT = 100


def alembic_config(table_prefix: str, **attributes: object) -> Config:
    """Alembic's configuration for the store's tables of ``table_prefix``."""
    config = Config(output_buffer=io.StringIO())
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes.update(table_prefix=table_prefix, **attributes)
    return config


def migrate(url: str, table_prefix: str = DEFAULT_PREFIX) -> tuple[str | None, str]:
    """Upgrade the schema at ``url`` to :data:`SCHEMA_VERSION`; return the revisions
    (before, after). Running it again changes nothing.

    Raises:
        ConfigurationError: ``url`` or ``table_prefix`` is invalid.
        StoreConnectionError: the database could not be reached.
        StoreError: the migration failed.
    """
    check_table_prefix(table_prefix, "table_prefix")
    engine = make_engine(url, Bounds(socket_timeout=LOCK_WAIT + 20.0))
    where = describe(engine)
    try:
        with engine.connect() as conn, _locked(conn, table_prefix):
            before = schema_revision(conn, table_prefix)
            command.upgrade(alembic_config(table_prefix, connection=conn), "head")
            after = schema_revision(conn, table_prefix)
            conn.commit()
    except DBAPIError as exc:
        raise _store_error(exc, f"store {where}: migrating (prefix {table_prefix})") from exc
    finally:
        engine.dispose()
    return before, after or ""


@contextmanager
def _locked(conn: Connection, table_prefix: str) -> Iterator[None]:
    """Hold the migration lock of ``table_prefix`` in this database on ``conn``."""
    backend = conn.dialect.name
    key = f"celery_fair.migrate.{conn.engine.url.database}.{table_prefix}"
    if backend == "postgresql":  # released when the transaction ends
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                     {"k": zlib.crc32(key.encode())})
        yield
    elif backend in ("mysql", "mariadb"):  # held by the session until released
        name = key[-64:]  # GET_LOCK names are at most 64 characters
        got = conn.execute(text("SELECT GET_LOCK(:n, :s)"), {"n": name, "s": LOCK_WAIT})
        if got.scalar() != 1:
            raise StoreError(f"another migration of the tables prefixed {table_prefix!r} "
                             f"held its lock for {LOCK_WAIT} seconds: try again")
        try:
            yield
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name})
    else:  # SQLite: the engine begins with BEGIN IMMEDIATE, the database's write lock
        conn.begin()
        yield


def schema_revision(conn_or_engine: Connection | Engine,
                    table_prefix: str = DEFAULT_PREFIX) -> str | None:
    """The schema's revision in the database (None: never migrated)."""
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.connect() as conn:
            return schema_revision(conn, table_prefix)
    # Alembic logs its context at INFO on every configure: noise in a dispatcher's log.
    quiet = logging.getLogger("alembic")
    level, quiet.level = quiet.level, logging.WARNING
    try:
        context = MigrationContext.configure(
            conn_or_engine, opts={"version_table": f"{table_prefix}alembic_version"})
        return context.get_current_revision()
    finally:
        quiet.setLevel(level)


def check_schema(engine: Engine, table_prefix: str = DEFAULT_PREFIX,
                 where: str = "store") -> None:
    """Refuse to use a schema that is missing or at another revision than the code's.

    Raises:
        SchemaOutOfDate: naming the database, what was found and the command to run.
        StoreConnectionError: the database could not be reached.
    """
    database = describe(engine)
    try:
        found = schema_revision(engine, table_prefix)
    except DBAPIError as exc:
        raise _store_error(exc, f"{where}: reading the schema's revision at {database}") \
            from exc
    if found == SCHEMA_VERSION:
        return
    state = "has no celery_fair schema" if found is None else \
        f"has the schema at revision {found}"
    fix = f"run `{MIGRATE_COMMAND}`"
    if found is not None and found not in _known_revisions():  # migrations never go back
        fix = (f"a newer celery_fair migrated it, so upgrade celery_fair here ({fix} "
               "cannot go back)")
    raise SchemaOutOfDate(
        f"{where}: the SQL store's database {database} (tables prefixed {table_prefix!r}) "
        f"{state}; this celery_fair expects revision {SCHEMA_VERSION}: {fix}")


def upgrade_sql(url: str, table_prefix: str = DEFAULT_PREFIX) -> str:
    """The SQL an upgrade from an empty schema to :data:`SCHEMA_VERSION` runs on the
    database of ``url`` (Alembic's offline mode): for whoever applies SQL themselves.
    Nothing connects to the database."""
    check_table_prefix(table_prefix, "table_prefix")
    config = alembic_config(table_prefix, dialect=sql_url(url).get_backend_name())
    command.upgrade(config, "head", sql=True)
    buffer = config.output_buffer
    assert isinstance(buffer, io.StringIO)
    return buffer.getvalue()


def describe(target: Engine | str) -> str:
    """The database of an engine or URL as errors and output show it (no password)."""
    url = target.url if isinstance(target, Engine) else sql_url(target)
    return str(safe_url(url.render_as_string(hide_password=True)))


def _known_revisions() -> set[str]:
    script = ScriptDirectory.from_config(alembic_config(DEFAULT_PREFIX))
    return {rev.revision for rev in script.walk_revisions()}


def _store_error(exc: DBAPIError, what: str) -> StoreError:
    first = (str(exc.orig or exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc.orig, OSError) or exc.connection_invalidated or \
            type(exc).__name__ in ("OperationalError", "InterfaceError"):
        return StoreConnectionError(f"{what}: {first}")
    return StoreError(f"{what}: {first}")
