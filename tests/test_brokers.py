"""RabbitMQ specifics (publisher confirms, priority and quorum queues) and what cannot work.

The RabbitMQ tests run on the local server (a vhost per session); results, the ledger and
the celery_fair store stay on Redis.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import celery
import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Connection, Exchange, Queue

from celery_fair import ConfigurationError
from celery_fair.dispatcher import PICK_LEASE_MS, Dispatcher
from celery_fair.envelope import Envelope
from celery_fair.task import store_for

from . import twins
from .conftest import wait_for

CELERY_VERSION = tuple(int(part) for part in celery.__version__.split(".")[:2])

pytestmark = pytest.mark.timeout(240)


def _states(app: Any) -> dict[str, str]:
    """Dispatch record states of the app's default fair queue."""
    store = store_for(app)
    prefix = store.keys(twins.queue_of(app)).prefix
    out = {}
    for key in store.client.scan_iter(f"{prefix}:d:*"):
        state = store.client.hget(key, "s")
        out[key.decode().rsplit(":", 1)[1]] = state.decode() if state else ""
    return out


def _ready_messages(app: Any, queue: str) -> int:
    with Connection(app.conf.broker_url) as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


# -- publisher confirms -------------------------------------------------------------------


def test_dispatcher_publishes_in_confirm_mode(make_app, worker):
    app = make_app(broker="amqp", fair_max_inflight=2)
    fair, _ = twins.register(app)
    result = fair.delay("confirmed")
    stepper = Dispatcher(app)
    assert stepper.step().dispatched == 1
    producer = stepper.publisher._producer
    assert producer is not None
    assert producer.connection.transport_options["confirm_publish"] is True
    assert producer.channel._confirm_selected  # py-amqp put the channel in confirm mode
    stepper.close()
    with worker(concurrency=1, the_app=app):
        assert result.get(timeout=60)["args"] == ["confirmed"]
    wait_for(lambda: twins.settled(app), what="slot released")


def test_refused_publish_is_not_confirmed_and_is_held_again(make_app, worker):
    """A queue that refuses publishes when full (x-overflow reject-publish): the broker
    nacks the second message; its dispatch stays 'picked' (not 'queued') and is held
    again when its pick lease runs out, then dispatched once there is room."""
    app = make_app(broker="amqp", fair_max_inflight=10)
    queue = twins.queue_of(app)
    app.conf.task_queues = [Queue(queue, queue_arguments={
        "x-max-length": 1, "x-overflow": "reject-publish"})]
    fair, _ = twins.register(app)
    first, second = fair.delay("first"), fair.delay("second")
    stepper = Dispatcher(app)
    result = stepper.step()
    assert (result.dispatched, result.refused) == (2, 1)
    assert sorted(_states(app).values()) == ["picked", "queued"]
    assert _ready_messages(app, queue) == 1
    with worker(concurrency=1, the_app=app):
        assert first.get(timeout=60)["args"] == ["first"]
        wait_for(lambda: _ready_messages(app, queue) == 0, what="the queue emptied")
        # Later than the refused dispatch's pick lease: it is held again, then published.
        later = stepper.step(now_ms=twins.now_ms() + PICK_LEASE_MS + 1000)
        assert (later.requeued, later.dispatched, later.refused) == (1, 1, 0)
        assert second.get(timeout=60)["args"] == ["second"]
    stepper.close()
    wait_for(lambda: twins.settled(app), what="slots released")


def test_unroutable_publish_is_not_confirmed(make_app, namespace):
    """A message no queue is bound for would be dropped by RabbitMQ even with confirms;
    the dispatcher publishes with `mandatory`, sees it returned and does not confirm."""
    app = make_app(broker="amqp", fair_max_inflight=10)
    exchange = f"nowhere-{namespace}"
    with Connection(app.conf.broker_url) as conn:
        Exchange(exchange, type="direct", durable=False)(conn.default_channel).declare()
    fair, _ = twins.register(app)
    fair.apply_async(("lost?",), exchange=exchange, routing_key="no-binding")
    stepper = Dispatcher(app)
    result = stepper.step()
    assert (result.dispatched, result.refused) == (1, 1)
    assert list(_states(app).values()) == ["picked"]
    later = stepper.step(now_ms=twins.now_ms() + PICK_LEASE_MS + 1000)
    assert later.requeued == 1  # held again, never lost
    stepper.close()


# -- priority queues ----------------------------------------------------------------------


def test_priority_queue_declared_from_the_app_and_priority_kept(make_app, worker,
                                                                dispatcher):
    app = make_app(broker="amqp", fair_max_inflight=4)
    queue = twins.queue_of(app)
    app.conf.task_queues = [Queue(queue, queue_arguments={"x-max-priority": 10})]
    fair, plain = twins.register(app)
    held = fair.apply_async(("prio",), priority=7)
    assert _held(app, held.id).priority == 7
    stepper = Dispatcher(app)
    assert stepper.step().dispatched == 1  # the dispatcher declares the queue first
    stepper.close()
    with Connection(app.conf.broker_url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False,
                              arguments={"x-max-priority": 10})  # equivalent: accepted
        with pytest.raises(PreconditionFailed):  # declared with x-max-priority
            channel.queue_declare(queue, durable=True, auto_delete=False, arguments={})
    with worker(concurrency=1, the_app=app), dispatcher(app):
        plain_answer = plain.apply_async(("prio",), priority=7).get(timeout=60)
        assert held.get(timeout=60) == plain_answer
    assert plain_answer["priority"] == 7
    wait_for(lambda: twins.settled(app), what="slot released")


