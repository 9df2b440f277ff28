"""The dispatcher's part in pauses (``controls.pause``) and boosts (``controls.boost``):
lift those whose end has come, and record each in the audit log. About once a second,
whatever the load: a pause or a boost ends within a second of its time, at the cost of
two small store reads per queue."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable

from . import audit
from .boosts import expire_boosts
from .errors import SlotMigrating
from .store.base import Store
from .store.pausing import WHOLE_QUEUE

logger = logging.getLogger(__name__)

#: How often a dispatcher looks for pauses past their end (seconds).
EXPIRE_SECONDS = 1.0


class PauseExpiry:
    """Lifts due pauses for one dispatcher (the store makes each lift happen once, so
    among several dispatchers one records it)."""

    def __init__(self, store: Callable[[], Store], clock: Callable[[], float]) -> None:
        self._store, self._clock = store, clock
        self._next = 0.0
        self.actor = f"dispatcher {socket.gethostname()}:{os.getpid()}"

    def maybe_expire(self, queues: Iterable[str], now_ms: int) -> list[tuple[str, str]]:
        """Lift the due pauses of ``queues`` and end their due boosts (at most once per
        EXPIRE_SECONDS); returns (queue, group) of each pause lifted ('' group: the whole
        queue)."""
        if self._clock() < self._next:
            return []
        self._next = self._clock() + EXPIRE_SECONDS
        store, lifted = self._store(), []
        for queue in queues:
            try:
                lifted += self._expire(store, queue, now_ms)
            except SlotMigrating:
                continue  # its cluster slot is moving (the step says so): next time
        return lifted

    def _expire(self, store: Store, queue: str, now_ms: int) -> list[tuple[str, str]]:
        lifted = []
        for group in store.expire_pauses(queue, now_ms):
            lifted.append((queue, group))
            name = None if group == WHOLE_QUEUE else group
            logger.info("celery_fair: pause of %s ended", f"group {group} in queue "
                        f"{queue}" if name else f"queue {queue}")
            audit.record(store, "expire", {"queue": queue, "group": name},
                         actor=self.actor)
        expire_boosts(store, queue, now_ms, self.actor)
        return lifted
