"""The dispatcher's directory of fair queues: which it serves, and how much each may take.

:class:`QueueDirectory` re-reads the set of fair queues and their live workers' pools every
``REFRESH_SECONDS``, configures a queue's policy the first time it serves it, stops serving
a queue idle past the prune horizon, and says how many tasks a queue may have in flight
in a step (``capacity.py`` when workers share their pools across queues).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .capacity import dispatch_ahead, room, sharing
from .config import FairConfig
from .errors import SlotMigrating
from .schedule import PRUNE_SECONDS, StepSchedule
from .shards import Shard
from .store.base import Policy, Store
from .store.base import now_ms as _now_ms
from .summary import Capacity, queue_capacity

# The name this log has always had (the directory lived in dispatcher.py): users filter on it.
logger = logging.getLogger("celery_fair.dispatcher")

#: How often the set of fair queues and the live workers' capacity are re-read.
REFRESH_SECONDS = 1.0


class QueueDirectory:
    """The fair queues one dispatcher serves (all of them, or ``fixed_queues``; with
    ``shard``, only those of its shard: shards.py).

    ``clock``: the dispatcher's monotonic clock; ``schedule``: its step schedule, told
    which queues exist and when one is due at once; ``forget``: called with a queue no
    longer served.
    """

    def __init__(self, store: Store, config: FairConfig, fixed_queues: list[str] | None,
                 schedule: StepSchedule, clock: Callable[[], float],
                 forget: Callable[[str], None], shard: Shard | None = None) -> None:
        self.store = store
        self.config = config
        self.fixed_queues = fixed_queues
        self.shard = shard
        self.queues: list[str] = []
        self._schedule = schedule
        self._clock = clock
        self._forget = forget
        self._configured: set[str] = set()
        self._capacity: dict[str, Capacity] = {}
        self._pools: dict[str, dict[str, int]] = {}  # queue -> {live worker: pool size}
        self._refreshed = 0.0
        #: Whether releases refill ``queue``'s freed slots (refill.py; the dispatcher
        #: sets it): its "auto" dispatch-ahead is then 0.
        self.refills: Callable[[str], bool] = lambda queue: False

    def refresh(self) -> bool:
        """Re-read the set of fair queues and their capacity if REFRESH_SECONDS passed;
        True when it did."""
        if self._clock() - self._refreshed < REFRESH_SECONDS:
            return False
        queues = self.fixed_queues or self.store.queues()
        shard = self.shard
        self.queues = list(queues) if shard is None else [q for q in queues if shard.serves(q)]
        for queue in list(self.queues):
            if queue not in self._configured:
                try:
                    self.store.configure(queue, policy_of(self.config, queue))
                except SlotMigrating as exc:  # served once configured, at a refresh
                    logger.warning("queue %s: not served yet: %s", queue, exc)
                    self.queues.remove(queue)
                    continue
                self._configured.add(queue)
                logger.info("serving fair queue %s", queue)
            self.set_capacity(queue)
        self._schedule.track(self.queues)
        self._prune()
        # Only a refresh that worked counts: otherwise, with no queue known yet, the steps
        # in between would do nothing, "work" and end the outage every second.
        self._refreshed = self._clock()
        return True

    def recheck_empty(self, queues: list[str]) -> None:
        """Between full refreshes only a queue without capacity is re-read: a worker
        that just came up wakes us and should get work at once."""
        for queue in queues:
            capacity = self._capacity.get(queue)
            if capacity is not None and capacity.limit == 0:
                self.set_capacity(queue)

    def _prune(self) -> None:
        """Stop serving the queues in which nothing happened for PRUNE_SECONDS, if the
        store finds nothing left in them (atomically; a later hold adds one back): each
        known queue costs a step per sweep and a key in every wait."""
        if self.fixed_queues:
            return
        for queue in self._schedule.idle():
            try:
                forgotten = self.store.forget_queue(queue)
            except SlotMigrating:  # its cluster slot is moving: kept, asked again later
                forgotten = False
            if not forgotten:
                self._schedule.touch(queue)  # not empty: look again a horizon later
                continue
            logger.info("queue %s: nothing held, delayed or in flight for %.0fs; no longer "
                        "served (a new hold brings it back)", queue, PRUNE_SECONDS)
            self.queues.remove(queue)
            self._schedule.drop(queue)
            self._configured.discard(queue)
            self._capacity.pop(queue, None)
            self._forget(queue)

    def capacity(self, queue: str) -> Capacity | None:
        """``queue``'s capacity and dispatch-ahead, as last read (None: not read yet)."""
        return self._capacity.get(queue)

    def capacities(self) -> dict[str, Capacity]:
        """Every served queue's capacity, as last read."""
        return self._capacity

    def room(self, queue: str) -> int | None:
        """What ``queue`` may have in flight in this step. When its workers consume other
        fair queues too, their pools are shared (capacity.py): what those queues hold
        now is read first (one round trip), so together they stay within the pools."""
        known = self._capacity.get(queue)
        limit = 0 if known is None else known.limit
        others = sharing(queue, self._pools) if limit else []
        if not others:
            return limit
        loads = self.store.loads(others)
        return room(queue, self._pools, loads,
                    dispatch_ahead(self.config.dispatch_ahead, refills=False))

    def shares_pools(self, queue: str) -> bool:
        """Whether some worker of ``queue`` consumes other fair queues too."""
        return bool(sharing(queue, self._pools))

    def set_capacity(self, queue: str) -> None:
        slots = 0
        if self.config.max_inflight is None:
            self._pools[queue] = self.store.worker_pools(queue, _now_ms())
            slots = sum(self._pools[queue].values())
        # summary.queue_capacity: the definition `fair status` and Flower show too
        capacity = queue_capacity(self.config, slots, bool(slots) and self.refills(queue))
        if capacity != self._capacity.get(queue):
            if capacity.limit == 0:
                logger.warning("queue %s: no live worker consumes it; holding its tasks",
                               queue)
            else:
                logger.info("queue %s: capacity %s", queue, capacity)
            self._capacity[queue] = capacity
            self._schedule.due_now(queue)


def policy_of(c: FairConfig, queue: str | None = None) -> Policy:
    """The policy settings a dispatcher configures ``queue`` with (None: the app-wide
    ones, which the simulator replays a trace under)."""
    choice = c.policy if queue is None else c.policy_for(queue)
    return Policy(c.default_concurrency, c.interactive_reserve, 1.0,
                  c.group_concurrency, c.group_weights, c.default_rate, c.group_rates,
                  choice.name, choice.charge, choice.cap_mode, choice.interactive_share,
                  choice.aging_seconds, choice.subgroup, choice.scope)
