"""Singleton keys end to end (issue 14 item 4): real Celery worker processes (two of 4
threads: 8 slots), a real dispatcher, the real Redis store (and, for the 500 tasks, the
SQL store on PostgreSQL). Each task records its start
and end per key in the ledger (tests/proj.py ``proj.single``: an atomic count of the
key's tasks running, and the highest seen), so "never two of one key at once" is checked
inside the tasks themselves. And a worker SIGKILLed mid-task frees its key through the
lease: the key's next tasks run on another worker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_fair import FairTask
from celery_fair.errors import InvalidOption
from celery_fair.store.redis import now_ms
from celery_fair.task import fair_task, store_for

from .conftest import wait_for
from .procs import CeleryProcess

KEYS, TASKS, TENANTS = 20, 500, 4
PER_KEY = TASKS // KEYS
LEASE = 3
CONF: dict[str, Any] = {"fair_lease_seconds": LEASE, "worker_prefetch_multiplier": 1}


@contextmanager
def workers(app: Any, namespace: str, tmp_path: Any, names: list[str],
            threads: int = 4, conf: dict[str, Any] = CONF,
            also: str | None = None) -> Iterator[list[CeleryProcess]]:
    """Worker processes (``-P threads -c threads`` each, consuming the default queue and
    ``also``), registered with the store (the app's: Redis, or the SQL store of
    ``store_backend``)."""
    conf = {**conf, "fair_store_url": app.conf.fair_store_url}
    queue = app.conf.task_default_queue
    broker = app.conf.broker_url
    consumed = f"{queue},{also}" if also else queue
    procs = [CeleryProcess(["worker", "-P", "threads", "-c", str(threads), "-Q", consumed,
                            "--without-mingle", "--without-gossip", "-l", "INFO",
                            "-n", f"{name}-{namespace}@%h"], conf, broker, namespace,
                           tmp_path / f"{name}.log") for name in names]
    try:
        store = store_for(app)
        wait_for(lambda: store.worker_capacity(queue, now_ms()) == threads * len(procs)
                 or not all(p.alive() for p in procs), timeout=60, what="workers registered")
        assert all(p.alive() for p in procs), [p.output() for p in procs]
        yield procs
    finally:
        for p in procs:
            p.stop()


def test_500_tasks_over_20_keys_on_8_slots_one_per_key_at_a_time(
        make_app: Any, dispatcher: Any, namespace: str, tmp_path: Any,
        store_backend: str) -> None:
    """On Redis and on the SQL store on PostgreSQL, two dispatchers racing."""
    app = make_app(**CONF)
    single, ledger = app.tasks["proj.single"], app.ledger
    # key after key (job n has key n // PER_KEY): without the keys, a key's tasks would
    # fill the slots together
    results = [single.delay(f"t{n // PER_KEY % TENANTS}", f"doc{n // PER_KEY}", f"job{n}",
                            0.01) for n in range(TASKS)]
    # two dispatchers race for the queue (on PostgreSQL: for its rows)
    with workers(app, namespace, tmp_path, ["w1", "w2"]), dispatcher(app), dispatcher(app):
        for r in results:
            r.get(timeout=120)
    assert ledger.runs() == {f"job{n}": 1 for n in range(TASKS)}  # each ran, once
    most = ledger.max_running()
    assert set(most) == {f"key:doc{k}" for k in range(KEYS)}
    assert set(most.values()) == {1}, most  # never two of one key at once
    assert ledger.max_all() > 1  # while the keys ran side by side
    # a key's tasks start in the order they were published
    order = [s["label"] for s in ledger.starts()]
    for k in range(KEYS):
        mine = [int(label[3:]) for label in order if int(label[3:]) // PER_KEY == k]
        assert mine == sorted(mine), f"doc{k} started out of order: {mine}"


def test_a_key_spans_queues_one_at_a_time_across_them(
        make_app: Any, dispatcher: Any, namespace: str, tmp_path: Any,
        store_backend: str) -> None:
    """A key's scope is the app: the tasks of each key go to two fair queues (every
    other one to the second), and still never two of a key run at once, in the order
    they were published (the key's waiting list is the namespace's)."""
    app = make_app(**CONF)
    single, ledger = app.tasks["proj.single"], app.ledger
    other = f"{app.conf.task_default_queue}-two"
    results = [single.apply_async((f"t{n // PER_KEY % TENANTS}", f"doc{n // PER_KEY}",
                                   f"job{n}", 0.01), queue=other if n % 2 else None)
               for n in range(TASKS)]
    with workers(app, namespace, tmp_path, ["w1", "w2"], also=other), dispatcher(app):
        for r in results:
            r.get(timeout=120)
    assert ledger.runs() == {f"job{n}": 1 for n in range(TASKS)}
    store = store_for(app)
    assert {q: store.snapshot(q)["inflight"] for q in (app.conf.task_default_queue, other)} \
        == {app.conf.task_default_queue: 0, other: 0}
    most = ledger.max_running()
    assert set(most) == {f"key:doc{k}" for k in range(KEYS)}
    assert set(most.values()) == {1}, most  # never two of one key at once, in any queue
    assert ledger.max_all() > 1
    order = [s["label"] for s in ledger.starts()]
    for k in range(KEYS):
        mine = [int(label[3:]) for label in order if int(label[3:]) // PER_KEY == k]
        assert mine == sorted(mine), f"doc{k} started out of order: {mine}"


@pytest.mark.parametrize("acks_late", [False, True])
def test_a_killed_worker_frees_its_key_through_the_lease(
        make_app: Any, dispatcher: Any, namespace: str, tmp_path: Any,
        acks_late: bool) -> None:
    """Acks early: the killed run is lost (as in Celery) and the key passes on. Acks
    late: the run is held again keeping its key, runs again first, then the others.
    (The ledger's count of the killed run never came down, so only the order is read.)"""
    conf = {**CONF, "task_acks_late": acks_late}
    app = make_app(**conf)
    single, ledger = app.tasks["proj.single"], app.ledger
    queue = app.conf.task_default_queue
    long = single.delay("t0", "doc", "long", 3 if acks_late else 60)
    after = [single.delay("t0", "doc", f"next{n}", 0) for n in range(2)]
    with dispatcher(app):
        with workers(app, namespace, tmp_path, ["doomed"], 2, conf) as [doomed]:
            wait_for(lambda: [s["label"] for s in ledger.starts()] == ["long"], timeout=60,
                     what="the long task to start")
            doomed.kill_group()  # no release: only the lease can free the key
        assert long.state != "SUCCESS"
        store = store_for(app)
        assert store.snapshot(queue)["inflight"] == 1  # the key is still taken
        with workers(app, namespace, tmp_path, ["heir"], 2, conf):
            for r in after:
                r.get(timeout=10 * LEASE)
            if acks_late:
                assert long.get(timeout=10 * LEASE) == "long"
    again = ["long"] if acks_late else []
    assert [s["label"] for s in ledger.starts()] == ["long", *again, "next0", "next1"]


@pytest.mark.parametrize("countdown", [0, 0.3])
def test_a_retry_keeps_its_key(make_app: Any, worker: Any, dispatcher: Any,
                               countdown: float) -> None:
    """A retry is published while its key's dispatch still runs: it waits for the key
    (first among its waiters when held at once; when due, after the countdown), and the
    key is never taken twice nor left taken."""
    app = make_app()
    flaky, single, ledger = app.tasks["proj.single_flaky"], app.tasks["proj.single"], \
        app.ledger
    first = flaky.delay("t0", "doc", "first", 1, countdown)
    later = single.delay("t0", "doc", "later")
    with worker(concurrency=4, the_app=app), dispatcher(the_app=app):
        assert first.get(timeout=60) == "first" and later.get(timeout=60) == "later"
    starts = [s["label"] for s in ledger.starts()]
    if countdown:  # the key passed to `later` while the retry waited out its countdown
        assert starts == ["first-0", "later", "first-1"]
    else:  # held at once, first among the key's waiters
        assert starts == ["first-0", "first-1", "later"]
    assert ledger.max_running() == {"key:doc": 1}
    [g] = store_for(app).snapshot(app.conf.task_default_queue)["groups"] or [None]
    assert g is None or g["inflight"] == 0


def test_drop_marks_revoked_with_a_log_line(make_app: Any, caplog: Any) -> None:
    app = make_app()

    @app.task(base=FairTask, shared=False, name="proj.refresh", fair_group="tenant",
              fair_singleton="tenant", fair_singleton_mode="drop")
    def refresh(tenant: str) -> None:
        return None

    first = refresh.delay("acme")
    with caplog.at_level(logging.INFO, logger="celery_fair.task"):
        second = refresh.delay("acme")
    assert first.state == "PENDING"  # held, waiting
    assert second.state == "REVOKED"
    assert any(second.id in r.getMessage() and "'acme'" in r.getMessage()
               for r in caplog.records), caplog.text
    other = refresh.delay("globex")  # another key: held
    assert other.state == "PENDING"
    assert store_for(app).snapshot(app.conf.task_default_queue)["held_background"] == 2


def test_bad_singleton_options_are_refused_before_anything_is_held(make_app: Any) -> None:
    with pytest.raises(InvalidOption, match="singleton='nope' is not an argument"):
        fair_task(group="tenant", singleton="nope")(lambda tenant, doc: None)
    with pytest.raises(InvalidOption, match="singleton_mode='later' is invalid"):
        fair_task(group="tenant", singleton="doc", singleton_mode="later")
    app = make_app()
    single = app.tasks["proj.single"]
    with pytest.raises(InvalidOption, match="fair_singleton_mode='never'"):
        single.apply_async(("t", "d"), fair_singleton_mode="never")
    with pytest.raises(InvalidOption, match="singleton key"):
        single.apply_async(("t", ""))  # an empty key
    with pytest.raises(InvalidOption, match="did you mean 'fair_singleton'"):
        single.apply_async(("t", "d"), fair_singletn="x")
    assert store_for(app).snapshot(app.conf.task_default_queue)["held_background"] == 0
