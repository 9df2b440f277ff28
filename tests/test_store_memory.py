"""What the store's lifecycle leaves in Redis: 50,000 tasks held, picked, begun and
released through RedisStore, against a redis-server of this test's own (so nothing else
moves ``used_memory`` meanwhile), with the production settings.

The one thing a finished task may leave is its tombstone (kept ``fair_done_ttl``, so a
copy the broker redelivers is skipped, not run twice): under :data:`PER_TASK` bytes.
Everything else comes back to within :data:`SLACK` bytes of where it started.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from celery_fair.config import SETTINGS
from celery_fair.store.base import Placement
from celery_fair.store.redis import RedisStore
from celery_fair.testing import RedisServer

from .store_helpers import NOW, Q, value

DEFAULTS = {s.name: s.default for s in SETTINGS}
TASKS = 50_000
#: Bytes of Redis one finished task may keep (its tombstone), at most.
PER_TASK = 64
#: Bytes the rest of a run may leave: counters, the keyspace's hash table grown by the
#: keys of the tasks in flight and not yet shrunk, the allocator's rounding.
SLACK = 64 * 1024
GROUPS = [f"tenant-{i}" for i in range(10)]
ROUND = 1_000  # tasks held before they are picked, begun and released


@pytest.fixture
def own_redis() -> Iterator[redis.Redis]:
    server = RedisServer()
    client = redis.Redis(port=server.port)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def run_tasks(store: RedisStore, count: int, now: int) -> int:
    """Hold ``count`` tasks, then pick (in batches of fair_batch_size), begin and release
    each as a worker would (ran to its end: a tombstone). Returns the clock after it."""
    batch, lease = DEFAULTS["fair_batch_size"], DEFAULTS["fair_lease_seconds"] * 1000
    done_ttl = DEFAULTS["fair_done_ttl"]
    for start in range(0, count, ROUND):
        for i in range(start, min(start + ROUND, count)):
            task_id = str(uuid.uuid4())
            group = GROUPS[i % len(GROUPS)]
            body = b'[["%s"], {}, {}]' % task_id.encode()
            store.hold(Q, task_id, value(group, body=body, task_id=task_id),
                       Placement(group, "b", 1, False), 0, now)
        while picked := store.pick(Q, batch, None, now, lease):
            for p in picked:
                assert store.begin(Q, p.dispatch_id, now + lease, now_ms=now) == 1
                assert store.release(Q, p.dispatch_id, done_ttl)
            now += 1
    return now


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


@pytest.mark.timeout(300)
def test_50000_finished_tasks_leave_under_64_bytes_each_in_redis(
        own_redis: redis.Redis) -> None:
    store = RedisStore(own_redis, "fair")
    now = run_tasks(store, 200, NOW)  # scripts loaded, counters made: where we start
    before = used_memory(own_redis)
    run_tasks(store, TASKS, now)
    after = used_memory(own_redis)

    figures = store.queue_figures(Q)
    assert (figures.inflight, figures.held_interactive, figures.held_background,
            figures.group_count) == (0, 0, 0, 0)
    tombstones = sum(int(own_redis.memory_usage(key, samples=0) or 0)
                     for key in own_redis.scan_iter(match="fair:*:done:*", count=1000))
    grown = after - before
    print(f"used_memory grew by {grown} bytes ({grown / TASKS:.1f} per task), "
          f"tombstones {tombstones} bytes ({tombstones / TASKS:.1f} per task)")
    assert grown < PER_TASK * TASKS, f"{grown / TASKS:.1f} bytes per finished task"
    assert grown - tombstones < SLACK, f"{grown - tombstones} bytes besides the tombstones"
