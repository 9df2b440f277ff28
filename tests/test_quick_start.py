"""``fair_quick_start``: a task that acks early starts without begin's round trip when
its message is a first delivery the pick script pushed itself, with over half its lease
ahead. Everything else still asks the store: acks_late tasks, messages kombu published,
copies the broker redelivered, and copies whose lease ran out (held again: the stale copy
is skipped, as without the setting). The trade-off it states: a worker killed mid-task
has the task run again after its lease (the record kept the message), where without it
the task would be lost with its worker.

Real Redis (store and broker), real workers; begin's calls are counted on the store.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from celery.app.task import Context

from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.headers import LEASE_HEADER
from celery_fair.lifecycle import starts_quickly
from celery_fair.store.redis import RedisStore
from celery_fair.task import store_for

from .conftest import wait_for
from .helpers import labels, settled
from .procs import CeleryProcess
from .test_worker_crash import _dispatch_states, _shown_and_stopped

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def begins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The dispatch ids begin is asked about, by any worker of this process."""
    asked: list[str] = []
    original = RedisStore.begin

    def counting(self: RedisStore, queue: str, dispatch_id: str, *args: Any,
                 **kwargs: Any) -> Any:
        asked.append(dispatch_id)
        return original(self, queue, dispatch_id, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "begin", counting)
    return asked


def _run(app: Any, worker: Any, dispatcher: Any, task: str, count: int) -> list[str]:
    results = [app.tasks[task].delay("acme", f"job-{i}") for i in range(count)]
    with worker(concurrency=2, the_app=app), dispatcher(the_app=app):
        done = [r.get(timeout=60) for r in results]
    wait_for(lambda: settled(app), what="every slot released")
    return done


def test_fresh_pushed_first_deliveries_start_without_asking_the_store(
        make_app: Any, worker: Any, dispatcher: Any, begins: list[str]) -> None:
    app = make_app(fair_quick_start=True)
    jobs = [f"job-{i}" for i in range(8)]
    assert _run(app, worker, dispatcher, "proj.work", 8) == jobs
    assert begins == []
    assert sorted(labels(app)) == sorted(jobs)  # each ran once


def test_without_the_setting_every_start_asks_the_store(
        make_app: Any, worker: Any, dispatcher: Any, begins: list[str]) -> None:
    app = make_app()
    assert len(_run(app, worker, dispatcher, "proj.work", 8)) == 8
    assert len(begins) == 8


def test_an_acks_late_task_still_asks_the_store(
        make_app: Any, worker: Any, dispatcher: Any, begins: list[str]) -> None:
    app = make_app(fair_quick_start=True, task_acks_late=True)
    assert len(_run(app, worker, dispatcher, "proj.work", 8)) == 8
    assert len(begins) == 8


def test_messages_kombu_published_still_ask_the_store(
        make_app: Any, worker: Any, dispatcher: Any, begins: list[str]) -> None:
    app = make_app(fair_quick_start=True, fair_direct_push=False)
    assert len(_run(app, worker, dispatcher, "proj.work", 8)) == 8
    assert len(begins) == 8


def test_a_copy_whose_lease_ran_out_asks_and_is_skipped_so_the_task_runs_once(
        make_app: Any, worker: Any, redis_client: Any, begins: list[str]) -> None:
    """The pushed copy waits in the broker past its lease: reclaim holds the task again
    and the next pick pushes a second copy. The first still carries its old lease, so it
    asks begin, which skips it (superseded); the task runs once, from the second."""
    app = make_app(fair_quick_start=True, fair_lease_seconds=1, fair_max_inflight=10)
    store, queue = store_for(app), app.conf.task_default_queue
    result = app.tasks["proj.work"].delay("acme", "once")
    dispatcher = Dispatcher(app)
    assert dispatcher.step().dispatched == 1
    first = json.loads(redis_client.lindex(queue, 0))
    until = first["headers"][LEASE_HEADER]
    wait_for(lambda: time.time() * 1000 > until + 50, what="the pushed copy's lease to end")
    assert store.reclaim(queue, int(time.time() * 1000), 10) == (1, 0)  # held again
    assert dispatcher.step().dispatched == 1
    dispatcher.close()
    assert redis_client.llen(queue) == 2
    with worker(concurrency=1, the_app=app):
        assert result.get(timeout=60) == "once"
        wait_for(lambda: first["headers"]["fair_dispatch_id"] in begins,
                 what="the stale copy to ask begin")
        wait_for(lambda: store.queue_figures(queue).skipped == 1, what="the stale copy skipped")
    assert labels(app) == ["once"]


