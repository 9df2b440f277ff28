"""A bound on how long one transaction may wait on PostgreSQL.

libpq has no read timeout: a command whose connection stops answering (a partition, a
frozen server, a relay that stops forwarding) waits until TCP gives up, which can be
never. The watchdog shuts the socket of a transaction still running past its deadline
(``fair_store_socket_timeout``), so the driver's wait ends with an error at once, as a
Redis command's socket timeout does. One thread serves the process; arming it costs a
heap push.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time


class Watchdog:
    """Deadlines of running transactions, and a thread that enforces them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, int]] = []  # (deadline, ticket, fd)
        self._live: set[int] = set()
        self._fired: set[int] = set()
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> int:
        """Shut socket ``fd`` unless :meth:`disarm` comes within ``seconds``; returns the
        ticket to disarm with."""
        ticket = next(self._tickets)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + seconds, ticket, fd))
            self._live.add(ticket)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="celery-fair-sql-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return ticket

    def disarm(self, ticket: int) -> bool:
        """Stop watching ``ticket``; True when its deadline had passed (its socket was
        shut: the transaction failed because the store did not answer in time)."""
        with self._cond:
            self._live.discard(ticket)
            if ticket in self._fired:
                self._fired.discard(ticket)
                return True
        return False

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait(60)
                    continue
                deadline, ticket, fd = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                self._live.discard(ticket)
                self._fired.add(ticket)
                _shut(fd)


def _shut(fd: int) -> None:
    """Shut the connection on ``fd`` both ways (the driver then sees it closed)."""
    try:
        sock = socket.socket(fileno=socket.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


WATCHDOG = Watchdog()
