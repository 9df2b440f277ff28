"""The dispatcher's loop (celery_fair/dispatcher.py) against a real Redis, real workers:
what an observer's failure, a store outage and wake-ups do to it."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import Counter
from typing import Any, Callable

import pytest
from celery import Celery

from celery_fair.dispatcher import MAX_BACKOFF_SECONDS
from celery_fair.envelope import Envelope
from celery_fair.schedule import PRUNE_SECONDS
from celery_fair.store.base import Placement
from celery_fair.store.keys import queues_key
from celery_fair.store.redis import RedisStore
from celery_fair.task import store_for
from celery_fair.testing import RedisServer

from .conftest import wait_for
from .helpers import queue_of, wait_settled


def _records(caplog: Any, text: str, level: int = logging.WARNING) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "celery_fair.dispatcher"
            and r.levelno == level and text in r.getMessage()]


# -- observers (metrics) -------------------------------------------------------------------

class RaisingObserver:
    """An observer whose every hook fails, as metrics do when their Redis read fails."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def on_dispatch(self, queue: str, group: str, klass: str, due_at: float | None) -> None:
        self.calls["dispatch"] += 1
        raise RuntimeError("metrics: top_groups failed")

    def on_reclaim(self, queue: str, requeued: int, lost: int) -> None:
        self.calls["reclaim"] += 1
        raise RuntimeError("metrics: reclaim hook failed")

    def on_step(self, seconds: float) -> None:
        self.calls["step"] += 1
        raise RuntimeError("metrics: step hook failed")


@pytest.mark.parametrize("direct_push", [True, False], ids=["direct-push", "publish"])
def test_an_observer_that_raises_never_stops_dispatching(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        dispatcher: Callable[..., Any], caplog: Any, direct_push: bool) -> None:
    app = make_app(fair_direct_push=direct_push)
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    observer = RaisingObserver()
    work = app.tasks["proj.work"]
    labels = [f"t{i % 3}-{i}" for i in range(30)]
    running = dispatcher(app)
    running.dispatcher.observer = observer
    with worker(concurrency=4, the_app=app), running:
        results = [work.delay(label.split("-")[0], label) for label in labels]
        assert sorted(r.get(timeout=30) for r in results) == sorted(labels)
        wait_settled(app)  # every slot released: each dispatch was confirmed and ran
    assert app.ledger.runs() == {label: 1 for label in labels}  # type: ignore[attr-defined]
    # each dispatch was still reported (the log says by which path, should one be missed)
    assert observer.calls["dispatch"] == len(labels), _dispatch_lines(caplog)
    # no step failed, so no backoff and no reclaim of unconfirmed picks
    assert not _records(caplog, "dispatcher step failed"), caplog.text
    assert not _records(caplog, "reclaimed"), caplog.text
    # the observer's failure: one warning for the whole burst, not one per message
    assert len(_records(caplog, "observer (metrics) failed")) == 1, caplog.text


def _dispatch_lines(caplog: Any) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if "dispatch" in r.getMessage())


# -- a store outage -------------------------------------------------------------------------

@pytest.fixture
def store_server() -> Any:
    server = RedisServer()
    yield server
    server.stop()


