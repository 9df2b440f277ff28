"""Redis-only behaviour of the Redis store, against the real redis-server: the wake list,
the scripts themselves (assembly, NOSCRIPT, no keyspace scans), the tombstones' TTLs,
the key layout and what the tests can only see in the keys. The contract every backend
keeps is tests/test_store_contract_*.py's.

Times are passed in explicitly (milliseconds), so every test is deterministic: nothing
here depends on the wall clock or on scheduling.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import pytest
import redis

import celery_fair.store
from celery_fair.envelope import BACKGROUND, INTERACTIVE, Envelope, placement_of
from celery_fair.store.base import BeginResult, Placement
from celery_fair.store.bulk import Hold
from celery_fair.store.lane import Lane
from celery_fair.store.redis import PRUNE_GRACE_MS, QUARANTINE_MAX, RedisStore, now_ms
from celery_fair.store.scripts import OPERATIONS, source
from celery_fair.testing import RedisServer

from .store_helpers import (
    LEASE,
    NOW,
    Q,
    _assert_counters_exact,
    configure,
    group_of,
    hold,
    pick,
    snapshot_groups,
    value,
)


@pytest.fixture
def store(redis_client: redis.Redis, namespace: str) -> RedisStore:
    return RedisStore(redis_client, namespace)


def lease_of(store: RedisStore, dispatch_id: str) -> float | None:
    return store.client.zscore(store.keys(Q).leases, dispatch_id)



_KEYSPACE = re.compile(r"""redis\s*\.\s*p?call\s*\(\s*['"](keys|scan)['"]""", re.IGNORECASE)
_LUA_DIR = Path(celery_fair.store.__file__).parent / "lua"


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


def test_a_hold_sends_on_the_connection_it_took_first_and_keeps_it(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # the connection taken first (to tell "not sent" from a reply lost) is the one the
    # round trip goes on, and the lane (lane.py) keeps it for the next: no checkout from
    # the pool per hold, nor a second connection
    data = value("acme")
    store.hold(Q, "warm-1", data, placement_of(data), 0, NOW)  # the scripts loaded (a
    store.hold_many(Q, [Hold("warm-2", data, placement_of(data))], NOW)  # NOSCRIPT first)
    lane = store._lane
    assert lane is not None
    [kept] = lane._idle
    pool = store.client.connection_pool
    monkeypatch.setattr(pool, "get_connection", lambda *a, **k: pytest.fail("checked out"))
    sent_on = []
    send = lane.send
    monkeypatch.setattr(lane, "send", lambda commands, connection=None: (
        sent_on.append(connection), send(commands, connection))[1])
    store.hold(Q, "task-1", data, placement_of(data), 0, NOW)
    store.hold_many(Q, [Hold("task-2", data, placement_of(data))], NOW)
    assert sent_on == [kept, kept] and lane._idle == [kept]
    monkeypatch.undo()
    assert [m.hold_id for m in store.held_messages(Q, "acme", 10)][2:] == ["task-1",
                                                                           "task-2"]


def test_the_lane_never_reads_a_half_read_connection_again_and_starts_afresh_after_fork(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    lane = store._lane
    assert lane is not None
    assert lane.call("PING") in (b"PONG", "PONG", True)
    [conn] = lane._idle
    with pytest.raises(redis.ResponseError):  # a reply error is a reply, read whole
        lane.call("NOSUCHCOMMAND")
    assert lane._idle == [conn] and conn._sock is not None
    # interrupted between the send and the reply: the reply is never read as another's
    monkeypatch.setattr(conn, "read_response", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("interrupted")))
    with pytest.raises(RuntimeError):
        lane.call("PING")
    monkeypatch.undo()
    assert lane._idle == [conn] and conn._sock is None  # disconnected, then kept
    assert lane.call("ECHO", "again") == b"again"  # connects afresh: the reply is ours
    lane._pid = -1  # as in a forked child: the parent's connections are not taken
    lane.call("PING")
    assert conn not in lane._idle and len(lane._idle) == 1


def test_the_lane_reconnects_through_connect_where_a_sentinel_connection_finds_the_master(
        store: RedisStore) -> None:
    # A Sentinel connection asks the Sentinels for the master in connect(); the reconnect
    # inside send_packed_command goes back to the address it had. Reconnecting there
    # after a failover sent every round trip to the dead master (test_sentinel's
    # failover under a dispatcher and a worker), so the lane reconnects through
    # connect(), as the pool does before handing a connection out.
    reconnects = []

    class Counting(redis.Connection):
        def connect(self) -> None:
            reconnects.append(self._sock is None)
            super().connect()

    where = store.client.connection_pool.connection_kwargs
    client = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=Counting, host=where["host"], port=where["port"]))
    lane = Lane(client)
    lane.call("PING")
    [conn] = lane._idle
    conn.disconnect()  # as a connection error does
    reconnects.clear()
    assert lane.call("ECHO", "again") == b"again"
    assert True in reconnects
    client.close()


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


