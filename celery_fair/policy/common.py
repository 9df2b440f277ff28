"""The state of one fair queue and what every operation shares: ``common.lua``'s
counterpart (eligibility, ready sets, forgetting idle groups, slots, leases, the copies
index), plus the reads of that state."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..limits import (
    APP_SCOPE,
    COST,
    DEFAULT_AGING,
    HARD,
    HARMONY,
    QUEUE_SCOPE,
    SMALLEST,
    SOFT,
    WFQ,
    Rate,
)
from ..store.base import KEEP as KEEP  # values of the store contract
from ..store.base import RESET as RESET
from ..store.base import Placement as Placement
from .decisions import (
    CLASSES,
    LOST,
    READY,
    RUNNING,
    SUPERSEDED,
    entry_tag,
    harmony_rank,
    smallest_key,
    standing,
)
from .records import Group, Held, QueueState, Record
from .routing import worker_slot
from .subgroups import NO_SUBGROUP, PATH_SUBGROUP, SUB_VT, hold_key


@dataclass
class QueueData:
    """The whole state of one fair queue, as plain data (:class:`FairQueue` adds the
    operations)."""

    policy: str = WFQ  # fair_policy
    charge: str = COST  # fair_charge
    cap_mode: str = HARD  # fair_cap_mode
    share: float | None = None  # fair_interactive_share
    aging: float = DEFAULT_AGING  # fair_aging_seconds
    subgroup: str = NO_SUBGROUP  # fair_subgroup
    scope: str = QUEUE_SCOPE  # fair_scope
    #: fair_scope 'app' (scope.py): group -> in flight over the store's app-scoped
    #: queues, and the store's queues (both shared: ``share_scope``); the groups another
    #: queue freed a slot of, refreshed at the next promote
    scope_n: dict[str, int] = field(default_factory=dict)
    app_queues: dict[str, Any] = field(default_factory=dict)
    scope_refresh: set[str] = field(default_factory=set)
    #: fair_scope 'app' under wfq (scope.py, shared): (class, group) -> the tag advances
    #: charged to the group over the app-scoped queues
    scope_charge: dict[tuple[str, str], float] = field(default_factory=dict)
    default_cap: int = -1  # -1: none
    reserve: int = 0
    default_weight: float = 1.0
    #: caps and weights from the settings, runtime limits, and both laid over: in force
    conf_caps: dict[str, int] = field(default_factory=dict)
    conf_weights: dict[str, float] = field(default_factory=dict)
    limit_caps: dict[str, int] = field(default_factory=dict)
    limit_weights: dict[str, float] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    #: paused groups (``fair pause``; '' the whole queue) -> until when (ms; inf: no end)
    pauses: dict[str, float] = field(default_factory=dict)
    #: boosted groups (``fair boost``) -> (boost weight, until when (ms; inf: no end)),
    #: kept apart from the weights: while it lasts the boost weight is the one in force
    boosts: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: rate limits: the default, the settings', the runtime ones and both laid over (in
    #: force; None: no rate limit, whatever the default)
    default_rate: Rate | None = None
    conf_rates: dict[str, Rate | None] = field(default_factory=dict)
    limit_rates: dict[str, Rate | None] = field(default_factory=dict)
    rates: dict[str, Rate | None] = field(default_factory=dict)
    #: throttled groups (by their rate or a task) -> until when (ms), and the
    #: theoretical arrival times of rate-limited groups (ms; one in the past is dropped)
    throttled: dict[str, float] = field(default_factory=dict)
    tats: dict[str, float] = field(default_factory=dict)
    msgs: dict[str, Held] = field(default_factory=dict)
    lists: dict[tuple[str, str], deque[str]] = field(default_factory=dict)
    #: 'smallest': (class, group) -> (sort key, hold id) of the ids held in key order,
    #: ascending (Redis's k_keys); empty under the other policies
    keys: dict[tuple[str, str], list[tuple[float, str]]] = field(default_factory=dict)
    #: fair_subgroup 'path': (class, group) -> {subgroup: its last key, SUB_VT: the key
    #: last picked} (Redis's k_subtags; subgroups.py)
    subtags: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    #: caps per subgroup (subcaps.py): (class, group, subgroup) -> the ids parked while
    #: their subgroup is at its cap, in order (Redis's k_parked); path -> its dispatches
    #: in flight (Redis's k_sgflight)
    parked: dict[tuple[str, str, str], deque[str]] = field(default_factory=dict)
    sflight: dict[str, int] = field(default_factory=dict)
    delayed: dict[str, int] = field(default_factory=dict)  # hold id -> due ms
    groups: dict[str, Group] = field(default_factory=dict)
    vt: dict[str, float] = field(default_factory=dict)
    ready: dict[str, dict[str, float]] = field(
        default_factory=lambda: {c: {} for c in CLASSES})
    #: soft caps: the over sets (groups at or over their cap with work held), per class
    over: dict[str, dict[str, float]] = field(
        default_factory=lambda: {c: {} for c in CLASSES})
    records: dict[str, Record] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)  # dispatch id -> deadline ms
    done: dict[str, int] = field(default_factory=dict)  # tombstones: id -> expires ms
    #: task id -> the copies held under <task id>~<suffix> (so cancel finds them)
    copies: dict[str, set[str]] = field(default_factory=dict)
    #: cancel token -> (expires ms, what that call removed), for a resend
    cancelled: dict[str, tuple[int, list[tuple[str, bytes]]]] = field(default_factory=dict)
    quarantine: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # id -> why
    quarantine_order: list[str] = field(default_factory=list)  # newest first
    #: singleton keys (singletons.py): hold id -> key; and shared by the store's queues
    #: (``share_singletons``): key -> owner ('h' or 'd' and ``ref(queue, id)``); key ->
    #: the refs waiting for it, in order; queue -> the hold ids its promote admits
    squeue: str = ""
    skeys: dict[str, str] = field(default_factory=dict)
    sowner: dict[str, str] = field(default_factory=dict)
    swait: dict[str, deque[str]] = field(default_factory=dict)
    sadmit: dict[str, deque[str]] = field(default_factory=dict)
    swake: set[str] = field(default_factory=set)  # queues a hand-over woke
    #: counters: inflight, inflight:i, held:i, held:b, released, skipped, dup, picks
    stat: dict[str, int] = field(default_factory=dict)
    #: fair_affinity: group -> its target (the map), target -> routed dispatches in flight
    aff: dict[str, str] = field(default_factory=dict)
    wflight: dict[str, int] = field(default_factory=dict)
    woken: bool = False  # a dispatcher should look at this queue
    expired_at: int = 0  # when expire() last looked (ms)
    # -- what every operation shares ----------------------------------------------------

    def _count(self, name: str, delta: int) -> None:
        self.stat[name] = self.stat.get(name, 0) + delta

    def _list(self, klass: str, g: str) -> deque[str]:
        return self.lists.setdefault((klass, g), deque())

    def _held(self, klass: str, g: str) -> int:
        return len(self.lists.get((klass, g), ()))

    def _drop_empty(self, klass: str, g: str) -> None:
        if not self.lists.get((klass, g), True):
            del self.lists[(klass, g)]

    def cap_of(self, g: str) -> int:
        """The group's cap in force (-1: none)."""
        return self.caps.get(g, self.default_cap)

    def weight_of(self, g: str) -> float:
        """The group's weight in force (the setting or runtime limit; not a boost)."""
        return self.weights.get(g, self.default_weight)

    def pick_weight(self, g: str) -> float:
        """The weight the pick uses: a boost's while it lasts (common.lua ``weight_of``)."""
        boost = self.boosts.get(g)
        return boost[0] if boost else self.weight_of(g)

    def rate_of(self, g: str) -> Rate | None:
        """The group's rate limit in force (None: none)."""
        return self.rates[g] if g in self.rates else self.default_rate

    def _rank(self, g: str, group: Group) -> float:
        """g's place in the ready sets under Harmony (``decisions.harmony_rank``)."""
        return harmony_rank(self._cap_count(g, group.inflight), self.pick_weight(g),
                            group.served, group.jump)

    def _cap_count(self, g: str, n: int) -> int:
        """The in-flight count g's cap binds: the queue's ``n``, or under fair_scope
        'app' the app's (``scope.py``)."""
        return self.scope_n.get(g, 0) if self.scope == APP_SCOPE else n

    def _standing(self, klass: str, g: str, n: int) -> str | None:
        return standing(klass, self._held(klass, g), self._cap_count(g, n), self.cap_of(g),
                        self.reserve,
                        g in self.pauses, g in self.throttled, self.cap_mode == SOFT)

    def _eligible(self, klass: str, g: str, n: int) -> bool:
        return self._standing(klass, g, n) == READY

    def _refresh(self, g: str) -> bool:
        """Make g's membership of the ready sets (and the over sets) match where it
        stands; a group entering starts at the class's virtual time (no credit for being
        idle), one in a set of the class (ready or over) keeps its tag; under Harmony its
        score is its rank, both classes alike. True when it entered a set."""
        group = self.groups.get(g)
        n = group.inflight if group else 0
        entered = False
        for klass in CLASSES:
            where = None if group is None else self._standing(klass, g, n)
            if where is None or group is None:
                self.ready[klass].pop(g, None)
                self.over[klass].pop(g, None)
                continue
            if self.policy == HARMONY:
                score = self._rank(g, group)
            else:
                member = g in self.ready[klass] or g in self.over[klass]
                if not member and self.scope == APP_SCOPE:
                    # wfq shares across queues (scope.py): what other queues charged it
                    # while it was out of the sets here is forgiven, as idle time is
                    group.seen[klass] = self.scope_charge.get((klass, g), 0.0)
                tag = entry_tag(group.tags.get(klass), self.vt.get(klass), member)
                if tag is not None:
                    group.tags[klass] = tag
                score = tag or 0.0
            into, out = (self.ready, self.over) if where == READY else (self.over, self.ready)
            entered = entered or g not in into[klass]
            into[klass][g] = score
            out[klass].pop(g, None)
        return entered

    def _forget_if_idle(self, g: str) -> None:
        group = self.groups.get(g)
        if group is None or group.inflight > 0 or group.delayed > 0 or group.parked > 0:
            return
        if any(self._held(klass, g) for klass in CLASSES):
            return
        del self.groups[g]
        self._scope_forgot(g)

    def _free_slot(self, g: str, klass: str) -> None:
        self.groups[g].inflight -= 1
        self._scope_add(g, -1)
        self._count("inflight", -1)
        if klass == "i":
            self._count("inflight:i", -1)
        self._refresh(g)
        self._scope_freed(g)
        self._forget_if_idle(g)

    def _scope_add(self, g: str, delta: int) -> None:
        """fair_scope 'app': the app's count of g moves too (scope.py)."""

    def _scope_freed(self, g: str) -> None:
        """fair_scope 'app': a slot of g came back app-wide (scope.py)."""

    def _scope_forgot(self, g: str) -> None:
        """fair_scope 'app': this queue forgot g (scope.py)."""

    def _scope_change(self, scope: str) -> None:
        """fair_scope changes (configure; scope.py keeps the app's counts)."""
        self.scope = scope

    def _index_copy(self, hold_id: str) -> None:
        if "~" in hold_id:
            self.copies.setdefault(hold_id.split("~", 1)[0], set()).add(hold_id)

    def _unindex_copy(self, hold_id: str) -> None:
        root = hold_id.split("~", 1)[0]
        if "~" in hold_id and root in self.copies:
            self.copies[root].discard(hold_id)
            if not self.copies[root]:
                del self.copies[root]

    def _enqueue(self, hold_id: str, p: Placement, now_ms: int) -> bool:
        queue = self._list(p.klass, p.group)
        if not p.front and (self.policy == SMALLEST or self.subgroup == PATH_SUBGROUP):
            self._insert(hold_id, p, now_ms, queue)
        else:
            if p.front or not queue:  # a new head
                self.groups[p.group].since[p.klass] = now_ms
            queue.appendleft(hold_id) if p.front else queue.append(hold_id)
        self._count("held:" + p.klass, 1)
        return self._refresh(p.group)

    def _insert(self, hold_id: str, p: Placement, now_ms: int, queue: deque[str]) -> None:
        """'smallest': ``hold_id`` into its list before the next id in key order, else
        at the tail (``insert_held``); ids without a key (held under another policy, or
        at the front) stay before every keyed one."""
        index = self.keys.setdefault((p.klass, p.group), [])
        entry = (smallest_key(now_ms, p.cost, self.aging) if self.policy == SMALLEST
                 else hold_key(self.subtags, self.weights, p, queue), hold_id)
        at = bisect.bisect_left(index, entry)
        index.insert(at, entry)
        place = queue.index(index[at + 1][1]) if at + 1 < len(index) else len(queue)
        if place == 0:  # a new head
            self.groups[p.group].since[p.klass] = now_ms
        queue.insert(place, hold_id)

    def _unkey(self, klass: str, g: str, hold_id: str) -> None:
        """``hold_id`` left g's class list: out of the sort-key index too, and the list
        empty, its subgroup tags go (``unlist_held``)."""
        if not self.lists.get((klass, g)):
            self.subtags.pop((klass, g), None)
        index = self.keys.get((klass, g))
        if not index:
            return
        for i, (_, held) in enumerate(index):
            if held == hold_id:
                del index[i]
                break
        if not index:
            del self.keys[(klass, g)]

    def _subgroup_picked(self, klass: str, g: str, hold_id: str) -> None:
        """fair_subgroup 'path': ``hold_id``, the head of g's class list, was taken off:
        its key is the list's virtual time now (a front hold has none); the subgroups'
        keys go with the last id (``pop_held``)."""
        index = self.keys.get((klass, g), [])
        key = next((k for k, held in index if held == hold_id), None)
        self._unkey(klass, g, hold_id)  # the list empty: its tags go
        if key is not None and self.lists.get((klass, g)):
            self.subtags.setdefault((klass, g), {})[SUB_VT] = key

    def _pop_head(self, klass: str, g: str, queue: deque[str]) -> str:
        """The head of g's class list, taken off (its sort key or subgroup key too)."""
        hold_id = queue.popleft()
        if self.policy == SMALLEST:
            self._unkey(klass, g, hold_id)
        elif self.subgroup == PATH_SUBGROUP:
            self._subgroup_picked(klass, g, hold_id)
        return hold_id

    def _hold_lease(self, did: str, deadline: int) -> str | None:
        """A worker holds dispatch ``did``: extend its lease; a lost one takes a slot
        again. Returns the state it was in (None: no record)."""
        rec = self.records.get(did)
        if rec is None or rec.state == SUPERSEDED:
            return None if rec is None else rec.state
        state = rec.state
        if state == LOST:
            self.groups.setdefault(rec.group, Group()).inflight += 1
            self._scope_add(rec.group, 1)
            self._count("inflight", 1)
            if rec.klass == "i":
                self._count("inflight:i", 1)
            rec.state, rec.expires_ms = RUNNING, None
            if rec.subgroup:  # its subgroup's flight too (subcaps.py)
                path = f"{rec.group}/{rec.subgroup}"
                self.sflight[path] = self.sflight.get(path, 0) + 1
            worker_slot(self.wflight, rec.target, 1)
            self._refresh(rec.group)
        self.leases[did] = deadline
        return state

    # -- reads and housekeeping -------------------------------------------------------

    def expire(self, now_ms: int) -> None:
        """Forget the tombstones and cancel answers whose time is over (Redis: TTLs);
        at most once a second (it reads them all)."""
        if now_ms - self.expired_at < 1000:
            return
        self.expired_at = now_ms
        self.done = {d: t for d, t in self.done.items() if t > now_ms}
        self.cancelled = {k: v for k, v in self.cancelled.items() if v[0] > now_ms}
        for did in [d for d, r in self.records.items()
                    if r.expires_ms is not None and r.expires_ms <= now_ms]:
            del self.records[did]

    def dispatch_state(self, did: str) -> str | None:
        rec = self.records.get(did)
        if rec is not None:
            return rec.state
        return "released" if did in self.done else None

    def inspect(self) -> QueueState:
        return QueueState(
            ready={k: dict(v) for k, v in self.ready.items()}, vt=dict(self.vt),
            tags={(k, g): t for g, grp in self.groups.items() for k, t in grp.tags.items()},
            inflight={g: grp.inflight for g, grp in self.groups.items() if grp.inflight},
            delayed={g: grp.delayed for g, grp in self.groups.items() if grp.delayed},
            held={key: list(ids) for key, ids in self.lists.items() if ids},
            total_inflight=self.stat.get("inflight", 0),
            since={(k, g): self.groups[g].since[k] for (k, g), ids in self.lists.items()
                   if ids},
            over={k: dict(v) for k, v in self.over.items()},
            inflight_interactive=self.stat.get("inflight:i", 0))

    def empty(self) -> bool:
        """Nothing held, delayed, in flight or quarantined (the queue may be forgotten)."""
        return not (self.msgs or self.leases or self.quarantine
                    or self.stat.get("inflight", 0))
