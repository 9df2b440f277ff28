"""The policy's decisions as pure functions: what every Python executor of the policy
shares. The memory store's :class:`~celery_fair.policy.FairQueue` calls them over its
dicts; the SQL store calls them over the rows it locked (``store/sql``). The Lua scripts
make the same decisions in Redis; ``tests/test_store_model.py`` holds all three equal."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ..errors import GroupFull
from ..limits import COUNT, RUNTIME
from ..limits import runtime_of as runtime_of
from ..store.models import BeginResult

INTERACTIVE, BACKGROUND = "i", "b"
CLASSES = (INTERACTIVE, BACKGROUND)  # interactive first
#: Record states (DESIGN.md, "Dispatch state machine"); 'released' is a tombstone.
PICKED, QUEUED, RUNNING, LOST, SUPERSEDED = "picked", "queued", "running", "lost", "superseded"
LIVE = (PICKED, QUEUED, RUNNING)


#: Where a group stands in a class (``standing``): in its ready set, or (soft caps) in
#: its over set, picked only while no group is ready.
READY, OVER = "ready", "over"


def standing(klass: str, held: int, inflight: int, cap: int, reserve: int,
             paused: bool = False, throttled: bool = False, soft: bool = False
             ) -> str | None:
    """Where a group holding ``held`` messages of ``klass`` with ``inflight``
    dispatches stands under ``cap`` (-1: none; 0: paused in both classes: the reserve is
    room above a cap, not a way past it, and neither is a soft cap): READY while under
    its cap (interactive: the cap plus the reserve); with ``soft`` caps OVER at or over
    it; else None. A ``paused`` group (``fair pause``) or a ``throttled`` one (its rate,
    ``fair_throttle``) stands nowhere, in either class, whatever its cap."""
    if held <= 0 or paused or throttled:
        return None
    if cap < 0:
        return READY
    if cap == 0:
        return None
    if inflight < cap + (reserve if klass == INTERACTIVE else 0):
        return READY
    return OVER if soft else None


def eligible(klass: str, held: int, inflight: int, cap: int, reserve: int,
             paused: bool = False, throttled: bool = False) -> bool:
    """Whether the group may be picked in ``klass`` the normal way (``standing`` is
    READY; the arguments are the same)."""
    return standing(klass, held, inflight, cap, reserve, paused, throttled) == READY


def background_first(inflight_interactive: int, share: float | None,
                     capacity: int | None) -> bool:
    """``fair_interactive_share``: whether interactive work holds its share of the
    capacity already (``inflight_interactive`` ≥ ``share`` × ``capacity``), so that a
    pick takes background work first while there is some. None share or capacity: never
    (strict priority). ``pick.lua`` computes the same."""
    return share is not None and capacity is not None and capacity >= 0 \
        and inflight_interactive >= share * capacity


def entry_tag(tag: float | None, vt: float | None, member: bool = False) -> float | None:
    """A ready group's tag: it enters at the class's virtual time when behind it (no
    credit for being idle). A ``member`` of the ready set already keeps its tag: only a
    release's correction (``fair_charge`` 'runtime') takes one below the virtual time,
    and that credit is what it was overcharged; or a routed pick looked past it while
    the virtual time passed it. A member without a tag (never set: scored 0) keeps
    that too, as Redis's ``refresh`` does. None: unchanged (never set, and not behind
    or a member)."""
    if member:
        return tag
    if (vt or 0.0) > (tag or 0.0):
        return vt
    return tag


#: How far below the lowest tag a boosted task's group goes (relative; ``front_tag``).
FRONT_EPSILON = 1e-9


def front_tag(head: float | None, tag: float | None) -> float:
    """The tag that puts a group first in its class's ready set once (``fair boost
    --task``): just below the lower of the set's head and its own, so no tie with another
    group's tag decides by name. Not the virtual time, often behind the head: the group
    would win that much credit, more than one pick; the virtual time is lowered to the
    tag when above it, so a refresh keeps it. See ``boost_task.lua``."""
    lowest = tag or 0.0
    if head is not None and head < lowest:
        lowest = head
    return lowest - FRONT_EPSILON * (1 + abs(lowest))


#: Harmony's tie-break: the last-served sequence goes into a rank as ``served / SPAN``
#: (below 1, so it orders only groups of the same level); exact while the level is below
#: 2^21 (a double's 53 bits). The sequence wraps at SPAN picks (4.3 billion per queue):
#: then for one round of ties the most recently served go first.
SERVED_SPAN = 2.0 ** 32


def harmony_rank(inflight: int, weight: float, served: int, jump: float | None) -> float:
    """A group's place in the ready sets under Harmony: its in-flight count per unit of
    weight in whole numbers (weight 3: three in flight count as one), then the pick
    sequence when it was last served (0: never, first). ``jump``: a rank ``fair boost
    --task`` set, kept until the group's next pick. ``pick.lua`` computes the same."""
    if jump is not None:
        return jump
    return math.floor(inflight / weight) + (served % SERVED_SPAN) / SERVED_SPAN


def smallest_key(now_ms: float, cost: float, aging: float) -> float:
    """Policy 'smallest': the sort key of a message held now (not at the front) in its
    group's class list: when it became held (ms) plus its cost times the aging
    (``fair_aging_seconds``) in ms, so a task of cost c ranks as if it had come c times
    the aging later. Keys are static: the list is kept in their order (ties by hold id),
    and a task is passed only by tasks held before its own key. ``common.lua``
    ``insert_held`` computes it in the same order of operations."""
    return float(now_ms) + cost * aging * 1000


