"""Failed releases outlive their process: a pool process that ends a task while the store
is down, then dies (a worker crashing on the outage takes its pool with it), leaves its
release in the spool; the copy the broker redelivers lands it before it would take the
run over, and so does every lease keeper on the host."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Callable

from celery import Celery

from celery_fair.config import get_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.spool import spool_for
from celery_fair.store.base import BeginResult
from celery_fair.task import DISPATCH_HEADER, QUEUE_HEADER, begin_dispatch, store_for
from celery_fair.worker import LeaseKeeper

#: Begins the dispatch as a run of its own process, spools its release as if the store had
#: been down when the task ended, and exits.
DIES_HOLDING = """
import sys, time
from celery_fair.spool import spool_for
from celery_fair.store.redis import RedisStore
from celery_fair.task import new_run
url, namespace, queue, did = sys.argv[1:]
store = RedisStore.from_url(url, namespace)
run = new_run()
assert store.begin(queue, did, int((time.time() + 60) * 1000), run=run, acks_late=True) == 1
spool_for(store).add(queue, did, 3600, run)
"""


def _dead_run_with_a_spooled_release(app: Celery) -> tuple[str, str]:
    """A dispatch whose run ended, could not tell the store, and died: (queue, did)."""
    store, queue = store_for(app), str(app.conf.task_default_queue)
    app.tasks["proj.work"].delay("acme", "once")
    assert Dispatcher(app).step().dispatched == 1
    [did] = [d.decode() for d in store.client.zrange(store.keys(queue).leases, 0, -1)]
    url = get_config(app).store_url
    subprocess.run([sys.executable, "-c", DIES_HOLDING, url, store.namespace, queue, did],
                   check=True, timeout=60)
    assert store.client.hget(store.keys(queue).dispatch(did), "s") == b"running"
    return queue, did


def test_the_copy_lands_the_dead_runs_release_and_is_skipped(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    store = store_for(app)
    got = begin_dispatch(app, {DISPATCH_HEADER: did, QUEUE_HEADER: queue}, acks_late=True)
    assert got is BeginResult.SKIP
    assert store.dispatch_state(queue, did) == "released"
    assert store.queue_figures(queue)["inflight"] == 0
    assert not list(spool_for(store).directory.glob("*.jsonl"))


def test_a_lease_keeper_lands_what_a_dead_process_spooled(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    store = store_for(app)
    LeaseKeeper(app, f"keeper-{time.time()}", [queue], 1).beat()
    assert store.dispatch_state(queue, did) == "released"
    assert store.queue_figures(queue)["inflight"] == 0
    assert not list(spool_for(store).directory.glob("*.jsonl"))


def test_a_torn_spool_line_is_passed_over(make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    spool = spool_for(store_for(app))
    [path] = spool.directory.glob("*.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"q": "half a li')  # the process died writing it
    assert spool.replay_dead() == 1


