"""Refill in release, the dispatcher's side (DESIGN.md "Refill in release").

With the direct push, each pick leaves its parameters in the store (the queue's
capacity, the leases, the dispatch id prefix, where to push) for ``REFILL_MS``; while
they are there, a release picks into the slot it frees itself (``release.lua``), so a
steady drain needs no dispatcher step per task. The dispatcher renews them at every step
(at least every sweep), reports what releases pushed at its next pick, and ends them when
it stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from kombu.exceptions import OperationalError

from .errors import FairError
from .store.base import DirectPush, Store

logger = logging.getLogger("celery_fair.dispatcher")

#: How long the refill parameters a step leaves last without another step: three sweeps
#: (schedule.SWEEP_SECONDS), so that a live dispatcher always renews them and a dead
#: one's end within seconds.
REFILL_MS = 3_000


class Refill:
    """Which queues this dispatcher's picks let releases refill."""

    def __init__(self, push_for: Callable[[str], DirectPush | None],
                 shares_pools: Callable[[str], bool]) -> None:
        self._push_for = push_for
        self._shares_pools = shares_pools
        #: Whether picks leave the parameters: only a dispatcher that goes on stepping
        #: (Dispatcher.run) drains what releases refill and hand off, so a bare step()
        #: (tools, tests driving time by hand) leaves none.
        self.live = False
        self.queues: set[str] = set()

    def push_for(self, queue: str, refill: bool = True) -> DirectPush | None:
        """The direct push into ``queue`` (None: none), with refill in release unless
        ``refill`` is false or its workers' pools are shared with other fair queues: the
        room those leave is read at each step (directory.room), which a release cannot."""
        push = self._push_for(queue)
        if push is None or not refill or not self.refills(queue):
            return push
        self.queues.add(queue)
        return replace(push, refill_ms=REFILL_MS)

    def refills(self, queue: str) -> bool:
        """Whether this dispatcher's picks let ``queue``'s releases refill (``push_for``),
        without asking for the push: its "auto" dispatch-ahead is then 0."""
        return self.live and self._push_for(queue) is not None \
            and not self._shares_pools(queue)

    def end(self, store: Store, last_step: Callable[[str], object]) -> None:
        """End refill in release for the queues it was given to (releases wake a
        dispatcher again), then ``last_step`` each queue where what releases refilled or
        handed off waits for a pick (else a handed-off dispatch's lease runs out and it
        is held again)."""
        queues, self.queues, self.live = sorted(self.queues), set(), False
        try:
            for queue in store.end_refill(queues):
                last_step(queue)
        except (FairError, OperationalError, OSError) as exc:
            logger.warning("celery_fair dispatcher: could not end refill in release (%s); "
                           "it ends within %.0fs", exc, REFILL_MS / 1000)
