"""Engines and transactions of the SQL store: one place for what differs by database.

- PostgreSQL (psycopg 3): READ COMMITTED, the default; wake-ups by LISTEN/NOTIFY.
- MariaDB/MySQL (PyMySQL): READ COMMITTED, because REPEATABLE READ's gap locks deadlock
  the range scans every pick makes.
- SQLite (a file): WAL, and every transaction ``BEGIN IMMEDIATE`` (it takes the write
  lock at once, so two writers never both read and then fail to upgrade).

A transaction that lost a deadlock or a lock wait is run again (:func:`transaction`);
a connection that fails becomes a :class:`~celery_fair.errors.StoreConnectionError`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from ...errors import ConfigurationError, StoreConnectionError, StoreError, StoreUnreachable
from ...redact import safe_url
from ..connection import Bounds

log = logging.getLogger(__name__)
T = TypeVar("T")

#: URL scheme -> the driver celery_fair uses for it.
DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg",
           "mysql": "mysql+pymysql", "mariadb": "mariadb+pymysql", "sqlite": "sqlite"}
#: Error codes of a transaction that may simply be run again (it changed nothing).
_RETRY_PG = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock not available
_RETRY_MYSQL = {1205, 1213}  # lock wait timeout, deadlock
#: Tries of a transaction that keeps losing deadlocks before the error is raised.
DEADLOCK_TRIES = 20


def sql_url(url: str) -> URL:
    """``url`` with the driver celery_fair uses for its database.

    Raises:
        ConfigurationError: naming the (password-masked) URL, when it is not one.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(f"setting fair_store_url={safe_url(url)!r} is invalid: "
                                 "expected a database URL") from None
    driver = DRIVERS.get(parsed.drivername, parsed.drivername)
    return parsed.set(drivername=driver)


def make_engine(url: str, bounds: Bounds) -> Engine:
    """An engine for ``url`` set up as this module's docstring says."""
    target = sql_url(url)
    backend = target.get_backend_name()
    options: dict[str, Any] = {"pool_size": 10, "max_overflow": 20}
    connect: dict[str, Any] = {}
    if backend == "postgresql":
        connect = {"connect_timeout": max(1, int(bounds.connect_timeout))}
    elif backend in ("mysql", "mariadb"):
        options["isolation_level"] = "READ COMMITTED"
        connect = {"connect_timeout": max(1, int(bounds.connect_timeout)),
                   "read_timeout": max(1, int(bounds.socket_timeout)),
                   "write_timeout": max(1, int(bounds.socket_timeout))}
    elif backend == "sqlite":
        options = {}
        connect = {"timeout": bounds.socket_timeout, "isolation_level": None,
                   "check_same_thread": False}
    try:
        engine = create_engine(target, connect_args=connect, **options)
    except (NoSuchModuleError, ImportError) as exc:
        raise ConfigurationError(
            f"setting fair_store_url={safe_url(url)!r} needs the database driver "
            f"{target.drivername!r}: pip install 'celery-fair[{_extra(backend)}]' "
            f"({exc})") from None
    if backend == "sqlite":
        _immediate(engine)
    return engine


def _extra(backend: str) -> str:
    return {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}.get(backend,
                                                                                  "sql")


def _immediate(engine: Engine) -> None:
    """SQLite: WAL (readers never wait for the writer), durable commits, and a write
    lock taken when each transaction begins."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi: Any, _: Any) -> None:
        cursor = dbapi.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def retryable(exc: DBAPIError) -> bool:
    """Whether ``exc`` is a deadlock or lock wait the database rolled back."""
    orig = exc.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code in _RETRY_PG:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _RETRY_MYSQL:
        return True
    return "database is locked" in str(orig)


def transaction(engine: Engine, where: str, work: Callable[[Connection], T],
                retries: int = 3) -> T:
    """Run ``work`` in one transaction; again, from the start, when it lost a deadlock or
    its connection broke before the commit (a transaction never committed changed
    nothing, so running it again is safe; pooled connections are not pinged first, which
    would cost a round trip per transaction).

    Raises:
        StoreUnreachable: the database could not be reached, or every try broke before
            its commit: nothing was changed.
        StoreConnectionError: the connection broke at the commit: the transaction may
            have committed (its reply lost).
        StoreError: any other database error.
    """
    broken = 0
    for attempt in range(DEADLOCK_TRIES + retries):
        try:
            conn = engine.connect()
        except DBAPIError as exc:
            broken += 1
            if broken > retries:
                raise StoreUnreachable(f"store {where}: {_first_line(exc)}") from exc
            time.sleep(min(1.0, 0.05 * 2 ** broken))
            continue
        with conn:
            try:
                trans = conn.begin()
                result = work(conn)
            except DBAPIError as exc:
                if exc.connection_invalidated or _disconnect(exc):
                    broken += 1
                    if broken > retries:
                        raise StoreUnreachable(f"store {where}: {_first_line(exc)}; nothing "
                                               "was changed") from exc
                    continue
                if not retryable(exc) or attempt >= DEADLOCK_TRIES - 1:
                    raise StoreError(f"store {where}: {_first_line(exc)}") from exc
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
                continue
            try:
                trans.commit()
            except DBAPIError as exc:
                raise StoreConnectionError(f"store {where}: {_first_line(exc)} at the "
                                           "commit") from exc
            return result
    raise StoreError(f"store {where}: gave up after {DEADLOCK_TRIES} deadlocks")


def _disconnect(exc: DBAPIError) -> bool:
    from sqlalchemy.exc import InterfaceError, OperationalError
    return isinstance(exc, (OperationalError, InterfaceError)) and not retryable(exc)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
