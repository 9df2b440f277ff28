"""The values of the store contract (:mod:`celery_fair.store.base`): what its operations
take and answer, the lifetimes and bounds every backend keeps, and the typed read
models."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import limits
from ..errors import CorruptMessage, InvalidGroup, InvalidOption
from ..names import validate_group
from ..singleton import validate_key


def now_ms() -> int:
    """The wall clock in ms since the epoch: what callers pass as the store's clock."""
    return int(time.time() * 1000)


wall_clock_ms = now_ms  # for methods whose argument of that name hides it

#: Arguments of the runtime limits (``limit``, ``set_rate``): leave the value as it is,
#: or clear the runtime limit (the setting applies again).
KEEP, RESET = "", "reset"

# -- what the lifecycle operations take and answer ----------------------------------

#: The classes of a held message: interactive (picked first) and background.
PLACEMENT_CLASSES = ("i", "b")


@dataclass(frozen=True)
class Placement:
    """Where a held message goes (what ``hold`` takes): its group and class, its cost, and
    whether it enters at the head of its group (a retry) or at the tail."""

    group: str
    klass: str
    cost: float
    front: bool
    #: backpressure (fair_group_max_held): refuse the hold with GroupFull when the group
    #: already holds this many messages (waiting in either class, or delayed), checked
    #: atomically with the hold; None: unlimited. Not part of the stored value.
    max_held: int | None = None
    #: singleton key (``singleton.py``; None: none); ``drop``: not held when the key has
    #: a message waiting (SingletonDropped).
    singleton: str | None = None
    drop: bool = False
    #: ``fair_subgroup`` 'path': the subgroup in the group (None: none); the stored
    #: value's meta ``sg`` carries it too (envelope.py), for the Redis scripts.
    subgroup: str | None = None


def check_hold(hold_id: str, value: Any, placement: Any) -> Placement:
    """The placement of a hold when its arguments are ones a store may keep: every
    backend's ``hold`` calls this before it writes anything, so all refuse alike.

    Returns ``placement`` with its group as text and its cost as a float.

    Raises:
        CorruptMessage: ``value`` is not bytes.
        InvalidOption: ``placement`` is not a :class:`Placement`, or its class or front
            flag is not one.
        InvalidGroup: the group is not a group name.
        InvalidCost: the cost is out of range.
    """
    if not isinstance(value, (bytes, bytearray)):
        raise CorruptMessage(f"hold {hold_id}: the stored value has type "
                             f"{type(value).__name__}: expected bytes (envelope.py's encoding)")
    if not isinstance(placement, Placement):
        raise InvalidOption(f"hold {hold_id}: the placement has type "
                            f"{type(placement).__name__}: expected a Placement")
    if placement.klass not in PLACEMENT_CLASSES:
        raise InvalidOption(f"hold {hold_id}: class {placement.klass!r} is invalid: expected "
                            "'i' (interactive) or 'b' (background)")
    if not isinstance(placement.front, bool):
        raise InvalidOption(f"hold {hold_id}: front {placement.front!r} is invalid: "
                            "expected True or False")
    try:
        group = validate_group(placement.group)
    except InvalidGroup as exc:
        raise InvalidGroup(f"hold {hold_id}: {exc}") from None
    cost = limits.cost(placement.cost, f"hold {hold_id}: cost")
    max_held = limits.max_held(placement.max_held, f"hold {hold_id}: max held")
    key = placement.singleton
    if key is not None:
        key = validate_key(key, f"hold {hold_id}: singleton key")
    sub = placement.subgroup
    try:
        sub = None if sub is None else validate_group(sub)
    except InvalidGroup as exc:
        raise InvalidGroup(f"hold {hold_id}: subgroup: {exc}") from None
    return Placement(group, placement.klass, cost, placement.front, max_held, key,
                     bool(placement.drop) and key is not None, sub)


