"""Direct tests of every Lua script through RedisStore, against the real redis-server.

Times are passed in explicitly (milliseconds), so every test is deterministic: nothing
here depends on the wall clock or on scheduling.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
import redis

import celery_fair.store
from celery_fair.config import SETTINGS
from celery_fair.envelope import BACKGROUND, INTERACTIVE, Envelope, placement_of
from celery_fair.store.base import BeginAnswer, BeginResult, Picked, Placement, Policy
from celery_fair.store.redis import PRUNE_GRACE_MS, QUARANTINE_MAX, RESET, RedisStore, now_ms
from celery_fair.store.scripts import OPERATIONS, source
from celery_fair.testing import RedisServer

Q = "fairq"
NOW = 1_700_000_000_000
LEASE = 10_000  # picked lease (ms)


# -- helpers -------------------------------------------------------------------------------

@pytest.fixture
def store(redis_client: redis.Redis, namespace: str) -> RedisStore:
    return RedisStore(redis_client, namespace)


def value(group: str, klass: str = BACKGROUND, cost: float = 1, front: bool = False,
          body: bytes = b"[[], {}, {}]", task_id: str = "t") -> bytes:
    envelope = Envelope(body=body, content_type="application/json", content_encoding="utf-8",
                        headers={"id": task_id, "task": "proj.work"}, exchange="",
                        routing_key=Q, queue=Q)
    return envelope.encode(group, klass, cost, front)


_counter = iter(range(10**9))


def hold(store: RedisStore, group: str, klass: str = BACKGROUND, cost: float = 1,
         front: bool = False, hold_id: str | None = None, due: int = 0, now: int = NOW,
         body: bytes | None = None) -> str:
    hid = hold_id or f"{group}-{next(_counter)}"
    data = value(group, klass, cost, front, body=body if body is not None else hid.encode())
    return store.hold(Q, hid, data, Placement(group, klass, cost, front), due, now)


def group_of(item: Picked) -> str:
    return Envelope.decode(item.value)[0]


def klass_of(item: Picked) -> str:
    return Envelope.decode(item.value)[1]


def pick(store: RedisStore, limit: int = 1, capacity: int | None = None, now: int = NOW,
         lease: int = LEASE) -> list[Picked]:
    return store.pick(Q, limit, capacity, now, lease)


def pick_groups(store: RedisStore, total: int, batch: int = 1, **kw) -> list[str]:
    order: list[str] = []
    while len(order) < total:
        got = pick(store, min(batch, total - len(order)), **kw)
        assert got, f"pick returned nothing after {len(order)} of {total}"
        order.extend(group_of(p) for p in got)
    return order


def assert_round_robin(order: Iterable[str], groups: Iterable[str]) -> None:
    """No group ever gets two ahead of another, at any point of the order."""
    counts = Counter({g: 0 for g in groups})
    for i, g in enumerate(order):
        counts[g] += 1
        spread = max(counts.values()) - min(counts.values())
        assert spread <= 1, f"after {i + 1} picks the counts are {dict(counts)}"


def snapshot_groups(store: RedisStore) -> dict[str, dict]:
    return {row["group"]: row for row in store.snapshot(Q)["groups"]}


def lease_of(store: RedisStore, dispatch_id: str) -> float | None:
    return store.client.zscore(store.keys(Q).leases, dispatch_id)


#: The production default of fair_interactive_reserve: tests configure what runs.
RESERVE = next(s.default for s in SETTINGS if s.name == "fair_interactive_reserve")


def configure(store: RedisStore, cap: int | None = None, reserve: int = RESERVE,
              weight: float = 1.0, caps: dict | None = None,
              weights: dict | None = None) -> None:
    store.configure(Q, Policy(cap, reserve, weight, caps or {}, weights or {}))


# -- hold ----------------------------------------------------------------------------------

def test_hold_immediate_is_pickable_verbatim(store: RedisStore, redis_client) -> None:
    data = value("acme", body=b"\x00binary\nbody\xff")
    assert store.hold(Q, "task-1", data, placement_of(data), 0, NOW) == "task-1"
    assert Q in store.queues()
    snap = snapshot_groups(store)
    assert snap["acme"]["held_background"] == 1 and snap["acme"]["delayed"] == 0
    # a newly ready group leaves exactly one wake marker
    assert redis_client.llen(store.keys(Q).wake) == 1
    hold(store, "acme")
    assert redis_client.llen(store.keys(Q).wake) == 1

    got = pick(store, 1)
    assert len(got) == 1
    assert got[0].hold_id == "task-1"
    assert got[0].value == data  # stored and returned byte for byte
    group, klass, envelope = Envelope.decode(got[0].value)
    assert (group, klass, envelope.body) == ("acme", BACKGROUND, b"\x00binary\nbody\xff")


def test_hold_delayed_waits_until_due(store: RedisStore, redis_client) -> None:
    wake = store.keys(Q).wake
    due = NOW + 5_000
    hold(store, "other", due=due + 4_000)
    redis_client.delete(wake)
    hid = hold(store, "acme", due=due)
    assert redis_client.llen(wake) == 1  # now the next one due: dispatchers re-plan
    redis_client.delete(wake)
    hold(store, "other", due=due + 1)
    assert redis_client.llen(wake) == 0  # not the next one due: nobody needs waking
    snap = snapshot_groups(store)
    assert snap["acme"]["delayed"] == 1 and snap["acme"]["held_background"] == 0
    assert snap["other"]["delayed"] == 2
    assert store.snapshot(Q)["delayed"] == 3
    assert pick(store, 10) == []
    assert store.client.zscore(store.keys(Q).delayed, hid) == due

    assert store.promote(Q, due - 1, 100) == (0, due)
    assert pick(store, 10, now=due - 1) == []
    assert store.promote(Q, due, 100) == (1, due + 1)
    got = pick(store, 10, now=due)
    assert [p.hold_id for p in got] == [hid]
    assert store.snapshot(Q)["delayed"] == 2


def test_hold_due_in_the_past_is_immediate(store: RedisStore) -> None:
    hid = hold(store, "acme", due=NOW - 1)
    assert [p.hold_id for p in pick(store, 10)] == [hid]
    hid = hold(store, "acme", due=NOW, now=NOW)
    assert [p.hold_id for p in pick(store, 10)] == [hid]


def test_duplicate_hold_id_gets_a_suffix_and_overwrites_nothing(store: RedisStore) -> None:
    first = value("acme", body=b"first")
    second = value("acme", body=b"second")
    third = value("other", body=b"third-delayed")
    fourth = value("other", body=b"fourth")
    assert store.hold(Q, "same", first, placement_of(first), 0, NOW) == "same"
    id2 = store.hold(Q, "same", second, placement_of(second), 0, NOW)
    assert id2 != "same" and id2.startswith("same")
    # delayed, same id again
    id3 = store.hold(Q, "same", third, placement_of(third), NOW + 100, NOW)
    assert id3 not in ("same", id2) and id3.startswith("same")
    id4 = store.hold(Q, "same", fourth, placement_of(fourth), 0, NOW)
    assert len({"same", id2, id3, id4}) == 4

    assert store.promote(Q, NOW + 100, 10) == (1, None)
    got = {p.hold_id: p.value for p in pick(store, 10, now=NOW + 100)}
    assert got == {"same": first, id2: second, id3: third, id4: fourth}


def test_the_same_hold_sent_twice_is_held_once(store: RedisStore) -> None:
    """redis-py resends a call whose reply a dropped connection lost: the very same value
    under the same id is one publication, not a second copy (which would run twice)."""
    once = value("acme", body=b"payload")
    assert store.hold(Q, "t1", once, placement_of(once), 0, NOW) == "t1"
    assert store.hold(Q, "t1", once, placement_of(once), 0, NOW) == "t1"
    assert store.snapshot(Q)["held_background"] == 1
    assert [p.hold_id for p in pick(store, 10)] == ["t1"]
    assert pick(store, 10) == []


# -- pick: fairness ------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 7, 300])
def test_pick_round_robin_three_equal_groups(store: RedisStore, batch: int) -> None:
    groups = ["gamma", "alpha", "beta"]
    for g in groups:  # all of one group, then the next: fairness is not arrival order
        for _ in range(100):
            hold(store, g)
    order = pick_groups(store, 300, batch=batch)
    assert Counter(order) == {g: 100 for g in groups}
    assert_round_robin(order, groups)
    assert pick(store, 10) == []


def test_pick_round_robin_across_releases(store: RedisStore) -> None:
    """Releasing as we go (a real dispatcher's pattern) keeps the interleaving."""
    groups = ["a", "b", "c"]
    for g in groups:
        for _ in range(60):
            hold(store, g)
    order: list[str] = []
    inflight: list[str] = []
    while len(order) < 180:
        got = pick(store, 5, capacity=4)
        assert got or inflight
        order.extend(group_of(p) for p in got)
        inflight.extend(p.dispatch_id for p in got)
        assert len(inflight) <= 4
        assert store.release(Q, inflight.pop(0))
    assert_round_robin(order, groups)


def test_pick_weights_three_to_one(store: RedisStore) -> None:
    configure(store, weights={"heavy": 3.0})
    for _ in range(400):
        hold(store, "heavy")
        hold(store, "light")
    order = pick_groups(store, 400, batch=16)
    counts = Counter(order)
    share = counts["heavy"] / 400
    assert 0.75 * 0.95 <= share <= 0.75 * 1.05, counts
    # and at every point, not only on average
    heavy = 0
    for i, g in enumerate(order, 1):
        heavy += g == "heavy"
        assert abs(heavy - 0.75 * i) <= 2, (i, heavy)


def test_pick_default_weight_applies_to_groups_without_override(store: RedisStore) -> None:
    configure(store, weight=2.0, weights={"slow": 1.0})
    for _ in range(300):
        hold(store, "normal")
        hold(store, "slow")
    counts = Counter(pick_groups(store, 300, batch=50))
    assert counts["normal"] == pytest.approx(200, abs=2), counts


def test_cost_affects_share(store: RedisStore) -> None:
    for _ in range(400):
        hold(store, "cheap", cost=1)
        hold(store, "pricey", cost=3)
    order = pick_groups(store, 400, batch=9)
    counts = Counter(order)
    assert counts["cheap"] / 400 == pytest.approx(0.75, rel=0.05), counts
    # equal work (cost) per group, at every point
    work = Counter()
    for g in order:
        work[g] += 3 if g == "pricey" else 1
        assert abs(work["cheap"] - work["pricey"]) <= 3, dict(work)


def test_fractional_cost(store: RedisStore) -> None:
    for _ in range(200):
        hold(store, "half", cost=0.5)
        hold(store, "whole", cost=1)
    counts = Counter(pick_groups(store, 150, batch=10))
    assert counts["half"] == pytest.approx(100, abs=2), counts


def test_new_group_starts_at_current_virtual_time(store: RedisStore) -> None:
    for _ in range(100):
        hold(store, "old")
    assert Counter(pick_groups(store, 40, batch=8)) == {"old": 40}
    # "new" was idle all along: it gets its share from now on, no catching up
    for _ in range(40):
        hold(store, "new")
    order = pick_groups(store, 40, batch=3)
    counts = Counter(order)
    assert 19 <= counts["new"] <= 21, counts
    assert "new" in order[:2]  # but it does not wait behind old's backlog either
    assert_round_robin(order[1:], ["old", "new"])


def test_returning_group_gets_no_credit_for_idle_time(store: RedisStore) -> None:
    for _ in range(200):
        hold(store, "busy")
    first = pick(store, 1)
    assert group_of(first[0]) == "busy"
    hold(store, "sometimes")
    took = pick(store, 2)
    assert [group_of(p) for p in took] == ["sometimes", "busy"]
    for p in first + took:
        store.release(Q, p.dispatch_id)
    assert "sometimes" not in snapshot_groups(store)  # idle: forgotten
    pick_groups(store, 100, batch=25)  # busy alone moves virtual time on
    for _ in range(30):
        hold(store, "sometimes")
    counts = Counter(pick_groups(store, 30, batch=5))
    assert 14 <= counts["sometimes"] <= 16, counts


def test_concurrent_picks_never_return_a_message_twice(store: RedisStore,
                                                       redis_client) -> None:
    held = {hold(store, g) for g in ("a", "b", "c", "d") for _ in range(100)}
    results: list[list[Picked]] = [[] for _ in range(4)]

    def run(i: int) -> None:
        mine = RedisStore(redis.Redis(connection_pool=redis_client.connection_pool),
                          store.namespace)
        while True:
            got = mine.pick(Q, 3, None, NOW, LEASE)
            if not got:
                return
            results[i].extend(got)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ids = [p.hold_id for r in results for p in r]
    dids = [p.dispatch_id for r in results for p in r]
    assert sorted(ids) == sorted(held)
    assert len(set(dids)) == len(dids)
    assert store.snapshot(Q)["inflight"] == 400


def test_a_pick_sent_twice_never_reuses_a_dispatch_id(store: RedisStore) -> None:
    """redis-py resends a call whose reply a dropped connection lost (its default retry),
    and a pipeline is resent after NOSCRIPT: the same pick, same id prefix, reaches Redis
    twice. The second must not overwrite the first's records (found by the chaos
    campaign: a running task's record overwritten by another group's dispatch, whose
    release then freed the wrong group's slot, and whose copy was skipped as finished)."""
    for g in ("a", "b", "c", "d"):
        hold(store, g)
    first = store.pick(Q, 2, None, NOW, LEASE, token="same.")
    assert store.begin(Q, first[0].dispatch_id, NOW + LEASE, now_ms=NOW) is BeginResult.RUN
    again = store.pick(Q, 2, None, NOW, LEASE, token="same.")
    assert len(first) == len(again) == 2
    dids = [p.dispatch_id for p in first + again]
    assert len(set(dids)) == 4
    assert {group_of(p) for p in first + again} == {"a", "b", "c", "d"}
    # every slot is released once, by its own dispatch, in its own group
    for p in first + again:
        assert store.release(Q, p.dispatch_id) is True
    assert store.snapshot(Q)["inflight"] == 0
    assert all(g["inflight"] == 0 for g in snapshot_groups(store).values())


# -- pick: capacity, caps, classes ---------------------------------------------------------

def test_pick_respects_capacity(store: RedisStore) -> None:
    for _ in range(10):
        hold(store, "a")
        hold(store, "b")
    got = pick(store, 100, capacity=3)
    assert len(got) == 3
    assert pick(store, 100, capacity=3) == []
    assert store.snapshot(Q)["inflight"] == 3
    assert store.release(Q, got[0].dispatch_id)
    assert len(pick(store, 100, capacity=3)) == 1
    assert pick(store, 100, capacity=3) == []
    # a lower capacity (fewer workers now) takes nothing until in-flight drops below it
    assert pick(store, 100, capacity=2) == []
    assert pick(store, 100, capacity=0) == []
    assert len(pick(store, 100, capacity=5)) == 2
    assert store.snapshot(Q)["inflight"] == 5


def test_pick_respects_group_caps(store: RedisStore) -> None:
    configure(store, cap=2, caps={"one": 1, "many": 5})
    for g in ("a", "b", "one", "many"):
        for _ in range(10):
            hold(store, g)
    got = pick(store, 100)
    counts = Counter(group_of(p) for p in got)
    assert counts == {"a": 2, "b": 2, "one": 1, "many": 5}
    assert pick(store, 100) == []
    snap = snapshot_groups(store)
    assert (snap["a"]["cap"], snap["one"]["cap"], snap["many"]["cap"]) == (2, 1, 5)
    assert snap["a"]["inflight"] == 2 and snap["a"]["held_background"] == 8

    # releasing a slot of "one" makes exactly one more of "one" pickable
    one = next(p for p in got if group_of(p) == "one")
    assert store.release(Q, one.dispatch_id)
    again = pick(store, 100)
    assert [group_of(p) for p in again] == ["one"]
    assert pick(store, 100) == []


def test_pick_reads_the_default_cap_once_per_call_not_per_message() -> None:
    """A group capped by the queue's default costs pick no more reads than a group with
    a cap of its own: the default is read once per call and passed down (``cap_of``).
    Counted with Redis ``commandstats`` on a server of its own (nothing else runs there)."""
    server = RedisServer()
    try:
        client = redis.Redis(port=server.port)
        store = RedisStore(client, "caps")
        reads = {}
        for name, caps in (("default", {}), ("own", {f"g{i}": 3 for i in range(5)})):
            client.flushall()
            configure(store, cap=3, caps=caps)
            for i in range(5):
                for _ in range(4):
                    hold(store, f"g{i}")
            client.config_resetstat()
            assert Counter(group_of(p) for p in pick(store, 100)) == \
                {f"g{i}": 3 for i in range(5)}
            reads[name] = client.info("commandstats")["cmdstat_hget"]["calls"]
        assert reads["default"] == reads["own"], reads
    finally:
        server.stop()


def test_configure_lowers_and_raises_caps_of_backlogged_groups(store: RedisStore) -> None:
    for _ in range(10):
        hold(store, "a")
    configure(store, cap=1)
    assert len(pick(store, 100)) == 1
    assert pick(store, 100) == []
    configure(store, cap=3)  # re-ranks: "a" is eligible again
    assert len(pick(store, 100)) == 2
    configure(store, cap=None)
    assert len(pick(store, 100)) == 7


def test_interactive_picked_before_background(store: RedisStore) -> None:
    for _ in range(5):
        hold(store, "bulk")
    bg = pick(store, 2)  # background groups have run and their tags moved on
    assert [klass_of(p) for p in bg] == [BACKGROUND] * 2
    hold(store, "web", klass=INTERACTIVE)
    hold(store, "bulk", klass=INTERACTIVE)
    hold(store, "web", klass=INTERACTIVE)
    got = pick(store, 10)
    assert [klass_of(p) for p in got] == [INTERACTIVE] * 3 + [BACKGROUND] * 3
    assert Counter(group_of(p) for p in got[:3]) == {"web": 2, "bulk": 1}


def test_interactive_first_under_capacity(store: RedisStore) -> None:
    for _ in range(5):
        hold(store, "bulk")
    hold(store, "web", klass=INTERACTIVE)
    got = pick(store, 10, capacity=1)
    assert [(group_of(p), klass_of(p)) for p in got] == [("web", INTERACTIVE)]


def test_interactive_reserve_above_cap(store: RedisStore) -> None:
    configure(store, cap=1, reserve=1)
    for _ in range(3):
        hold(store, "a")
    [bg] = pick(store, 10)
    assert klass_of(bg) == BACKGROUND
    assert pick(store, 10) == []  # "a" is at its cap
    for _ in range(3):
        hold(store, "a", klass=INTERACTIVE)
    [i1] = pick(store, 10)  # the reserve lets one interactive through...
    assert klass_of(i1) == INTERACTIVE
    assert pick(store, 10) == []  # ...and not more than cap + reserve
    assert snapshot_groups(store)["a"]["inflight"] == 2

    assert store.release(Q, i1.dispatch_id)
    [i2] = pick(store, 10)
    assert klass_of(i2) == INTERACTIVE
    assert pick(store, 10) == []
    # the background slot ends: interactive still comes first, within cap + reserve
    assert store.release(Q, bg.dispatch_id)
    [i3] = pick(store, 10)
    assert klass_of(i3) == INTERACTIVE
    assert pick(store, 10) == []
    assert store.release(Q, i2.dispatch_id)
    assert store.release(Q, i3.dispatch_id)
    # interactive all gone; a background task may take the one cap slot, not the reserve
    got = pick(store, 10)
    assert [klass_of(p) for p in got] == [BACKGROUND]


def test_no_reserve_means_interactive_waits_at_cap(store: RedisStore) -> None:
    configure(store, cap=1, reserve=0)
    hold(store, "a")
    assert len(pick(store, 10)) == 1
    hold(store, "a", klass=INTERACTIVE)
    assert pick(store, 10) == []
    hold(store, "b", klass=INTERACTIVE)  # other groups are not held up
    assert [group_of(p) for p in pick(store, 10)] == ["b"]


def test_a_paused_group_dispatches_nothing_in_any_class(store: RedisStore) -> None:
    configure(store, cap=2)  # the production reserve: interactive work may go above a cap
    hold(store, "a", klass=INTERACTIVE)
    hold(store, "a")
    hold(store, "b", klass=INTERACTIVE)
    store.limit(Q, "a", 0)
    # cap 0 pauses the group: not even the interactive reserve lets its tasks through
    assert [group_of(p) for p in pick(store, 10)] == ["b"]
    assert store.limit(Q, "a", RESET) == (2, 1.0)  # resumed
    assert sorted((group_of(p), klass_of(p)) for p in pick(store, 10)) == \
        [("a", BACKGROUND), ("a", INTERACTIVE)]


# -- release -------------------------------------------------------------------------------

def test_release_is_idempotent_and_frees_the_slot(store: RedisStore) -> None:
    configure(store, cap=1)
    for _ in range(3):
        hold(store, "a")
    [first] = pick(store, 10)
    assert pick(store, 10) == []
    assert store.release(Q, first.dispatch_id) is True
    assert store.release(Q, first.dispatch_id) is False
    assert store.release(Q, first.dispatch_id) is False
    assert store.release(Q, "never-dispatched") is False
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["inflight"] == 0
    [second] = pick(store, 10)  # capped group is pickable again: exactly one slot
    assert pick(store, 10) == []
    assert store.release(Q, second.dispatch_id) is True
    assert store.snapshot(Q)["inflight"] == 0


def test_release_of_a_finished_dispatch_keeps_a_tombstone_that_skips_redelivery(
        store: RedisStore, redis_client) -> None:
    configure(store, cap=1)
    hold(store, "a")
    hold(store, "a")
    [p] = pick(store, 10)
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.release(Q, p.dispatch_id, 7200) is True
    dk, done = store.keys(Q).dispatch(p.dispatch_id), store.keys(Q).done(p.dispatch_id)
    assert redis_client.exists(dk) == 0  # the record goes; the tombstone is its id alone,
    assert redis_client.hkeys(done) == [p.dispatch_id.encode()]  # in a small shared hash
    assert 7190 < redis_client.ttl(done) <= 7200
    assert store.dispatch_state(Q, p.dispatch_id) == "released"
    assert redis_client.zscore(store.keys(Q).leases, p.dispatch_id) is None
    [nxt] = pick(store, 10)  # the slot came back: the group's next task is dispatched
    # the broker redelivers the finished message (its ack died): skipped, takes no slot
    assert store.begin(Q, p.dispatch_id, NOW + 40_000) is BeginResult.SKIP
    assert store.renew(Q, [p.dispatch_id], NOW + 40_000) == 0
    assert redis_client.exists(dk) == 0
    assert redis_client.zscore(store.keys(Q).leases, p.dispatch_id) is None
    assert snapshot_groups(store)["a"]["inflight"] == 1
    assert int(redis_client.hget(store.keys(Q).stat, "skipped")) == 1
    # the skipped copy's own release (postrun IGNORED) and any later one change nothing
    assert store.release(Q, p.dispatch_id, 7200) is False
    assert store.release(Q, p.dispatch_id) is False
    assert redis_client.exists(dk) == 0 and redis_client.hexists(done, p.dispatch_id)
    assert snapshot_groups(store)["a"]["inflight"] == 1
    assert store.release(Q, nxt.dispatch_id, 7200) is True
    assert store.snapshot(Q)["inflight"] == 0
    assert store.check(Q, False, NOW + 50_000, 30_000) == []  # tombstones are valid


def test_a_shorter_done_ttl_never_cuts_other_tombstones_short(store: RedisStore,
                                                               redis_client) -> None:
    hold(store, "a")
    hold(store, "a")
    first, second = pick(store, 10)
    done = store.keys(Q).done(first.dispatch_id)
    assert done == store.keys(Q).done(second.dispatch_id)  # one pick call: one hash
    assert store.release(Q, first.dispatch_id, 7200)
    assert store.release(Q, second.dispatch_id, 60)  # a worker with a shorter setting
    assert 7190 < redis_client.ttl(done) <= 7200
    assert store.begin(Q, first.dispatch_id, NOW + 30_000) is BeginResult.SKIP


def test_a_released_record_of_an_older_version_still_skips_its_copy(
        store: RedisStore, redis_client) -> None:
    hold(store, "a")
    [p] = pick(store, 10)
    assert store.release(Q, p.dispatch_id)  # no tombstone
    redis_client.hset(store.keys(Q).dispatch(p.dispatch_id), "s", "released")
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.SKIP


def test_release_without_tombstone_lets_a_redelivered_copy_run(
        store: RedisStore, redis_client) -> None:
    # fair_done_ttl 0, or a release that must not block a redelivery (revoked, rejected,
    # a lost pool process with task_reject_on_worker_lost): the record goes
    hold(store, "a")
    [p] = pick(store, 1)
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.release(Q, p.dispatch_id, 0) is True
    assert redis_client.exists(store.keys(Q).dispatch(p.dispatch_id)) == 0
    assert store.begin(Q, p.dispatch_id, NOW + 40_000) is BeginResult.RUN_UNKNOWN


def test_release_of_a_lost_dispatch_that_finished_keeps_a_tombstone(
        store: RedisStore, redis_client) -> None:
    # the worker outlived its lease (slot reclaimed, record lost) and then finished
    hold(store, "a")
    [p] = pick(store, 1)
    store.begin(Q, p.dispatch_id, NOW + 30_000)
    assert store.reclaim(Q, NOW + 31_000, 10) == (0, 1)
    assert store.release(Q, p.dispatch_id, 60) is False  # no slot to free twice
    assert store.snapshot(Q)["inflight"] == 0
    assert store.begin(Q, p.dispatch_id, NOW + 40_000) is BeginResult.SKIP
    assert store.snapshot(Q)["inflight"] == 0


def test_release_wakes_dispatchers(store: RedisStore, redis_client) -> None:
    hold(store, "a")
    [p] = pick(store, 1)
    redis_client.delete(store.keys(Q).wake)
    store.release(Q, p.dispatch_id)
    assert redis_client.llen(store.keys(Q).wake) == 1
    assert store.wait([Q], 0.01) == {Q}
    assert store.wait([Q], 0.01) == set()


# -- confirm, begin, renew -----------------------------------------------------------------

def test_confirm_then_begin_runs(store: RedisStore) -> None:
    hold(store, "a")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    assert lease_of(store, p.dispatch_id) == NOW + 30_000  # the long lease replaced the short
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.RUN
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.RUN  # redelivery
    assert lease_of(store, p.dispatch_id) == NOW + 60_000
    assert store.release(Q, p.dispatch_id)
    assert store.client.zcard(store.keys(Q).leases) == 0


def test_confirm_returns_stale_ids_for_superseded_dispatches(store: RedisStore) -> None:
    for _ in range(3):
        hold(store, "a")
    picked = pick(store, 3, lease=1_000)
    # the dispatcher stalls past the picked lease; another dispatcher reclaims
    assert store.reclaim(Q, NOW + 1_001, 100) == (3, 0)
    stale = store.confirm(Q, [p.dispatch_id for p in picked], NOW + 30_000)
    assert sorted(stale) == sorted(p.dispatch_id for p in picked)
    for p in picked:
        assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.SKIP


def test_confirm_mixed_current_and_stale(store: RedisStore) -> None:
    hold(store, "a")
    [old] = pick(store, 1, lease=1_000)
    hold(store, "b")
    [cur] = pick(store, 1, now=NOW + 900, lease=1_000)
    assert store.reclaim(Q, NOW + 1_000, 100) == (1, 0)  # only old's lease ran out
    assert store.confirm(Q, [old.dispatch_id, cur.dispatch_id], NOW + 30_000) \
        == [old.dispatch_id]
    assert store.begin(Q, cur.dispatch_id, NOW + 30_000) is BeginResult.RUN


def test_confirm_after_worker_already_ran_the_dispatch_is_not_stale(
        store: RedisStore) -> None:
    """A fast worker may begin (and even finish) a task before the dispatcher confirms."""
    hold(store, "a")
    hold(store, "a")
    running, done = pick(store, 2)
    assert store.begin(Q, running.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.begin(Q, done.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.release(Q, done.dispatch_id)
    assert store.confirm(Q, [running.dispatch_id, done.dispatch_id], NOW + 50_000) == []
    assert store.snapshot(Q)["inflight"] == 1
    assert lease_of(store, done.dispatch_id) is None  # no lease resurrected for it
    assert lease_of(store, running.dispatch_id) == NOW + 30_000  # begin's lease stands
    # nor is a dispatch whose worker began it and then died (its slot was reclaimed)
    assert store.reclaim(Q, NOW + 30_000, 100) == (0, 1)
    assert store.confirm(Q, [running.dispatch_id], NOW + 70_000) == []
    assert lease_of(store, running.dispatch_id) is None
    assert store.snapshot(Q)["inflight"] == 0
    assert store.begin(Q, running.dispatch_id, NOW + 80_000) is BeginResult.RUN_REACQUIRED


def test_begin_unknown_dispatch(store: RedisStore, redis_client) -> None:
    assert store.begin(Q, "no-such-dispatch", NOW + 1_000) is BeginResult.RUN_UNKNOWN
    assert store.snapshot(Q)["inflight"] == 0
    assert store.client.zcard(store.keys(Q).leases) == 0
    assert not redis_client.exists(store.keys(Q).dispatch("no-such-dispatch"))


def test_begin_before_confirm(store: RedisStore) -> None:
    """The worker may see the message before the dispatcher confirms it."""
    hold(store, "a")
    [p] = pick(store, 1, lease=1_000)
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    # begin's long lease stands: the short picked lease no longer applies
    assert store.reclaim(Q, NOW + 1_001, 100) == (0, 0)


def test_renew_extends_leases(store: RedisStore) -> None:
    for _ in range(3):
        hold(store, "a")
    a, b, c = pick(store, 3)
    assert store.confirm(Q, [a.dispatch_id, b.dispatch_id, c.dispatch_id], NOW + 1_000) == []
    assert store.begin(Q, b.dispatch_id, NOW + 1_000) is BeginResult.RUN
    assert store.renew(Q, [a.dispatch_id, b.dispatch_id, "unknown"], NOW + 5_000) == 2
    assert store.renew(Q, [], NOW + 5_000) == 0
    # only c (not renewed) expires at the old deadline; no worker ever reported it, so
    # it is held again rather than left to the broker
    assert store.reclaim(Q, NOW + 2_000, 100) == (1, 0)
    assert store.reclaim(Q, NOW + 4_999, 100) == (0, 0)
    assert store.snapshot(Q)["inflight"] == 2
    # then the worker dies: a (received, never begun) is held again from its bytes; b
    # (begun, acks early: no bytes kept) is left to the broker
    assert store.reclaim(Q, NOW + 5_000, 100) == (1, 1)
    assert store.snapshot(Q)["inflight"] == 0


def test_renew_of_superseded_dispatch_does_not_count(store: RedisStore) -> None:
    hold(store, "a")
    [p] = pick(store, 1, lease=1_000)
    assert store.reclaim(Q, NOW + 1_000, 10) == (1, 0)
    assert store.renew(Q, [p.dispatch_id], NOW + 50_000) == 0
    assert store.begin(Q, p.dispatch_id, NOW + 50_000) is BeginResult.SKIP


# -- reclaim -------------------------------------------------------------------------------

def test_reclaim_picked_puts_message_back_at_front(store: RedisStore) -> None:
    ids = [hold(store, "a", hold_id=f"m{i}") for i in range(3)]
    [p] = pick(store, 1, lease=1_000)
    assert p.hold_id == "m0"
    assert store.reclaim(Q, NOW + 999, 100) == (0, 0)  # lease not yet run out
    assert store.reclaim(Q, NOW + 1_000, 100) == (1, 0)
    assert store.reclaim(Q, NOW + 1_000, 100) == (0, 0)  # done once
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["held_background"] == 3
    # the dispatcher that picked it died before publishing: a copy that did reach the
    # broker after all is skipped...
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.SKIP
    assert store.release(Q, p.dispatch_id) is False
    # ...and the message is dispatched again, first in its group, byte for byte
    again = pick(store, 10, now=NOW + 1_000)
    assert [x.hold_id for x in again] == ids
    assert again[0].value == p.value
    assert again[0].dispatch_id != p.dispatch_id
    assert store.begin(Q, again[0].dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert store.snapshot(Q)["inflight"] == 3


def test_reclaim_picked_reenters_ahead_of_other_groups_fairly(store: RedisStore) -> None:
    configure(store, cap=1)
    hold(store, "a", hold_id="a0")
    hold(store, "a", hold_id="a1")
    [p] = pick(store, 1, lease=1_000)
    assert p.hold_id == "a0"
    assert pick(store, 10) == []  # capped
    assert store.reclaim(Q, NOW + 5_000, 100) == (1, 0)
    [q] = pick(store, 10, now=NOW + 5_000)
    assert q.hold_id == "a0"


def test_reclaim_picked_when_hold_id_taken_meanwhile(store: RedisStore) -> None:
    hold(store, "a", hold_id="x", body=b"original")
    [p] = pick(store, 1, lease=1_000)
    hold(store, "a", hold_id="x", body=b"newer")  # same task id held again meanwhile
    assert store.reclaim(Q, NOW + 1_000, 100) == (1, 0)
    got = pick(store, 10, now=NOW + 1_000)
    bodies = [Envelope.decode(g.value)[2].body for g in got]
    assert bodies == [b"original", b"newer"]
    assert len({g.hold_id for g in got}) == 2


def test_reclaim_lost_frees_slot_and_begin_reacquires(store: RedisStore) -> None:
    configure(store, cap=1)
    for _ in range(3):
        hold(store, "a")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    # a worker started it (acks early: the record keeps no bytes)
    assert store.begin(Q, p.dispatch_id, NOW + 30_000) is BeginResult.RUN
    assert pick(store, 10) == []  # capped
    assert store.reclaim(Q, NOW + 29_999, 100) == (0, 0)
    # the worker died: the slot comes back, the message stays with the broker
    assert store.reclaim(Q, NOW + 30_000, 100) == (0, 1)
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["held_background"] == 2  # not held again
    [q] = pick(store, 10, now=NOW + 30_000)
    assert q.hold_id != p.hold_id
    assert store.snapshot(Q)["inflight"] == 1
    # the broker redelivers the lost message: it runs and takes a slot again
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.RUN_REACQUIRED
    assert store.snapshot(Q)["inflight"] == 2
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.RUN  # now current
    assert store.snapshot(Q)["inflight"] == 2
    assert store.release(Q, p.dispatch_id) is True
    assert store.release(Q, q.dispatch_id) is True
    assert store.release(Q, p.dispatch_id) is False
    assert store.snapshot(Q)["inflight"] == 0
    [r] = pick(store, 10, now=NOW + 60_000)
    assert store.release(Q, r.dispatch_id)
    assert snapshot_groups(store) == {}


def test_received_not_begun_is_held_again_when_its_worker_dies(store: RedisStore) -> None:
    """A worker received it (its lease keeper renewed it) and died before running it: the
    record still has the bytes, so it is held again; the broker's copy is skipped."""
    hold(store, "a", hold_id="x", body=b"payload")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 1_000) == []
    assert store.renew(Q, [p.dispatch_id], NOW + 30_000) == 1
    assert store.reclaim(Q, NOW + 29_999, 100) == (0, 0)
    assert store.reclaim(Q, NOW + 30_000, 100) == (1, 0)
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.SKIP
    [again] = pick(store, 10, now=NOW + 30_000)
    assert (again.hold_id, again.value) == ("x", p.value)


def _running(store: RedisStore, acks_late: bool, run: str = "first") -> Picked:
    hold(store, "a", hold_id="x", body=b"payload")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 1_000) == []
    assert store.begin(Q, p.dispatch_id, NOW + 30_000, now_ms=NOW, run=run,
                       acks_late=acks_late) is BeginResult.RUN
    return p


def test_copy_of_a_live_acks_late_run_is_skipped(store: RedisStore) -> None:
    """The broker redelivered a message whose run goes on (its ack died with a
    connection): the copy is skipped, takes no slot, changes nothing."""
    p = _running(store, acks_late=True)
    assert store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000, run="copy",
                       acks_late=True) is BeginResult.SKIP
    assert store.snapshot(Q)["inflight"] == 1
    assert store.queue_figures(Q).skipped == 1
    # the first run goes on and ends; a later copy finds the tombstone
    assert store.renew(Q, [p.dispatch_id], NOW + 40_000) == 1
    assert store.release(Q, p.dispatch_id, 3600) is True
    assert store.begin(Q, p.dispatch_id, NOW + 50_000, now_ms=NOW + 20_000, run="copy",
                       acks_late=True) is BeginResult.SKIP
    assert store.snapshot(Q)["inflight"] == 0


def test_acks_late_run_whose_worker_died_is_held_again(store: RedisStore) -> None:
    p = _running(store, acks_late=True)
    # a copy the broker redelivered while the lease still runs is skipped...
    assert store.begin(Q, p.dispatch_id, NOW + 36_000, now_ms=NOW + 6_000, run="copy",
                       acks_late=True) is BeginResult.SKIP
    # ...and when the lease runs out unrenewed, the kept bytes are held again
    assert store.reclaim(Q, NOW + 30_000, 100) == (1, 0)
    assert store.snapshot(Q)["inflight"] == 0
    [again] = pick(store, 10, now=NOW + 30_000)
    assert (again.hold_id, again.value) == ("x", p.value)
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, run="late") is BeginResult.SKIP
    assert store.begin(Q, again.dispatch_id, NOW + 60_000, acks_late=True) is BeginResult.RUN