@pytest.mark.parametrize("known", [False, True], ids=["no-queue-yet", "serving-a-queue"])
def test_a_store_outage_is_logged_once_and_retries_back_off_to_the_cap(
        make_app: Callable[..., Celery], dispatcher: Callable[..., Any],
        store_server: RedisServer, caplog: Any, known: bool) -> None:
    """While the store is away every retry fails; the waits between them double up to
    MAX_BACKOFF_SECONDS (each failure's log line names the wait before the next try, and
    the records' timestamps show it was waited out) and the outage is one warning when it
    starts and one when it ends: the dispatcher never flips between "failed" and "works
    again" in between."""
    app = make_app(fair_store_url=store_server.url + "/0")
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    if known:  # one fair queue held into (no worker: it stays held)
        app.tasks["proj.work"].delay("acme", "held")
    with dispatcher(app):
        wait_for(lambda: _records(caplog, "dispatcher started", logging.INFO),
                 what="the dispatcher to start")
        if known:
            wait_for(lambda: _records(caplog, "serving fair queue", logging.INFO),
                     what="the dispatcher to serve the queue")
        store_server.halt()

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "celery_fair.dispatcher"
                    and r.getMessage().startswith("dispatcher step failed")]

        # 0.1 + 0.2 + ... + 3.2 s waited between the first seven: about 6 s, and the
        # store's own retries (fair_store_retries) on each attempt
        wait_for(lambda: len(failures()) >= 7, timeout=60, interval=0.05,
                 what="seven failed attempts")
        store_server.start()
        wait_for(lambda: _records(caplog, "dispatcher step works again"), timeout=30,
                 what="the dispatcher to notice the store is back")
    records = failures()[:7]
    waits = [float(re.search(r"\(now ([\d.]+)s", r.getMessage()).group(1))  # type: ignore[union-attr]
             for r in records]
    [back] = _records(caplog, "dispatcher step works again")
    gaps = [b.created - a.created for a, b in zip(records, [*records[1:], back])]
    assert len(_records(caplog, "dispatcher step failed")) == 1, caplog.text
    assert len(_records(caplog, "dispatcher step works again")) == 1, caplog.text
    # the waits double from 0.1 s up to the cap, and no further (doubling would be 6.4 s)...
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, MAX_BACKOFF_SECONDS]
    # ...and each was waited out before the next try: the next failure comes no sooner.
    # (How much later depends on the store's own retries inside each try and on the
    # machine's load, so only the lower bound is the dispatcher's.)
    assert all(gap >= wait * 0.95 for wait, gap in zip(waits, gaps)), (waits, gaps)


# -- wake-ups and the working set -----------------------------------------------------------