class BeginResult(enum.IntEnum):
    """What ``begin`` says about a dispatch a worker is about to run."""

    #: the dispatch is current: run it
    RUN = 1
    #: its slot had been reclaimed (lease ran out) and was taken again: run it
    RUN_REACQUIRED = 2
    #: the store never saw it (no record): run it, nothing held is ever dropped
    RUN_UNKNOWN = 0
    #: a stale duplicate: the message was held again and a newer dispatch carries it, or
    #: the dispatch already ran to its end and the broker redelivered it
    SKIP = -1


@dataclass(frozen=True)
class BeginAnswer:
    """What one ``begin_run`` or ``take_over`` call says: a :class:`BeginResult`, or
    ``held_by``, the token of a run of the caller's host that holds the dispatch under a
    live lease (the caller judges whether that run is gone, then takes it over or runs
    the call again without a host to skip the copy)."""

    result: BeginResult | None
    held_by: str = ""


@dataclass(frozen=True)
class Picked:
    """One message taken by ``pick``."""

    dispatch_id: str
    hold_id: str
    value: bytes


@dataclass(frozen=True)
class Pushed:
    """One message ``pick`` pushed into the broker's list itself (metrics, log line)."""

    klass: str
    due_at: float | None  # epoch seconds it became due; None when not recorded
    group: str
    hold_id: str = ""  # the task id
    dispatch_id: str = ""


@dataclass(frozen=True)
class DirectPush:
    """Where ``pick`` may push into kombu's list on the store's own Redis (direct.py)."""

    queue: str
    sep: str
    priority_steps: tuple[int, ...]
    exchange: str  # the queue's own direct exchange ('' for none)
    routing_key: str
    binding_key: str  # kombu's binding set of that exchange
    refill_ms: int = 0  # how long release.lua may refill with these (refill.py; 0: never)


WFQ, HARMONY, SMALLEST, POLICIES = limits.WFQ, limits.HARMONY, limits.SMALLEST, limits.POLICIES
HARD, SOFT, CAP_MODES = limits.HARD, limits.SOFT, limits.CAP_MODES
COST = limits.COST


@dataclass(frozen=True)
class Policy:
    """Policy settings of one fair queue, shared by every dispatcher through the store."""

    default_cap: int | None
    interactive_reserve: int
    default_weight: float
    caps: Mapping[str, int]
    weights: Mapping[str, float]
    #: the rate limit of a group without one of its own (None: none), and the groups'
    #: own (None: no rate limit, whatever the default)
    default_rate: limits.Rate | None = None
    rates: Mapping[str, limits.Rate | None] = dataclasses.field(default_factory=dict)
    #: the scheduling policy, one of :data:`POLICIES`
    name: str = WFQ
    #: what a dispatch charges a group's share under wfq, one of ``limits.CHARGES``
    charge: str = COST
    #: ``fair_cap_mode``: 'hard' (at its cap a group waits) or 'soft' (see policies.py)
    cap_mode: str = HARD
    #: ``fair_interactive_share``: see policies.py (None: strict priority)
    interactive_share: float | None = None
    #: 'smallest': seconds of waiting worth one unit of declared cost
    #: (``fair_aging_seconds``; 0: arrival order)
    aging_seconds: float = limits.DEFAULT_AGING
    #: ``fair_subgroup``: 'none', or 'path' (a group's subgroups take turns)
    subgroup: str = limits.NO_SUBGROUP
    #: ``fair_scope``: 'queue', or 'app' (a group's cap binds across app-scoped queues)
    scope: str = limits.QUEUE_SCOPE


# -- lifetimes and bounds every backend keeps, and the summary read model ---------------