def test_copy_after_the_lease_ran_out_takes_the_run_over(store: RedisStore) -> None:
    """The first run's worker died and its lease ran out, but no dispatcher has reclaimed
    it yet: the copy runs in its place, in the slot it still holds."""
    p = _running(store, acks_late=True)
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, now_ms=NOW + 30_000, run="copy",
                       acks_late=True) is BeginResult.RUN
    assert store.snapshot(Q)["inflight"] == 1
    assert store.reclaim(Q, NOW + 30_000, 100) == (0, 0)  # its lease is the copy's now


def test_copy_of_an_acks_early_run_still_runs(store: RedisStore) -> None:
    """Without the bytes (acks early) a dead run could not be held again, so a copy is
    not skipped on the strength of the lease: it runs, as in Celery."""
    p = _running(store, acks_late=False)
    assert store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000, run="copy",
                       acks_late=False) is BeginResult.RUN
    assert store.snapshot(Q)["inflight"] == 1


def test_the_same_run_beginning_again_runs(store: RedisStore) -> None:
    p = _running(store, acks_late=True, run="mine")
    assert store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000, run="mine",
                       acks_late=True) is BeginResult.RUN


@pytest.mark.parametrize("runner_gone", [True, False])
def test_copy_asks_whether_a_run_of_its_own_host_is_gone(store: RedisStore,
                                                        runner_gone: bool) -> None:
    """A pool process killed mid-task (its message requeued by Celery): the copy, on the
    same host, sees that run's process is gone and takes over at once; while it lives,
    the copy is skipped."""
    p = _running(store, acks_late=True, run="h1:123:7:first")
    asked: list[str] = []

    def gone(run: str) -> bool:
        asked.append(run)
        return runner_gone

    got = store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000,
                      run="h1:456:7:copy", acks_late=True, host="h1:", gone=gone)
    assert asked == ["h1:123:7:first"]
    assert got is (BeginResult.RUN if runner_gone else BeginResult.SKIP)
    assert store.queue_figures(Q).skipped == (0 if runner_gone else 1)
    assert store.snapshot(Q)["inflight"] == 1