def _held(app: Any, task_id: str, queue: str | None = None) -> Envelope:
    store = store_for(app)
    value = store.client.hget(store.keys(queue or twins.queue_of(app)).msg, task_id)
    assert value is not None, f"task {task_id} is not held"
    return Envelope.decode(value)[2]


# -- quorum queues and native delayed delivery --------------------------------------------


@pytest.mark.xfail(CELERY_VERSION < (5, 5), run=False, reason=(
    "Celery < 5.5 workers cannot consume quorum queues (global QoS): nothing to compare"))
@pytest.mark.parametrize("exchange_type", ["topic", "direct"])
def test_quorum_queue_countdown(make_app, namespace, worker, dispatcher, exchange_type):
    """Celery 5.5+ reroutes an ETA message for a quorum queue (topic exchange) to its
    native delayed-delivery exchange; the held message gets its real destination back,
    waits in the delayed set and reaches the quorum queue when due. Plain Celery's twin
    goes through native delayed delivery (set up by the worker) and agrees."""
    app = make_app(broker="amqp", fair_max_inflight=4)
    queue = twins.queue_of(app)
    app.conf.task_queues = [Queue(queue, Exchange(queue, type=exchange_type), routing_key=queue,
                                  queue_arguments={"x-queue-type": "quorum"})]
    app.conf.task_default_exchange = queue
    app.conf.task_default_exchange_type = exchange_type
    app.conf.task_default_routing_key = queue
    fair, plain = twins.register(app)
    start = datetime.now(timezone.utc).timestamp()
    held = fair.apply_async(("later",), countdown=2)
    envelope = _held(app, held.id)
    # topic: back from celery_delayed_27 to the real exchange; direct: Celery sent it to
    # the queue by name (it warns that native delayed delivery needs a topic exchange).
    expected_exchange = "" if exchange_type == "direct" else queue
    assert (envelope.exchange, envelope.routing_key, envelope.queue) == \
        (expected_exchange, queue, queue)
    store = store_for(app)
    due = store.client.zscore(store.keys(queue).delayed, held.id)
    assert due is not None and due >= (start + 2) * 1000 - 50
    with worker(concurrency=2, the_app=app), dispatcher(app):
        plain_result = plain.apply_async(("later",), countdown=2)
        fair_answer = held.get(timeout=60)
        plain_answer = plain_result.get(timeout=60)
        # A retry's countdown (published by the worker) is rerouted and restored too.
        assert app.tasks["proj.flaky"].delay("acme", 1, 1).get(timeout=60) == 1
    # The same task, args and ETA; only how the message got there differs: plain Celery's
    # came through the delayed-delivery exchanges, celery-fair's straight from its queue.
    route = ("exchange", "routing_key")
    assert {k: v for k, v in fair_answer.items() if k not in route} == \
        {k: v for k, v in plain_answer.items() if k not in route}
    assert (fair_answer["exchange"], fair_answer["routing_key"]) == (expected_exchange, queue)
    assert min(s["t"] for s in app.ledger.starts()) >= start + 2 - 0.05
    wait_for(lambda: twins.settled(app), what="slot released")


# -- what cannot work ---------------------------------------------------------------------


@pytest.mark.parametrize("url", ["memory://", "sqs://", "filesystem://"])
def test_unsupported_broker_is_a_clear_error(make_app, redis_server, url):
    app = make_app(broker_url=url, fair_store_url=redis_server.url + "/0")
    fair, _ = twins.register(app)
    with pytest.raises(ConfigurationError, match="not supported.*Redis.*RabbitMQ"):
        fair.delay("x")
    with pytest.raises(ConfigurationError, match="not supported"):
        Dispatcher(app)
    # Eager mode runs the task in the caller: any broker will do (that Celery itself can
    # load: its eager path opens a producer, and kombu's SQS transport needs botocore).
    if url != "sqs://":
        app.conf.task_always_eager = True
        assert fair.delay("eager").get()["args"] == ["eager"]


def test_task_protocol_1_is_a_clear_error(make_app):
    app = make_app(task_protocol=1)
    fair, _ = twins.register(app)
    with pytest.raises(ConfigurationError, match="task_protocol=1.*protocol 2"):
        fair.delay("x")
    with pytest.raises(ConfigurationError, match="task_protocol"):
        Dispatcher(app)
    assert store_for(app).queues() == []


def test_dispatcher_refuses_eager_mode(make_app):
    app = make_app(task_always_eager=True)
    with pytest.raises(ConfigurationError, match="task_always_eager"):
        Dispatcher(app)
