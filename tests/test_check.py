"""The invariant checker: each kind of corruption of a real store is found, and repaired
without losing a held message; a healthy store — also under a running dispatcher and
worker — is reported clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable

import pytest
import redis

from celery_fair.check import Report, check
from celery_fair.envelope import Envelope, placement_of
from celery_fair.store.base import DispatcherBeat, Picked, now_ms
from celery_fair.store.redis import RedisStore

from .conftest import subprocess_env, wait_for
from .store_helpers import NOW, Q, hold, pick

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELERY = os.path.join(os.path.dirname(sys.executable), "celery")


@pytest.fixture
def store(redis_client: redis.Redis, namespace: str) -> RedisStore:
    return RedisStore(redis_client, namespace)


def busy_store(store: RedisStore) -> list[Picked]:
    """Two groups with held work, one dispatch queued, one running, one delayed."""
    for g in ("acme", "globex"):
        for _ in range(3):
            hold(store, g)
    hold(store, "initech", due=NOW + 60_000)
    picked = pick(store, 2)
    store.confirm(Q, [p.dispatch_id for p in picked], NOW + 30_000)
    store.begin(Q, picked[0].dispatch_id, NOW + 30_000)
    return picked


def run(store: RedisStore, repair: bool = False) -> Report:
    return check(store, repair=repair, queues=[Q])


def assert_repaired(store: RedisStore, kinds: set[str], also: frozenset[str] = frozenset()
                    ) -> Report:
    """Report mode finds exactly ``kinds`` and changes nothing; repair fixes all of them
    (and ``also``: what follows from a repair, as a group under its cap again becoming
    ready); a second check is clean."""
    found = run(store)
    assert found.kinds() == kinds, str(found)
    assert found.problems == found.findings
    assert run(store).kinds() == kinds, "report mode changed the store"
    fixed = run(store, repair=True)
    assert fixed.kinds() == kinds | also, str(fixed)
    assert not fixed.problems, str(fixed)
    after = run(store)
    assert after.ok, str(after)
    return fixed


def held_ids(store: RedisStore) -> set[str]:
    return {i.decode() for i in store.client.hkeys(store.keys(Q).msg)}


def drain(store: RedisStore) -> list[str]:
    """Pick everything held (releasing as we go); the hold ids picked."""
    out: list[str] = []
    while True:
        got = pick(store, 100)
        if not got:
            return out
        for p in got:
            out.append(p.hold_id)
            store.release(Q, p.dispatch_id)


def test_healthy_store_is_clean(store: RedisStore) -> None:
    assert run(store).ok  # empty
    busy_store(store)
    report = run(store)
    assert report.ok, str(report)
    assert str(report).startswith("ok:")
    assert run(store, repair=True).findings == []


def test_group_inflight_count_drift(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    redis_client.hincrby(store.keys(Q).group("acme"), "n", 5)
    assert_repaired(store, {"group_inflight"})
    assert redis_client.hget(store.keys(Q).group("acme"), "n") == b"1"


def test_queue_inflight_drift(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    redis_client.hset(store.keys(Q).stat, "inflight", 7)
    fixed = assert_repaired(store, {"queue_inflight"})
    assert "inflight is 7, dispatch records say 2" in str(fixed)
    assert redis_client.hget(store.keys(Q).stat, "inflight") == b"2"


def test_stuck_cap_is_found_and_freed(store: RedisStore, redis_client: redis.Redis) -> None:
    """A phantom in-flight slot at the cap keeps the group out of the ready set for ever."""
    from .store_helpers import configure

    configure(store, cap=1)
    hold(store, "acme")
    hold(store, "acme")
    k = store.keys(Q)
    redis_client.hset(k.group("acme"), "n", 1)  # a slot no dispatch holds
    redis_client.zrem(k.ready("b"), "acme")
    redis_client.hset(k.stat, "inflight", 1)
    assert pick(store) == []
    assert_repaired(store, {"group_inflight", "queue_inflight"}, frozenset({"not_ready"}))
    assert len(pick(store)) == 1


def test_group_missing_from_ready_set(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    redis_client.zrem(store.keys(Q).ready("b"), "globex")
    assert_repaired(store, {"not_ready"})
    assert sorted(h.split("-")[0] for h in drain(store)) == ["acme"] * 2 + ["globex"] * 2


def test_ineligible_group_in_ready_set(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    redis_client.zadd(store.keys(Q).ready("i"), {"acme": 0, "ghost": 0})
    assert_repaired(store, {"ready_but_ineligible"})
    assert redis_client.zcard(store.keys(Q).ready("i")) == 0


def test_ready_score_differs_from_tag(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    redis_client.zadd(store.keys(Q).ready("b"), {"acme": 99})
    assert_repaired(store, {"ready_tag_mismatch"})


def test_orphaned_message_is_held_again(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    [lost] = redis_client.lrange(k.held("b", "globex"), 0, 0)
    redis_client.lrem(k.held("b", "globex"), 1, lost)
    assert_repaired(store, {"orphan_message"})
    assert lost.decode() in drain(store)


def test_held_id_without_body(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.rpush(k.held("b", "acme"), "no-such-id")
    redis_client.rpush(k.held("b", "hooli"), "gone-too")  # a group nobody registered
    fixed = assert_repaired(store, {"held_without_body"})
    assert {f.subject for f in fixed.findings} == {"acme", "hooli"}
    assert len(drain(store)) == 4  # the real messages still all come out


def test_delayed_id_without_body_and_count_drift(store: RedisStore,
                                                 redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.zadd(k.delayed, {"phantom": NOW})
    redis_client.hincrby(k.group("initech"), "d", 2)
    assert_repaired(store, {"delayed_without_body", "group_delayed"})
    assert store.promote(Q, NOW + 61_000, 10)[0] == 1


def test_group_missing_from_groups_set(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    redis_client.srem(store.keys(Q).groups, "globex", "initech")
    fixed = assert_repaired(store, {"group_unregistered"})
    assert {f.subject for f in fixed.findings} == {"globex", "initech"}


def test_idle_group_kept(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.sadd(k.groups, "ghost")
    redis_client.hset(k.group("phantom"), "tb", 3)
    fixed = assert_repaired(store, {"idle_group"})
    assert {f.subject for f in fixed.findings} == {"ghost", "phantom"}


def test_dispatch_without_lease(store: RedisStore, redis_client: redis.Redis) -> None:
    picked = busy_store(store)
    k = store.keys(Q)
    redis_client.zrem(k.leases, picked[1].dispatch_id)
    assert_repaired(store, {"dispatch_without_lease"})
    # the added lease runs out like any other and frees the slot
    assert redis_client.zscore(k.leases, picked[1].dispatch_id) is not None
    assert sum(store.reclaim(Q, 2**50, 100)) == 2
    assert run(store).ok and redis_client.hget(k.stat, "inflight") == b"0"


def test_lease_without_dispatch(store: RedisStore, redis_client: redis.Redis) -> None:
    picked = busy_store(store)
    k = store.keys(Q)
    redis_client.zadd(k.leases, {"ghost.1": NOW})
    group = redis_client.hget(k.dispatch(picked[1].dispatch_id), "g").decode()
    redis_client.delete(k.dispatch(picked[1].dispatch_id))  # record gone, lease kept
    redis_client.hincrby(k.group(group), "n", -1)
    redis_client.hincrby(k.stat, "inflight", -1)
    assert_repaired(store, {"lease_without_dispatch"})
    assert redis_client.zcard(k.leases) == 1


def test_released_tombstones_are_valid_and_a_stray_lease_on_one_goes(
        store: RedisStore, redis_client: redis.Redis) -> None:
    picked = busy_store(store)
    k = store.keys(Q)
    did = picked[0].dispatch_id
    assert store.release(Q, did, 3600)  # finished: a tombstone
    assert redis_client.hexists(k.done(did), did)
    assert run(store).ok, str(run(store))
    redis_client.zadd(k.leases, {picked[0].dispatch_id: NOW})
    found = assert_repaired(store, {"lease_without_dispatch"})
    assert "released dispatch" in str(found)
    assert redis_client.hexists(k.done(did), did)


def test_picked_record_without_bytes(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    [p] = pick(store)
    k = store.keys(Q)
    redis_client.hdel(k.dispatch(p.dispatch_id), "v")
    assert_repaired(store, {"picked_without_message"})
    store.reclaim(Q, NOW + LEASE_PAST, 100)
    # its slot comes back, and it is not held again from nothing
    assert redis_client.hget(k.dispatch(p.dispatch_id), "s") == b"lost"
    assert run(store).ok


LEASE_PAST = 3_600_000


def test_undecodable_message_is_quarantined(store: RedisStore,
                                            redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.hset(k.msg, "junk", b"\xff\x00 not an envelope")
    redis_client.rpush(k.held("b", "acme"), "junk")
    assert_repaired(store, {"corrupt_message", "held_without_body"})
    assert redis_client.hget(f"{k.prefix}:quarantine", "junk") == b"\xff\x00 not an envelope"
    assert len(drain(store)) == 4


def test_foreign_key_type_is_renamed_aside(store: RedisStore,
                                           redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.delete(k.vt)
    redis_client.set(k.vt, "someone else's")
    report = run(store)
    assert report.kinds() == {"foreign_key"}
    assert "is a string, expected a hash" in str(report)
    fixed = run(store, repair=True)
    assert fixed.kinds() == {"foreign_key"} and not fixed.problems
    [aside] = redis_client.keys(f"{k.prefix}:foreign:*")
    assert redis_client.get(aside) == b"someone else's"
    assert run(store).ok
    assert len(drain(store)) == 4


def test_foreign_group_list_type(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.set(k.held("i", "acme"), "x")
    assert run(store).kinds() == {"foreign_key"}
    assert not run(store, repair=True).problems
    assert run(store).ok


def test_check_finds_keys_of_odd_group_names(store: RedisStore,
                                             redis_client: redis.Redis) -> None:
    """Group names with glob characters, braces and colons are found by the key scan."""
    odd = ["a*b", "[x]", "{tag}", "c:d", "ü\\"]
    for g in odd:
        hold(store, g)
    assert run(store).ok
    for g in odd:
        redis_client.srem(store.keys(Q).groups, g)
    fixed = assert_repaired(store, {"group_unregistered"})
    assert {f.subject for f in fixed.findings} == set(odd)


def test_report_json_and_cli_exit_codes(redis_server: Any, redis_client: redis.Redis,
                                        namespace: str) -> None:
    store = RedisStore(redis_client, namespace)
    queue = "q-" + namespace
    value = Envelope(b"[]", "application/json", "utf-8", {"id": "x", "task": "t"}, "",
                     queue, queue).encode("acme", "b", 1, False)
    store.hold(queue, "x", value, placement_of(value), 0, NOW)
    redis_client.hset(store.keys(queue).group("acme"), "n", 3)
    # A dispatcher serves the queue (its beat, for the minute this test takes): the held
    # task is not a finding here (tests/test_liveness.py checks that one).
    store.beat(DispatcherBeat("h:1:x", "h", 1, now_ms(), now_ms(), (queue,), False, "proj"),
               now_ms(), 60_000)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CELERY, "-A", "tests.proj", "fair", "check", *args], cwd=ROOT,
                              env=subprocess_env({}, redis_server.url + "/0", namespace),
                              capture_output=True, text=True, timeout=60)

    found = cli("--json")
    assert found.returncode == 1, found.stdout + found.stderr
    data = json.loads(found.stdout)
    assert data["ok"] is False
    assert [f["kind"] for f in data["findings"]] == ["group_inflight"]
    fixed = cli("--repair")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "group_inflight acme: n is 3, dispatch records say 0 -> set to 0" in fixed.stdout
    clean = cli()
    assert clean.returncode == 0 and clean.stdout.startswith("ok:"), clean.stdout
    # the session's server runs without persistence: said on stderr, not a failure
    assert "warning: persistence is off" in clean.stderr


def test_clean_under_a_running_dispatcher_and_worker(app: Any, worker: Callable[..., Any],
                                                     dispatcher: Callable[..., Any],
                                                     ledger: Any) -> None:
    """Checks taken while tasks are held, picked, queued, running and released concurrently
    never see a broken invariant: each check is atomic."""
    work = app.tasks["proj.work"]
    app.conf.fair_default_concurrency = 2
    from celery_fair.config import reset_config

    reset_config(app)
    total = 0
    with worker(concurrency=3), dispatcher():
        reports = []
        for round_ in range(6):
            for g in ("acme", "globex", "initech"):
                for i in range(4):
                    work.apply_async((g, f"{round_}-{i}", 0.01),
                                     fair_interactive=(i == 0), countdown=0.05 * (i == 3))
                    total += 1
            reports.append(check(app))
        # check all the while the tasks run, then once everything is done
        wait_for(lambda: reports.append(check(app)) or ledger.ends() >= total, timeout=60,
                 interval=0.01, what="all tasks to finish")
    bad = [str(r) for r in reports if not r.ok]
    assert not bad, "\n".join(bad)
    assert len(reports) > 10
    assert check(app).ok


def test_held_counters_drift(store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    k = store.keys(Q)
    redis_client.hincrby(k.stat, "held:b", 3)
    redis_client.zadd(k.backlog, {"acme": 9, "ghost": 1})
    fixed = assert_repaired(store, {"queue_held_count", "group_held_count"})
    assert {f.subject for f in fixed.findings} == {"stat", "acme", "ghost"}
    assert sorted(store.top_groups(Q, 5)) == [("acme", 2), ("globex", 2)]


def hold_many(store: RedisStore, count: int, groups: int = 5) -> None:
    """``count`` held messages over ``groups`` groups, in pipelined hold calls."""
    script = store._scripts["hold"]
    prefix = store.keys(Q).prefix
    for start in range(0, count, 2000):
        pipe = store.client.pipeline(transaction=False)
        for i in range(start, min(count, start + 2000)):
            g = f"g{i % groups}"
            hid = f"{g}-{i}"
            script(keys=[prefix], args=[hid, value_of(g, hid), 0, NOW, g, "b", 1, 0],
                   client=pipe)
        pipe.execute()


def value_of(group: str, hold_id: str) -> bytes:
    from .store_helpers import value

    return value(group, body=hold_id.encode())


def test_check_of_tens_of_thousands_held_never_reads_more_than_a_batch_per_call(
        store: RedisStore, redis_client: redis.Redis) -> None:
    """`fair check` must not block Redis (and a broker sharing it) for O(held): each script
    call reads a bounded batch. Measured by Redis itself (SLOWLOG of every call) and by
    the entries each call reports it read."""
    held = 30_000
    hold_many(store, held)
    for _ in range(5):
        hold(store, "late", due=NOW + 60_000)
    store.confirm(Q, [p.dispatch_id for p in pick(store, 20)], NOW + 30_000)
    sha = store._scripts["check"].sha
    old = redis_client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis_client.config_set("slowlog-max-len", 100_000)
    redis_client.slowlog_reset()
    redis_client.config_set("slowlog-log-slower-than", 0)
    try:
        assert run(store).ok
        entries = redis_client.slowlog_get(100_000)
    finally:
        redis_client.config_set("slowlog-log-slower-than", old)
        redis_client.slowlog_reset()
    calls = [e["duration"] for e in entries
             if e["command"].split()[:2] in ([b"EVALSHA", sha.encode()],
                                             [b"EVAL"])]
    assert len(calls) >= held // 500, f"{len(calls)} script calls for {held} held messages"
    reads: list[int] = []
    assert store.check(Q, False, NOW, 30_000, reads=reads) == []
    assert max(reads) <= 600, max(reads)  # batch 500; HSCAN's COUNT is a hint
    assert sum(reads) >= 2 * held  # the lists, then the messages: all were read
    # no call dominates: the longest takes a small part of the check's Redis time
    assert max(calls) <= 0.25 * sum(calls), (max(calls), sum(calls))
    assert redis_client.keys(f"{store.keys(Q).prefix}:check:*") == []  # scratch cleared


def test_repairing_check_beside_a_running_dispatcher_and_workers_finds_nothing(
        app: Any, worker: Callable[..., Any], dispatcher: Callable[..., Any],
        ledger: Any) -> None:
    """`check --repair` in small steps interleaved with holds, picks, promotions and
    releases: a count that changed between two steps is never reported (nor "repaired"),
    and every task runs exactly once."""
    work = app.tasks["proj.work"]
    app.conf.fair_default_concurrency = 2
    from celery_fair.config import reset_config

    reset_config(app)
    total = 0
    reports = []
    with worker(concurrency=3), dispatcher():
        for round_ in range(8):
            for g in ("acme", "globex", "initech", "umbrella"):
                for i in range(5):
                    work.apply_async((g, f"{round_}-{i}", 0.01),
                                     fair_interactive=(i == 0), countdown=0.05 * (i == 3))
                    total += 1
            reports.append(check(app, repair=True, batch=3))
        wait_for(lambda: reports.append(check(app, repair=True, batch=3))
                 or ledger.ends() >= total, timeout=90, interval=0.01,
                 what="all tasks to finish")
    bad = [str(r) for r in reports if not r.ok]
    assert not bad, "\n".join(bad)
    assert len(reports) > 10
    runs = ledger.runs()  # per label; each label is used once by each of the 4 groups
    assert sum(runs.values()) == total and set(runs.values()) == {4}, runs
    assert check(app).ok


def test_a_check_started_meanwhile_stops_the_older_one(store: RedisStore) -> None:
    """Two checks of one queue at once would mix their tallies (false findings, false
    repairs): the newer one takes over, the older one's next step fails, writing nothing."""
    from celery_fair.errors import StoreError
    from celery_fair.store.checking import Checker

    busy_store(store)
    older = Checker(store, Q, [1, NOW, 30_000], 500, None)
    assert older.call("fixed") == ""
    assert run(store, repair=True).ok  # a newer check, run to its end
    with pytest.raises(StoreError, match="another check of this queue started"):
        older.call("delayed", "0")
    assert run(store).ok