def test_begin_run_answers_the_holding_run_of_its_host_and_take_over_takes_it(
        store: RedisStore) -> None:
    """The two atomic calls ``begin`` is made of (a transactional backend runs each in a
    transaction; whether the holding run is gone is judged between them)."""
    p = _running(store, acks_late=True, run="h1:123:7:first")
    ask = dict(now_ms=NOW + 1_000, run="h1:456:7:copy", acks_late=True)
    answer = store.begin_run(Q, p.dispatch_id, NOW + 31_000, host="h1:", **ask)
    assert answer == BeginAnswer(None, "h1:123:7:first")
    assert store.dispatch_state(Q, p.dispatch_id) == "running"  # nothing changed
    assert store.queue_figures(Q).skipped == 0
    taken = store.take_over(Q, p.dispatch_id, NOW + 31_000, host="h1:",
                            token=answer.held_by, **ask)
    assert taken == BeginAnswer(BeginResult.RUN)
    # the first run's own copy now finds the new run holding it
    again = store.begin_run(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 2_000,
                            run="h1:123:7:late", acks_late=True, host="h1:")
    assert again == BeginAnswer(None, "h1:456:7:copy")


def test_copy_does_not_ask_about_another_hosts_run(store: RedisStore) -> None:
    p = _running(store, acks_late=True, run="h2:123:7:first")
    got = store.begin(Q, p.dispatch_id, NOW + 31_000, now_ms=NOW + 1_000,
                      run="h1:456:7:copy", acks_late=True, host="h1:",
                      gone=lambda run: pytest.fail(f"asked about {run}"))
    assert got is BeginResult.SKIP


