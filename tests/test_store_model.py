"""Every backend makes the memory store's decisions: hypothesis drives one backend at a
time (the Redis store's Lua scripts on the real redis-server; the SQL store on SQLite,
PostgreSQL and MariaDB) and the memory store (the Python policy, ``celery_fair.policy``)
with the same operations and the same clock: hold, pick,
register and unregister workers (their slots and start times), affinity routing (assign
the map over what was read, routed picks with each target's limit and a spill time; the
map, each target's routed dispatches in flight and the moves compared after each step),
confirm, begin (with a run of this host found gone), renew, release, promote, reclaim,
configure (either policy, wfq or harmony, with hard or soft caps and with or without an
interactive share, on every backend; smallest with any aging, whose held lists are kept
in sort-key order, switched to and from the others with messages held; ``fair_subgroup``
'path' under wfq and harmony (on Redis also a run mostly under it), holds in subgroups x,
y or none with subgroup weights keyed "<group>/<subgroup>", switched on and off with
messages held (on Redis each list's subgroup keys and tags, ``sg``, compared too); any
charge: cost, count or runtime, whose releases
report runtimes that correct the tags), limit, pause, boost (a
group's weight, with expiry; a task to the front), rate limits (GCRA tokens in the
pick, throttles lifted by promote), a task's throttle and cancel (resent under its
token), singleton keys (every backend: holds with a key, waiting or dropped, their hand-over
at release, reclaim and cancel); bursts of both classes at once and picks with a capacity
just above what is in flight, where the interactive share's bound falls either side of
the interactive work in flight (with only fixed capacities in-flight work soon fills
them and the share's case hardly comes up: a SQL pick ignoring the share went unnoticed
in 40 examples).

After every step both must agree: what each operation returned (the dispatch ids and
messages a pick took, in order), and, through the common inspection
(:class:`~celery_fair.policy.QueueState`), every ready set with its tags, the groups'
tags, virtual time, in-flight and delayed counts, the held lists in order with when
each list's head became the head (on Redis under smallest also the sort keys of
each list, ``k_keys``), the queue's
figures, each group's figures and each dispatch's state (Redis's state is read from its
keys here, so the policy knows nothing of Redis; the SQL store answers ``inspect`` as the
memory store does). At the end of each run the backend's invariant checker must find
nothing.

Examples per backend: ``FAIR_MODEL_EXAMPLES`` (each Redis backend, default 80) and
``FAIR_MODEL_EXAMPLES_SQL`` (each SQL backend, default 10; its scope leg half: a SQL
operation is a few transactions, and the whole CI has a budget). ``python -m bench
model`` runs the same test as a long campaign (1,000 and 200 by default).
"""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any, Callable

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select

from celery_fair.check import check
from celery_fair.envelope import Envelope
from celery_fair.errors import GroupFull, SingletonDropped
from celery_fair.limits import (
    APP_SCOPE,
    CHARGES,
    HARMONY,
    NO_SUBGROUP,
    PATH_SUBGROUP,
    SMALLEST,
    SUBGROUPS,
    WFQ,
    Rate,
)
from celery_fair.policy import CLASSES, KEEP, RESET, QueueState
from celery_fair.policy.singletons import ref
from celery_fair.store import store_for_url
from celery_fair.store.base import Placement, Policy, Store
from celery_fair.store.models import CAP_MODES, POLICIES
from celery_fair.store.pausing import WHOLE_QUEUE
from celery_fair.store.redis import RedisStore
from celery_fair.testing import MemoryStore, RedisServer

from .backends import SQL_BACKENDS

Q = "modelq"
Q2 = "modelq2"  # fair_scope 'app': a second app-scoped queue (ScopeMachine)
GROUPS = ["a", "b", "c", "dd"]
WORKERS = ["w1", "w2", "w3"]  # the worker registry: start times and slots (register.lua)
#: affinity targets: two workers and a dedicated queue (never spilled to or from)
TARGETS = ["w1", "w2", "queue:vip"]
#: ten a second; 3 at once; one a second, 2 at once; none (whatever the default)
RATES = [Rate(100.0), Rate(100.0, 3), Rate(1000.0, 2), None]
PICK_LEASE, LEASE = 10_000, 30_000
#: interactive shares: none (strict priority), most, half, a third, a quarter of the
#: capacity
SHARES = (None, 0.8, 0.5, 1 / 3, 0.25)
HOST = "r"  # the runs r1 and r2 are this host's
#: fair_aging_seconds under smallest: arrival order, and costs worth 0.5 s to 4 s of
#: waiting (the ticks and holds are ms to seconds apart, so keys cross both ways)
AGINGS = (0.0, 0.5, 1.0, 4.0)
#: fair_subgroup 'path': the subgroups a hold draws from (None: none), and the weights'
#: keys (groups, and subgroups by their path)
SUBS = [None, None, "x", "y"]
WEIGHTED = [*GROUPS, "a/x", "a/y", "b/x"]
SUBCAPPED = ["a/x", "a/y", "b/x"]  # the paths a cap per subgroup is drawn for
#: What a release reports the task ran (seconds; None: nothing, an older worker)
RUNTIMES = [None, 0.0, 0.1, 0.25, 1.0, 3.5]
#: singleton keys (the Redis machine's holds with a key)
SINGLETON_KEYS = ("x", "y")


