"""Replaying a trace through the real policy: the memory store (``celery_fair.policy``,
the same decisions the Redis scripts and the SQL store make, held equal by the model
test) with a virtual clock and N virtual worker slots. No copy of the scheduling logic:
``wfq``, ``harmony`` and ``smallest`` are the store itself, configured with that policy
(``smallest`` with the settings' ``aging_seconds``); ``fifo`` is
what plain Celery does (one queue, arrival order), the baseline to compare with."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import FairError
from ..limits import COST, COUNT, NO_SUBGROUP, RUNTIME, SMALLEST, WFQ
from ..store.base import Placement, Policy
from ..store.memory import MemoryStore
from ..store.models import POLICIES as STORE_POLICIES
from .trace import TraceTask

__all__ = ["CHARGES", "CHARGING", "POLICIES", "BadSimulation", "Run", "simulate"]

#: Policies the simulator replays: plain Celery's FIFO, and the store's policies.
POLICIES = ("fifo", *STORE_POLICIES)
#: What a dispatch charges a group's share (``fair_charge``): 1 per task, the task's
#: declared cost, or the time it ran (each release reports the task's duration).
CHARGES = ("count", "cost", "runtime")
#: The policies that charge a share (harmony charges none).
CHARGING = (WFQ, SMALLEST)
_Q = "simulated"
_NEVER = 10 ** 15  # a lease that never runs out in a replay


class BadSimulation(FairError, ValueError):
    """A simulation asked for something the simulator cannot do."""


@dataclass
class Run:
    """What happened to every task of one replay."""

    policy: str
    charge: str
    slots: int
    #: per task, in trace order: (group, published at, started at (None: never, e.g. a
    #: cap of 0), duration) in seconds
    tasks: list[tuple[str, float, float | None, float]] = field(default_factory=list)


def simulate(tasks: Sequence[TraceTask], slots: int, policy: str = "wfq",
             charge: str = "cost", settings: Policy | None = None) -> Run:
    """Replay ``tasks`` on ``slots`` workers under ``policy`` charged by ``charge``, with
    ``settings`` (caps, weights, rates; default: none) as a dispatcher would configure.

    Raises:
        BadSimulation: an unknown policy or charge, or slots below 1.
    """
    if policy not in POLICIES:
        raise BadSimulation(f"policy {policy!r} is not one the simulator knows: "
                            f"{', '.join(POLICIES)}")
    if charge not in CHARGES:
        raise BadSimulation(f"charge {charge!r} is not one the simulator knows: "
                            f"{', '.join(CHARGES)}")
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise BadSimulation(f"slots must be an integer >= 1, got {slots!r}")
    if charge == COUNT and policy != SMALLEST:  # smallest orders by the costs: kept
        tasks = [replace(t, cost=1.0) for t in tasks]
    run = Run(policy, charge, slots)
    store_charge = charge if policy == SMALLEST else RUNTIME if charge == RUNTIME else COST
    starts = _fifo(tasks, slots) if policy == "fifo" else _fair(
        tasks, slots, _settings(settings, policy, store_charge))
    run.tasks = [(t.group, t.at, start, t.duration) for t, start in zip(tasks, starts)]
    return run


def _settings(settings: Policy | None, policy: str, charge: str) -> Policy:
    """``settings`` under ``policy`` and ``charge``; the subgroups (``fair_subgroup``,
    the trace's ``subgroup`` column) under every policy but 'smallest', which orders a
    group's tasks itself."""
    base = settings or Policy(None, 0, 1.0, {}, {})
    subgroup = NO_SUBGROUP if policy == SMALLEST else base.subgroup
    return replace(base, name=policy, charge=charge, subgroup=subgroup)


def _fifo(tasks: Sequence[TraceTask], slots: int) -> list[float | None]:
    """Start times in one queue served in arrival order (interactive or not)."""
    free = [0.0] * slots  # when each slot is free next
    starts: list[float | None] = []
    for task in tasks:
        slot_free = heapq.heappop(free)
        start = max(slot_free, task.at)
        starts.append(start)
        heapq.heappush(free, start + task.duration)
    return starts


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _fair(tasks: Sequence[TraceTask], slots: int, settings: Policy) -> list[float | None]:
    """Start times under the memory store's policy: at each event (a publication, a task's
    end, a throttle's end) releases, holds, promote, then picks into the free slots."""
    store = MemoryStore()
    store.configure(_Q, settings)
    starts: list[float | None] = [None] * len(tasks)
    running: list[tuple[int, int, str]] = []  # (end ms, task index, dispatch id)
    nxt, wake = 0, None  # next task to publish; when promote wants a step
    while nxt < len(tasks) or running or wake is not None:
        times = [t for t in (_ms(tasks[nxt].at) if nxt < len(tasks) else None,
                             running[0][0] if running else None, wake) if t is not None]
        now = min(times)
        while running and running[0][0] <= now:
            _, i, did = heapq.heappop(running)
            store.release(_Q, did, runtime=tasks[i].duration)
        while nxt < len(tasks) and _ms(tasks[nxt].at) <= now:
            t = tasks[nxt]
            store.hold(_Q, str(nxt), str(nxt).encode(),
                       Placement(t.group, "i" if t.interactive else "b", t.cost, False,
                                 None, subgroup=t.subgroup),
                       0, now)
            nxt += 1
        _, wake = store.promote(_Q, now, 1000)
        if wake is not None and wake <= now:
            wake = now + 1  # due again at once: look a ms later, never spin in place
        for picked in store.pick(_Q, slots - len(running), None, now, _NEVER):
            i = int(picked.hold_id)
            starts[i] = now / 1000
            heapq.heappush(running, (now + _ms(tasks[i].duration), i, picked.dispatch_id))
    return starts  # held work that can never go (a cap of 0) is left unstarted