def test_run_gone_knows_dead_processes_and_its_own_thread() -> None:
    import os
    import subprocess
    import sys
    import threading

    from celery_fair.lifecycle import _HOST as h
    from celery_fair.lifecycle import run_gone

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    me, thread = os.getpid(), threading.get_ident()
    assert run_gone(f"{h}{child.pid}:1:x")  # exited and reaped
    assert not run_gone(f"{h}{os.getppid()}:1:x")  # alive
    assert run_gone(f"{h}{me}:{thread}:x")  # this thread runs one task at a time
    assert not run_gone(f"{h}{me}:{thread + 1}:x")  # another thread of this process
    assert not run_gone(f"other{h}{child.pid}:1:x")  # not of this PID namespace and boot
    assert not run_gone("not a run token")


def test_release_by_a_run_that_was_taken_over_does_nothing(store: RedisStore) -> None:
    p = _running(store, acks_late=True, run="h1:1:1:first")
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, now_ms=NOW + 30_000, run="h1:2:1:copy",
                       acks_late=True) is BeginResult.RUN  # the first one's lease ran out
    assert store.release(Q, p.dispatch_id, 3600, run="h1:1:1:first") is False
    assert store.snapshot(Q)["inflight"] == 1
    assert store.release(Q, p.dispatch_id, 3600, run="h1:2:1:copy") is True
    assert store.snapshot(Q)["inflight"] == 0