def test_counts_that_move_between_steps_are_recounted_not_reported(store: RedisStore) -> None:
    """A delayed message comes due, a message is picked and another held between the
    steps of a repairing check: the tallies then disagree with the counters, and the
    final step's atomic recount shows there is nothing wrong."""
    from celery_fair.store.checking import Checker

    busy_store(store)
    hold(store, "initech", due=NOW + 1)

    class Interleaved(Checker):
        def call(self, step: str, *args: Any) -> str:
            if step == "final":  # the moved counts made suspects of both groups
                suspects = store.client.smembers(f"{store.keys(Q).prefix}:check:suspects")
                assert suspects == {b"acme", b"initech"}, suspects
            nxt = super().call(step, *args)
            if step == "delayed" and not nxt:
                assert store.promote(Q, NOW + 10, 100)[0] == 1
            if step == "dispatch" and not nxt:
                picked = pick(store, 1)
                store.confirm(Q, [p.dispatch_id for p in picked], NOW + 30_000)
                hold(store, "acme")
            return nxt

    reads: list[int] = []
    checker = Interleaved(store, Q, [1, NOW, 30_000], 500, reads)
    checker.run()
    assert checker.findings == []
    assert run(store).ok


def test_many_small_groups_are_checked_in_few_calls(store: RedisStore) -> None:
    """Small lists share a call (a list visited counts as one entry read), so a check
    costs O(entries / batch) round trips, not one per list."""
    hold_many(store, 3000, groups=3000)
    reads: list[int] = []
    assert store.check(Q, False, NOW, 30_000, reads=reads) == []
    assert len(reads) < 60, len(reads)
    assert max(reads) <= 600, max(reads)


def test_messages_whose_list_a_foreign_key_replaced_are_reported_then_held_again(
        store: RedisStore, redis_client: redis.Redis) -> None:
    busy_store(store)
    hold(store, "acme", klass="i")
    k = store.keys(Q)
    redis_client.delete(k.held("i", "acme"))
    redis_client.set(k.held("i", "acme"), "x")
    assert run(store).kinds() == {"foreign_key", "orphan_message"}
    assert not run(store, repair=True).problems
    assert run(store).ok
    assert len(drain(store)) == 5
