"""The store backends the contract suite runs against, and the databases under them.

Every backend is a real one: the memory store, the Redis store on the session's
redis-server, and the SQL store (``celery_fair.store.sql``, reached through the factory
only) on an SQLite file, the running PostgreSQL and the running MariaDB. Each SQL server
gets one database per test session (``celery_fair_<random>``, created here with the
driver itself and dropped at the end); stores of different namespaces share its tables
(their rows carry the namespace), so a fresh namespace per test isolates the tests as a
schema of their own would.

Where the servers are: ``CELERY_FAIR_TEST_POSTGRES_URL`` (default
``postgresql+psycopg://postgres@127.0.0.1:5432``) and ``CELERY_FAIR_TEST_MYSQL_URL``
(default ``mysql+pymysql://root@127.0.0.1:3306``), without a database name.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

from celery_fair.store.sql import migrate

from .components import MARIADB, POSTGRESQL, require_component

#: Every backend of the contract suite, in the order the tests run.
BACKENDS = ("memory", "redis", "sqlite", "postgresql", "mariadb")
#: The SQL ones (the SQL store behind the factory).
SQL_BACKENDS = ("sqlite", "postgresql", "mariadb")
#: The table prefix the suite's SQL stores use (the factory's default).
TABLE_PREFIX = "fair_"

POSTGRES_URL = os.environ.get("CELERY_FAIR_TEST_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432")
MYSQL_URL = os.environ.get("CELERY_FAIR_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")


def _server(url: str) -> tuple[str, int, str, str]:
    """Host, port, user and password of a server URL (for the driver's own connect)."""
    parts = urlsplit(url)
    return (parts.hostname or "127.0.0.1", parts.port or 0, unquote(parts.username or ""),
            unquote(parts.password or ""))


def _where(url: str) -> str:
    """``url`` as a skip reason may show it: scheme, host and port, no credentials."""
    host, port, _, _ = _server(url)
    return f"{urlsplit(url).scheme}://{host}:{port}"


class Database:
    """One database of the session on a SQL server: created, migrated, dropped."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url  # SQLAlchemy URL of the database, what the factory takes

    def drop(self) -> None:
        """Drop the database (PostgreSQL, MariaDB); the SQLite file goes with its dir."""


class ServerDatabase(Database):
    """A database ``celery_fair_<random>`` made on a running PostgreSQL or MariaDB."""

    def __init__(self, kind: str, server_url: str) -> None:
        self.name = "celery_fair_" + uuid.uuid4().hex[:12]
        self.server_url = server_url.rstrip("/")
        super().__init__(kind, f"{self.server_url}/{self.name}")
        self._run(f"CREATE DATABASE {self.name}")

    def _run(self, statement: str) -> None:
        """Run ``statement`` on the server (outside any database of ours)."""
        try:
            (_postgres if self.kind == "postgresql" else _mysql)(self.server_url, statement)
        except ConnectionRefusedError as exc:
            server = POSTGRESQL if self.kind == "postgresql" else MARIADB
            require_component(server.name, server.how_to_install,
                              f"{_where(self.server_url)} cannot be reached ({exc})")

    def drop(self) -> None:
        force = " WITH (FORCE)" if self.kind == "postgresql" else ""
        self._run(f"DROP DATABASE IF EXISTS {self.name}{force}")


def _postgres(server_url: str, statement: str) -> None:
    import psycopg

    host, port, user, password = _server(server_url)
    try:
        with psycopg.connect(host=host, port=port or 5432, user=user or "postgres",
                             password=password or None, dbname="postgres", autocommit=True,
                             connect_timeout=5) as conn:
            conn.execute(statement.encode())
    except psycopg.OperationalError as exc:
        if "connect" not in str(exc).lower():
            raise
        raise ConnectionRefusedError(type(exc).__name__) from None


def _mysql(server_url: str, statement: str) -> None:
    import pymysql

    host, port, user, password = _server(server_url)
    try:
        conn = pymysql.connect(host=host, port=port or 3306, user=user or "root",
                               password=password, connect_timeout=5)
    except pymysql.err.OperationalError as exc:
        raise ConnectionRefusedError(f"{type(exc).__name__} {exc.args[0]}") from None
    try:
        conn.cursor().execute(statement)
    finally:
        conn.close()


def create_database(kind: str, tmp_dir: Path) -> Database:
    """A fresh, migrated database of ``kind`` (sqlite, postgresql, mariadb) for the
    session. Skips when the server cannot be reached (a failure under
    CELERY_FAIR_STRICT=1, as in CI)."""
    database: Database
    if kind == "sqlite":
        database = Database(kind, f"sqlite:///{tmp_dir / 'celery_fair.sqlite3'}")
    else:
        database = ServerDatabase(kind, POSTGRES_URL if kind == "postgresql" else MYSQL_URL)
    try:
        migrate(database.url, table_prefix=TABLE_PREFIX)
    except BaseException:
        database.drop()
        raise
    return database