def test_reclaim_queued_no_worker_reported_holds_again(store: RedisStore) -> None:
    """The broker accepted it but no worker ever reported it (a Redis broker restarting
    while a worker popped it loses it): held again, and a copy that does turn up is
    skipped."""
    configure(store, cap=1)
    hold(store, "a", hold_id="x", body=b"payload")
    hold(store, "a", hold_id="y")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 30_000) == []
    assert store.reclaim(Q, NOW + 29_999, 100) == (0, 0)
    assert store.reclaim(Q, NOW + 30_000, 100) == (1, 0)
    assert store.snapshot(Q)["inflight"] == 0
    assert store.begin(Q, p.dispatch_id, NOW + 60_000) is BeginResult.SKIP
    [again] = pick(store, 10, now=NOW + 30_000)
    assert (again.hold_id, again.value) == ("x", p.value)  # first in its group, verbatim
    assert Envelope.decode(again.value)[2].body == b"payload"
    assert store.begin(Q, again.dispatch_id, NOW + 60_000) is BeginResult.RUN
    assert store.release(Q, again.dispatch_id) is True


def test_reclaim_queued_without_bytes_is_lost(store: RedisStore, redis_client) -> None:
    """A queued record without the message (confirmed by an older version) cannot be
    held again: its slot comes back and the broker is left to redeliver it."""
    hold(store, "a")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 1_000) == []
    redis_client.hdel(store.keys(Q).dispatch(p.dispatch_id), "v")
    assert store.reclaim(Q, NOW + 1_000, 100) == (0, 1)
    assert store.snapshot(Q)["inflight"] == 0
    assert store.begin(Q, p.dispatch_id, NOW + 2_000) is BeginResult.RUN_REACQUIRED


