"""Outages: the store's Redis or the dispatcher's broker goes away and comes back while a
dispatcher and a worker run. Nothing crashes, nothing spins, each side logs one line when
the outage starts and one when it ends, and every task runs.

The store (or broker) here is a redis-server of the test's own, stopped and restarted on
the same port with its data (append-only file, fsync always); the rest of the test
project stays on the session's server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery

from celery_fair.check import check
from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import StoreConnectionError
from celery_fair.store.base import BeginResult
from celery_fair.task import DISPATCH_HEADER, QUEUE_HEADER, store_for
from celery_fair.testing import RedisServer
from celery_fair.worker import pending_releases, release_dispatch

from .conftest import wait_for
from .proj import create_app

LOGGERS = ("celery_fair.dispatcher", "celery_fair.worker", "celery_fair.task")


@pytest.fixture
def outage_server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly="yes", appendfsync="always")
    yield server
    server.stop()


def messages(caplog: Any, text: str, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name in LOGGERS and r.levelno == level and text in r.getMessage()]


def test_store_restart_under_dispatcher_and_worker(make_app: Callable[..., Celery],
                                                   worker: Callable[..., Any],
                                                   dispatcher: Callable[..., Any],
                                                   outage_server: RedisServer,
                                                   caplog: Any) -> None:
    # Renewals every 4 s, so that the lease keeper meets the outage.
    app = make_app(fair_store_url=outage_server.url + "/0", fair_lease_seconds=12,
                   fair_default_concurrency=2)
    ledger, work = app.ledger, app.tasks["proj.work"]  # type: ignore[attr-defined]
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    store, queue = store_for(app), app.conf.task_default_queue
    labels = [f"{g}-{i}" for g in ("acme", "globex", "initech") for i in range(4)]
    with worker(concurrency=3, the_app=app), dispatcher(app):
        results = [work.delay(label.split("-")[0], label, 0.4) for label in labels]
        wait_for(lambda: len(ledger.starts()) >= 2, what="tasks to start")
        outage_server.halt()
        with pytest.raises(StoreConnectionError) as info:
            work.delay("acme", "during the outage")
        assert outage_server.url in str(info.value), str(info.value)
        # tasks that were running finish during the outage: their releases fail
        started = len(ledger.starts())
        wait_for(lambda: ledger.ends() >= started, what="running tasks to end")
        wait_for(lambda: messages(caplog, "lease renewal failed"), timeout=10,
                 what="the lease keeper to notice")
        # Kept, not dropped. The retry thread takes them out while it tries again (up to
        # the store's retry backoff, about 0.7 s a try): look between its tries.
        wait_for(lambda: len(pending_releases) > 0, timeout=10,
                 what="the failed releases to be kept")
        outage_server.start()
        assert sorted(r.get(timeout=60) for r in results) == sorted(labels)
        wait_for(lambda: not len(pending_releases), timeout=10,
                 what="the pending releases to be retried")
        wait_for(lambda: store.snapshot(queue)["inflight"] == 0, timeout=10,
                 what="every slot back")
        report = check(app)
        assert report.ok, str(report)
    for what in ("dispatcher step", "releasing slots", "lease renewal"):
        assert len(messages(caplog, f"{what} failed")) == 1, (what, caplog.text)
    assert len(messages(caplog, "dispatcher step works again")) == 1
    assert len(messages(caplog, "releasing slots works again")) == 1
    # backoff, not a busy loop: the outage lasted about a second or more
    retries = messages(caplog, "dispatcher step failed again", logging.DEBUG)
    assert len(retries) < 40, len(retries)
    assert sorted(ledger.runs()) == sorted(labels)


def test_a_failed_release_lands_soon_after_the_store_is_back(
        make_app: Callable[..., Celery], outage_server: RedisServer) -> None:
    """A release marks its task done, so a redelivered copy is skipped: one that failed in
    the outage is retried by a thread of its process as soon as the store is back, not
    only at that process's next release."""
    app = make_app(fair_store_url=outage_server.url + "/0", fair_max_inflight=1)
    store, queue = store_for(app), app.conf.task_default_queue
    app.tasks["proj.work"].delay("acme", "once")
    assert Dispatcher(app).step().dispatched == 1
    [did] = [d.decode() for d in store.client.zrange(store.keys(queue).leases, 0, -1)]
    assert store.begin(queue, did, int((time.time() + 60) * 1000), acks_late=True) \
        is BeginResult.RUN
    outage_server.halt()
    release_dispatch(app, {DISPATCH_HEADER: did, QUEUE_HEADER: queue}, "test", done=True)
    assert len(pending_releases) == 1  # kept, not dropped
    outage_server.start()
    # The retry thread takes a release out of the pending ones before it sends it: wait
    # for it to land, not for the pending count to drop.
    wait_for(lambda: store.dispatch_state(queue, did) == "released", timeout=10,
             what="the retry thread to land the release")
    assert not len(pending_releases)
    assert store.queue_figures(queue).inflight == 0


