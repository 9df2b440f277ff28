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

With ``fair_group_queues`` the groups matching a pattern go to a dedicated real queue
instead (``group_queues.py``): the map names it as a target (``queue:<name>``), whose
limit is the pools of the live workers consuming it; without affinity the other groups
go to the fair queue itself, one target whose limit is the queue's room.

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
from .capacity import dispatch_ahead
from .config import FairConfig
from .group_queues import dedicated, dedicated_queue, queue_of, target
from .policies import HASH_AFFINITY, PolicyChoice, routes
from .store.base import Store
from .store.models import LiveWorker
from .store.registry import slot_table
from .store.routing import Routed, refuse_affinity, refuse_group_queues

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

    Raises ConfigurationError at construction when a queue asks for affinity or
    dedicated queues and the store cannot route, or ``fair_assign`` does not import.
    """

    def __init__(self, store: Callable[[], Store], config: FairConfig,
                 clock: Callable[[], float]) -> None:
        self._store = store
        self.config = config
        self._clock = clock
        self._routes: dict[str, _Route] = {}
        refuse_affinity(store(), _asking(config, lambda c: c.affinity == HASH_AFFINITY))
        refuse_group_queues(store(), _asking(config, lambda c: bool(c.group_queues)))
        hashing = _asking(config, lambda c: c.affinity == HASH_AFFINITY)
        self.assigner = Assigner(load_assign(config.assign) if hashing else None)

    def routes(self, queue: str) -> bool:
        """Whether ``queue``'s groups are routed (to workers, or to dedicated queues)."""
        return routes(self.config.policy_for(queue))

    def pick(self, queue: str, now_ms: int, limit: int, capacity: int | None,
             lease_ms: int, *, reclaimed: bool) -> Routed:
        """Promote and pick ``queue`` routed (``reclaimed``: leases were just taken back,
        so its workers are read again first); groups met unassigned are assigned and
        picked in a second call. The targets are the workers (affinity) or the queue
        itself (with its room, ``capacity``), and each dedicated queue."""
        choice = self.config.policy_for(queue)
        route = self._refresh(queue, now_ms, force=reclaimed)
        limits = dict(route.limits)
        dedicated_room = sum(n for t, n in limits.items() if dedicated_queue(t) is not None)
        if choice.affinity != HASH_AFFINITY:
            limits[target(queue)] = capacity or 0  # the queue's own workers, as unrouted
        if self.config.max_inflight is None:
            # 'auto': the targets' own limits are the capacity (with the queue's one
            # ahead in all, a worker would wait for room taken by the others' aheads)
            capacity = sum(limits.values())
        elif capacity is not None:  # fair_max_inflight counts the queue's own workers
            capacity += dedicated_room
        spill = choice.spill_seconds
        spill_ms = None if spill is None else int(spill * 1000)
        store = self._store()
        routed = store.pick_routed(queue, limit, capacity, now_ms, lease_ms, limits,
                                   spill_ms, promote=True)
        changes = self._changes(queue, route, [(g, None) for g in routed.unassigned])
        if not changes:
            return routed
        store.assign(queue, changes)
        again = store.pick_routed(queue, limit - len(routed.picked), capacity, now_ms,
                                  lease_ms, limits, spill_ms)
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
        choice = self.config.policy_for(queue)
        store = self._store()
        workers = [w for w in store.live_workers(queue, now_ms) if w.slot is not None] \
            if choice.affinity == HASH_AFFINITY else []
        ahead = dispatch_ahead(self.config.dispatch_ahead, refills=False) \
            if self.config.max_inflight is None else 0  # routed queues never refill
        limits = {w.hostname: w.pool + ahead for w in workers}
        for name in dedicated(choice.group_queues, queue):
            # a dedicated queue's capacity: the pools of the workers consuming it
            pools = sum(store.worker_pools(name, now_ms).values())
            limits[target(name)] = pools + ahead if pools else 0
        route = _Route(workers, slot_table(workers), clock, limits)
        self._routes[queue] = route
        changed = before is None or before.table != route.table
        if changed and (route.table or choice.group_queues):
            self._remap(queue, route, before)
        return route

    def _remap(self, queue: str, route: _Route, before: _Route | None) -> None:
        """The workers changed (or this dispatcher just started, maybe with other
        fair_group_queues): every group of the map to its owner under the new table;
        only those whose owner changed are written."""
        current = self._store().assignments(queue)
        changes = self._changes(queue, route, list(current.items()))
        moves = self._store().assign(queue, changes) if changes else 0
        if before is not None or moves:
            logger.info("queue %s: workers %s; %d of %d groups moved", queue,
                        ", ".join(w or "-" for w in route.table), moves, len(current))

    def _changes(self, queue: str, route: _Route, groups: list[tuple[str, str | None]]
                 ) -> list[tuple[str, str | None, str]]:
        """Each (group, target as read; None: unknown) whose owner under ``route`` is
        another: (group, as read, new)."""
        choice = self.config.policy_for(queue)
        workers = self._assign_workers(route)
        changes = []
        for group, old in groups:
            name = queue_of(choice.group_queues, group)
            if name is not None and name != queue:
                new: str | None = target(name)  # a dedicated queue: never hashed
            elif choice.affinity == HASH_AFFINITY:
                new = self.assigner.owner(group, route.table, workers)
            else:
                new = target(queue)
            if new is not None and new != old:
                changes.append((group, old, new))
        self.assigner.report()
        return changes

    def _assign_workers(self, route: _Route) -> list[AssignWorker]:
        """The live workers as ``fair_assign`` sees them (nothing to build without it)."""
        if self.assigner.function is None:
            return []
        return [AssignWorker(w.hostname, _utc(w.started_ms), w.pool, self._queues_of(w.hostname))
                for w in route.workers]

    def _queues_of(self, hostname: str) -> tuple[str, ...]:
        return tuple(sorted(q for q, r in self._routes.items()
                            if any(w.hostname == hostname for w in r.workers)))


def _asking(config: FairConfig, asks: Callable[[PolicyChoice], bool]) -> list[str]:
    """The queues whose choice ``asks`` (``"*"`` first: the app-wide one does)."""
    asking = [q for q, c in config.queue_policies.items() if asks(c)]
    if asks(config.policy):
        asking.insert(0, "*")
    return asking


def _utc(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
