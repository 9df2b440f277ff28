"""Task options work for fair tasks as they do in plain Celery — on Redis and on RabbitMQ.

Each test makes the same call through a fair task and through its plain twin
(tests/twins.py) and asserts the same return value and state; where the hold itself must
do something (an ETA's due time, an expiry while held), it steps a Dispatcher by hand so
the assertion does not depend on timing.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.exceptions import TimeLimitExceeded

from celery_fair.dispatcher import Dispatcher
from celery_fair.envelope import Envelope
from celery_fair.task import store_for

from . import twins
from .conftest import wait_for
from .procs import CeleryProcess

pytestmark = pytest.mark.timeout(240)


def _compare(app: Any, worker: Any, dispatcher: Any, fair: Any, plain: Any,
             args: tuple[Any, ...] = ("x",), **options: Any) -> tuple[Any, Any]:
    """Run one call through the fair twin and the plain twin; return both answers."""
    with worker(concurrency=2, the_app=app), dispatcher(app):
        got_fair = fair.apply_async(args, **options)
        got_plain = plain.apply_async(args, **options)
        answers = got_fair.get(timeout=60), got_plain.get(timeout=60)
        assert got_fair.state == got_plain.state == "SUCCESS"
    wait_for(lambda: twins.settled(app), what="the fair queue to settle")
    return answers


def _held(app: Any, task_id: str) -> Envelope:
    store = store_for(app)
    value = store.client.hget(store.keys(twins.queue_of(app)).msg, task_id)
    assert value is not None, f"task {task_id} is not held"
    return Envelope.decode(value)[2]


# -- headers, shadow, limits as message fields -------------------------------------------


def test_custom_headers_shadow_and_limits_survive(broker, app, worker, dispatcher):
    fair, plain = twins.register(app)
    fair_answer, plain_answer = _compare(
        app, worker, dispatcher, fair, plain, ("hdr",),
        headers={"x_trace": "abc-123", "tenant_hint": 7}, shadow="renamed.task",
        time_limit=30, soft_time_limit=20)
    assert fair_answer == plain_answer
    assert fair_answer["custom"] == {"x_trace": "abc-123", "tenant_hint": 7}
    assert fair_answer["shadow"] == "renamed.task"
    assert fair_answer["timelimit"] == [30, 20]


@pytest.mark.parametrize("compression, content_type", [
    ("gzip", "application/x-gzip"), ("zlib", "application/x-gzip"),  # kombu: one codec
    ("bzip2", "application/x-bz2"), ("lzma", "application/x-lzma")])
def test_compression(broker, app, worker, dispatcher, compression, content_type):
    fair, plain = twins.register(app)
    big = "compress me " * 200
    held = fair.apply_async((big,), compression=compression)
    envelope = _held(app, held.id)
    assert envelope.headers["compression"] == content_type
    assert big.encode() not in envelope.body  # held compressed, published verbatim
    fair_answer, plain_answer = _compare(app, worker, dispatcher, fair, plain, (big,),
                                         compression=compression)
    assert fair_answer == plain_answer
    assert held.get(timeout=30)["args"] == [big]


@pytest.mark.parametrize("serializer", ["json", "msgpack", "pickle"])
def test_serializers(broker, make_app, worker, dispatcher, serializer):
    if serializer == "msgpack":
        pytest.importorskip("msgpack")  # in the test extra; kombu needs it for msgpack
    app = make_app(accept_content=["json", "msgpack", "pickle"],
                   result_accept_content=["json", "msgpack", "pickle"],
                   result_serializer="pickle" if serializer == "pickle" else "json")
    fair, plain = twins.register(app)
    value: Any = {"n": 1, "s": "é", "l": [1, 2.5, None]}
    if serializer == "pickle":  # what only pickle carries
        value = {"when": datetime(2024, 1, 2, 3, 4, tzinfo=timezone.utc), "set": {1, 2}}
    held = fair.apply_async((value,), serializer=serializer)
    assert _held(app, held.id).content_type == \
        {"json": "application/json", "msgpack": "application/x-msgpack",
         "pickle": "application/x-python-serialize"}[serializer]
    with worker(concurrency=2, the_app=app), dispatcher(app):
        plain_answer = plain.apply_async((value,), serializer=serializer).get(timeout=60)
        assert held.get(timeout=60) == plain_answer
    assert plain_answer["args"] == [value]
    wait_for(lambda: twins.settled(app), what="the fair queue to settle")


def test_ignore_result(broker, app, worker, dispatcher, ledger):
    fair, plain = twins.register(app)
    with worker(concurrency=2), dispatcher():
        got_fair = fair.apply_async(("ignored-fair",), ignore_result=True)
        got_plain = plain.apply_async(("ignored-plain",), ignore_result=True)
        wait_for(lambda: set(ledger.runs()) == {"ignored-fair", "ignored-plain"},
                 what="both tasks to run")
        wait_for(lambda: twins.settled(app), what="the fair task's slot to be released")
    assert got_fair.state == got_plain.state == "PENDING"


def test_acks_late(broker, make_app, worker, dispatcher):
    app = make_app(task_acks_late=True)
    fair, plain = twins.register(app)
    fair_answer, plain_answer = _compare(app, worker, dispatcher, fair, plain, ("late",))
    assert fair_answer == plain_answer


# -- priority -----------------------------------------------------------------------------


def test_priority_orders_the_real_queue_as_in_celery(broker, make_app, worker, ledger):
    """Messages waiting in the real queue run in priority order, fair or plain."""
    from kombu import Queue

    app = make_app(fair_max_inflight=10, task_acks_late=True)
    queue = twins.queue_of(app)
    app.conf.task_queues = [Queue(queue, queue_arguments={"x-max-priority": 10})]
    ledger = app.ledger
    fair, plain = twins.register(app)
    priorities = [1, 9, 5, 3]

    for p in priorities:
        fair.apply_async((f"fair-{p}",), priority=p)
    # All four go to the real queue before any worker consumes it.
    assert Dispatcher(app).step().dispatched == 4
    for p in priorities:
        plain.apply_async((f"plain-{p}",), priority=p)
    with worker(concurrency=1, the_app=app):
        wait_for(lambda: len(ledger.starts()) == 8, what="all eight tasks to run")
    order = [s["label"] for s in ledger.starts()]
    fair_order = [int(x.split("-")[1]) for x in order if x.startswith("fair")]
    plain_order = [int(x.split("-")[1]) for x in order if x.startswith("plain")]
    assert fair_order == plain_order
    if broker == "amqp":  # RabbitMQ: the higher the priority the sooner
        assert fair_order == [9, 5, 3, 1]
    wait_for(lambda: twins.settled(app), what="slots released")


# -- countdown, eta, time zones -----------------------------------------------------------


@pytest.mark.parametrize("how", ["countdown", "aware-eta", "naive-eta"])
def test_eta_in_other_time_zones(broker, make_app, worker, dispatcher, how):
    """The held message is due exactly when Celery's worker would run it, whatever the
    app's time zone (non-UTC, enable_utc off) and the ETA's own zone."""
    app = make_app(timezone="Asia/Kolkata", enable_utc=False, fair_max_inflight=4)
    fair, plain = twins.register(app)
    due = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    options: dict[str, Any] = {
        "countdown": {"countdown": 1.5},
        "aware-eta": {"eta": due.astimezone(ZoneInfo("America/New_York"))},
        "naive-eta": {"eta": due.replace(tzinfo=None)},  # Celery reads a naive ETA as UTC
    }[how]
    before = twins.now_ms()
    held = fair.apply_async(("eta",), **options)
    after = twins.now_ms()
    store = store_for(app)
    due_ms = store.client.zscore(store.keys(twins.queue_of(app)).delayed, held.id)
    assert due_ms is not None
    if how == "countdown":  # 1.5 s after the call
        assert before + 1500 <= due_ms <= after + 1500
    else:
        assert abs(due_ms - due.timestamp() * 1000) <= 1
    # Not a moment early: a step just before the due time dispatches nothing.
    assert Dispatcher(app).step(now_ms=int(due_ms) - 1).dispatched == 0
    with worker(concurrency=2, the_app=app), dispatcher(app):
        plain_answer = plain.apply_async(("eta",), **options).get(timeout=60)
        assert held.get(timeout=60) == plain_answer
    started = [s["t"] for s in app.ledger.starts()]
    assert min(started) >= due.timestamp() - 0.05  # both ran at (not before) the ETA
    wait_for(lambda: twins.settled(app), what="the fair queue to settle")


# -- expires ------------------------------------------------------------------------------


def test_expired_while_held_is_revoked_not_dispatched(broker, make_app, ledger):
    app = make_app(fair_max_inflight=4)
    fair, _ = twins.register(app)
    held = fair.apply_async(("too-late",), expires=60)
    kept = fair.apply_async(("in-time",), expires=600)
    stepper = Dispatcher(app)
    result = stepper.step(now_ms=twins.now_ms() + 120_000)  # 2 minutes later
    assert (result.dispatched, result.expired) == (2, 1)
    assert held.state == "REVOKED"
    assert "expired" in str(held.result)
    assert kept.state == "PENDING"
    # The expired one is gone from the store; only the one in time is in flight.
    snap = store_for(app).snapshot(twins.queue_of(app))
    assert snap["inflight"] == 1 and snap["groups"][0]["held_background"] == 0
    stepper.close()


def test_expired_while_queued_is_revoked_by_the_worker(broker, make_app, worker):
    """Dispatched in time, expired before a worker took it: REVOKED (as Celery on Redis)
    and its slot released at once — the dispatcher sets no broker TTL that would drop the
    message unseen on RabbitMQ."""
    app = make_app(fair_max_inflight=4)
    fair, plain = twins.register(app)
    # Absolute: a relative expiry would start counting only once apply_async runs.
    expires_at = datetime.now(timezone.utc) + timedelta(seconds=2)
    got_fair = fair.apply_async(("late-fair",), expires=expires_at)
    stepper = Dispatcher(app)
    result = stepper.step()
    assert (result.dispatched, result.expired) == (1, 0)  # sent while still valid
    stepper.close()
    got_plain = plain.apply_async(("late-plain",), expires=expires_at) \
        if broker == "redis" else None
    wait_for(lambda: datetime.now(timezone.utc) > expires_at + timedelta(seconds=0.2),
             what="the expiry to pass")
    with worker(concurrency=2, the_app=app):
        wait_for(lambda: got_fair.state == "REVOKED", what="the worker to revoke it")
        if got_plain is not None:
            wait_for(lambda: got_plain.state == "REVOKED", what="plain Celery revokes too")
        wait_for(lambda: twins.settled(app), what="the slot to be released")
    assert app.ledger.runs() == {}


# -- time limits (prefork: a subprocess worker) -------------------------------------------


def test_time_limits_on_prefork(broker, make_app, namespace, redis_server, tmp_path,
                                dispatcher):
    """Soft limit: SoftTimeLimitExceeded is raised inside the task (which catches it);
    hard limit: the pool process is killed, the task fails with TimeLimitExceeded and
    its slot comes back — for the fair task as for its plain twin."""
    conf = {"fair_max_inflight": 4}
    app = make_app(**conf)
    nap, plain_nap = app.tasks["proj.nap"], app.tasks["proj.plain_nap"]
    proc = CeleryProcess(["worker", "-P", "prefork", "-c", "2", "-l", "INFO",
                          "-n", f"limits-{namespace}@%h"], conf, app.conf.broker_url,
                         namespace, tmp_path / "worker.log", store=redis_server.url + "/0")
    try:
        with dispatcher(app):
            soft = [t.apply_async(("t", 60), soft_time_limit=0.5) for t in (nap, plain_nap)]
            hard = [t.apply_async(("t", 60), time_limit=1) for t in (nap, plain_nap)]
            assert [r.get(timeout=120) for r in soft] == ["soft limit"] * 2, proc.output()
            for r in hard:
                with pytest.raises(TimeLimitExceeded):
                    r.get(timeout=120)
            assert [r.state for r in soft + hard] == ["SUCCESS"] * 2 + ["FAILURE"] * 2
            wait_for(lambda: twins.settled(app), what="the slots to be released")
    finally:
        proc.stop()