def _request(app: Any, lease_left: float, **extra: Any) -> Context:
    headers = {"fair_dispatch_id": "d1", "fair_queue": "q",
               LEASE_HEADER: int(time.time() * 1000 + lease_left * 1000), **extra}
    return Context(headers=headers, delivery_info={"redelivered": False})


@pytest.mark.parametrize(("lease_left", "extra", "acks_late", "quick"), [
    (25, {}, False, True),                       # fresh: far from the 30 s lease's end
    (10, {}, False, False),                      # under half the lease left
    (25, {}, True, False),                       # acks_late always asks
    (25, {"redelivered": True}, False, False),   # kombu's restore marks the headers
])
def test_which_requests_start_quickly(make_app: Any, lease_left: float, extra: dict[str, Any],
                                      acks_late: bool, quick: bool) -> None:
    app = make_app(fair_quick_start=True, fair_lease_seconds=30)
    assert starts_quickly(app, _request(app, lease_left, **extra), acks_late) is quick


def test_a_redelivered_delivery_info_or_no_lease_header_asks(make_app: Any) -> None:
    app = make_app(fair_quick_start=True)
    redelivered = _request(app, 25)
    redelivered.delivery_info = {"redelivered": True}
    assert not starts_quickly(app, redelivered, acks_late=False)
    published = Context(headers={"fair_dispatch_id": "d1", "fair_queue": "q"},
                        delivery_info={})
    assert not starts_quickly(app, published, acks_late=False)
    app.conf.fair_quick_start = False
    reset_config(app)
    assert not starts_quickly(app, _request(app, 25), acks_late=False)


def test_the_setting_must_be_a_boolean(make_app: Any) -> None:
    from celery_fair.config import get_config
    from celery_fair.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="fair_quick_start"):
        get_config(make_app(fair_quick_start="sometimes"))


LEASE = 3
KILL_CONF: dict[str, Any] = {"fair_quick_start": True, "fair_lease_seconds": LEASE,
                             "worker_prefetch_multiplier": 1}


def test_a_quick_started_task_whose_worker_dies_runs_again_after_its_lease(
        make_app: Any, dispatcher: Any, redis_server: Any, namespace: str,
        tmp_path: Any) -> None:
    """The trade-off, end to end: the task started without begin, so its record kept
    the message; its worker is SIGKILLed mid-task; reclaim holds it again and a second
    worker runs it to its end (without the setting an acks-early task is lost here)."""
    app = make_app(**KILL_CONF)
    ledger, store, queue = app.ledger, store_for(app), app.conf.task_default_queue
    broker = redis_server.url + "/0"
    args = ["worker", "-P", "prefork", "-c", "1", "--without-mingle", "--without-gossip",
            "-l", "INFO"]
    first = CeleryProcess([*args, "-n", f"first-{namespace}@%h"], KILL_CONF, broker,
                          namespace, tmp_path / "first.log")
    procs = [first]
    with _shown_and_stopped(procs):
        result = app.tasks["proj.work"].delay("acme", "long", 4.0)
        with dispatcher(app):
            wait_for(lambda: labels(app) == ["long"], timeout=60, what="the task to start")
            # started without begin: its dispatch is still 'queued', not 'running'
            assert list(_dispatch_states(app).values()) == ["queued"]
            first.kill_group()
            wait_for(lambda: "superseded" in _dispatch_states(app).values(),
                     timeout=5 * LEASE, what="the lease to run out and the task held again")
            second = CeleryProcess([*args, "-n", f"second-{namespace}@%h"], KILL_CONF,
                                   broker, namespace, tmp_path / "second.log")
            procs.append(second)
            assert result.get(timeout=60) == "long"
            wait_for(lambda: settled(app), timeout=5 * LEASE, what="every slot released")
    assert ledger.runs() == {"long": 2}
    assert store.snapshot(queue)["inflight"] == 0
