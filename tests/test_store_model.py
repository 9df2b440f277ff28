"""Model-based test of the Redis store: hypothesis drives the real scripts (hold, pick,
confirm, begin, release, reclaim, promote, configure) on the real redis-server, with the
clock passed in, and a small pure-Python model of the policy alongside. After every step
both must agree: which messages a pick returned and in what order, each group's in-flight
count, held lists and delayed count, the ready sets with their tags, virtual time and the
fair queue's in-flight total. At the end of each run the invariant checker must find
nothing.

The model is the policy as DESIGN.md states it: start-time fair queueing (a group's tag
advances by cost / weight per dispatch; a group entering a ready set starts at
max(its tag, virtual time); the pick is the lowest tag, ties by name), interactive before
background, a per-group cap with an interactive reserve above it, a per-queue capacity,
idle groups forgotten, leases that hold a picked message again at its group's head.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from celery_fair.check import check
from celery_fair.envelope import Envelope
from celery_fair.store.base import BeginResult, Policy
from celery_fair.store.redis import RedisStore

Q = "modelq"
GROUPS = ["a", "b", "c", "dd"]
CLASSES = ("i", "b")  # interactive first
PICK_LEASE, LEASE = 10_000, 30_000


def stored(group: str, klass: str, cost: float, front: bool, hold_id: str) -> bytes:
    envelope = Envelope(body=hold_id.encode(), content_type="application/json",
                        content_encoding="utf-8", headers={"id": hold_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q)
    return envelope.encode(group, klass, cost, front)


@dataclass
class Msg:
    group: str
    klass: str
    cost: float
    front: bool


@dataclass
class Dispatch:
    group: str
    klass: str
    hold_id: str
    msg: Msg
    state: str  # picked, queued, running, lost, superseded, released
    deadline: int = 0
    #: the record still has the message: picked, queued until a worker begins it where
    #: the store keeps it for that, and running for an acks_late run (then the broker
    #: losing it, or the worker holding it dying, is recoverable)
    has_bytes: bool = True
    #: the run that began it ('' for none) and whether it acks late
    runner: str = ""
    acks_late: bool = False


@dataclass
class Model:
    """The policy, written as stated rather than as the scripts do it."""

    cap: int | None = None
    reserve: int = 1  # fair_interactive_reserve's default
    caps: dict[str, int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    msgs: dict[str, Msg] = field(default_factory=dict)
    lists: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    delayed: dict[str, int] = field(default_factory=dict)  # hold id -> due
    n: dict[str, int] = field(default_factory=dict)
    tags: dict[tuple[str, str], float] = field(default_factory=dict)
    vt: dict[str, float] = field(default_factory=dict)
    ready: dict[str, dict[str, float]] = field(default_factory=lambda: {"i": {}, "b": {}})
    records: dict[str, Dispatch] = field(default_factory=dict)
    dup: int = 0

    def held(self, klass: str, g: str) -> list[str]:
        return self.lists.setdefault((klass, g), [])

    def delayed_of(self, g: str) -> int:
        return sum(1 for i in self.delayed if self.msgs[i].group == g)

    def inflight(self) -> int:
        return sum(self.n.values())

    def eligible(self, klass: str, g: str) -> bool:
        if not self.held(klass, g):
            return False
        cap = self.caps.get(g, self.cap)
        if cap is None:
            return True
        if cap == 0:  # paused: nothing in any class, the reserve included
            return False
        return self.n.get(g, 0) < cap + (self.reserve if klass == "i" else 0)

    def refresh(self, g: str) -> None:
        for klass in CLASSES:
            if self.eligible(klass, g):
                tag = max(self.tags.get((klass, g), 0.0), self.vt.get(klass, 0.0))
                self.tags[(klass, g)] = tag
                self.ready[klass][g] = tag
            else:
                self.ready[klass].pop(g, None)

    def forget_if_idle(self, g: str) -> None:
        if self.n.get(g, 0) or self.delayed_of(g) or any(self.held(k, g) for k in CLASSES):
            return
        self.n.pop(g, None)
        for klass in CLASSES:
            self.tags.pop((klass, g), None)

    def free_slot(self, g: str) -> None:
        self.n[g] -= 1
        self.refresh(g)
        self.forget_if_idle(g)

    def hold(self, hold_id: str, msg: Msg, due: int, now: int) -> str:
        if self.msgs.get(hold_id) == msg:  # the same stored value: one publication, resent
            return hold_id
        if hold_id in self.msgs:
            self.dup += 1
            hold_id = f"{hold_id}~{self.dup}"
        self.msgs[hold_id] = msg
        if due > now:
            self.delayed[hold_id] = due
            return hold_id
        self._enqueue(hold_id, msg)
        return hold_id

    def _enqueue(self, hold_id: str, msg: Msg) -> None:
        queue = self.held(msg.klass, msg.group)
        queue.insert(0, hold_id) if msg.front else queue.append(hold_id)
        self.refresh(msg.group)

    def promote(self, now: int) -> int:
        due = sorted((t, i) for i, t in self.delayed.items() if t <= now)
        for _, hold_id in due:
            del self.delayed[hold_id]
            self._enqueue(hold_id, self.msgs[hold_id])
        return len(due)

    def pick(self, limit: int, capacity: int | None) -> list[str]:
        """Hold ids in pick order."""
        if capacity is not None:
            limit = min(limit, capacity - self.inflight())
        out: list[str] = []
        while len(out) < limit:
            head = next(((k, min(self.ready[k].items(), key=lambda gt: (gt[1], gt[0].encode())))
                         for k in CLASSES if self.ready[k]), None)
            if head is None:
                break
            klass, (g, tag) = head
            hold_id = self.held(klass, g).pop(0)
            msg = self.msgs.pop(hold_id)
            self.vt[klass] = tag
            self.tags[(klass, g)] = tag + msg.cost / self.weights.get(g, 1.0)
            self.n[g] = self.n.get(g, 0) + 1
            out.append(hold_id)
            self.ready[klass].pop(g)
            self.refresh(g)
        return out

    def release(self, did: str, done: bool) -> bool:
        """``done``: the task ran to its end, its record stays as a tombstone."""
        rec = self.records.get(did)
        if rec is None or rec.state in ("superseded", "released"):
            return False
        if done:
            self.records[did] = Dispatch(rec.group, rec.klass, rec.hold_id, rec.msg,
                                         "released", 0)
        else:
            del self.records[did]
        if rec.state == "lost":
            return False
        self.free_slot(rec.group)
        return True

    def reclaim(self, now: int) -> tuple[int, int]:
        expired = sorted((r.deadline, did) for did, r in self.records.items()
                         if r.state in ("picked", "queued", "running") and r.deadline <= now)
        requeued = lost = 0
        for _, did in expired:
            rec = self.records[did]
            if rec.state == "picked" or (rec.state == "queued" and rec.has_bytes) \
                    or (rec.state == "running" and rec.has_bytes and rec.acks_late):
                hold_id = rec.hold_id
                if hold_id in self.msgs:
                    hold_id = f"{hold_id}~{did}"
                self.msgs[hold_id] = rec.msg
                self.held(rec.klass, rec.group).insert(0, hold_id)
                rec.state = "superseded"
                requeued += 1
            else:
                rec.state = "lost"
                lost += 1
            self.free_slot(rec.group)
        return requeued, lost

    def begin(self, did: str, deadline: int, now: int, run: str,
              acks_late: bool) -> BeginResult:
        rec = self.records.get(did)
        if rec is None:
            return BeginResult.RUN_UNKNOWN
        if rec.state in ("superseded", "released"):  # a stale or finished copy
            return BeginResult.SKIP
        if rec.state == "running" and rec.runner not in ("", run) and rec.has_bytes \
                and rec.acks_late and rec.deadline > now:
            return BeginResult.SKIP  # another run holds it; reclaim covers its death
        result = self.hold_lease(did, deadline)
        rec.state, rec.runner = "running", run
        rec.acks_late = acks_late
        rec.has_bytes = rec.has_bytes and acks_late
        return result

    def hold_lease(self, did: str, deadline: int) -> BeginResult:
        """A worker holds the dispatch: a longer lease; a lost one takes a slot again."""
        rec = self.records[did]
        result = BeginResult.RUN
        if rec.state == "lost":
            self.n[rec.group] = self.n.get(rec.group, 0) + 1
            self.refresh(rec.group)
            rec.state = "running"
            result = BeginResult.RUN_REACQUIRED
        rec.deadline = deadline
        return result

    def renew(self, dids: list[str], deadline: int) -> int:
        renewed = 0
        for did in dids:
            rec = self.records.get(did)
            if rec is not None and rec.state not in ("superseded", "released"):
                self.hold_lease(did, deadline)
                renewed += 1
        return renewed

    def confirm(self, dids: list[str], deadline: int) -> list[str]:
        stale = []
        for did in dids:
            rec = self.records.get(did)
            if rec is not None and rec.state == "picked":
                rec.state, rec.deadline = "queued", deadline
            elif rec is not None and rec.state == "superseded":
                stale.append(did)
        return stale

    def configure(self, cap: int | None, reserve: int, caps: dict[str, int],
                  weights: dict[str, float]) -> None:
        self.cap, self.reserve, self.caps, self.weights = cap, reserve, caps, weights
        for g in GROUPS:
            self.refresh(g)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        self.store = RedisStore(client, "m" + uuid.uuid4().hex[:10])
        self.model = Model()
        self.now = 1_700_000_000_000
        self.ids = 0
        self.picks = 0  # dispatch ids are p<pick>.<n>: replayable, unlike random ones

    def teardown(self) -> None:
        report = check(self.store, queues=[Q])
        assert report.ok, str(report)
        keys = list(self.client.scan_iter(match=f"{self.store.namespace}:*", count=1000))
        if keys:
            self.client.delete(*keys)

    @initialize(cap=st.sampled_from([None, 1, 2, 3]), reserve=st.sampled_from([0, 1]))
    def start(self, cap: int | None, reserve: int) -> None:
        self.configure_both(cap, reserve, {}, {})

    def configure_both(self, cap: int | None, reserve: int, caps: dict[str, int],
                       weights: dict[str, float]) -> None:
        self.store.configure(Q, Policy(cap, reserve, 1.0, caps, weights))
        self.model.configure(cap, reserve, caps, weights)

    @rule(group=st.sampled_from(GROUPS), klass=st.sampled_from(CLASSES),
          cost=st.sampled_from([1, 1, 2, 0.5, 3]), front=st.booleans(),
          delay=st.sampled_from([0, 0, 0, 5_000]), same_id=st.booleans())
    def hold(self, group: str, klass: str, cost: float, front: bool, delay: int,
             same_id: bool) -> None:
        if not same_id or not self.ids:
            self.ids += 1
        hold_id = f"t{self.ids}"
        msg = Msg(group, klass, cost, front)
        due = self.now + delay if delay else 0
        got = self.store.hold(Q, hold_id, stored(group, klass, cost, front, hold_id), due,
                              self.now)
        assert got == self.model.hold(hold_id, msg, due, self.now)

    @rule(limit=st.integers(1, 5), capacity=st.sampled_from([None, None, 2, 4, 6]))
    def pick(self, limit: int, capacity: int | None) -> None:
        self.picks += 1
        picked = self.store.pick(Q, limit, capacity, self.now, PICK_LEASE,
                                 token=f"p{self.picks}.")
        before = dict(self.model.msgs)
        expected = self.model.pick(limit, capacity)
        assert [p.hold_id for p in picked] == expected
        for p in picked:
            msg = before[p.hold_id]
            self.model.records[p.dispatch_id] = Dispatch(
                msg.group, msg.klass, p.hold_id, msg, "picked", self.now + PICK_LEASE)

    def _some(self, data: Any, states: tuple[str, ...]) -> list[str]:
        dids = sorted(d for d, r in self.model.records.items() if r.state in states)
        return data.draw(st.lists(st.sampled_from(dids), unique=True)) if dids else []

    @rule(data=st.data())
    def confirm(self, data: Any) -> None:
        dids = self._some(data, ("picked", "superseded"))
        deadline = self.now + LEASE
        assert sorted(self.store.confirm(Q, dids, deadline)) == sorted(
            self.model.confirm(dids, deadline))
        for did in dids:  # whether a confirmed record keeps the message is the store's call
            rec = self.model.records[did]
            if rec.state == "queued":
                rec.has_bytes = bool(self.client.hexists(self.store.keys(Q).dispatch(did), "v"))

    @rule(data=st.data(), acks_late=st.booleans())
    def begin(self, data: Any, acks_late: bool) -> None:
        # a running dispatch begun again: its own run, or a copy the broker redelivered
        for did in self._some(data, ("queued", "lost", "superseded", "picked", "released",
                                     "running")):
            deadline, run = self.now + LEASE, data.draw(st.sampled_from(["r1", "r2"]))
            assert self.store.begin(Q, did, deadline, now_ms=self.now, run=run,
                                    acks_late=acks_late) == \
                self.model.begin(did, deadline, self.now, run, acks_late)

    @rule(data=st.data())
    def renew(self, data: Any) -> None:
        dids = self._some(data, ("queued", "lost", "superseded", "picked", "released",
                                 "running"))
        deadline = self.now + LEASE
        assert self.store.renew(Q, dids, deadline) == self.model.renew(dids, deadline)

    @rule(data=st.data())
    def release(self, data: Any) -> None:
        for did in self._some(data, ("queued", "running", "lost", "picked", "released")):
            done = data.draw(st.booleans())
            assert self.store.release(Q, did, 3600 if done else 0) == \
                self.model.release(did, done)

    @rule(ms=st.sampled_from([1_000, 6_000, 12_000, 40_000]))
    def advance_and_reclaim(self, ms: int) -> None:
        self.now += ms
        assert self.store.promote(Q, self.now, 1000)[0] == self.model.promote(self.now)
        assert self.store.reclaim(Q, self.now, 1000) == self.model.reclaim(self.now)

    @rule(cap=st.sampled_from([None, 1, 2, 4]), reserve=st.sampled_from([0, 1, 2]),
          caps=st.dictionaries(st.sampled_from(GROUPS), st.integers(0, 3), max_size=2),
          weights=st.dictionaries(st.sampled_from(GROUPS), st.sampled_from([0.5, 2.0, 3.0]),
                                  max_size=3))
    def configure(self, cap: int | None, reserve: int, caps: dict[str, int],
                  weights: dict[str, float]) -> None:
        self.configure_both(cap, reserve, caps, weights)

    @invariant()
    def same_state(self) -> None:
        k, m = self.store.keys(Q), self.model
        pipe = self.client.pipeline(transaction=False)
        for klass in CLASSES:
            pipe.zrange(k.ready(klass), 0, -1, withscores=True)
            pipe.hget(k.vt, klass)
        for g in GROUPS:
            pipe.hmget(k.group(g), "n", "d")
            for klass in CLASSES:
                pipe.lrange(k.held(klass, g), 0, -1)
        pipe.hget(k.stat, "inflight")
        replies = iter(pipe.execute())
        for klass in CLASSES:
            ready = {g.decode(): s for g, s in next(replies)}
            assert ready == m.ready[klass], klass
            assert float(next(replies) or 0) == m.vt.get(klass, 0.0), klass
        for g in GROUPS:
            n, d = next(replies)
            assert int(n or 0) == m.n.get(g, 0), g
            assert int(d or 0) == m.delayed_of(g), g
            for klass in CLASSES:
                held = [i.decode() for i in next(replies)]
                assert held == m.held(klass, g), (klass, g)
        assert int(next(replies) or 0) == m.inflight()


@pytest.mark.timeout(600)  # a failure's shrinking takes longer than a passing run
def test_store_matches_the_policy_model(redis_client: redis.Redis) -> None:
    examples = int(os.environ.get("FAIR_MODEL_EXAMPLES", "60"))
    run_state_machine_as_test(
        lambda: StoreMachine(redis_client),
        settings=settings(max_examples=examples, stateful_step_count=40, deadline=None,
                          suppress_health_check=list(HealthCheck), database=None))
