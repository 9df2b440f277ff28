"""Store round trips without redis-py's per-command machinery: the hot path's lane.

Every task makes a few store round trips (begin and release in the worker, the
dispatcher's step and wake-up wait): through ``redis.Redis.execute_command`` or a
``Pipeline`` each one costs about 110 µs of client CPU here, of which the exchange on the
socket is 40: the rest is a pool checkout and check-in under a lock, observability
records, argument filtering and retry wrappers, paid per call. A :class:`Lane` keeps a
few connections taken from the client's pool once (so ``client.close()`` and a fork's
pool reset still reach them) and sends on them directly: the same connection class, the
same socket and health-check settings, the same retry policy (the connection's copy of
the client's ``Retry``, disconnecting before each new try, as redis-py does), the same
errors (a reply error raised as redis-py raises it: ``NoScriptError`` for NOSCRIPT...).

A connection is used by one thread at a time (taken from the idle list, given back
after a clean exchange; one that failed is disconnected first, so nothing half-read is
ever reused), and the list is the process's own: a forked child starts with none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from .connection import _GET_CONNECTION_ARGS

Command = Sequence[Any]


class Lane:
    """Round trips on connections of ``client``'s pool kept out of it (see the module)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._idle: list[Any] = []
        self._pid = os.getpid()

    def take(self) -> Any:
        """A connection for this thread's next round trip; :meth:`give` it back after.
        May be unconnected: sending connects (with the connection's retries)."""
        if self._pid != os.getpid():  # forked: the parent's sockets are not ours
            self._idle, self._pid = [], os.getpid()
        try:
            return self._idle.pop()  # atomic: no two threads get the same one
        except IndexError:
            return self.client.connection_pool.get_connection(*_GET_CONNECTION_ARGS)

    def give(self, connection: Any) -> None:
        """Keep ``connection`` (from :meth:`take`) for the next round trip."""
        if self._pid == os.getpid():
            self._idle.append(connection)

    def connected(self) -> Any:
        """:meth:`take`, connected now, as the pool hands one out (one closed or with
        data waiting connected afresh): failing here is failing to connect, so nothing
        was sent. Raises redis-py's errors (the connection given back first)."""
        conn = self.take()
        try:
            conn.connect()
            try:
                if conn.can_read():
                    raise redis.ConnectionError("Connection has data")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.disconnect()
                conn.connect()
                if conn.can_read():
                    raise redis.ConnectionError("Connection not ready") from None
        except BaseException:
            conn.disconnect()
            self.give(conn)
            raise
        return conn

    def send(self, commands: Sequence[Command], connection: Any = None) -> list[Any]:
        """Send ``commands`` in one round trip (on ``connection``, taken before, if
        given); the replies in order, a reply error as its exception (not raised: the
        caller decides, as with a pipeline). Connection errors and timeouts are retried
        as the client would retry them; the last one is raised."""
        conn = connection if connection is not None else self.take()
        try:
            replies: list[Any] = conn.retry.call_with_retry(
                lambda: _exchange(conn, commands), lambda error, *_: conn.disconnect())
        except BaseException:
            conn.disconnect()  # whatever was not read must never be read as a reply
            self.give(conn)
            raise
        self.give(conn)
        return replies

    def call(self, *command: Any) -> Any:
        """One command; its reply, or its error raised."""
        [reply] = self.send([command])
        if isinstance(reply, ResponseError):
            raise reply
        return reply


def _exchange(conn: Any, commands: Sequence[Command]) -> list[Any]:
    # Connect through connect(), as the pool does before handing a connection out: a
    # Sentinel connection asks the Sentinels for the master there, while the reconnect
    # inside send_packed_command goes back to the address it had (after a failover, the
    # old master's).
    conn.connect()
    conn.send_packed_command(conn.pack_commands(commands))
    replies = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except ResponseError as exc:  # a reply, read whole: the others follow
            replies.append(exc)
    return replies


class LaneScript(Script):
    """A registered script (``client.register_script``) whose calls without another
    client go through ``lane``: EVALSHA, and after a NOSCRIPT the script loaded and run
    again, as ``Script.__call__`` does."""

    def __init__(self, lane: Lane, script: str) -> None:
        super().__init__(lane.client, script)
        self.lane = lane

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if client is not None and client is not self.registered_client:
            return super().__call__(keys or [], args or [], client)
        keys = list(keys or [])
        command = ("EVALSHA", self.sha, len(keys), *keys, *(args or []))
        try:
            return self.lane.call(*command)
        except NoScriptError:
            loaded = self.lane.call("SCRIPT", "LOAD", self.script)
            self.sha = loaded.decode() if isinstance(loaded, bytes) else loaded
            return self.lane.call("EVALSHA", self.sha, *command[2:])


def round_trip(client: Any, lane: Lane | None, commands: Sequence[Command],
               connection: Any = None) -> list[Any]:
    """``commands`` in one round trip on ``client`` (on ``connection``, taken before, if
    given): the replies, a reply error as its exception. Through ``lane`` when it is
    ``client``'s, else a redis-py pipeline (a cluster node's client)."""
    if lane is not None and client is lane.client:
        return lane.send(commands, connection)
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    if connection is not None:  # sent on it, then put back by the pipeline's reset
        pipe.connection = connection
    return list(pipe.execute(raise_on_error=False))
