"""A release under fair_store_replicas whose WAIT is not acknowledged in time: its script
ran on the master, so the task is released; it is neither kept pending nor retried (each
retry would cost another replicas timeout at every task's end, and the pending list would
grow without bound while a replica is down). A real master and replica of the test's own.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

import pytest
import redis
from celery import Celery

from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import ReplicationTimeout
from celery_fair.headers import DISPATCH_HEADER, QUEUE_HEADER
from celery_fair.spool import spool_for
from celery_fair.store import store_for
from celery_fair.testing import RedisServer
from celery_fair.worker import pending_releases, release_dispatch

from .test_spool import _dead_run_with_a_spooled_release
from .test_store_replicas import master_and_replica  # noqa: F401 (fixture)


def test_a_release_not_replicated_in_time_is_applied_and_not_kept_pending(
        make_app: Callable[..., Celery],
        master_and_replica: tuple[RedisServer, RedisServer],  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    master, replica = master_and_replica
    app = make_app(fair_store_url=master.url + "/0", fair_store_replicas=1,
                   fair_store_replicas_timeout=1.0, fair_max_inflight=10)
    store, queue = store_for(app), app.conf.task_default_queue
    for i in range(3):
        app.tasks["proj.work"].delay("acme", f"task-{i}")
    assert Dispatcher(app).step().dispatched == 3
    dids = [d.decode() for d in store.client.zrange(  # type: ignore[attr-defined]
        store.keys(queue).leases, 0, -1)]  # type: ignore[attr-defined]
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    os.kill(replica.proc.pid, signal.SIGSTOP)  # acknowledges nothing from now on
    try:
        for did in dids:
            release_dispatch(app, {DISPATCH_HEADER: did, QUEUE_HEADER: queue}, "test",
                             done=True)
            assert not len(pending_releases)  # applied on the master: nothing to retry
        assert [store.dispatch_state(queue, did) for did in dids] == ["released"] * 3
        assert store.queue_figures(queue).inflight == 0
        warned = [r for r in caplog.records if r.levelno == logging.WARNING
                  and "replicating releases failed" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in warned]  # once, not per release
        assert "acknowledged by 0 of 1 replicas" in warned[0].getMessage()
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
        pending_releases._items.clear()  # what the code before this fix kept


def test_a_spooled_release_not_replicated_in_time_is_landed_not_replayed_again(
        make_app: Callable[..., Celery],
        master_and_replica: tuple[RedisServer, RedisServer]) -> None:  # noqa: F811
    """The same for the spool of a process that died: replaying it lands the release on
    the master, and its file goes, rather than failing (the file kept, replayed again
    at every begin and lease beat, a replicas timeout each)."""
    master, replica = master_and_replica
    app = make_app(fair_store_url=master.url + "/0", fair_store_replicas=1,
                   fair_store_replicas_timeout=1.0, fair_max_inflight=1,
                   task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    store = store_for(app)
    spool = spool_for(store)
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        assert spool.replay_dead() == 1
        assert store.dispatch_state(queue, did) == "released"
        assert not list(spool.directory.glob("*.jsonl"))
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)


def _queued(app: Celery) -> list[str]:
    """The task ids in the broker's list for the app's queue (its Redis broker)."""
    import json

    with app.connection_for_write() as conn:
        raw = conn.default_channel.client.lrange(app.conf.task_default_queue, 0, -1)
    return [json.loads(m)["headers"]["id"] for m in raw]


def test_a_pick_a_failover_could_undo_is_not_published_so_the_task_runs_once(
        make_app: Callable[..., Celery],
        master_and_replica: tuple[RedisServer, RedisServer]) -> None:  # noqa: F811
    """With fair_store_replicas=1 a pick no replica acknowledged is not published. The
    replica is promoted (cut off from the master, as in a partition) before the
    dispatcher picks on the old master; the task, still held on the new master, is
    dispatched from there, and that is its only message. (Published at once, as before,
    the task had two: one from each master.)"""
    master, replica = master_and_replica
    app = make_app(fair_store_url=master.url + "/0", fair_store_replicas=1,
                   fair_store_replicas_timeout=1.0, fair_max_inflight=10)  # broker: the
    # session's Redis
    app.tasks["proj.work"].apply_async(("acme", "x"), task_id="task-1")  # replicated
    redis.Redis(port=replica.port).replicaof("NO", "ONE")  # promoted
    try:
        Dispatcher(app).step()
    except ReplicationTimeout as exc:  # the dispatcher's loop backs off and goes on
        refused = str(exc)
    else:
        refused = ""
    master.proc.kill()
    master.proc.wait()
    promoted = make_app(fair_store_url=replica.url + "/0",  # no replica of its own
                        fair_max_inflight=10)
    assert Dispatcher(promoted).step().dispatched == 1
    assert _queued(app) == ["task-1"]
    assert "pick acknowledged by 0 of 1 replicas" in refused