def subgroup_key(vt: float | None, last: float | None, cost: float, weight: float) -> float:
    """``fair_subgroup`` 'path': the key of a message held now in its group's class list:
    the later of the list's virtual time ``vt`` (the key last picked) and its subgroup's
    ``last`` key (None: none yet, 0), plus its cost over the subgroup's weight
    (self-clocked fair queueing). ``common.lua`` ``subgroup_key`` computes the same."""
    return max(vt or 0.0, last or 0.0) + cost / weight


def advance(tag: float, cost: float, weight: float) -> float:
    """A group's tag after one dispatch of ``cost``: start-time fair queueing."""
    return tag + cost / weight


def charged(charge: str, cost: float, mean: float | None = None) -> float:
    """What one dispatch of a task of ``cost`` charges its group (``fair_charge``): 1
    under 'count'; under 'runtime' the estimate, corrected at release: the group's
    ``mean`` runtime when it has one, else the cost; else the cost."""
    if charge == COUNT:
        return 1.0
    return mean if charge == RUNTIME and mean is not None else cost


#: How slowly a group's mean runtime follows its runtimes: each moves it 1/8 of the way.
RUNTIME_SMOOTHING = 8.0


def mean_runtime(mean: float | None, runtime: float) -> float:
    """A group's mean runtime (an exponential moving average) after one more ``runtime``;
    the first is the mean. ``release.lua`` does the same arithmetic, in the same order."""
    return runtime if mean is None else mean + (runtime - mean) / RUNTIME_SMOOTHING


def corrected(tag: float, runtime: float, estimate: float, weight: float) -> float:
    """A group's tag once a dispatch charged ``estimate`` at pick (``fair_charge``
    'runtime') reports the ``runtime`` (seconds) it ran: the difference, per unit of
    weight. ``release.lua`` does the same arithmetic, in the same order."""
    return tag + (runtime - estimate) / weight


def gcra(tat: float | None, now_ms: float, interval_ms: float,
         burst: int, late_ms: float = 0.0) -> tuple[float, float]:
    """One dispatch of a rate-limited group (GCRA): its new theoretical arrival time, and
    when it may be picked again (a throttle when that is after ``now_ms``). A token counts
    from its TAT or from ``late_ms`` (at most half an interval) before now, whichever is
    later: a dispatcher that woke that late loses nothing of the rate, lateness beyond
    loses only the excess, and the burst is never exceeded at once. A quiet group's
    bucket is full, never fuller. ``pick.lua`` does the same arithmetic, in the same
    order."""
    floor = now_ms - min(late_ms, interval_ms / 2)
    tat = (floor if tat is None or tat < floor else tat) + interval_ms
    return tat, tat - (burst - 1) * interval_ms


def throttle_due(until_ms: float) -> int:
    """When a dispatcher should step to lift a throttle ending at ``until_ms``: rounded
    up, so that the step does lift it."""
    return math.ceil(until_ms)


def dispatch_id(token: str, picks: int, n: int) -> str:
    """The ``n``-th (1-based) dispatch id of the ``picks``-th pick of a queue: never
    repeated, as ``token`` is new per call."""
    return f"{token}{picks}.{n}"


def copy_id(hold_id: str, n: int | str) -> str:
    """The hold id of a second copy held under ``hold_id`` (``cancel`` finds it)."""
    return f"{hold_id}~{n}"


def task_of(hold_id: str) -> str:
    """The task id a hold id (or a copy's) belongs to."""
    return hold_id.split("~", 1)[0]


def in_force(limit: float | None, setting: float | None, default: float) -> float:
    """A runtime limit over the setting over the queue's default."""
    if limit is not None:
        return limit
    return default if setting is None else setting


def skip_copy(state: str | None, runner: str, kept: bool, has_value: bool,
              lease_ms: int | None, now_ms: int, run: str, taken_over: str,
              host: str) -> BeginResult | str | None:
    """``begin``'s first question: is the delivered copy to be skipped? SKIP for a
    superseded dispatch or a tombstone, or when another run runs it under a live lease
    with the message kept (acks_late); that run's token when it is a run of ``host``
    (the caller judges whether it is gone). None: go on and run it."""
    if state in (SUPERSEDED, "released"):
        return BeginResult.SKIP
    if state == RUNNING and runner not in ("", run, taken_over) and kept and has_value \
            and (lease_ms or 0) > now_ms:
        if host and runner.startswith(host):
            return runner
        return BeginResult.SKIP
    return None


def requeues(state: str, kept: bool, has_value: bool) -> bool:
    """``reclaim``: whether a dispatch whose lease ran out is held again (no worker
    had it, or an acks_late run kept it), rather than lost with its dead worker."""
    return has_value and (state != RUNNING or kept)


def may_release(runner: str, run: str) -> bool:
    """``release`` with ``run``: only while that run holds it (none took it over)."""
    return not (run and runner and runner != run)


def batch_room(holds: Iterable[tuple[str, int | None, bool]],
               held: Callable[[str], int]) -> None:
    """``hold_many``'s backpressure, before anything is written: each new hold
    ``(group, max held, new)`` needs its group to hold fewer than its max held counting
    the batch's new holds before it (``held(group)``: what the group holds now). A
    resend (not ``new``) is never refused nor counted.

    Raises:
        GroupFull: the first hold without room (queue left to the caller).
    """
    counts: dict[str, int] = {}
    for group, max_held, new in holds:
        if not new:
            continue
        if group not in counts:
            counts[group] = held(group)
        if max_held is not None and counts[group] >= max_held:
            raise GroupFull(group=group, count=counts[group], limit=max_held)
        counts[group] += 1