def stored(group: str, klass: str, cost: float, front: bool, hold_id: str,
           sub: str | None = None) -> bytes:
    envelope = Envelope(body=hold_id.encode(), content_type="application/json",
                        content_encoding="utf-8", headers={"id": hold_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q, subgroup=sub)
    return envelope.encode(group, klass, cost, front)


def redis_state(store: RedisStore, queue: str, groups: list[str]) -> QueueState:
    """What the Redis keys of ``queue`` say (for ``groups``), as a QueueState."""
    k = store.keys(queue)
    pipe = store.client.pipeline(transaction=False)
    for klass in CLASSES:
        pipe.zrange(k.ready(klass), 0, -1, withscores=True)
        pipe.zrange(k.over(klass), 0, -1, withscores=True)
    pipe.hgetall(k.vt)
    for g in groups:
        pipe.hgetall(k.group(g))
        for klass in CLASSES:
            pipe.lrange(k.held(klass, g), 0, -1)
    pipe.hget(k.stat, "inflight")
    pipe.hget(k.stat, "inflight:i")
    replies = iter(pipe.execute())
    ready, over = {}, {}
    for klass in CLASSES:
        ready[klass] = {g.decode(): s for g, s in next(replies)}
        over[klass] = {g.decode(): s for g, s in next(replies)}
    vt = {c.decode(): float(t) for c, t in next(replies).items()}
    tags, inflight, delayed, held, since = {}, {}, {}, {}, {}
    for g in groups:
        fields = {f.decode(): v for f, v in next(replies).items()}
        for name, counts in (("n", inflight), ("d", delayed)):
            if int(fields.get(name, 0)):
                counts[g] = int(fields[name])
        for klass in CLASSES:
            if "t" + klass in fields:
                tags[(klass, g)] = float(fields["t" + klass])
            ids = [i.decode() for i in next(replies)]
            if ids:
                held[(klass, g)] = ids
                since[(klass, g)] = int(fields["h" + klass])
    return QueueState(ready, vt, tags, inflight, delayed, held, int(next(replies) or 0),
                      since, over, int(next(replies) or 0))


class StoreMachine(RuleBasedStateMachine):
    """The backend ``other`` (a fresh namespace each run) against the memory store."""

    def __init__(self, other: Store, state: Callable[[str], QueueState],
                 policies: tuple[str, ...] = POLICIES, cap_modes: tuple[str, ...] = CAP_MODES,
                 shares: tuple[float | None, ...] = SHARES,
                 subgroups: tuple[str, ...] = (NO_SUBGROUP,), path_caps: bool = False) -> None:
        super().__init__()
        self.subgroups = subgroups  # fair_subgroup's values the backend runs
        self.subgroup = NO_SUBGROUP  # the one drawn (routing refuses 'path')
        self.policies = policies  # what configure draws from (every backend runs them all)
        self.cap_modes, self.shares = cap_modes, shares
        self.other = other  # the backend under test
        #: whether configure draws caps on paths (caps per subgroup: every backend has
        #: them; the legs without 'path' draw none)
        self.path_caps = path_caps
        self.state = state
        self.memory = MemoryStore()
        self.now = 1_700_000_000_000
        self.ids = 0
        self.picks = 0  # dispatch ids are p<pick>.<n>: replayable, unlike random ones
        self.dispatched: list[str] = []
        self.tokens = 0  # cancel calls

    def both(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``operation`` on both stores; they must answer the same."""
        expected = getattr(self.other, operation)(Q, *args, **kwargs)
        got = getattr(self.memory, operation)(Q, *args, **kwargs)
        assert got == expected, operation
        return expected

    def teardown(self) -> None:
        try:
            report = check(self.other, queues=[Q])
            assert report.ok, str(report)
            assert self.memory.check(Q, False, self.now, LEASE) == []
        finally:
            self.other.flush()
            self.other.close()

    @initialize(cap=st.sampled_from([None, 1, 2, 3]), reserve=st.sampled_from([0, 1]),
                data=st.data())
    def start(self, cap: int | None, reserve: int, data: Any) -> None:
        self.both("configure", Policy(cap, reserve, 1.0, self._draw_path_caps(data), {},
                                      **self._draw_policy(data)))

    def _draw_path_caps(self, data: Any) -> dict[str, int]:
        """Caps per subgroup on the paths the holds use (none for a leg that draws
        none)."""
        if not self.path_caps:
            return {}
        return data.draw(st.dictionaries(st.sampled_from(SUBCAPPED), st.integers(0, 2),
                                         max_size=3))

    def _draw_policy(self, data: Any) -> dict[str, Any]:
        """A policy, charge, cap mode, interactive share and subgroup setting the backend
        runs (a subgroup 'path' never with 'smallest': both order a group's list)."""
        name = data.draw(st.sampled_from(self.policies))
        subgroup = self.subgroup = NO_SUBGROUP if name == SMALLEST else \
            data.draw(st.sampled_from(self.subgroups))
        return {"name": name, "subgroup": subgroup,
                "charge": data.draw(st.sampled_from(CHARGES)),
                "cap_mode": data.draw(st.sampled_from(self.cap_modes)),
                "interactive_share": data.draw(st.sampled_from(self.shares)),
                "aging_seconds": data.draw(st.sampled_from(AGINGS))}

    @rule(group=st.sampled_from(GROUPS), klass=st.sampled_from(CLASSES),
          cost=st.sampled_from([1, 1, 2, 0.5, 3]), front=st.booleans(),
          delay=st.sampled_from([0, 0, 0, 5_000]), same_id=st.booleans(),
          max_held=st.sampled_from([None, None, 1, 2, 3]), sub=st.sampled_from(SUBS))
    def hold(self, group: str, klass: str, cost: float, front: bool, delay: int,
             same_id: bool, max_held: int | None, sub: str | None = None) -> None:
        if not same_id or not self.ids:
            self.ids += 1
        hold_id = f"t{self.ids}"
        due = self.now + delay if delay else 0
        args = (hold_id, stored(group, klass, cost, front, hold_id, sub),
                Placement(group, klass, cost, front, max_held, subgroup=sub), due, self.now)
        try:
            held = self.other.hold(Q, *args)
        except GroupFull as full:  # backpressure: both refuse, with the same count
            with pytest.raises(GroupFull) as same:
                self.memory.hold(Q, *args)
            assert (same.value.count, same.value.limit) == (full.count, full.limit)
            assert str(same.value) == str(full)
            return
        assert self.memory.hold(Q, *args) == held

    @precondition(lambda self: self.path_caps)
    @rule(klass=st.sampled_from(CLASSES), front=st.booleans(),
          subs=st.lists(st.sampled_from(["x", "y"]), min_size=2, max_size=5))
    def hold_in_subgroups(self, klass: str, front: bool, subs: list[str]) -> None:
        """Caps per subgroup: holds on capped paths ("a/x", "a/y"), often enough for
        the picks to park and the releases to unpark (``hold`` draws a subgroup seldom)."""
        for sub in subs:
            self.hold("a", klass, 1.0, front, 0, False, None, sub)

    @rule(limit=st.integers(1, 5), capacity=st.sampled_from([None, None, 2, 4, 6]))
    def pick(self, limit: int, capacity: int | None) -> None:
        self.picks += 1
        picked = self.both("pick", limit, capacity, self.now, PICK_LEASE,
                           token=f"p{self.picks}.")
        self.dispatched += [p.dispatch_id for p in picked]

    @rule(changes=st.lists(st.tuples(st.sampled_from(GROUPS),
                                     st.sampled_from([None, "", *TARGETS]),
                                     st.sampled_from(TARGETS)), min_size=1, max_size=4))
    def assign(self, changes: list[tuple[str, str | None, str]]) -> None:
        """The dispatchers' map (fair_affinity): set over what was read, or dropped."""
        self.both("assign", changes)

    @precondition(lambda self: self.subgroup != PATH_SUBGROUP)  # refused together
    @rule(limit=st.integers(1, 5), capacity=st.sampled_from([None, None, 3, 6]),
          limits=st.dictionaries(st.sampled_from(TARGETS), st.integers(0, 3), max_size=3),
          spill=st.sampled_from([None, None, 0, 5_000]))
    def pick_routed(self, limit: int, capacity: int | None, limits: dict[str, int],
                    spill: int | None) -> None:
        """A routed pick: only groups whose target is live with room, or spilled; each
        dispatch counted against its target until release, reclaim or renewal."""
        self.picks += 1
        routed = self.both("pick_routed", limit, capacity, self.now, PICK_LEASE, limits,
                           spill, token=f"p{self.picks}.")
        self.dispatched += [p.dispatch_id for p in routed.picked]

    @rule(group=st.sampled_from(GROUPS), interactive=st.integers(1, 4),
          background=st.integers(1, 3))
    def burst(self, group: str, interactive: int, background: int) -> None:
        """Work of both classes at once (the interactive share's case)."""
        for klass, n in (("i", interactive), ("b", background)):
            for _ in range(n):
                self.hold(group, klass, 1, False, 0, False, None)

    @rule(limit=st.integers(1, 5), room=st.integers(1, 4))
    def pick_with_room(self, limit: int, room: int) -> None:
        """A pick with a capacity a little above what is in flight: as a dispatcher's,
        where the interactive share's bound (share x capacity) falls either side of the
        interactive work in flight."""
        self.pick(limit, self.memory.inspect(Q).total_inflight + room)

    def _some(self, data: Any) -> list[str]:
        """One to three dispatch ids, mostly recent ones (where the states differ)."""
        if not self.dispatched:
            return []
        recent = st.sampled_from(self.dispatched[-6:])
        return list(data.draw(st.lists(recent | st.sampled_from(self.dispatched),
                                       min_size=1, max_size=3, unique=True)))

    @rule(data=st.data())
    def confirm(self, data: Any) -> None:
        dids = self._some(data)
        assert sorted(self.other.confirm(Q, dids, self.now + LEASE)) == \
            sorted(self.memory.confirm(Q, dids, self.now + LEASE))

    @rule(data=st.data(), acks_late=st.booleans(), on_host=st.booleans(),
          gone=st.sets(st.sampled_from(["r1", "r2"])))
    def begin(self, data: Any, acks_late: bool, on_host: bool, gone: set[str]) -> None:
        # a running dispatch begun again: its own run, a copy the broker redelivered, or
        # a copy whose run on this host is gone (taken over)
        for did in self._some(data):
            run = data.draw(st.sampled_from(["r1", "r2"]))
            host = {"host": HOST, "gone": gone.__contains__} if on_host else {}
            self.both("begin", did, self.now + LEASE, now_ms=self.now, run=run,
                      acks_late=acks_late, **host)

    @rule(data=st.data())
    def renew(self, data: Any) -> None:
        self.both("renew", self._some(data), self.now + LEASE)

    @rule(data=st.data(), run=st.sampled_from([None, "r1", "r2"]),
          runtime=st.sampled_from(RUNTIMES))
    def release(self, data: Any, run: str | None, runtime: float | None) -> None:
        for did in self._some(data):
            self.both("release", did, 3600 if data.draw(st.booleans()) else 0, run=run,
                      runtime=runtime, now_ms=self.now)

    @rule(data=st.data(), acks_late=st.booleans(), runtime=st.sampled_from(RUNTIMES))
    def run_to_end(self, data: Any, acks_late: bool, runtime: float | None) -> None:
        """The common lifecycle in one step: published, begun by a worker, finished."""
        for did in self._some(data):
            self.both("confirm", [did], self.now + LEASE)
            self.both("begin", did, self.now + LEASE, now_ms=self.now, run="r1",
                      acks_late=acks_late)
            self.both("release", did, 3600, run="r1", runtime=runtime, now_ms=self.now)

    @rule(data=st.data(), acks_late=st.booleans(), dies=st.booleans(),
          gone=st.sets(st.sampled_from(["r1"])))
    def worker_dies(self, data: Any, acks_late: bool, dies: bool, gone: set[str]) -> None:
        """A worker begins a dispatch and then either its pool process is found gone by
        another process of this host that gets a copy, or the whole worker dies and the
        lease runs out before a copy arrives."""
        did = self._some(data)[:1]
        if not did:
            return
        self.both("confirm", did, self.now + LEASE)
        self.both("begin", did[0], self.now + LEASE, now_ms=self.now, run="r1",
                  acks_late=acks_late)
        if dies:
            self.advance_and_reclaim(LEASE + 1)
        self.both("begin", did[0], self.now + LEASE, now_ms=self.now, run="r2",
                  acks_late=acks_late, host=HOST, gone=gone.__contains__)

    @rule(ms=st.sampled_from([1_000, 6_000, 12_000, 40_000]))
    def advance_and_reclaim(self, ms: int) -> None:
        self.now += ms
        self.both("promote", self.now, 1000)
        self.both("reclaim", self.now, 1000)
        self.both("expire_pauses", self.now)
        self.both("expire_boosts", self.now)

    @rule(ms=st.sampled_from([30, 100, 250]))
    def tick(self, ms: int) -> None:
        """A little time passes and a dispatcher steps: throttles come due."""
        self.now += ms
        self.both("promote", self.now, 1000)

    @rule(group=st.sampled_from(GROUPS), rate=st.sampled_from([*RATES, KEEP, RESET]))
    def set_rate(self, group: str, rate: Rate | str | None) -> None:
        self.both("set_rate", group, rate)

    @rule(worker=st.sampled_from(WORKERS), pool=st.sampled_from([1, 4]),
          ms=st.sampled_from([5_000, 20_000, 120_000]))
    def register_worker(self, worker: str, pool: int, ms: int) -> None:
        self.both("register_worker", worker, pool, self.now + ms, self.now)

    @rule(worker=st.sampled_from(WORKERS))
    def unregister_worker(self, worker: str) -> None:
        self.both("unregister_worker", worker)

    @rule(group=st.sampled_from(GROUPS), ms=st.sampled_from([50, 400, 5_000]))
    def throttle(self, group: str, ms: int) -> None:
        self.both("throttle", group, self.now + ms)

    @rule(group=st.sampled_from([*GROUPS, WHOLE_QUEUE]),
          until=st.sampled_from([None, 3_000, 20_000]))
    def pause(self, group: str, until: int | None) -> None:
        self.both("pause", group, None if until is None else self.now + until)

    @rule(group=st.sampled_from([*GROUPS, WHOLE_QUEUE]))
    def resume(self, group: str) -> None:
        self.both("resume", group)

    @rule(group=st.sampled_from(GROUPS), weight=st.sampled_from([0.5, 3.0, 10.0]),
          until=st.sampled_from([None, 3_000, 20_000]))
    def boost(self, group: str, weight: float, until: int | None) -> None:
        self.both("boost", group, weight, None if until is None else self.now + until)

    @rule(group=st.sampled_from(GROUPS))
    def unboost(self, group: str) -> None:
        self.both("unboost", group)

    @rule(data=st.data())
    def boost_task(self, data: Any) -> None:
        """A task to the front: held (often), delayed, dispatched or unknown."""
        if self.ids:
            self.both("boost_task", f"t{data.draw(st.integers(1, self.ids))}",
                      now_ms=self.now)

    @rule(cap=st.sampled_from([None, 1, 2, 4]), reserve=st.sampled_from([0, 1, 2]),
          weight=st.sampled_from([1.0, 1.0, 2.0]),
          caps=st.dictionaries(st.sampled_from(GROUPS), st.integers(0, 3), max_size=2),
          weights=st.dictionaries(st.sampled_from(WEIGHTED), st.sampled_from([0.5, 2.0, 3.0]),
                                  max_size=3),
          default_rate=st.sampled_from([None, None, *RATES]),
          rates=st.dictionaries(st.sampled_from(GROUPS), st.sampled_from(RATES), max_size=2),
          data=st.data())
    def configure(self, cap: int | None, reserve: int, weight: float, caps: dict[str, int],
                  weights: dict[str, float], default_rate: Rate | None,
                  rates: dict[str, Rate | None], data: Any) -> None:
        caps = {**caps, **self._draw_path_caps(data)}
        self.both("configure", Policy(cap, reserve, weight, caps, weights, default_rate,
                                      rates, **self._draw_policy(data)))

    @rule(group=st.sampled_from([*GROUPS, *SUBCAPPED]),
          cap=st.sampled_from([KEEP, RESET, -1, 0, 1, 2]),
          weight=st.sampled_from([KEEP, RESET, 0.5, 3.0]))
    def limit(self, group: str, cap: int | str, weight: float | str) -> None:
        self.both("limit", group, cap, weight)

    @rule(data=st.data(), resend=st.booleans())
    def cancel(self, data: Any, resend: bool) -> None:
        if not self.ids:
            return
        if not resend or not self.tokens:
            self.tokens += 1
        ids = data.draw(st.lists(st.sampled_from([f"t{i}" for i in range(1, self.ids + 1)]),
                                 min_size=1, max_size=3))
        token = f"c{self.tokens}"
        assert sorted(self.other.cancel(Q, ids, token=token, now_ms=self.now)) == \
            sorted(self.memory.cancel(Q, ids, token=token, now_ms=self.now))

    @invariant()
    def same_state(self) -> None:
        assert self.memory.inspect(Q) == self.state(Q)
        self.both_read("queue_figures")
        self.both_read("group_figures", GROUPS)
        self.both_read("summarize", GROUPS)  # with the head times
        self.both_read("pauses")
        self.both_read("boosts")
        self.both_read("throttles")
        self.both_read("rates")
        self.both_read("live_workers", self.now)  # slots and start times
        self.both_read("assignments")  # affinity: the map, targets' in flight, moves
        self.both_read("worker_inflight")
        self.both_read("affinity_moves")
        for did in self.dispatched:
            self.both_read("dispatch_state", did)
        for i in range(1, self.ids + 1):  # where each task stands, held or dispatched
            assert self.memory.locate(f"t{i}") == self.other.locate(f"t{i}"), f"t{i}"

    def both_read(self, operation: str, *args: Any) -> None:
        assert getattr(self.memory, operation)(Q, *args) == \
            getattr(self.other, operation)(Q, *args), (operation, args)


class KeyedMachine(StoreMachine):
    """A backend with singleton keys: holds with a key, waiting or dropped; each backend
    compares every key's owner and waiting list (``same_singletons``)."""

    def memory_singletons(self) -> tuple[dict[str, str], dict[str, str],
                                         dict[str, list[str]]]:
        """The memory store's hold id -> key, key -> owner, key -> waiting ids."""
        with self.memory._queue(Q) as fq:
            return (dict(fq.skeys), dict(fq.sowner),
                    {key: list(ids) for key, ids in fq.swait.items() if ids})

    @rule(group=st.sampled_from(GROUPS), klass=st.sampled_from(CLASSES),
          key=st.sampled_from(SINGLETON_KEYS), front=st.booleans(),
          delay=st.sampled_from([0, 0, 0, 5_000]), drop=st.booleans())
    def hold_singleton(self, group: str, klass: str, key: str, front: bool, delay: int,
                       drop: bool) -> None:
        self.ids += 1
        hold_id = f"t{self.ids}"
        args = (hold_id, stored(group, klass, 1, front, hold_id),
                Placement(group, klass, 1, front, None, key, drop),
                self.now + delay if delay else 0, self.now)
        try:
            held = self.other.hold(Q, *args)
        except SingletonDropped:  # both drop it
            with pytest.raises(SingletonDropped):
                self.memory.hold(Q, *args)
            return
        assert self.memory.hold(Q, *args) == held


class RedisMachine(KeyedMachine):
    """The Redis store, whose sort keys (``k_keys``: smallest, subgroups) and subgroup
    tags (``sg``) are compared too."""

    @invariant()
    def same_parked(self) -> None:
        """Caps per subgroup: the parked lists and each subgroup's flight."""
        store: Any = self.other
        k = store.keys(Q)
        parked = {}
        for member in sorted(m.decode() for m in store.client.smembers(k.parked_lists)):
            klass, _, path = member.partition(":")
            group, _, sub = path.partition("/")
            parked[(klass, group, sub)] = [
                i.decode() for i in store.client.lrange(k.parked(klass, group, sub), 0, -1)]
        flight = {p.decode(): int(n) for p, n in
                  store.client.hgetall(k.subgroup_flight).items()}
        with self.memory._queue(Q) as fq:
            assert (parked, flight) == ({w: list(ids) for w, ids in fq.parked.items()},
                                        fq.sflight)

    @invariant()
    def same_singletons(self) -> None:
        store: Any = self.other
        k = store.keys(Q)
        pipe = store.client.pipeline(transaction=False)
        pipe.hgetall(k.singleton_keys)
        pipe.hgetall(k.singleton_owners)
        for key in SINGLETON_KEYS:
            pipe.lrange(k.singleton_waiting(key), 0, -1)
        skeys, owners, *waiting = pipe.execute()
        assert ({i.decode(): v.decode() for i, v in skeys.items()},
                {i.decode(): v.decode() for i, v in owners.items()},
                {key: [i.decode() for i in ids] for key, ids in zip(SINGLETON_KEYS, waiting)
                 if ids}) == self.memory_singletons()

    @invariant()
    def same_keys(self) -> None:
        store: Any = self.other
        k = store.keys(Q)
        pipe = store.client.pipeline(transaction=False)
        for klass in CLASSES:
            for g in GROUPS:
                pipe.zrange(k.held_keys(klass, g), 0, -1, withscores=True)
                pipe.hgetall(k.subgroup_tags(klass, g))
        replies = iter(pipe.execute())
        got, tags = {}, {}
        for klass in CLASSES:
            for g in GROUPS:
                entries = [(score, i.decode()) for i, score in next(replies)]
                if entries:
                    got[(klass, g)] = entries
                sub = {f.decode(): float(v) for f, v in next(replies).items()}
                if sub:
                    tags[(klass, g)] = sub
        with self.memory._queue(Q) as fq:
            assert got == fq.keys
            assert tags == {w: t for w, t in fq.subtags.items() if t}


def redis_machine(server: RedisServer, subgroups: bool = False,
                  scope: bool = False) -> StoreMachine:
    """The Redis store under every policy; or (``subgroups``) under wfq and harmony with
    ``fair_subgroup`` 'path' mostly, so that its runs hold and pick in subgroups a lot
    (drawn among everything, it came up a few picks in ten runs)."""
    store = RedisStore(redis.Redis(port=server.port), "m" + uuid.uuid4().hex[:10])
    if scope:  # fair_scope 'app', with a second queue
        return ScopeMachine(store, lambda queue: redis_state(store, queue, GROUPS))
    if subgroups:
        return RedisMachine(store, lambda queue: redis_state(store, queue, GROUPS),
                            policies=(WFQ, HARMONY),
                            subgroups=(PATH_SUBGROUP, PATH_SUBGROUP, NO_SUBGROUP),
                            path_caps=True)
    return RedisMachine(store, lambda queue: redis_state(store, queue, GROUPS),
                        subgroups=SUBGROUPS, path_caps=True)


class ScopeRules(KeyedMachine):
    """fair_scope 'app': the queue under test and a second app-scoped queue (Q2, capped
    groups) share the groups' in-flight counts; Q2 holds, picks and releases on both
    stores, so Q's caps, ranks and stale heads (SC.stale) and the refreshes a release
    in Q2 hands Q (SC.freed, SC.admit at Q's promote) are compared step by step. The
    backend's machine gives ``app_counts`` (group -> in flight app-wide)."""

    def app_counts(self) -> dict[str, int]:
        raise NotImplementedError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.other_dispatched: list[str] = []

    def _draw_policy(self, data: Any) -> dict[str, Any]:
        return {**super()._draw_policy(data), "scope": APP_SCOPE}

    def on_both(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """``operation`` on Q2 of both stores; they must answer the same."""
        expected = getattr(self.other, operation)(Q2, *args, **kwargs)
        assert getattr(self.memory, operation)(Q2, *args, **kwargs) == expected, operation
        return expected

    @initialize(name=st.sampled_from([WFQ, HARMONY]))
    def start_other(self, name: str) -> None:
        self.on_both("configure", Policy(None, 0, 1.0, {"b": 2, "c": 0}, {}, name=name,
                                         scope=APP_SCOPE))

    @rule(group=st.sampled_from(GROUPS))
    def hold_other(self, group: str) -> None:
        self.ids += 1
        hold_id = f"o{self.ids}"
        self.on_both("hold", hold_id, stored(group, "b", 1, False, hold_id, None),
                     Placement(group, "b", 1, False), 0, self.now)

    @rule(group=st.sampled_from(GROUPS), n=st.integers(1, 3))
    def busy_other(self, group: str, n: int) -> None:
        """Q2 runs some of ``group`` at once: its count app-wide rises past Q's view."""
        for _ in range(n):
            self.hold_other(group)
        self.pick_other(n)

    @rule(group=st.sampled_from(GROUPS), n=st.integers(1, 3), limit=st.integers(1, 5))
    def busy_other_then_pick(self, group: str, n: int, limit: int) -> None:
        """Q2's picks, then Q's at once: a group ranked ready in Q before them is at its
        cap app-wide now (stale: passed over), unless a step of Q refreshed it between."""
        self.busy_other(group, n)
        self.pick(limit, None)

    @rule(limit=st.integers(1, 3))
    def pick_other(self, limit: int) -> None:
        self.picks += 1
        picked = self.on_both("pick", limit, None, self.now, PICK_LEASE,
                              token=f"o{self.picks}.")
        self.other_dispatched += [p.dispatch_id for p in picked]

    @rule(data=st.data())
    def release_other(self, data: Any) -> None:
        if self.other_dispatched:
            did = data.draw(st.sampled_from(self.other_dispatched))
            self.other_dispatched.remove(did)
            self.on_both("release", did, 0, now_ms=self.now)

    @rule()
    def promote_other(self) -> None:
        self.on_both("promote", self.now, 1000)
        self.on_both("reclaim", self.now, 1000)

    @invariant()
    def same_app_counts(self) -> None:
        counts = self.app_counts()
        assert counts == self.memory._scope_n
        assert all(n > 0 for n in counts.values())
        assert self.memory.inspect(Q2) == self.state(Q2)
        # fair check's view: each app count the sum of the queues', no total left over
        assert self.other.check_scope(False) == [] == self.memory.check_scope(False)


class ScopeMachine(ScopeRules, RedisMachine):
    """``ScopeRules`` on Redis (``<ns>:scope:n``)."""

    def app_counts(self) -> dict[str, int]:
        store: Any = self.other
        return {g.decode(): int(n) for g, n in
                store.client.hgetall(f"{store.namespace}:scope:n").items()}


class SqlMachine(KeyedMachine):
    """The SQL store: its singleton rows (``skeys`` of held messages, ``sowners``,
    ``swaits`` by position) against the memory store's dicts."""

    @invariant()
    def same_singletons(self) -> None:
        store: Any = self.other
        t, ns = store.t, store.namespace
        with store.engine.connect() as conn:
            keys = {ref[1:]: key for ref, key in conn.execute(select(
                t.skeys.c.ref, t.skeys.c.skey).where(t.skeys.c.ns == ns)) if ref[0] == "h"}
            o = t.sowners.c  # the namespace's rows, each naming its queue
            owners = {key: owner[0] + ref(queue, owner[1:]) for key, owner, queue in
                      conn.execute(select(o.skey, o.owner, o.oqueue).where(o.ns == ns))}
            waiting: dict[str, list[str]] = {}
            w = t.swaits.c
            for key, hold_id, queue in conn.execute(select(w.skey, w.hold_id, w.wqueue).where(
                    w.ns == ns).order_by(w.skey, w.pos)):
                waiting.setdefault(key, []).append(ref(queue, hold_id))
        assert (keys, owners, waiting) == self.memory_singletons()


class SqlScopeMachine(ScopeRules, SqlMachine):
    """``ScopeRules`` on the SQL store (``scope_n`` rows)."""

    def app_counts(self) -> dict[str, int]:
        store: Any = self.other
        c = store.t.scope_n.c
        with store.engine.connect() as conn:
            return {g: int(n) for g, n in conn.execute(select(c.grp, c.n).where(
                c.ns == store.namespace))}


def sql_machine(url: str, scope: bool = False) -> StoreMachine:
    store: Any = store_for_url(url, "m" + uuid.uuid4().hex[:10])
    if scope:  # fair_scope 'app', with a second queue
        return SqlScopeMachine(store, store.inspect, subgroups=SUBGROUPS)
    return SqlMachine(store, store.inspect, subgroups=SUBGROUPS, path_caps=True)


@pytest.mark.timeout(900)  # a failure's shrinking takes longer than a passing run
@pytest.mark.parametrize("backend", ("redis", "redis-subgroups", "redis-scope",
                                     *SQL_BACKENDS, *(f"{b}-scope" for b in SQL_BACKENDS)))
def test_every_backend_makes_the_memory_stores_decisions(backend: str, request: Any) -> None:
    if backend.startswith("redis"):
        server = request.getfixturevalue("redis_server")
        examples = int(os.environ.get("FAIR_MODEL_EXAMPLES", "80"))
        machine = functools.partial(redis_machine, server, backend == "redis-subgroups",
                                    backend == "redis-scope")
    else:
        url = request.getfixturevalue("sql_url")(backend.removesuffix("-scope"))
        examples = int(os.environ.get("FAIR_MODEL_EXAMPLES_SQL", "10"))
        if backend.endswith("-scope"):
            examples = max(1, examples // 2)
        machine = functools.partial(sql_machine, url, backend.endswith("-scope"))
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples, stateful_step_count=60, deadline=None,
                          suppress_health_check=list(HealthCheck), database=None))


class Draws:
    """A ``data`` whose draws are given: replays a run hypothesis found."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any) -> Any:
        return self.values.pop(0)


def test_a_task_boosted_under_harmony_is_ranked_by_the_apps_flight_in_redis_too(
        redis_server: RedisServer) -> None:
    """A run the redis-scope leg found: under harmony and fair_scope 'app', boost_task's
    rank (just below the lowest of the ready sets' heads and the group's own rank) took
    the group's own rank from its flight in this queue, not the app's as every rank
    does (0 against 1 here: b runs in the other queue)."""
    machine: Any = redis_machine(redis_server, scope=True)
    unchanged = ("none", "cost", "hard", None, 0.0)  # subgroup, charge, caps, share, aging
    try:
        machine.start(cap=None, reserve=0, data=Draws("wfq", *unchanged))
        machine.start_other(name="wfq")
        machine.busy_other_then_pick(group="b", limit=1, n=1)
        machine.configure(cap=None, caps={}, data=Draws("harmony", *unchanged),
                          default_rate=None, rates={}, reserve=0, weight=1.0, weights={})
        machine.burst(background=1, group="b", interactive=1)
        machine.boost_task(data=Draws(2))
        machine.same_state()
    finally:
        machine.teardown()


def test_a_routed_pick_spills_a_group_by_the_head_time_it_set_in_the_same_call(
        redis_server: RedisServer) -> None:
    """A run the redis-subgroups leg found: b's head had waited past the spill time and
    its worker had room for two. A routed pick took those two (so b's next message is
    the head since now), then spilled the third to the roomiest worker on Redis: the
    pick writes the new head times at its end, and the spill read the old one. Every
    other store (and now Redis) reads the head time the call set."""
    machine: Any = redis_machine(redis_server, True, False)
    try:
        machine.start(cap=None, reserve=0, data=Draws(
            {"a/x": 0, "a/y": 0, "b/x": 0}, "wfq", "none", "cost", "soft", None, 0.0))
        machine.burst(background=1, group="b", interactive=3)
        machine.advance_and_reclaim(ms=12000)
        machine.assign(changes=[("b", None, "w2")])
        machine.pick_routed(capacity=None, limit=4, limits={"w1": 3, "w2": 2}, spill=5000)
        machine.same_state()
    finally:
        machine.teardown()


def test_a_release_looks_again_at_a_group_another_queue_freed_in_redis_too(
        redis_server: RedisServer) -> None:
    """A run the redis-scope leg found: dd stood out of its ready set here, at its cap
    across the app's queues, until a release in the other queue freed a slot (marking
    it for this queue's next promote). A release of dd here then left it out on Redis:
    the release looked only when its own count crossed the cap, and the app's count was
    already below it. Every other store (and now Redis) looks under scope 'app'."""
    machine: Any = redis_machine(redis_server, scope=True)
    unchanged = ("none", "cost", "hard", None, 0.0)  # subgroup, charge, caps, share, aging
    try:
        machine.start(cap=None, reserve=0, data=Draws("wfq", *unchanged))
        machine.start_other(name="wfq")
        machine.hold_other(group="dd")
        machine.pick_routed(capacity=None, limit=5, limits={"w1": 0, "w2": 0, "queue:vip": 0},
                            spill=None)
        machine.pick_other(limit=1)
        machine.pick_with_room(limit=3, room=1)
        machine.pick_with_room(limit=1, room=1)
        machine.configure(cap=1, caps={"a": 0}, data=Draws("wfq", *unchanged),
                          default_rate=None, rates={}, reserve=2, weight=1.0, weights={})
        machine.burst(background=1, group="dd", interactive=3)
        machine.busy_other_then_pick(group="a", limit=5, n=1)
        machine.release_other(data=Draws("o2.1.1"))
        machine.same_state()
        machine.run_to_end(acks_late=True, data=Draws(["p6.4.1"]), runtime=3.5)
        machine.same_state()
    finally:
        machine.teardown()


def test_a_policy_change_empties_the_over_sets_on_sql_too(
        sql_url: Callable[[str], str]) -> None:
    """A run the sqlite-scope and postgresql-scope legs found: dd stood in its over set
    here (soft caps; at its cap across the app's queues) without a tag of its own. A
    configure from 'smallest' to 'wfq' empties the sets, so dd enters its ready set
    anew at the virtual time (Redis, memory); the SQL store emptied only the ready
    sets, so dd kept its old score as a member."""
    machine: Any = sql_machine(sql_url("sqlite"), True)
    try:
        machine.start(cap=None, reserve=0,
                      data=Draws("wfq", "none", "cost", "hard", None, 0.0))
        machine.start_other(name="wfq")
        machine.busy_other(group="dd", n=4)
        machine.configure(cap=1, caps={}, data=Draws("smallest", "count", "soft", 1 / 3, 4.0),
                          default_rate=None, rates={}, reserve=2, weight=2.0, weights={})
        machine.burst(background=2, group="dd", interactive=3)
        machine.burst(background=1, group="a", interactive=2)
        machine.busy_other_then_pick(group="a", limit=1, n=1)
        machine.busy_other_then_pick(group="c", limit=1, n=2)
        machine.configure(cap=None, caps={}, data=Draws("wfq", "none", "cost", "hard", None,
                                                        1.0),
                          default_rate=None, rates={}, reserve=1, weight=2.0, weights={})
        machine.same_state()
    finally:
        machine.teardown()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_key_given_before_the_keys_were_dropped_does_not_move_the_lists_time_on_sql(
        sql_url: Callable[[str], str], kind: str) -> None:
    """A run the sqlite leg found: a message held under 'smallest' keeps its sort key on
    a SQL store after a configure to fair_subgroup 'path' (for its place in the list:
    the other stores keep the list itself in order and drop the keys). Picked, it made
    that old key the list's virtual time, so the next subgroup holds were keyed ~1.7e12
    and went behind messages the other stores put them before."""
    machine: Any = sql_machine(sql_url(kind), False)
    try:
        machine.start(cap=None, reserve=0, data=Draws({}, "smallest", "cost", "hard", None,
                                                      4.0))
        for _ in range(2):
            machine.hold(cost=3, delay=0, front=False, group="a", klass="i", max_held=None,
                         same_id=False, sub=None)
        machine.configure(cap=None, caps={}, data=Draws({}, "harmony", "path", "cost",
                                                        "hard", None, 1.0),
                          default_rate=None, rates={}, reserve=0, weight=1.0, weights={})
        machine.hold_in_subgroups(front=False, klass="i", subs=["x", "y", "x"])
        machine.pick(capacity=None, limit=1)  # the first message, keyed under 'smallest'
        machine.hold_in_subgroups(front=False, klass="i", subs=["x", "y"])
        machine.same_state()
    finally:
        machine.teardown()