def test_release_of_lost_dispatch_frees_nothing_twice(store: RedisStore) -> None:
    hold(store, "a")
    hold(store, "a")
    [p] = pick(store, 1)
    store.confirm(Q, [p.dispatch_id], NOW + 1_000)
    assert store.begin(Q, p.dispatch_id, NOW + 1_000) is BeginResult.RUN  # acks early
    assert store.reclaim(Q, NOW + 1_000, 100) == (0, 1)
    assert store.snapshot(Q)["inflight"] == 0
    # the task ends after its slot was reclaimed: nothing to free, no negative count
    assert store.release(Q, p.dispatch_id) is False
    assert store.snapshot(Q)["inflight"] == 0
    assert snapshot_groups(store)["a"]["inflight"] == 0
    assert store.begin(Q, p.dispatch_id, NOW + 2_000) is BeginResult.RUN_UNKNOWN


def test_reclaim_of_a_picked_record_without_its_message_frees_the_slot(
        store: RedisStore) -> None:
    """A picked record that lost its bytes (damage, or an older version's repair) cannot
    be held again: its slot comes back and the record is 'lost' (a copy the dispatcher did
    publish runs and takes a slot again), instead of a script error after the lease was
    removed, which leaked the slot for good."""
    hold(store, "a", hold_id="t1")
    hold(store, "a", hold_id="t2")
    configure(store, cap=1)
    (p,) = pick(store, 1, lease=1_000)
    dk = store.keys(Q).dispatch(p.dispatch_id)
    store.client.hdel(dk, "v")
    assert store.reclaim(Q, NOW + 2_000, 100) == (0, 1)
    assert store.client.hget(dk, "s") == b"lost"
    assert store.snapshot(Q)["inflight"] == 0
    assert [q.hold_id for q in pick(store, 10, now=NOW + 2_000)] == ["t2"]  # slot free
    assert store.begin(Q, p.dispatch_id, NOW + 60_000, now_ms=NOW + 2_000) == \
        BeginResult.RUN_REACQUIRED


def test_reclaim_respects_limit(store: RedisStore) -> None:
    for _ in range(5):
        hold(store, "a")
    pick(store, 5, lease=1_000)
    assert store.reclaim(Q, NOW + 1_000, 2) == (2, 0)
    assert store.reclaim(Q, NOW + 1_000, 100) == (3, 0)


