"""Surviving a store or broker outage: capped exponential backoff, and one log line when
something starts failing and one when it works again (not one per retry)."""

from __future__ import annotations

import logging
import threading
import time


class Backoff:
    """Delays ``first``, 2×, 4×... up to ``cap`` seconds; :meth:`reset` after a success."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap = first, cap
        self._next = first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._next = self.first


class Outage:
    """Tracks whether ``what`` is failing, logging only the changes of state.

    The first failure is a WARNING (with a traceback when the error is not one of the
    ``expected`` kinds); later ones are DEBUG; each says ``then`` (what happens next, such
    as the wait before the next try); the first success after failures is one WARNING
    saying how long it lasted. Thread-safe.
    """

    def __init__(self, logger: logging.Logger, what: str,
                 expected: tuple[type[BaseException], ...] = ()) -> None:
        self.logger, self.what, self.expected = logger, what, expected
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException, then: str = "retrying") -> bool:
        """Record a failure; True when it is the first of an outage (it was logged)."""
        with self._lock:
            self._failures += 1
            first = self._since is None
            if first:
                self._since = time.monotonic()
        if first:
            self.logger.warning("%s failed, %s: %s", self.what, then, exc,
                                exc_info=not isinstance(exc, self.expected))
        else:
            self.logger.debug("%s failed again, %s: %s", self.what, then, exc)
        return first

    def ok(self, detail: str = "") -> bool:
        """Record a success; True when it ends an outage (it was logged)."""
        if self._since is None:  # the common case, without the lock
            return False
        with self._lock:
            since, failures, self._since, self._failures = self._since, self._failures, None, 0
        if since is None:
            return False
        self.logger.warning("%s works again after %.1fs (%d failed attempts)%s", self.what,
                            time.monotonic() - since, failures, detail)
        return True
