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
from .watchdog import WATCHDOG

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
        # libpq has no read timeout: TCP keepalives find a peer that went silent (a
        # network partition) within about fair_store_socket_timeout + 3 s, and
        # tcp_user_timeout a peer that stopped acknowledging what was sent.
        idle = max(1, int(bounds.socket_timeout))
        connect = {"connect_timeout": max(1, int(bounds.connect_timeout)), "keepalives": 1,
                   "keepalives_idle": idle, "keepalives_interval": 1, "keepalives_count": 3,
                   "tcp_user_timeout": int(bounds.socket_timeout * 1000)}
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
                retries: int = 3, timeout: float | None = None) -> T:
    """Run ``work`` in one transaction; again, from the start, when it lost a deadlock or
    its connection broke before the commit (a transaction never committed changed
    nothing, so running it again is safe; pooled connections are not pinged first, which
    would cost a round trip per transaction). On PostgreSQL a transaction still running
    after ``timeout`` seconds has its connection shut (``watchdog.py``).

    Raises:
        StoreUnreachable: the database could not be reached, or every try broke before
            its commit, or did not answer in time: nothing was changed.
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
            ticket = _arm(conn, timeout)
            try:
                phase, outcome = _once(conn, work)
            finally:
                late = ticket is not None and WATCHDOG.disarm(ticket)
        if phase == "done":
            return outcome  # type: ignore[no-any-return]
        failure: DBAPIError = outcome
        if late:
            error = StoreUnreachable if phase == "work" else StoreConnectionError
            raise error(f"store {where}: no answer within {timeout}s "
                        "(fair_store_socket_timeout)" + _AT[phase]) from failure
        if phase == "commit":
            raise StoreConnectionError(f"store {where}: {_first_line(failure)}{_AT[phase]}") \
                from failure
        if failure.connection_invalidated or _disconnect(failure):
            broken += 1
            if broken > retries:
                raise StoreUnreachable(f"store {where}: {_first_line(failure)}{_AT[phase]}") \
                    from failure
            continue
        if not retryable(failure) or attempt >= DEADLOCK_TRIES - 1:
            raise StoreError(f"store {where}: {_first_line(failure)}") from failure
        time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    raise StoreError(f"store {where}: gave up after {DEADLOCK_TRIES} deadlocks")


_AT = {"work": "; nothing was changed", "commit": " at the commit: it may have committed"}


def _once(conn: Connection, work: Callable[[Connection], T]) -> tuple[str, Any]:
    """One try: ("done", result), or (the phase that failed, its DBAPIError)."""
    try:
        trans = conn.begin()
        result = work(conn)
    except DBAPIError as exc:
        return "work", exc
    try:
        trans.commit()
    except DBAPIError as exc:
        return "commit", exc
    return "done", result


def _arm(conn: Connection, timeout: float | None) -> int | None:
    """Watch a PostgreSQL connection for ``timeout`` seconds (libpq has no read timeout;
    the other drivers time out reads themselves)."""
    if timeout is None or conn.dialect.name != "postgresql":
        return None
    return WATCHDOG.arm(conn.connection.dbapi_connection.fileno(), timeout)  # type: ignore


def _disconnect(exc: DBAPIError) -> bool:
    from sqlalchemy.exc import InterfaceError, OperationalError
    return isinstance(exc, (OperationalError, InterfaceError)) and not retryable(exc)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