# -- promote -------------------------------------------------------------------------------

def test_promote_retries_to_head_others_to_tail(store: RedisStore) -> None:
    hold(store, "a", hold_id="a1")
    hold(store, "a", hold_id="a2")
    hold(store, "a", hold_id="eta", due=NOW + 100)
    hold(store, "a", hold_id="retry", front=True, due=NOW + 100)
    hold(store, "a", hold_id="later", due=NOW + 500)
    hold(store, "b", hold_id="b-retry", front=True, due=NOW + 700)
    assert store.promote(Q, NOW + 99, 100) == (0, NOW + 100)
    assert store.promote(Q, NOW + 100, 100) == (2, NOW + 500)
    assert snapshot_groups(store)["a"]["delayed"] == 1
    got = pick(store, 10, now=NOW + 100)
    assert [p.hold_id for p in got] == ["retry", "a1", "a2", "eta"]
    assert store.promote(Q, NOW + 10_000, 1) == (1, NOW + 700)  # limit respected
    assert store.promote(Q, NOW + 10_000, 100) == (1, None)
    assert store.promote(Q, NOW + 10_000, 100) == (0, None)
    assert [p.hold_id for p in pick(store, 10, now=NOW + 10_000)] in (
        ["later", "b-retry"], ["b-retry", "later"])


def test_promote_makes_a_group_ready_and_a_retry_skips_its_backlog(store: RedisStore) -> None:
    configure(store, cap=1)
    for i in range(3):
        hold(store, "a", hold_id=f"a{i}")
    [p] = pick(store, 1)
    # the running task retries: its new message is delayed, then re-enters at the head
    hold(store, "a", hold_id="a0-retry", front=True, due=NOW + 50)
    assert store.release(Q, p.dispatch_id)
    assert store.promote(Q, NOW + 50, 100) == (1, None)
    assert [x.hold_id for x in pick(store, 10, now=NOW + 50)] == ["a0-retry"]


# -- bookkeeping ---------------------------------------------------------------------------

def test_worker_capacity_only_reads_and_registering_prunes_the_long_dead(
        store: RedisStore, redis_client) -> None:
    key = store.keys(Q).workers
    now = now_ms()
    store.register_worker(Q, "live", 4, now + 30_000, now)
    store.register_worker(Q, "just-expired", 2, now - 1, now)
    store.register_worker(Q, "long-dead", 8, now - PRUNE_GRACE_MS - 1_000, now)
    # an entry written by a registration of its own is pruned by the next one
    assert redis_client.hexists(key, "long-dead") is False
    redis_client.hset(key, "long-dead", f"{now - PRUNE_GRACE_MS - 1_000}:8")
    assert store.worker_capacity(Q, now) == 4  # expired workers never count
    assert store.worker_capacity(Q, now + 30_001) == 0
    # ... and reading wrote nothing
    assert set(redis_client.hkeys(key)) == {b"live", b"just-expired", b"long-dead"}
    store.register_worker(Q, "live", 4, now + 30_000, now)
    assert set(redis_client.hkeys(key)) == {b"live", b"just-expired"}  # within the grace
    assert store.prune_workers(Q, now) == 1
    assert set(redis_client.hkeys(key)) == {b"live"}
    assert store.worker_capacity(Q, now) == 4


def test_idle_groups_are_forgotten(store: RedisStore, redis_client) -> None:
    k = store.keys(Q)
    hold(store, "a")
    hold(store, "b", klass=INTERACTIVE)
    hold(store, "c", due=NOW + 100)
    assert set(snapshot_groups(store)) == {"a", "b", "c"}
    got = pick(store, 10)
    assert set(snapshot_groups(store)) == {"a", "b", "c"}  # in flight / delayed
    assert snapshot_groups(store)["a"]["inflight"] == 1
    for p in got:
        store.release(Q, p.dispatch_id)
    assert set(snapshot_groups(store)) == {"c"}  # still has a delayed message
    assert not redis_client.exists(k.group("a"), k.group("b"))
    store.promote(Q, NOW + 100, 10)
    [p] = pick(store, 10, now=NOW + 100)
    assert store.confirm(Q, [p.dispatch_id], NOW + 1_000) == []
    assert store.begin(Q, p.dispatch_id, NOW + 1_000) is BeginResult.RUN
    assert store.reclaim(Q, NOW + 1_000, 10) == (0, 1)  # lost with its worker
    assert snapshot_groups(store) == {}
    for cls in ("i", "b"):
        assert redis_client.zcard(k.ready(cls)) == 0
    assert list(redis_client.scan_iter(match=f"{k.prefix}:g:*")) == []
    assert list(redis_client.scan_iter(match=f"{k.prefix}:q:*")) == []
    assert store.snapshot(Q)["inflight"] == 0
    # a forgotten group comes back like a new one
    hold(store, "a")
    assert [group_of(x) for x in pick(store, 10)] == ["a"]


@pytest.mark.parametrize("names", [
    ["emoji 😀🎉", "租户 七", "ünïcödé", "with space", " lead"],
    ["a:b", "a", "b:a", "q:b:x", "x:", ":"],
    ["{brace}", "}{", "{", "}", "{a}:{b}", "ns:{fairq}:g"],
])
def test_group_names_used_verbatim_as_keys(store: RedisStore, names: list[str]) -> None:
    configure(store, cap=2, caps={names[0]: 1}, weights={names[1]: 2.0})
    for g in names:
        for _ in range(4):
            hold(store, g)
        hold(store, g, klass=INTERACTIVE)
    snap = snapshot_groups(store)
    assert set(snap) == set(names)
    assert snap[names[0]]["cap"] == 1 and snap[names[1]]["weight"] == 2.0
    assert all(row["held_background"] == 4 and row["held_interactive"] == 1
               for row in snap.values())
    got = pick(store, 1000)
    counts = Counter(group_of(p) for p in got)
    # cap 1 (override, read back from JSON by the script) or the default cap 2
    assert counts == {g: 1 if g == names[0] else 2 for g in names}
    assert all(Counter(klass_of(p) for p in got if group_of(p) == g)[INTERACTIVE] == 1
               for g in names)
    for p in got:
        assert store.release(Q, p.dispatch_id)
    got = pick(store, 1000)
    assert Counter(group_of(p) for p in got) == {g: 1 if g == names[0] else 2 for g in names}
    for p in got:
        store.release(Q, p.dispatch_id)
    while more := pick(store, 1000):
        for p in more:
            store.release(Q, p.dispatch_id)
    assert snapshot_groups(store) == {}  # every name's keys were found again to forget it

    # weight overrides reach the script under the same name
    configure(store, weights={names[1]: 2.0})
    for _ in range(60):
        hold(store, names[1])
        hold(store, names[2])
    assert store.client.llen(store.keys(Q).held(BACKGROUND, names[1])) == 60
    counts = Counter(pick_groups(store, 60, batch=7))
    assert counts == {names[1]: 40, names[2]: 20}


def test_group_name_containing_another_groups_key_does_not_collide(
        store: RedisStore) -> None:
    # "x" background list is <prefix>:q:b:x; a group named "b:x" has <prefix>:q:b:b:x
    hold(store, "x", hold_id="plain")
    hold(store, "b:x", hold_id="tricky")
    hold(store, "i:x", hold_id="tricky-i")
    got = pick(store, 10)
    assert {(p.hold_id, group_of(p)) for p in got} == {
        ("plain", "x"), ("tricky", "b:x"), ("tricky-i", "i:x")}


# -- the scripts themselves ----------------------------------------------------------------

_KEYSPACE = re.compile(r"""redis\s*\.\s*p?call\s*\(\s*['"](keys|scan)['"]""", re.IGNORECASE)
_LUA_DIR = Path(celery_fair.store.__file__).parent / "lua"