class Clock:
    """A monotonic clock the test moves by hand (the dispatcher's ``clock``): time-driven
    work (periodic steps, refreshes, pruning) happens only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class CountingStore(RedisStore):
    """The real store, counting the store calls a dispatcher step makes per queue."""

    def __init__(self, store: RedisStore) -> None:
        super().__init__(store.client, store.namespace)
        self.calls: Counter[str] = Counter()
        self.steps: Counter[str] = Counter()  # the step's own round trips

    def promote_reclaim_pick(self, queue: str, *args: Any, **kw: Any) -> Any:
        self.calls[queue] += 1
        self.steps[queue] += 1
        return super().promote_reclaim_pick(queue, *args, **kw)

    def worker_capacity(self, queue: str, now_ms: int) -> int:
        self.calls[queue] += 1
        return super().worker_capacity(queue, now_ms)

    def confirm(self, queue: str, *args: Any, **kw: Any) -> Any:
        self.calls[queue] += 1
        return super().confirm(queue, *args, **kw)


def _value(queue: str, task_id: str) -> bytes:
    envelope = Envelope(body=b"[]", content_type="application/json",
                        content_encoding="utf-8", headers={"id": task_id, "task": "t"},
                        exchange="", routing_key=queue, queue=queue)
    return envelope.encode("acme", "b", 1, False)


#: Where ``_value`` goes.
ACME = Placement("acme", "b", 1, False)


def _hold(store: RedisStore, queue: str) -> None:
    """Hold a message as another process would (its own store object)."""
    task_id = uuid.uuid4().hex
    RedisStore(store.client, store.namespace).hold(queue, task_id, _value(queue, task_id),
                                                   ACME, 0, int(time.time() * 1000))


def test_wait_returns_the_queue_that_was_woken(app: Celery) -> None:
    store, queue = store_for(app), queue_of(app)
    names = [f"{queue}-{i}" for i in range(5)]
    _hold(store, names[3])
    assert store.wait(names, 1.0) == {names[3]}
    assert store.wait(names, 0.01) == set()  # the marker was taken
    # no timeout: a look without blocking, taking every marker there
    _hold(store, names[1])
    _hold(store, names[4])
    assert store.wait(names, 0) == {names[1], names[4]}
    assert store.wait(names, 0) == set()


def test_one_wake_up_steps_only_the_woken_queue(app: Celery,
                                                dispatcher: Callable[..., Any]) -> None:
    store, queue = store_for(app), queue_of(app)
    names = [f"{queue}-{i}" for i in range(50)]
    store.client.sadd(queues_key(store.namespace), *names)  # 50 known queues, all idle
    counting = CountingStore(store)
    running = dispatcher(app)
    running.dispatcher.store = counting
    running.dispatcher.clock = Clock()  # held still: nothing becomes due by time
    with running:
        wait_for(lambda: set(counting.steps) >= set(names),
                 what="the first step over every known queue")
        # Serving a queue configures it, which wakes it: let those wake-ups be taken,
        # then one more as a barrier (they are taken one at a time, in order).
        wakes = [store.keys(name).wake for name in names]
        wait_for(lambda: not store.client.exists(*wakes), what="the first wake-ups taken")
        _hold(store, names[0])
        wait_for(lambda: counting.steps[names[0]] >= 3, what="the barrier's wake-up")
        counting.calls.clear()
        counting.steps.clear()
        _hold(store, names[7])
        wait_for(lambda: counting.steps[names[7]], what="the woken queue to be stepped")
        # a second wake-up as a barrier: whatever the first caused has been done by now
        _hold(store, names[9])
        wait_for(lambda: counting.steps[names[9]], what="the second woken queue")
    assert set(counting.calls) == {names[7], names[9]}, counting.calls


def test_an_idle_queue_is_pruned_past_the_horizon_and_a_hold_brings_it_back(
        app: Celery, dispatcher: Callable[..., Any], caplog: Any) -> None:
    store, queue = store_for(app), queue_of(app)
    idle, holding = f"{queue}-idle", f"{queue}-holding"
    store.client.sadd(queues_key(store.namespace), idle)
    _hold(store, holding)  # no worker: its message stays held
    caplog.set_level(logging.INFO, logger="celery_fair.dispatcher")
    clock = Clock()
    running = dispatcher(app)
    running.dispatcher.clock = clock

    def serving(name: str) -> int:
        return len(_records(caplog, f"serving fair queue {name}", logging.INFO))

    steps, step = [], running.dispatcher.step

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = step(*args, **kwargs)
        steps.append(result)
        return result

    running.dispatcher.step = counted  # type: ignore[method-assign]
    with running:
        wait_for(lambda: serving(idle) and serving(holding), what="both queues served")
        # Serving a queue wakes it (configure.lua): those wake-ups must be taken before the
        # clock moves, or the queue taking one after counts as active then (not prunable).
        wait_for(lambda: not store.client.exists(store.keys(idle).wake,
                                                 store.keys(holding).wake),
                 what="the wake-ups of serving them taken")
        taken = len(steps)
        wait_for(lambda: len(steps) > taken, what="a step after them")
        clock.now += PRUNE_SECONDS + 1
        wait_for(lambda: idle not in store.queues(), timeout=15,
                 what="the idle queue to be pruned from the set of fair queues")
        wait_for(lambda: _records(caplog, f"queue {idle}: nothing", logging.INFO),
                 what="the dispatcher to drop it from its working set")
        assert holding in store.queues()  # it holds a message: never pruned
        _hold(store, idle)
        assert idle in store.queues()
        clock.now += 60  # the next refresh of the queue set
        wait_for(lambda: serving(idle) == 2, what="the dispatcher to serve it again")
    assert not _records(caplog, f"queue {holding}: nothing", logging.INFO)


def test_forget_keeps_a_queue_with_anything_held_delayed_in_flight_or_quarantined(
        app: Celery) -> None:
    store, queue = store_for(app), queue_of(app)
    now = int(time.time() * 1000)
    every = queues_key(store.namespace)
    cases = {"held": lambda q: store.hold(q, "h", _value(q, "h"), ACME, 0, now),
             "delayed": lambda q: store.hold(q, "d", _value(q, "d"), ACME, now + 60_000, now),
             "in-flight": lambda q: (store.hold(q, "f", _value(q, "f"), ACME, 0, now),
                                     store.pick(q, 1, None, now, 10_000)),
             "quarantined": lambda q: store.quarantine(q, "x", b"junk", "test")}
    for case, fill in cases.items():
        name = f"{queue}-{case}"
        fill(name)
        store.client.sadd(every, name)
        assert store.forget_queue(name) is False, case
        assert store.client.sismember(every, name), case
    empty = f"{queue}-empty"
    store.client.sadd(every, empty)
    assert store.forget_queue(empty) is True
    assert not store.client.sismember(every, empty)