def test_pick_reads_the_default_cap_once_per_call_not_per_message() -> None:
    """A group capped by the queue's default costs pick no more reads than a group with
    a cap of its own: the default is read once per call and passed down (``cap_of``);
    while no group has a cap of its own, no group's is read at all. Counted with Redis
    ``commandstats`` on a server of its own (nothing else runs there)."""
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
        # 5 groups: one read of each own cap in the call, none without
        assert reads["default"] == reads["own"] - 5, reads
    finally:
        server.stop()


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
    store.hold_many(Q, [Hold("y", value("g"), Placement("g", "b", 1, False))], NOW)
    [p] = store.pick(Q, 1, None, NOW, LEASE)
    store.confirm(Q, [p.dispatch_id], NOW + 1)
    store.renew(Q, [p.dispatch_id], NOW + 2)
    store.begin(Q, p.dispatch_id, NOW + 3)
    store.reclaim(Q, NOW, 10)
    store.promote(Q, NOW, 10)
    store.release(Q, p.dispatch_id)
    configure(store)
    store.limit(Q, "g", 2)
    store.pause(Q, "g", None)
    store.boost(Q, "g", 2, None)
    store.boost_task(Q, "not-held")
    store.set_rate(Q, "g", "10/s")
    store.cancel(Q, ["not-held"])
    store.summarize(Q, ["g"])
    store.register_worker(Q, "w", 1, NOW + 60_000, NOW)
    store.assign(Q, [("g", "", "w")])
    store.check(Q, False, NOW, LEASE)
    redis_client.hset(store.keys(Q).scope("n"), "zz", 1)  # a group to check (and repair)
    assert [f[0] for f in store.check_scope(True)] == ["scope_count"]
    store.forget_queue(Q)
    store.wait([Q], 0)
    assert [n for n, s in store._scripts.items() if not redis_client.script_exists(s.sha)[0]] == []


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


def test_configure_rebuilds_the_held_counters(store: RedisStore) -> None:
    for g in ("a", "a", "b"):
        hold(store, g)
    store.client.delete(store.keys(Q).stat, store.keys(Q).backlog)  # e.g. an older version
    configure(store)
    _assert_counters_exact(store)
    assert store.top_groups(Q, 5) == [("a", 2), ("b", 1)]


@pytest.mark.parametrize("placement, error", [
    (["acme", "x", "1", "0"], "placement is out of range"),  # class
    (["", "b", "1", "0"], "placement is out of range"),  # group
    (["acme", "b", "inf", "0"], "placement is out of range"),  # cost
    (["other", "b", "1", "0"], "prefix is not envelope.py's encoding"),  # not the value's
    (["acme", "i", "1", "0"], "prefix is not envelope.py's encoding"),
    (["acme", "b", "2", "0"], "prefix is not envelope.py's encoding"),
    (["acme", "b", "1", "1"], "prefix is not envelope.py's encoding"),
], ids=repr)
def test_hold_lua_refuses_a_placement_out_of_range_or_not_the_values_and_writes_nothing(
        store: RedisStore, redis_client: redis.Redis, placement: list[str],
        error: str) -> None:
    # What RedisStore.hold checks first, the script checks again: pick and the others
    # read the placement back from the value, so the two must never disagree.
    hold(store, "acme")
    before = {key: redis_client.dump(key) for key in redis_client.scan_iter(
        match=f"{store.namespace}:*")}
    with pytest.raises(redis.ResponseError, match=re.escape(error)):
        store._scripts["hold"](keys=[store.keys(Q).prefix],
                               args=["x", value("acme"), 0, NOW, *placement])
    after = {key: redis_client.dump(key) for key in redis_client.scan_iter(
        match=f"{store.namespace}:*")}
    assert after == before