def test_no_script_scans_the_keyspace() -> None:
    files = {str(p.relative_to(_LUA_DIR)): p.read_text(encoding="utf-8")
             for p in sorted(_LUA_DIR.rglob("*.lua"))}
    assert "include/common.lua" in files
    assert {f"{name}.lua" for name in OPERATIONS} <= set(files)
    for name in OPERATIONS:
        files[f"{name} (assembled)"] = source(name)
    for name, text in files.items():
        assert not _KEYSPACE.search(text), f"{name} scans the keyspace"
        # nor hides the command name in a variable
        for line in text.splitlines():
            if re.search(r"redis\s*\.\s*p?call\s*\(\s*[^'\"\s]", line):
                pytest.fail(f"{name}: redis.call with a computed command name: {line}")
    # the check itself works
    assert _KEYSPACE.search("redis.call('KEYS', '*')")
    assert _KEYSPACE.search('redis.pcall( "scan", 0)')


def test_every_script_is_assembled_and_loaded(store: RedisStore, redis_client) -> None:
    for name in OPERATIONS:
        text = source(name)
        assert not re.search(r"^-- @include \w+$", text, re.MULTILINE), name
        assert (_LUA_DIR / f"{name}.lua").exists()
    store.hold(Q, "x", value("g"), Placement("g", "b", 1, False), 0, NOW)
    [p] = store.pick(Q, 1, None, NOW, LEASE)
    store.confirm(Q, [p.dispatch_id], NOW + 1)
    store.renew(Q, [p.dispatch_id], NOW + 2)
    store.begin(Q, p.dispatch_id, NOW + 3)
    store.reclaim(Q, NOW, 10)
    store.promote(Q, NOW, 10)
    store.release(Q, p.dispatch_id)
    configure(store)
    store.limit(Q, "g", 2)
    store.cancel(Q, ["not-held"])
    store.summarize(Q, ["g"])
    store.check(Q, False, NOW, LEASE)
    store.forget_queue(Q)
    store.wait([Q], 0)
    assert [n for n, s in store._scripts.items() if not redis_client.script_exists(s.sha)[0]] == []


# -- runtime limits (limit.lua) and the held counters ---------------------------------------

def test_limit_overrides_settings_at_once_and_survives_configure(store: RedisStore) -> None:
    configure(store, cap=1)
    for _ in range(4):
        hold(store, "a")
    assert len(pick(store, 4)) == 1                      # the setting's cap
    assert store.limit(Q, "a", 3) == (3, 1.0)
    assert len(pick(store, 4)) == 2                      # re-ranked at once: 3 in flight
    configure(store, cap=1)                              # a dispatcher (re)starts
    row = snapshot_groups(store)["a"]
    assert (row["cap"], row["limited"]) == (3, ["cap"])
    assert store.limit(Q, "a", RESET) == (1, 1.0)       # back to the setting
    assert snapshot_groups(store)["a"]["limited"] == []


def test_limit_reset_restores_the_groups_own_setting(store: RedisStore) -> None:
    configure(store, cap=1, caps={"a": 2}, weights={"a": 4})
    assert store.limit(Q, "a", 5, 0.5) == (5, 0.5)
    configure(store, cap=1, caps={"a": 2}, weights={"a": 4})  # a dispatcher restarts
    assert store.limit(Q, "a") == (5, 0.5)
    assert store.limit(Q, "a", RESET, RESET) == (2, 4.0)
    assert store.limit(Q, "b", 3) == (3, 1.0)
    assert store.limit(Q, "b", RESET) == (1, 1.0)             # the queue default


def test_limit_zero_pauses_a_group_and_minus_one_lifts_the_cap(store: RedisStore) -> None:
    configure(store, cap=1)
    hold(store, "a")
    hold(store, "a")
    hold(store, "b")
    store.limit(Q, "a", 0)
    assert [group_of(p) for p in pick(store, 5)] == ["b"]
    assert store.limit(Q, "a", -1) == (None, 1.0)
    assert [group_of(p) for p in pick(store, 5)] == ["a", "a"]


def test_limit_weight_is_used_by_pick(store: RedisStore) -> None:
    configure(store, weights={"a": 1})
    for _ in range(8):
        hold(store, "a")
        hold(store, "b")
    assert store.limit(Q, "a", weight=3) == (None, 3.0)
    assert Counter(pick_groups(store, 8)) == {"a": 6, "b": 2}


def test_the_quarantine_keeps_the_newest_entries_and_logs_each_one_dropped(
        store: RedisStore, redis_client, caplog) -> None:
    k = store.keys(Q)
    for i in range(QUARANTINE_MAX + 3):  # values celery_fair did not write
        redis_client.hset(k.msg, f"junk-{i}", b"garbage")
        redis_client.rpush(k.held("b", "evil"), f"junk-{i}")
    redis_client.zadd(k.ready("b"), {"evil": 0})
    redis_client.sadd(k.groups, "evil")
    hold(store, "acme", hold_id="fine")
    caplog.set_level(logging.ERROR)
    assert [p.hold_id for p in pick(store, 10)] == ["fine"]  # the rest was quarantined
    assert redis_client.hlen(k.quarantine) == QUARANTINE_MAX
    assert redis_client.hlen(k.quarantine_why) == QUARANTINE_MAX
    assert redis_client.llen(k.quarantine_order) == QUARANTINE_MAX
    kept = {key.decode() for key in redis_client.hkeys(k.quarantine)}
    assert kept == {f"junk-{i}" for i in range(3, QUARANTINE_MAX + 3)}  # the newest
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 3
    assert all(f"junk-{i} dropped" in line for i, line in enumerate(dropped))


def _held_truth(store: RedisStore) -> tuple[dict[str, int], int, int]:
    k = store.keys(Q)
    per_group, by_class = {}, {"i": 0, "b": 0}
    for g in store.client.smembers(k.groups):
        g = g.decode()
        lens = {c: store.client.llen(k.held(c, g)) for c in "ib"}
        by_class = {c: by_class[c] + lens[c] for c in "ib"}
        if sum(lens.values()):
            per_group[g] = sum(lens.values())
    return per_group, by_class["i"], by_class["b"]


def _assert_counters_exact(store: RedisStore) -> None:
    per_group, held_i, held_b = _held_truth(store)
    figures = store.queue_figures(Q)
    assert (figures.held_interactive, figures.held_background) == (held_i, held_b)
    assert dict(store.top_groups(Q, 1000)) == per_group


def test_held_counters_follow_every_script(store: RedisStore) -> None:
    configure(store, cap=2)
    for g in ("a", "a", "a", "b"):
        hold(store, g)
    hold(store, "c", INTERACTIVE)
    hold(store, "b", due=NOW + 100)
    _assert_counters_exact(store)
    assert store.top_groups(Q, 1) == [("a", 3)]
    store.promote(Q, NOW + 100, 10)                       # delayed -> held
    _assert_counters_exact(store)
    picked = pick(store, 3)
    _assert_counters_exact(store)
    store.reclaim(Q, NOW + LEASE + 1, 10)                 # picked -> held again
    _assert_counters_exact(store)
    held_id = hold(store, "d")
    store.cancel(Q, [held_id])
    _assert_counters_exact(store)
    assert store.queue_figures(Q).released == 0
    again = pick(store, 2)
    store.confirm(Q, [p.dispatch_id for p in again], NOW + LEASE * 10)
    store.release(Q, again[0].dispatch_id)
    store.release(Q, again[0].dispatch_id)                # idempotent: counted once
    assert store.queue_figures(Q).released == 1
    assert picked  # (the first pick's dispatches were reclaimed above)


def test_configure_rebuilds_the_held_counters(store: RedisStore) -> None:
    for g in ("a", "a", "b"):
        hold(store, g)
    store.client.delete(store.keys(Q).stat, store.keys(Q).backlog)  # e.g. an older version
    configure(store)
    _assert_counters_exact(store)
    assert store.top_groups(Q, 5) == [("a", 2), ("b", 1)]
