"""A dispatcher's heartbeat in the store: how status, Flower, ``/metrics`` and ``fair
check`` tell that a dispatcher is running (``liveness.py`` reads it).

The dispatcher's loop beats at most once every :data:`BEAT_SECONDS` (it goes round at
least once a second even when idle, so an idle dispatcher stays live). A beat lasts
:data:`BEAT_TTL_MS`: twice the longest backoff between steps while the store or broker
fails, so a dispatcher riding out a short outage is not reported dead, while a killed one
drops out within ten seconds. A clean stop forgets the beat at once. The beat is a
report, never a condition of work: a store error while beating is logged (once per
outage) and the dispatcher goes on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from .outage import Outage
from .store.base import DispatcherBeat, Store, now_ms

logger = logging.getLogger("celery_fair.dispatcher")

#: Least time between two beats of one dispatcher (seconds).
BEAT_SECONDS = 1.0
#: How long a beat lasts (ms): 2 x the dispatcher's longest backoff (5 s).
BEAT_TTL_MS = 10_000


class Heartbeat:
    """The beats of one dispatcher process.

    ``store``: the store to beat in (read at each beat: tests swap the dispatcher's);
    ``queues``: the fair queues it serves now, and whether it serves every one.
    """

    def __init__(self, store: Callable[[], Store],
                 queues: Callable[[], tuple[list[str], bool]], app: str) -> None:
        # the SQL store keeps names of at most 255 characters
        self._store, self._queues, self.app = store, queues, app[:255]
        self.host, self.pid = socket.gethostname()[:200], os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.started_ms = now_ms()
        self.last_step_ms = 0
        self._beaten: float | None = None  # monotonic time of the last beat
        self._beaten_step = 0  # the last step that beat carried
        self._outage = Outage(logger, "dispatcher heartbeat")

    def stepped(self) -> None:
        """A step just finished: the beat's "last step"."""
        self.last_step_ms = now_ms()

    def maybe_beat(self) -> None:
        """Beat unless the last beat is under BEAT_SECONDS old; never raises. The first
        step is told at once: until then status can only say "last step none yet"."""
        first_step = self.last_step_ms and not self._beaten_step
        if self._beaten is not None and not first_step \
                and time.monotonic() - self._beaten < BEAT_SECONDS:
            return
        self._beaten, self._beaten_step = time.monotonic(), self.last_step_ms
        queues, every = self._queues()
        beat = DispatcherBeat(self.id, self.host, self.pid, self.started_ms,
                              self.last_step_ms, tuple(queues), every, self.app)
        try:
            self._store().beat(beat, now_ms(), BEAT_TTL_MS)
        except Exception as exc:  # noqa: BLE001 - a report must not stop dispatching
            self._outage.failed(exc, "dispatching goes on")
        else:
            self._outage.ok()

    def forget(self) -> None:
        """The dispatcher stops cleanly: drop its beat now (else it lapses by itself)."""
        if self._beaten is None:  # never beat (``--once``, or never run)
            return
        try:
            self._store().forget_dispatcher(self.id)
        except Exception as exc:  # noqa: BLE001 - stopping goes on; the beat expires
            logger.warning("dispatcher heartbeat not removed (it lapses within %ds): %s",
                           BEAT_TTL_MS // 1000, exc)
