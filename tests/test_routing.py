"""Routing: task_routes, queue/exchange/routing_key at call time, several real queues.

Each real queue is its own fair queue with its own capacity: with ``fair_max_inflight``
'auto', a worker adds its pool size only to the queues it consumes. Runs on Redis and on
RabbitMQ; the fair task's delivery info is compared with its plain twin's.
"""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Exchange, Queue

from celery_fair.dispatcher import Dispatcher
from celery_fair.envelope import Envelope
from celery_fair.task import store_for

from . import twins
from .conftest import wait_for

pytestmark = pytest.mark.timeout(240)


def _queues(app: Any, namespace: str) -> dict[str, str]:
    """Three more real queues: a, b, and c behind a named direct exchange."""
    names = {k: f"{k}-{namespace}" for k in ("a", "b", "c")}
    default = twins.queue_of(app)
    app.conf.task_queues = [
        Queue(default), Queue(names["a"]), Queue(names["b"]),
        Queue(names["c"], Exchange(f"x-{namespace}", type="direct"),
              routing_key=f"rk-{namespace}"),
    ]
    return names


def _held_in(app: Any, queue: str, task_id: str) -> Envelope:
    store = store_for(app)
    value = store.client.hget(store.keys(queue).msg, task_id)
    assert value is not None, f"task {task_id} is not held in fair queue {queue}"
    return Envelope.decode(value)[2]


def test_routes_and_call_options_pick_the_fair_queue(broker, app, namespace, worker,
                                                     dispatcher):
    names = _queues(app, namespace)
    app.conf.task_routes = {"twin.*": {"queue": names["a"]}}
    fair, plain = twins.register(app)
    calls: list[dict[str, Any]] = [
        {},  # task_routes
        {"queue": names["b"]},  # explicit queue wins over the route
        {"exchange": f"x-{namespace}", "routing_key": f"rk-{namespace}"},
    ]
    expected = [names["a"], names["b"], names["c"]]
    held = [fair.apply_async((f"r{i}",), **options) for i, options in enumerate(calls)]
    for result, queue in zip(held, expected):
        _held_in(app, queue, result.id)
    assert set(expected) <= set(store_for(app).queues())
    envelope = _held_in(app, names["c"], held[2].id)
    assert (envelope.exchange, envelope.routing_key) == (f"x-{namespace}", f"rk-{namespace}")

    all_queues = [twins.queue_of(app), *names.values()]
    with worker(concurrency=3, queues=all_queues), dispatcher():
        plain_answers = [plain.apply_async((f"r{i}",), **options).get(timeout=60)
                         for i, options in enumerate(calls)]
        fair_answers = [r.get(timeout=60) for r in held]
    assert fair_answers == plain_answers
    assert [a["routing_key"] for a in fair_answers] == \
        [names["a"], names["b"], f"rk-{namespace}"]
    for queue in expected:
        wait_for(lambda q=queue: twins.settled(app, q), what=f"fair queue {queue} settled")


def test_each_queue_has_its_own_auto_capacity(broker, make_app, namespace, worker):
    """A worker consuming only queue a brings capacity to a, never to b."""
    app = make_app(fair_max_inflight="auto")
    names = _queues(app, namespace)
    fair, _ = twins.register(app)
    store = store_for(app)
    in_a = fair.apply_async(("in-a",), queue=names["a"])
    in_b = fair.apply_async(("in-b",), queue=names["b"])
    stepper = Dispatcher(app)
    with worker(concurrency=3, the_app=app, queues=[names["a"]]):
        wait_for(lambda: store.worker_capacity(names["a"], twins.now_ms()) == 3,
                 what="the worker's capacity on queue a")
        assert store.worker_capacity(names["b"], twins.now_ms()) == 0
        result = stepper.step()
        assert result.by_queue[names["a"]] == 1 and result.by_queue[names["b"]] == 0
        assert in_a.get(timeout=60)["args"] == ["in-a"]
        assert stepper.step().by_queue[names["b"]] == 0  # still no capacity for b
        assert store.snapshot(names["b"])["groups"][0]["held_background"] == 1
    with worker(concurrency=2, the_app=app, queues=[names["b"]]):
        wait_for(lambda: store.worker_capacity(names["b"], twins.now_ms()) == 2,
                 what="the second worker's capacity on queue b")
        assert store.worker_capacity(names["a"], twins.now_ms()) == 0
        wait_for(lambda: stepper.step().by_queue[names["b"]] == 1, what="b dispatched")
        assert in_b.get(timeout=60)["args"] == ["in-b"]
    stepper.close()
    for queue in (names["a"], names["b"]):
        wait_for(lambda q=queue: twins.settled(app, q), what=f"fair queue {queue} settled")
