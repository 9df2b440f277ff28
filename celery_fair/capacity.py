"""How many tasks a fair queue may have in flight when its workers consume other fair
queues too (``fair_max_inflight = "auto"``).

A worker registers its whole pool in every fair queue it consumes; counted per queue, a
worker of two queues would be given its pool twice, the real queues would run deeper than
the pool, and FIFO order would come back. So the pool a queue may fill is what its
workers' other queues do not use. Each worker's other queues keep what they have in
flight (their in flight counted against the worker in proportion to its pool among
their workers) and, while they hold work, at least their guaranteed part of its pool
(``pool // queues``), so one backlogged queue cannot starve another of the same worker.
A worker with fewer slots than queues guarantees none: its queues share it first come.

Bound: with one dispatcher, the fair queues one worker consumes have at most its pool
plus ``fair_dispatch_ahead`` in flight together: a queue may fill the pool and the ahead
less what the others keep, and what it takes counts against them in turn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: ``fair_dispatch_ahead = "auto"`` where releases do not refill the slots they free.
AUTO_AHEAD = 2


def dispatch_ahead(setting: int | None, refills: bool) -> int:
    """The dispatch-ahead allowance of a queue: the setting (``fair_dispatch_ahead``;
    None: "auto"), which "auto" makes 0 where releases refill the slots they free
    (``refills``: refill.py). There a freed slot gets its next message in the release's
    own call, so a message ahead only commits the queue to FIFO order (a newcomer waits
    behind it) and gains no throughput."""
    if setting is not None:
        return setting
    return 0 if refills else AUTO_AHEAD


#: pools[queue] = {worker: pool size} of the live workers consuming it.
Pools = Mapping[str, Mapping[str, int]]
#: loads[queue] = (in flight, held): what each queue has, read fresh before a pick.
Loads = Mapping[str, tuple[int, int]]


def sharing(queue: str, pools: Pools) -> list[str]:
    """The other fair queues consumed by some worker of ``queue``."""
    mine = set(pools.get(queue, {}))
    return sorted(q for q, workers in pools.items() if q != queue and mine & set(workers))


def room(queue: str, pools: Pools, loads: Loads, ahead: int) -> int:
    """Tasks ``queue`` may have in flight now, its own in flight included: its workers'
    pools plus ``ahead``, less what their other queues keep (never below 0)."""
    workers = pools.get(queue, {})
    if not workers:
        return 0
    total = float(sum(workers.values()) + ahead)
    for worker, pool in workers.items():
        others = [q for q in pools if q != queue and worker in pools[q]]
        guaranteed = pool // (len(others) + 1)
        for other in others:
            inflight, held = loads.get(other, (0, 0))
            share = inflight * pool / max(sum(pools[other].values()), 1)
            total -= max(share, guaranteed if held else 0)
    return max(math.floor(total + 1e-9), 0)