def test_hold_many_lua_refuses_a_batch_with_one_bad_message_naming_it_and_writes_nothing(
        store: RedisStore, redis_client: redis.Redis) -> None:
    # RedisStore.hold_many checks the placements first; the script checks each message
    # against its value again, all before its first write.
    hold(store, "acme")
    before = {key: redis_client.dump(key) for key in redis_client.scan_iter(
        match=f"{store.namespace}:*")}
    good = ["a", value("acme"), 0, "acme", "b", "1", "0", "", ""]
    bad = ["x", value("acme"), 0, "other", "b", "1", "0", "", ""]
    with pytest.raises(redis.ResponseError, match=re.escape(
            "prefix is not envelope.py's encoding of the placement given (class, front, "
            "cost, group) (message 1 of the batch)")):
        store._scripts["hold_many"](keys=[store.keys(Q).prefix], args=[NOW, 300, *good, *bad])
    after = {key: redis_client.dump(key) for key in redis_client.scan_iter(
        match=f"{store.namespace}:*")}
    assert after == before


def test_configure_counts_the_interactive_in_flight_again(store: RedisStore,
                                                           redis_client) -> None:
    """A store written by a version without `inflight:i` (interactive dispatches in flight
    at the upgrade, not counted): configure recounts them from the live dispatches, so
    their releases do not take the count below zero and loosen the interactive share."""
    configure(store)
    for _ in range(3):
        hold(store, "a", INTERACTIVE)
    hold(store, "a", BACKGROUND)
    picked = pick(store, 4)
    stat = store.keys(Q).stat
    redis_client.hdel(stat, "inflight:i")  # as an older version left it
    configure(store)
    assert int(redis_client.hget(stat, "inflight:i")) == 3
    for p in picked:
        store.release(Q, p.dispatch_id)
    assert int(redis_client.hget(stat, "inflight:i")) == 0


def test_an_older_workers_release_corrects_nothing(store: RedisStore) -> None:
    """Rolling upgrades: a worker of a version before fair_charge calls release.lua with
    three arguments (no runtime): the slot is freed, the estimate stands, no mean is
    kept; a runtime that is not a number from 0 to a year is read as none."""
    from celery_fair.limits import RUNTIME
    from celery_fair.store.base import Policy

    store.configure(Q, Policy(None, 0, 1.0, {}, {}, charge=RUNTIME))
    for _ in range(3):
        hold(store, "a", cost=2.0)
    first, second = pick(store, 2)
    group = store.keys(Q).group("a")
    assert store.client.hget(store.keys(Q).dispatch(first.dispatch_id), "e") == b"2"
    assert store._run("release", Q, first.dispatch_id, 0, "") == 1
    assert store.client.hget(group, "tb") == b"4" and store.client.hget(group, "r") is None
    assert store._run("release", Q, second.dispatch_id, 0, "", "nan") == 1
    assert store.client.hget(group, "tb") == b"4" and store.client.hget(group, "r") is None


def test_a_message_picked_while_it_is_located_is_found_by_its_dispatch(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # locate reads the stored value, then where it stands: a pick in between once left a
    # "held" answer with no place (tests/test_position.py, now and then under load)
    hid = hold(store, "acme")
    read = store.client.hget

    def read_then_pick(*args: object, **kwargs: object) -> object:
        value = read(*args, **kwargs)
        monkeypatch.setattr(store.client, "hget", read)
        assert [p.hold_id for p in pick(store)] == [hid]
        return value

    monkeypatch.setattr(store.client, "hget", read_then_pick)
    found = store.locate(hid)
    assert found is not None and found.state == "picked" and found.dispatch_id, found
