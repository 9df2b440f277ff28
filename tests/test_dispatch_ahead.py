"""``fair_dispatch_ahead = "auto"`` end to end: a real in-thread Celery worker, a real
dispatcher running its loop, a real Redis store, Redis or RabbitMQ as the broker.

Where the broker is the store's own Redis, releases refill the slots they free
(refill.py), so "auto" keeps nothing ahead: a tenant that arrives behind a backlog takes
the next slot that frees. On RabbitMQ (no refill) "auto" keeps 2 ahead, as a number
does anywhere: the newcomer waits behind them. Order is read from the tasks' own ledger,
never from timing; what ``fair status`` shows is read as it reads it.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_fair.config import get_config
from celery_fair.summary import Capacity, read_capacity
from celery_fair.task import store_for

from .conftest import wait_for
from .helpers import labels

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("broker", "ahead", "expected"), [
    ("redis", "auto", 0), ("redis", 2, 2), ("amqp", "auto", 2)])
def test_a_newcomer_waits_behind_only_the_ahead_auto_gives_its_queue(
        make_app: Any, worker: Any, dispatcher: Any, broker: str, ahead: Any,
        expected: int) -> None:
    app = make_app(broker=broker, fair_dispatch_ahead=ahead)
    work = app.tasks["proj.work"]
    store, queue = store_for(app), app.conf.task_default_queue
    backlog = [work.delay("big", f"big-{i}", 0.3) for i in range(expected + 3)]
    with worker(concurrency=1, the_app=app), dispatcher(the_app=app) as running:
        wait_for(lambda: labels(app) == ["big-0"], what="the backlog's first start")
        # what `fair status` shows, and what the dispatcher lets be in flight
        assert read_capacity(store, get_config(app), queue) == Capacity(1, expected)
        assert running.directory.capacity(queue) == Capacity(1, expected)
        newcomer = work.delay("small", "small-0", 0.0)
        for result in [*backlog, newcomer]:
            result.get(timeout=60)
    order = labels(app)
    # the newcomer starts once the running task and the ahead messages have started
    assert order.index("small-0") == 1 + expected, order


@pytest.mark.parametrize(("value", "kept"), [("auto", None), (0, 0), (5, 5)])
def test_auto_and_any_count_from_zero_are_accepted(make_app: Any, value: Any,
                                                   kept: int | None) -> None:
    assert get_config(make_app(fair_dispatch_ahead=value)).dispatch_ahead == kept