def test_store_down_at_publish_raises_naming_the_store(make_app: Callable[..., Celery],
                                                       outage_server: RedisServer,
                                                       redis_client: redis.Redis) -> None:
    app = make_app(fair_store_url=outage_server.url + "/0")
    outage_server.halt()
    with pytest.raises(StoreConnectionError) as info:
        app.tasks["proj.work"].delay("acme", "x")
    assert f"{outage_server.url}/0" in str(info.value)
    assert redis_client.llen(app.conf.task_default_queue) == 0  # nothing sent either


def test_on_store_error_publish_sends_straight_to_the_broker(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        outage_server: RedisServer, caplog: Any) -> None:
    app = make_app(fair_store_url=outage_server.url + "/0", fair_on_store_error="publish")
    work = app.tasks["proj.work"]
    caplog.set_level(logging.WARNING, logger="celery_fair")
    store, queue = store_for(app), app.conf.task_default_queue
    outage_server.halt()
    with worker(concurrency=2, the_app=app):
        results = [work.delay("acme", f"unfair-{i}") for i in range(3)]
        assert [r.get(timeout=30) for r in results] == [f"unfair-{i}" for i in range(3)]
    [line] = messages(caplog, "holding fair tasks failed")
    assert "straight to the broker" in line and outage_server.url in line
    outage_server.start()
    work.delay("acme", "fair again")
    assert store.snapshot(queue)["groups"][0]["held_background"] == 1
    assert len(messages(caplog, "holding fair tasks works again")) == 1


def test_broker_restart_under_dispatcher(redis_server: RedisServer, namespace: str,
                                         worker: Callable[..., Any],
                                         dispatcher: Callable[..., Any],
                                         outage_server: RedisServer, caplog: Any) -> None:
    """The dispatcher's broker goes away: publishes fail, the picked messages are held
    again when their pick lease runs out, and all run once the broker is back."""
    store_url = redis_server.url + "/0"
    app = create_app(outage_server.url + "/0", namespace, "q-" + namespace, store=store_url,
                     fair_max_inflight=4)
    reset_config(app)
    work = app.tasks["proj.work"]
    caplog.set_level(logging.DEBUG, logger="celery_fair.dispatcher")
    with dispatcher(app):
        outage_server.halt()
        results = [work.delay(g, f"{g}-{i}") for g in ("acme", "globex") for i in range(3)]
        wait_for(lambda: len(messages(caplog, "dispatcher step failed again",
                                      logging.DEBUG)) >= 3, what="a few failed steps")
        outage_server.start()
        with worker(concurrency=2, the_app=app):
            assert sorted(r.get(timeout=60) for r in results) == sorted(
                f"{g}-{i}" for g in ("acme", "globex") for i in range(3))
            wait_for(lambda: check(app).ok, timeout=10, what="a clean check")
    [line] = messages(caplog, "dispatcher step failed")
    assert "retrying with backoff" in line
    assert len(messages(caplog, "dispatcher step works again")) == 1


def test_rabbitmq_connection_lost_under_dispatcher(redis_server: RedisServer, namespace: str,
                                                   worker: Callable[..., Any],
                                                   dispatcher: Callable[..., Any],
                                                   caplog: Any) -> None:
    """On RabbitMQ: the dispatcher's connection is closed by the broker and reconnecting is
    refused for a while (a vhost of the test's own whose permissions are revoked, then
    restored; the shared server is never restarted)."""
    from .conftest import RabbitVhost

    vhost = RabbitVhost()
    try:
        app = create_app(vhost.url, namespace, "q-" + namespace,
                         store=redis_server.url + "/0", fair_max_inflight=4)
        reset_config(app)
        work = app.tasks["proj.work"]
        caplog.set_level(logging.DEBUG, logger="celery_fair.dispatcher")
        with dispatcher(app):
            work.delay("acme", "before")  # the dispatcher connects and publishes
            wait_for(lambda: store_for(app).snapshot("q-" + namespace)["inflight"] == 1,
                     what="the first dispatch")
            vhost._ctl("clear_permissions", "-p", vhost.name, "guest")
            vhost._ctl("close_all_connections", "--vhost", vhost.name, "celery-fair test")
            results = [work.delay(g, f"{g}-{i}") for g in ("acme", "globex") for i in range(3)]
            wait_for(lambda: len(messages(caplog, "dispatcher step failed again",
                                          logging.DEBUG)) >= 3, what="a few failed steps")
            vhost._ctl("set_permissions", "-p", vhost.name, "guest", ".*", ".*", ".*")
            with worker(concurrency=2, the_app=app):
                assert sorted(r.get(timeout=60) for r in results) == sorted(
                    f"{g}-{i}" for g in ("acme", "globex") for i in range(3))
                wait_for(lambda: check(app).ok, timeout=20, what="a clean check")
        assert len(messages(caplog, "dispatcher step failed,")) == 1, caplog.text
        assert len(messages(caplog, "dispatcher step works again")) == 1
    finally:
        vhost.delete()
