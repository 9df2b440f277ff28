"""Celery features keep working for fair tasks: results, canvas, retries, ETA, eager mode.

Everything runs against the session's real redis-server with real in-thread workers and a
real dispatcher. Where a test needs to look at the store *between* two dispatches, it steps a
Dispatcher by hand instead of running its loop, so what it sees does not depend on timing.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import chain, chord, group, signals

from celery_fair import FairTask, fair_context
from celery_fair.dispatcher import Dispatcher
from celery_fair.envelope import Envelope
from celery_fair.task import store_for

from .conftest import wait_for
from .helpers import groups as _groups
from .helpers import held as _held
from .helpers import queue_of as _queue
from .helpers import settled as _settled
from .helpers import snapshot as _snapshot


def _held_envelope(app: Any, task_id: str) -> Envelope:
    store = store_for(app)
    value = store.client.hget(store.keys(_queue(app)).msg, task_id)
    assert value is not None, f"task {task_id} is not held"
    return Envelope.decode(value)[2]


def _namespace_keys(redis_client: Any, namespace: str) -> list[str]:
    return sorted(k.decode() for k in redis_client.keys(f"{namespace}:*"))


# -- results ------------------------------------------------------------------------------


def test_async_result_get(app, worker, dispatcher):
    add = app.tasks["proj.add"]
    with worker(concurrency=2), dispatcher():
        result = add.delay(20, 22)
        assert result.get(timeout=30) == 42
        # A fresh AsyncResult for the same id sees the same stored outcome.
        again = app.AsyncResult(result.id)
        assert again.state == "SUCCESS"
        assert again.get(timeout=5) == 42
    wait_for(lambda: _settled(app), what="slot released after the task")


def test_pending_while_held_then_completes(app, worker, dispatcher, redis_client):
    add = app.tasks["proj.add"]
    with worker(concurrency=2):
        result = add.delay(1, 2)
        # No dispatcher: the message is in its holding queue, not on the real queue.
        assert result.state == "PENDING"
        assert _held(app) == {"default": 1}
        assert redis_client.llen(_queue(app)) == 0
        assert _snapshot(app)["inflight"] == 0
        assert result.state == "PENDING"
        with dispatcher():
            assert result.get(timeout=30) == 3
        assert result.state == "SUCCESS"
    wait_for(lambda: _settled(app), what="store emptied")


# -- canvas -------------------------------------------------------------------------------


def test_chain_value_and_continuations_keep_the_group(app, worker, dispatcher):
    add, group_of = app.tasks["proj.add"], app.tasks["proj.group_of"]
    stepper = Dispatcher(app)
    with worker(concurrency=2):
        wait_for(lambda: store_for(app).worker_capacity(_queue(app), int(time.time() * 1000)),
                 what="worker capacity registered")
        result = chain(add.s(1, 2).set(fair_group="acme"), add.s(10), group_of.si()).delay()
        assert _held(app) == {"acme": 1}

        # Step the dispatcher by hand: each continuation is published by the worker and
        # must be held again, in the parent's group ('acme'), never in 'default'.
        assert stepper.step().dispatched == 1
        wait_for(lambda: _held(app) == {"acme": 1}, what="2nd step held in group acme")
        assert "default" not in _groups(app)
        assert stepper.step().dispatched == 1
        wait_for(lambda: _held(app) == {"acme": 1}, what="3rd step held in group acme")
        assert "default" not in _groups(app)

        with dispatcher():
            assert result.get(timeout=30) == "acme"  # group_of saw the inherited group
            assert result.parent.get(timeout=5) == 13
            assert result.parent.parent.get(timeout=5) == 3
    wait_for(lambda: _settled(app), what="store emptied")


def test_chain_of_numbers(app, worker, dispatcher):
    add = app.tasks["proj.add"]
    with worker(concurrency=2), dispatcher():
        assert chain(add.s(1, 2), add.s(3), add.s(4)).delay().get(timeout=30) == 10
    wait_for(lambda: _settled(app), what="store emptied")


def test_chord_callback_sum(app, worker, dispatcher):
    add, tsum = app.tasks["proj.add"], app.tasks["proj.tsum"]
    with worker(concurrency=4), dispatcher():
        result = chord([add.s(i, i) for i in range(10)], tsum.s()).delay()
        assert result.get(timeout=60) == sum(2 * i for i in range(10))
    wait_for(lambda: _settled(app), what="store emptied")


def test_chord_callback_held_in_the_header_group(app, worker, dispatcher):
    add, group_of = app.tasks["proj.add"], app.tasks["proj.group_of"]
    with worker(concurrency=4), dispatcher():
        header = [add.s(i, 1).set(fair_group="acme") for i in range(3)]
        assert chord(header, group_of.si()).delay().get(timeout=60) == "acme"
    wait_for(lambda: _settled(app), what="store emptied")


def test_group_of_fair_tasks(app, worker, dispatcher):
    add = app.tasks["proj.add"]
    with worker(concurrency=4):
        result = group(add.s(i, 100) for i in range(12)).apply_async()
        # Every member is held individually before anything runs.
        assert _held(app) == {"default": 12}
        with dispatcher():
            assert result.get(timeout=60) == [i + 100 for i in range(12)]
    wait_for(lambda: _settled(app), what="store emptied")


def test_link_callback_fires(app, worker, dispatcher, ledger):
    add, work, group_of = app.tasks["proj.add"], app.tasks["proj.work"], \
        app.tasks["proj.group_of"]
    callback, observer = add.s(1000), group_of.si()
    callback.freeze()
    observer.freeze()
    with worker(concurrency=2), dispatcher():
        result = add.apply_async((2, 3), fair_group="linker",
                                 link=[callback, work.si("acme", "linked"), observer])
        assert result.get(timeout=30) == 5
        assert _outcome(app, callback.id) == 1005
        # a callback without a group of its own is held in its parent's group
        assert _outcome(app, observer.id) == "linker"
        wait_for(lambda: ledger.runs() == {"linked": 1}, what="linked task ran")
    wait_for(lambda: _settled(app), what="store emptied")


def _outcome(app: Any, task_id: str) -> Any:
    """The result of a task the test did not start. (Not ``AsyncResult(id).get()``: on
    Celery 5.3, whose backend object is shared with the in-process worker's threads, a
    worker publishing several link callbacks registers their results there, and a get()
    from the test thread then waits on its own object forever.)"""
    result = app.AsyncResult(task_id)
    wait_for(result.ready, what=f"task {task_id} done")
    return result.result


def test_link_error_fires(app, worker, dispatcher):
    add, group_of = app.tasks["proj.add"], app.tasks["proj.group_of"]
    errback = group_of.si()
    errback.freeze()
    with worker(concurrency=2), dispatcher():
        result = add.apply_async((2, "x"), fair_group="failing", link_error=errback)
        with pytest.raises(TypeError):
            result.get(timeout=30)
        assert app.AsyncResult(errback.id).get(timeout=30) == "failing"
    wait_for(lambda: _settled(app), what="store emptied")


# -- retry and ETA ------------------------------------------------------------------------


def test_retry_with_countdown(app, worker, dispatcher, ledger):
    flaky = app.tasks["proj.flaky"]
    countdown = 1.0
    stepper = Dispatcher(app)
    with worker(concurrency=2):
        wait_for(lambda: store_for(app).worker_capacity(_queue(app), int(time.time() * 1000)),
                 what="worker capacity registered")
        result = flaky.delay("acme", 2, countdown)
        assert stepper.step().dispatched == 1

        # The first attempt fails and retries: the retry waits for its countdown in the
        # delayed set, in its group, and the first attempt's slot is free again.
        def waiting_for_countdown() -> bool:
            snap = _snapshot(app)
            groups = {g["group"]: g for g in snap["groups"]}
            return (snap["delayed"] == 1 and snap["inflight"] == 0
                    and groups.get("acme", {}).get("delayed") == 1
                    and groups["acme"]["held_background"] == 0)

        wait_for(waiting_for_countdown, what="retry in the delayed set, slot released")
        assert [s["label"] for s in ledger.starts()] == ["flaky-0"]
        retry = _held_envelope(app, result.id)
        assert retry.headers["retries"] == 1
        assert retry.headers["fair_group"] == "acme"

        with dispatcher():
            assert result.get(timeout=60) == 2  # succeeded on its second retry
    starts = ledger.starts()
    assert [s["label"] for s in starts] == ["flaky-0", "flaky-1", "flaky-2"]
    # The second retry went through the running dispatcher and still waited its countdown.
    assert starts[2]["t"] >= starts[1]["t"] + countdown - 0.01
    wait_for(lambda: _snapshot(app)["inflight"] == 0, what="no slot left in flight")
    wait_for(lambda: _settled(app), what="store emptied")


@pytest.mark.parametrize("how", ["countdown", "eta"])
def test_countdown_and_eta_are_held_until_due(app, worker, dispatcher, ledger, how):
    work = app.tasks["proj.work"]
    store = store_for(app)
    t0 = time.time()
    if how == "countdown":
        result = work.apply_async(("acme", "late"), countdown=1.5)
    else:
        result = work.apply_async(("acme", "late"),
                                  eta=datetime.now(timezone.utc) + timedelta(seconds=1.5))
    # Held in the delayed set, not in the group's queue.
    snap = _snapshot(app)
    assert snap["delayed"] == 1
    assert _groups(app)["acme"]["delayed"] == 1
    assert _held(app) == {}
    due_ms = store.client.zscore(store.keys(_queue(app)).delayed, result.id)
    assert due_ms is not None and due_ms >= (t0 + 1.5) * 1000 - 1
    eta = datetime.fromisoformat(_held_envelope(app, result.id).headers["eta"]).timestamp()
    assert eta >= t0 + 1.5 - 0.001

    with worker(concurrency=2), dispatcher():
        # Sample the store while the dispatcher runs: every sample whose read finished
        # before the due time must still show the message delayed and nothing run.
        samples = 0
        while True:
            snap = _snapshot(app)
            runs = ledger.runs()
            read_done = time.time()
            if read_done * 1000 >= due_ms:
                break
            assert snap["delayed"] == 1, "promoted before its ETA"
            assert runs == {}, "ran before its ETA"
            samples += 1
            time.sleep(0.05)  # sampling pace only; nothing waits on this
        assert result.get(timeout=30) == "late"
    assert samples > 0 or time.time() - t0 >= 1.5
    (start,) = ledger.starts()
    assert start["t"] >= eta
    wait_for(lambda: _settled(app), what="store emptied")


def test_task_that_expires_while_held_is_revoked_and_released(app, worker, dispatcher,
                                                               ledger):
    from celery.exceptions import TaskRevokedError

    work = app.tasks["proj.work"]
    # An absolute expiry: a relative one would start counting only once apply_async runs.
    expires_at = datetime.now(timezone.utc) + timedelta(seconds=1)
    result = work.apply_async(("acme", "too-late"), expires=expires_at)
    fresh = work.apply_async(("acme", "in-time"), expires=600)
    assert _held(app) == {"acme": 2}
    wait_for(lambda: datetime.now(timezone.utc) > expires_at + timedelta(seconds=0.1),
             what="the first task to expire")
    with worker(concurrency=2), dispatcher():
        assert fresh.get(timeout=30) == "in-time"
        with pytest.raises(TaskRevokedError):
            result.get(timeout=30)
        assert result.state == "REVOKED"
        # the revoked dispatch gave its slot back (task_revoked receiver)
        wait_for(lambda: _settled(app), what="revoked task's slot released")
    assert ledger.runs() == {"in-time": 1}


# -- modes and non-fair tasks -------------------------------------------------------------


def test_eager_mode_does_not_touch_the_store(make_app, redis_client, namespace):
    app = make_app(task_always_eager=True)
    add, work = app.tasks["proj.add"], app.tasks["proj.work"]
    assert add.delay(2, 3).get() == 5
    assert work.apply_async(("acme", "eager"), fair_group="other").get() == "eager"
    assert chain(add.s(1, 1), add.s(1)).delay().get() == 3
    assert app.ledger.runs() == {"eager": 1}
    assert _namespace_keys(redis_client, namespace) == []
    assert store_for(app).queues() == []


def test_plain_task_on_the_same_app_is_untouched(app, worker, redis_client, namespace):
    @app.task(name="proj.plain", shared=False)
    def plain(x: int) -> int:
        return x * 2

    assert not isinstance(plain, FairTask)
    with worker(concurrency=2):
        # No dispatcher runs: a plain task goes straight to the broker.
        assert plain.delay(21).get(timeout=30) == 42
        with fair_context(group="acme"):
            assert plain.delay(5).get(timeout=30) == 10
        assert store_for(app).queues() == []
        # The only celery_fair keys are the worker's capacity registration (with its start
        # and slot) and the wake-up it gives dispatchers: nothing held, delayed or in flight.
        prefix = store_for(app).keys(_queue(app)).prefix
        assert set(_namespace_keys(redis_client, namespace)) <= \
            {f"{prefix}:workers", f"{prefix}:wmeta", f"{prefix}:wake"}


def test_plain_task_headers_carry_no_fair_fields(app, worker):
    seen: list[dict[str, Any]] = []

    @app.task(name="proj.plain_headers", shared=False, bind=True)
    def plain_headers(self: Any) -> str:
        seen.append({k: getattr(self.request, k, None)
                     for k in ("fair_group", "fair_dispatch_id", "fair_queue")})
        return "ok"

    with worker(concurrency=1):
        assert plain_headers.delay().get(timeout=30) == "ok"
    assert seen == [{"fair_group": None, "fair_dispatch_id": None, "fair_queue": None}]


# -- group resolution ---------------------------------------------------------------------


def _group_of_call(app: Any, call: Any) -> str:
    """The one group whose held count grew by one when ``call()`` ran."""
    before = _held(app)
    call()
    after = _held(app)
    grown = {g: n - before.get(g, 0) for g, n in after.items() if n != before.get(g, 0)}
    assert list(grown.values()) == [1], f"expected exactly one new held message: {grown}"
    return next(iter(grown))


def test_group_resolution_precedence(app):
    work, add = app.tasks["proj.work"], app.tasks["proj.add"]

    @app.task(base=FairTask, fair_group=lambda args, kwargs: f"cb-{args[0]}", shared=False,
              name="proj.by_callable")
    def by_callable(n: int) -> int:
        return n

    cases = [
        # (expected group, call)
        ("acme", lambda: work.delay("acme", "a")),                    # argument name
        ("kw", lambda: work.apply_async(kwargs={"tenant": "kw"})),     # ... as a kwarg
        ("call", lambda: work.apply_async(("acme",), fair_group="call")),  # call time wins
        ("hdr", lambda: work.apply_async(("acme",), headers={"fair_group": "hdr"})),
        ("call", lambda: work.apply_async(("acme",), fair_group="call",
                                          headers={"fair_group": "hdr"})),
        ("cb-7", lambda: by_callable.delay(7)),                         # callable rule
        ("default", lambda: add.delay(1, 2)),                           # nothing: default
        ("acme", lambda: work.apply_async(("acme",), fair_group=None)),  # None: unresolved
        ("default", lambda: work.apply_async(kwargs={"tenant": None})),
        ("12345", lambda: work.delay(12345, "int-tenant")),            # int ids are names
    ]
    for expected, call in cases:
        assert _group_of_call(app, call) == expected

    with fair_context(group="ctx"):
        assert _group_of_call(app, lambda: add.delay(1, 2)) == "ctx"     # context
        assert _group_of_call(app, lambda: work.delay("acme")) == "acme"  # rule beats it
        assert _group_of_call(app, lambda: by_callable.delay(8)) == "cb-8"
        assert _group_of_call(app, lambda: add.apply_async((1, 2), fair_group="x")) == "x"
        # a rule that yields nothing falls through to the context
        assert _group_of_call(app, lambda: work.apply_async(kwargs={"tenant": None})) == "ctx"
        with fair_context(group="inner"):
            assert _group_of_call(app, lambda: add.delay(1, 2)) == "inner"
        assert _group_of_call(app, lambda: add.delay(1, 2)) == "ctx"
    assert _group_of_call(app, lambda: add.delay(1, 2)) == "default"

    assert set(_groups(app)) == {"acme", "kw", "call", "hdr", "cb-7", "cb-8", "default",
                                 "12345", "ctx", "x", "inner"}


def test_fair_context_is_per_thread(app):
    add = app.tasks["proj.add"]
    inside = threading.Event()
    release = threading.Event()

    def other_thread() -> None:
        with fair_context(group="thread-group"):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other_thread)
    t.start()
    try:
        assert inside.wait(10)
        # Another thread's context does not leak into this one.
        assert _group_of_call(app, lambda: add.delay(1, 2)) == "default"
    finally:
        release.set()
        t.join(10)


def test_default_group_setting_is_the_last_resort(make_app):
    app = make_app(fair_default_group="fallback")
    add, work = app.tasks["proj.add"], app.tasks["proj.work"]
    assert _group_of_call(app, lambda: add.delay(1, 2)) == "fallback"
    assert _group_of_call(app, lambda: work.delay("acme")) == "acme"
    with fair_context(group="ctx"):
        assert _group_of_call(app, lambda: add.delay(1, 2)) == "ctx"


UNICODE_GROUPS = ["租户-東京", "Ünïcødé café", "🚀-team", "مستأجر", "acme:{eu}/1 x", "ü" * 200]


def test_unicode_group_names_round_trip(app, worker, dispatcher, ledger):
    work, group_of = app.tasks["proj.work"], app.tasks["proj.group_of"]
    for i, name in enumerate(UNICODE_GROUPS):
        work.delay(name, f"u{i}")
    observed = [group_of.apply_async(fair_group=name) for name in UNICODE_GROUPS]
    assert _held(app) == {name: 2 for name in UNICODE_GROUPS}

    with worker(concurrency=4), dispatcher():
        assert [r.get(timeout=30) for r in observed] == UNICODE_GROUPS
        wait_for(lambda: len(ledger.runs()) == len(UNICODE_GROUPS), what="all work ran")
    assert ledger.runs() == {f"u{i}": 1 for i in range(len(UNICODE_GROUPS))}
    assert sorted(s["group"] for s in ledger.starts()) == sorted(UNICODE_GROUPS)
    wait_for(lambda: _settled(app), what="store emptied")


def test_postrun_state_of_fair_tasks_is_success(app, worker, dispatcher):
    """Fair tasks run through the normal tracer: postrun sees SUCCESS, not IGNORED."""
    states: list[str] = []

    def on_postrun(sender: Any = None, state: str | None = None, **_: Any) -> None:
        if sender is not None and sender.name == "proj.add":
            states.append(str(state))

    signals.task_postrun.connect(on_postrun, weak=False)
    try:
        add = app.tasks["proj.add"]
        with worker(concurrency=2), dispatcher():
            assert [r.get(timeout=30) for r in [add.delay(i, i) for i in range(3)]] == [0, 2, 4]
        wait_for(lambda: len(states) == 3, what="three postruns")
        assert states == ["SUCCESS"] * 3
    finally:
        signals.task_postrun.disconnect(on_postrun)


@pytest.mark.parametrize("tz", ["America/New_York", "Asia/Kolkata", "UTC"])
def test_naive_eta_is_utc_like_the_worker_reads_it(make_app, worker, dispatcher, tz):
    """Celery's worker reads a naive ETA as UTC whatever ``timezone`` says; so must the
    delayed set, or a task is held hours too long (or released hours early)."""
    app = make_app(timezone=tz)
    work = app.tasks["proj.work"]
    store = store_for(app)
    naive_eta = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=1.5)
    t0 = time.time()
    result = work.apply_async(("acme", "naive"), eta=naive_eta)
    due_ms = store.client.zscore(store.keys(_queue(app)).delayed, result.id)
    expected_ms = naive_eta.replace(tzinfo=timezone.utc).timestamp() * 1000
    assert due_ms is not None, "a task with an ETA in the future must wait in the delayed set"
    assert abs(due_ms - expected_ms) <= 1, \
        f"due {due_ms - t0 * 1000:+.0f} ms from now, expected about +1500 ms"
    with worker(concurrency=1, the_app=app), dispatcher(app):
        assert result.get(timeout=30) == "naive"
    (start,) = app.ledger.starts()
    assert start["t"] >= expected_ms / 1000 - 0.001
