"""fair_store_replicas: hold, release and cancel on Redis wait (WAIT) for that many
replicas, and fail with a clear error naming how many acknowledged when fewer do in time.

A real master and replica of the test's own (a replica stopped with SIGSTOP cannot
acknowledge anything until SIGCONT), or the session's server, which has no replica.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery

from celery_fair.config import get_config
from celery_fair.errors import (
    ConfigurationError,
    HoldNotReplicated,
    HoldOutcomeUnknown,
    ReplicationTimeout,
)
from celery_fair.store import Bounds, RedisStore, store_for
from celery_fair.testing import RedisServer

from .conftest import wait_for
from .store_helpers import NOW, Q, hold

LEASE_MS = 30_000


@pytest.fixture
def master_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    # no 5 s wait before the full sync (Redis's default for a diskless one)
    master, replica = RedisServer(**{"repl-diskless-sync-delay": "0"}), RedisServer()
    try:
        redis.Redis(port=replica.port).replicaof("127.0.0.1", master.port)
        wait_for(lambda: redis.Redis(port=replica.port).info("replication").get(
            "master_link_status") == "up", timeout=10, what="the replica to sync")
        yield master, replica
    finally:
        replica.stop()
        master.stop()


def store_on(url: str, replicas: int, timeout: float) -> RedisStore:
    return RedisStore.from_url(url, "t" + uuid.uuid4().hex[:10], Bounds(socket_timeout=10),
                               replicas=replicas, replicas_timeout=timeout)


def unwaited(store: Any) -> RedisStore:
    """``store`` without fair_store_replicas: the same Redis and namespace."""
    return RedisStore(store.client, store.namespace)


def hold_in_thread(store: RedisStore) -> tuple[threading.Thread, threading.Event, list[Any]]:
    done, outcome = threading.Event(), []

    def run() -> None:
        try:
            outcome.append(hold(store, "acme"))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, outcome


def test_a_hold_returns_only_once_a_replica_has_it(
        master_and_replica: tuple[RedisServer, RedisServer]) -> None:
    master, replica = master_and_replica
    os.kill(replica.proc.pid, signal.SIGSTOP)  # it can acknowledge nothing now
    try:
        # Without fair_store_replicas the hold returns at once, replica or not.
        _, done, _ = hold_in_thread(store_on(master.url, 0, 1.0))
        assert done.wait(5)
        waiting = store_on(master.url, 1, 5.0)
        thread, done, outcome = hold_in_thread(waiting)
        assert not done.wait(0.5), "the hold returned before any replica acknowledged it"
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert done.wait(5) and isinstance(outcome[0], str), outcome
    assert redis.Redis(port=replica.port).keys(f"{waiting.namespace}:*")


def test_without_a_replica_hold_pick_release_and_cancel_fail_naming_the_count(
        redis_server: RedisServer) -> None:
    store = store_on(redis_server.url, 1, 0.1)
    with pytest.raises(HoldNotReplicated) as info:
        hold(store, "acme", hold_id="t1")
    assert isinstance(info.value, HoldOutcomeUnknown)  # never published to the broker
    assert (info.value.acknowledged, info.value.wanted) == (0, 1)
    assert "hold acknowledged by 0 of 1 replicas within 0.1 s" in str(info.value)
    assert "fair_store_replicas" in str(info.value)
    assert store.queue_figures(Q).held == 1  # the master has it
    with pytest.raises(ReplicationTimeout, match="pick acknowledged by 0 of 1"):
        store.pick(Q, 10, None, NOW, LEASE_MS)  # the caller publishes nothing
    assert store.queue_figures(Q).inflight == 1  # picked on the master: held again later
    picker, later = unwaited(store), NOW + LEASE_MS + 1
    assert picker.reclaim(Q, later, 100) == (1, 0)  # its pick lease ran out
    [picked] = picker.pick(Q, 10, None, later, LEASE_MS)
    with pytest.raises(ReplicationTimeout, match="release acknowledged by 0 of 1"):
        store.release(Q, picked.dispatch_id)
    assert store.queue_figures(Q).inflight == 0  # released on the master all the same
    with pytest.raises(HoldNotReplicated):
        hold(store, "acme", hold_id="t2")
    with pytest.raises(ReplicationTimeout, match="cancel acknowledged by 0 of 1"):
        store.cancel(Q, ["t2"])
    store.flush()


def test_a_publish_whose_hold_is_not_replicated_raises_and_is_not_published(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_store_replicas=1, fair_store_replicas_timeout=0.1,
                   fair_on_store_error="publish")
    with pytest.raises(HoldNotReplicated):
        app.tasks["proj.work"].delay("acme", "x")
    with app.connection_for_write() as conn:
        assert conn.default_channel.client.llen(app.conf.task_default_queue) == 0


@pytest.mark.parametrize("conf, expected", [
    ({"fair_store_replicas": -1}, "fair_store_replicas=-1 is invalid"),
    ({"fair_store_replicas_timeout": 0}, "fair_store_replicas_timeout=0 is invalid"),
    ({"fair_store_replicas": 1, "fair_store_replicas_timeout": 5.0},
     "fewer seconds than fair_store_socket_timeout"),
    ({"fair_store_replicas": 1, "fair_store_url": "sqlite:////tmp/x.db"},
     "fair_store_replicas applies to a Redis store only"),
    ({"fair_store_transport_options": {"master_name": "m"}},
     "fair_store_transport_options is for a Sentinel store"),
    ({"fair_store_url": "redis+sentinel://h:1,h:x/0"}, "expected a Sentinel URL"),
])
def test_bad_replica_and_sentinel_settings_are_refused_naming_them(
        make_app: Callable[..., Celery], conf: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected):
        get_config(make_app(**conf))


def test_publishing_again_after_an_unreplicated_hold_runs_the_task_once(
        make_app: Callable[..., Celery]) -> None:
    """HoldNotReplicated says the task is held on the master and may be lost with it: the
    caller publishes it again with the same task id (the chaos campaigns do). That resend
    (the same message, held a little later) is held once, whether the first is still held
    or was dispatched already, and however long its WAITs fail (a cluster's new primary
    has no replica until its old one is back): it ran 4 times in the cluster campaign.
    Another message under the same task id (a retry: its retries count) is held."""
    app = make_app(fair_store_replicas=1, fair_store_replicas_timeout=0.1)
    task, store, queue = app.tasks["proj.work"], store_for(app), app.conf.task_default_queue

    def publish(*args: Any) -> None:
        with pytest.raises(HoldNotReplicated):  # the session's Redis has no replica
            task.apply_async(args, task_id="t-resent")

    publish("acme", "x")
    publish("acme", "x")  # while the first is held: not a second copy
    assert store.queue_figures(queue).held == 1
    picker = unwaited(store)  # the replica-less server's picks would not be published
    [picked] = picker.pick(queue, 10, None, NOW, LEASE_MS)
    assert picked.hold_id == "t-resent"
    publish("acme", "x")  # the first is dispatched now
    assert picker.pick(queue, 10, None, NOW, LEASE_MS) == []
    publish("acme", "y")  # another message under that id
    [again] = picker.pick(queue, 10, None, NOW, LEASE_MS)
    assert again.hold_id == "t-resent"
