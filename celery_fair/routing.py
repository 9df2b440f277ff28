"""Affinity routing in the dispatcher (``fair_affinity = "hash"``): which worker each group
of a fair queue goes to, kept in the store's map for the pick to read.

The owners are computed here, not in the store: the jump hash (``affinity.py``) needs
64-bit integers that Redis's Lua does not have. Per routed queue the router reads the live
workers (at most once a second, and at once after a reclaim: a dead worker's registration
ends with its leases) and their slot table. When the table changes, every group of the map
is given its owner under the new table (``fair_assign``'s choice where it gives one): only
the groups whose owner changed are written, and counted as moves in the store. A group the
pick meets without a live worker in the map (new, or its worker gone) is reported by the
pick, assigned, and the pick runs again in the same step.

Each worker may have its pool plus ``fair_dispatch_ahead`` (with ``fair_max_inflight``
'auto', whose capacity is then the sum of these) routed dispatches in flight; the pick
counts them in the store (``store/routing.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .assign import Assigner, AssignWorker, load_assign
from .config import FairConfig
from .policies import HASH_AFFINITY
from .store.base import Store
from .store.models import LiveWorker
from .store.registry import slot_table
from .store.routing import Routed, refuse_affinity

__all__ = ["REFRESH_SECONDS", "Router"]

logger = logging.getLogger("celery_fair.dispatcher")

#: How often a routed queue's live workers are read again (a reclaim reads them at once).
REFRESH_SECONDS = 1.0


@dataclass
class _Route:
    """One routed queue's live workers as last read."""

    workers: list[LiveWorker]
    table: list[str | None]
    read_at: float
    limits: dict[str, int] = field(default_factory=dict)  # worker -> most in flight


class Router:
    """The routed queues of one dispatcher.

    Raises ConfigurationError at construction when a queue asks for affinity and the
    store cannot route, or ``fair_assign`` does not import.
    """

    def __init__(self, store: Callable[[], Store], config: FairConfig,
                 clock: Callable[[], float]) -> None:
        self._store = store
        self.config = config
        self._clock = clock
        self._routes: dict[str, _Route] = {}
        asking = [q for q, c in config.queue_policies.items() if c.affinity == HASH_AFFINITY]
        if config.policy.affinity == HASH_AFFINITY:
            asking.insert(0, "*")
        refuse_affinity(store(), asking)
        self.assigner = Assigner(load_assign(config.assign) if asking else None)

    def routes(self, queue: str) -> bool:
        """Whether ``queue``'s groups are routed to workers."""
        return self.config.policy_for(queue).affinity == HASH_AFFINITY

    def pick(self, queue: str, now_ms: int, limit: int, capacity: int | None,
             lease_ms: int, *, reclaimed: bool) -> Routed:
        """Promote and pick ``queue`` routed (``reclaimed``: leases were just taken back,
        so its workers are read again first); groups met unassigned are assigned and
        picked in a second call."""
        route = self._refresh(queue, now_ms, force=reclaimed)
        if self.config.max_inflight is None:
            # 'auto': the workers' own limits are the capacity (with the queue's one
            # ahead in all, a worker would wait for room taken by the others' aheads)
            capacity = sum(route.limits.values())
        spill = self.config.policy_for(queue).spill_seconds
        spill_ms = None if spill is None else int(spill * 1000)
        store = self._store()
        routed = store.pick_routed(queue, limit, capacity, now_ms, lease_ms, route.limits,
                                   spill_ms, promote=True)
        if not routed.unassigned or not route.table:
            return routed
        self._assign(queue, route, [(g, None) for g in routed.unassigned])
        again = store.pick_routed(queue, limit - len(routed.picked), capacity, now_ms,
                                  lease_ms, route.limits, spill_ms)
        return Routed(routed.picked + again.picked, routed.workers + again.workers,
                      again.unassigned, routed.promoted)

    def table(self, queue: str) -> list[str | None]:
        """``queue``'s slot table as last read (empty: not read yet, or no worker)."""
        route = self._routes.get(queue)
        return list(route.table) if route else []

    def forget(self, queue: str) -> None:
        """``queue`` is no longer served."""
        self._routes.pop(queue, None)

    def _refresh(self, queue: str, now_ms: int, force: bool) -> _Route:
        before = self._routes.get(queue)
        clock = self._clock()
        if before is not None and not force and clock - before.read_at < REFRESH_SECONDS:
            return before
        workers = [w for w in self._store().live_workers(queue, now_ms) if w.slot is not None]
        ahead = self.config.dispatch_ahead if self.config.max_inflight is None else 0
        route = _Route(workers, slot_table(workers), clock,
                       {w.hostname: w.pool + ahead for w in workers})
        self._routes[queue] = route
        if route.table and (before is None or before.table != route.table):
            self._remap(queue, route, before)
        return route

    def _remap(self, queue: str, route: _Route, before: _Route | None) -> None:
        """The workers changed (or this dispatcher just started): every group of the map
        to its owner under the new table; only those whose owner changed are written."""
        current = self._store().assignments(queue)
        moves = self._assign(queue, route, list(current.items()))
        if before is not None or moves:
            logger.info("queue %s: workers %s; %d of %d groups moved", queue,
                        ", ".join(w or "-" for w in route.table), moves, len(current))

    def _assign(self, queue: str, route: _Route, groups: list[tuple[str, str | None]]) -> int:
        """Give each (group, worker as read; None: unknown) its owner under ``route``;
        returns the groups moved from one worker to another."""
        workers = self._assign_workers(route)
        changes = []
        for group, old in groups:
            new = self.assigner.owner(group, route.table, workers)
            if new is not None and new != old:
                changes.append((group, old, new))
        self.assigner.report()
        return self._store().assign(queue, changes) if changes else 0

    def _assign_workers(self, route: _Route) -> list[AssignWorker]:
        """The live workers as ``fair_assign`` sees them (nothing to build without it)."""
        if self.assigner.function is None:
            return []
        return [AssignWorker(w.hostname, _utc(w.started_ms), w.pool, self._queues_of(w.hostname))
                for w in route.workers]

    def _queues_of(self, hostname: str) -> tuple[str, ...]:
        return tuple(sorted(q for q, r in self._routes.items()
                            if any(w.hostname == hostname for w in r.workers)))


def _utc(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