#: Most entries one step of :meth:`Store.check` reads (a few ms of the store's time).
CHECK_BATCH = 500
#: How late a token may be taken and still count from its own time (ms; at most half
#: the rate's interval; ``gcra``'s ``late_ms``): a dispatcher that wakes a little late
#: (Redis fires a blocking command's timeout about 5 ms late, more on a busy machine)
#: loses nothing of the rate, one later only the excess, and never lets more than the
#: burst go at once (``store/throttling.py``).
RATE_EARLY_MS = 20
#: How long the record of a superseded or lost dispatch is kept (seconds). A stale copy
#: delivered later than this runs as an unknown dispatch.
TOMBSTONE_SECONDS = 86_400
#: How long what a cancel call removed is kept to answer that call again (seconds):
#: redis-py resends a call whose reply a dropped connection lost (10 retries by default),
#: and the resend must still see the messages, or their tasks are never marked REVOKED.
CANCELLED_SECONDS = 300
#: How long what a publication held under its task id is remembered (seconds), on a
#: Redis store whose writes wait for replicas (fair_store_replicas ≥ 1): the same message
#: published again meanwhile (its caller was told HoldNotReplicated or HoldOutcomeUnknown,
#: and sends it again as told) is held once, even after the first was dispatched or has
#: run (hold.lua, ``k_sent``). A key of ~300 bytes of Redis memory per hold for as long
#: (measured: 496 bytes per held task over the message instead of 201), which is why it
#: is kept only where HoldNotReplicated makes resends a matter of course: a failover of a
#: shard whose only replica is the failed master fails every WAIT until it is back.
RESEND_SECONDS = 300
#: Most entries the quarantine of one fair queue keeps (the newest): it holds damaged data
#: for a human to look at, and must not grow without end. Each one dropped is logged.
QUARANTINE_MAX = 1_000
#: How long after its registration expired a worker's entry is dropped (ms). Expired
#: workers never count; the margin only keeps a registering worker whose clock runs ahead
#: from dropping entries another host's clock still sees as live.
PRUNE_GRACE_MS = 60_000


# -- read models: what status, metrics, summaries and ``fair inspect`` read --------------

@dataclass(frozen=True)
class QueueFigures:
    """Totals of one fair queue, from the store's counters (O(1) to read)."""

    queue: str
    inflight: int
    delayed: int
    held_interactive: int
    held_background: int
    released: int  # dispatches whose end the workers reported, so far
    skipped: int  # stale copies the workers skipped, so far
    group_count: int  # groups with work (held, delayed or in flight)
    ready_interactive: int  # groups with interactive work that may be picked now
    ready_background: int

    @property
    def held(self) -> int:
        """Messages held, both classes."""
        return self.held_interactive + self.held_background


@dataclass(frozen=True)
class GroupFigures:
    """One group as status, metrics and limits show it: its counts and the policy in
    force (``cap`` None: no cap); ``limited`` names what a runtime limit sets ("cap",
    "weight")."""

    group: str
    held_interactive: int
    held_background: int
    delayed: int
    inflight: int
    cap: int | None
    weight: float
    limited: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupHeads:
    """One group as ``summarize`` sees it: its counts and, per class, when its oldest held
    message (the head of its list) became due and when it became the head (epoch seconds;
    None when it holds none, an old message without the time, or a head stamped before
    the store kept head times). :func:`~celery_fair.store.heads.head_wait` reads them."""

    group: str
    held_interactive: int
    held_background: int
    inflight: int
    delayed: int
    due_interactive: float | None
    due_background: float | None
    since_interactive: float | None = None
    since_background: float | None = None


def limited_by(cap: object, weight: object) -> tuple[str, ...]:
    """What runtime limits set for a group (``GroupFigures.limited``), from whether each
    of its cap and weight is a runtime limit."""
    return tuple(name for name, on in (("cap", cap), ("weight", weight)) if on)


def busiest_first(rows: list[GroupFigures]) -> list[GroupFigures]:
    """``rows`` most held first, then most in flight, then by name (``busiest_groups``)."""
    return sorted(rows, key=lambda r: (-(r.held_interactive + r.held_background),
                                       -r.inflight, r.group))


