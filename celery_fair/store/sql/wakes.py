"""Wake-ups of the SQL store's dispatchers.

PostgreSQL: LISTEN/NOTIFY on one channel per namespace, the queue's name as payload; a
dedicated connection listens. MariaDB/MySQL and SQLite have no notifications: a
dispatcher in this process is woken at once, one in another process looks again every
:data:`POLL_SECONDS` (a wake-up may be spurious: the contract allows it).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, text

log = logging.getLogger(__name__)

#: How often a dispatcher on a database without notifications looks again (seconds).
POLL_SECONDS = 0.1
#: Longest a look waits for a notification this store sent (PostgreSQL delivers it
#: asynchronously, normally within a millisecond).
OWN_NOTICE_SECONDS = 0.25


class Wakes:
    """In-process wake-ups, and a look every :data:`POLL_SECONDS` for the others."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._woken: set[str] = set()

    #: The channel a transaction that wakes a queue notifies (PostgreSQL; the payload is
    #: the queue's name); None: no notifications.
    notice: str | None = None

    def wake(self, queue: str) -> None:
        """Wake the dispatchers of ``queue``, here and (where the database can) in other
        processes."""
        self.wake_here(queue)

    def wake_here(self, queue: str) -> None:
        """Wake this process's dispatchers (a transaction notified the others)."""
        with self._cond:
            self._woken.add(queue)
            self._cond.notify_all()

    def _take(self, names: set[str]) -> set[str]:
        found = self._woken & names
        self._woken -= found
        return found

    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        names = set(queues)
        deadline = time.monotonic() + min(timeout, POLL_SECONDS)
        with self._cond:
            while not (found := self._take(names)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return names if timeout >= POLL_SECONDS else set()
                self._cond.wait(left)
        return found

    def close(self) -> None:
        """Nothing to close."""


class NotifyWakes(Wakes):
    """PostgreSQL's LISTEN/NOTIFY (see the module docstring). Every wake-up, this
    process's included, arrives as a notification (a transaction that woke a queue
    notifies at its commit), so each wakes a waiter once."""

    def __init__(self, engine: Engine, namespace: str) -> None:
        super().__init__()
        self.engine = engine
        self.channel = "fair_" + hashlib.sha1(namespace.encode()).hexdigest()[:16]
        self.notice = self.channel
        self._listener: Any = None
        self._lock = threading.Lock()
        self._expected: dict[str, float] = {}  # queue -> when this store notified it

    def wake(self, queue: str) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT pg_notify(:c, :q)"), {"c": self.channel, "q": queue})
            conn.commit()

    def wake_here(self, queue: str) -> None:
        """A transaction of this store notified ``queue``: the notification wakes this
        process too, a moment later; until it arrives a look at the queue (timeout 0)
        waits for it, up to :data:`OWN_NOTICE_SECONDS` (read your own wake-ups)."""
        with self._cond:
            self._expected[queue] = time.monotonic()

    def _listen(self) -> Any:
        if self._listener is None or self._listener.closed:
            import psycopg

            url = self.engine.url
            self._listener = psycopg.connect(
                host=url.host, port=url.port, user=url.username, password=url.password,
                dbname=url.database, autocommit=True, connect_timeout=5)
            self._listener.execute(f'LISTEN "{self.channel}"')
        return self._listener

    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        names = set(queues)
        deadline = time.monotonic() + max(timeout, self._own_notice(names))
        with self._lock:
            if self._listener is None:
                # Only a process that waits listens: a session that LISTENs and never
                # reads (a web app's, a worker's) would pin PostgreSQL's notification
                # queue, and a full queue fails every NOTIFY. What was notified before
                # this first look was not heard: look at everything once.
                try:
                    self._listen()
                except Exception as exc:  # noqa: BLE001 - the next look tries again
                    self._lost(exc, deadline)
                return names
            while not (found := self._take(names)):
                left = deadline - time.monotonic()
                try:
                    conn = self._listen()
                    notices = list(conn.notifies(timeout=max(left, 0.0), stop_after=1))
                    notices += list(conn.notifies(timeout=0.0))
                except Exception as exc:  # a lost listener: look at everything once
                    self._lost(exc, deadline)
                    return names
                with self._cond:
                    for notice in notices:
                        self._woken.add(notice.payload)
                        self._expected.pop(notice.payload, None)
                if left <= 0:
                    return self._take(names)
        return found

    def _lost(self, exc: Exception, deadline: float) -> None:
        log.warning("celery_fair: listening for wake-ups failed (%s); reconnecting",
                    type(exc).__name__)
        self.close()
        time.sleep(min(max(deadline - time.monotonic(), 0.0), 1.0))

    def _own_notice(self, names: set[str]) -> float:
        """How long to wait for a notification this store sent to one of ``names`` and
        has not received yet (0: none in flight)."""
        now = time.monotonic()
        with self._cond:
            for queue, sent in list(self._expected.items()):
                if now - sent > OWN_NOTICE_SECONDS:
                    del self._expected[queue]  # lost with a listener: never wait for it
            pending = [sent for queue, sent in self._expected.items() if queue in names]
        return max((sent + OWN_NOTICE_SECONDS - now for sent in pending), default=0.0)

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.close()
            except Exception:  # already broken: nothing to release
                pass


def wakes_for(engine: Engine, namespace: str) -> Wakes:
    """Notifications on PostgreSQL, polling elsewhere."""
    if engine.dialect.name == "postgresql":
        return NotifyWakes(engine, namespace)
    return Wakes()