def snapshot_of(totals: QueueFigures, rows: list[GroupFigures]) -> dict[str, Any]:
    """``snapshot``'s plain document: the totals with every group's figures under
    ``groups`` (as JSON shows them), for tests and tools."""
    return {**dataclasses.asdict(totals), "groups": [as_json(r) for r in rows]}


def as_json(figures: QueueFigures | GroupFigures) -> dict[str, Any]:
    """A read model as the CLI's JSON and the summary document show it (tuples as
    lists, so a document read back compares equal)."""
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(figures).items()}


@dataclass(frozen=True)
class Place:
    """Where a held message stands in its group and what is ahead of it (``locate``):
    start-time fair queueing with unit costs, the current backlog, no new arrivals."""

    position: int | None  # 1-based place in its group's list
    group_held: int  # messages its group holds of its class
    inflight: int  # of its group
    cap: int | None
    weight: float
    ready: bool  # its group is in the ready set (not waiting at its cap)
    groups_ahead: int | None  # groups ranked before it in the ready set (None: not ready)
    dispatches_before: int
    estimate_is_lower_bound: bool  # more ready groups than were read


@dataclass(frozen=True)
class Location:
    """Where a task stands (``fair inspect``): ``state`` is "held" (with ``place``),
    "delayed" (with ``due_ms``) or its dispatch's state (with ``dispatch_id``)."""

    task_id: str
    queue: str
    group: str
    klass: str  # "interactive" or "background"
    state: str
    due_ms: int | None = None
    dispatch_id: str | None = None
    place: Place | None = None

    def as_json(self) -> dict[str, Any]:
        """The JSON document ``fair inspect --json`` prints: the fields of its state."""
        doc: dict[str, Any] = {"task_id": self.task_id, "queue": self.queue,
                               "group": self.group, "class": self.klass, "state": self.state}
        if self.due_ms is not None:
            doc["due_ms"] = self.due_ms
        if self.dispatch_id is not None:
            doc["dispatch_id"] = self.dispatch_id
        if self.place is not None:
            doc.update(dataclasses.asdict(self.place))
        return doc


@dataclass(frozen=True)
class DispatcherBeat:
    """A dispatcher's heartbeat (``beat``/``dispatchers``): who it is, since when it runs,
    when it last finished a step (ms since the epoch), the fair queues it serves and its
    app. ``every_queue``: started without ``-Q``, it serves every fair queue (``queues``
    lists those it knew at the beat; a new one is served within a second)."""

    id: str  # unique per process: ``host:pid:random``
    host: str
    pid: int
    started_ms: int
    last_step_ms: int
    queues: tuple[str, ...]
    every_queue: bool
    app: str

    def serves(self, queue: str) -> bool:
        """Whether this dispatcher serves ``queue``."""
        return self.every_queue or queue in self.queues

    def as_json(self) -> dict[str, Any]:
        """The plain document a backend keeps and the CLI's JSON shows."""
        return {**dataclasses.asdict(self), "queues": list(self.queues)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DispatcherBeat:
        return cls(str(doc["id"]), str(doc["host"]), int(doc["pid"]),
                   int(doc["started_ms"]), int(doc["last_step_ms"]),
                   tuple(str(q) for q in doc["queues"]), bool(doc["every_queue"]),
                   str(doc["app"]))


@dataclass(frozen=True)
class LiveWorker:
    """A live worker of a fair queue (``Store.live_workers``): its hostname, pool size,
    when it registered first (ms since the epoch) and its slot (see ``registry.py``);
    ``started_ms`` and ``slot`` are None for a worker of a version before slots."""

    hostname: str
    pool: int
    started_ms: int | None
    slot: int | None

    def as_json(self) -> dict[str, Any]:
        return {"hostname": self.hostname, "pool": self.pool,
                "started_ms": self.started_ms, "slot": self.slot}
