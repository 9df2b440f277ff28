"""The direct push: with the broker on the store's own Redis, ``pick.lua`` writes kombu's
message into the real queue itself. It must write exactly what kombu would publish, and
leave to kombu every message it cannot route as kombu would.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from kombu import Exchange, Queue
from kombu.utils.json import dumps

from celery_fair.config import reset_config
from celery_fair.direct import direct_push
from celery_fair.dispatcher import Dispatcher
from celery_fair.store.redis import RedisStore
from celery_fair.task import store_for

from . import twins
from .conftest import wait_for

pytestmark = pytest.mark.timeout(120)

#: Fields that differ between any two publishes of the same call.
PER_MESSAGE = {"id", "root_id", "fair_dispatch_id", "correlation_id", "delivery_tag"}
#: What only the script's push adds: the dispatch's lease (fair_quick_start).
PUSHED_ONLY = {"fair_lease_until"}


def _counting(dispatcher: Dispatcher) -> list[str]:
    """Hold ids the dispatcher publishes through kombu (not pushed by the script)."""
    published: list[str] = []
    original = dispatcher.publisher.publish_one

    def counting(producer: Any, queue: str, item: Any) -> bool:
        published.append(item.hold_id)
        return bool(original(producer, queue, item))

    dispatcher.publisher.publish_one = counting  # type: ignore[method-assign]
    return published


def _step(app: Any, direct: bool) -> list[str]:
    app.conf.fair_direct_push = direct
    reset_config(app)
    dispatcher = Dispatcher(app)
    published = _counting(dispatcher)
    assert dispatcher.step().dispatched == 1
    dispatcher.close()
    return published


def _pop(redis_client: Any, key: str) -> dict[str, Any]:
    raw = redis_client.rpop(key)
    assert raw is not None, f"nothing in {key!r}"
    message: dict[str, Any] = json.loads(raw)
    return message


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "body": base64.b64decode(message["body"]),
        "content": (message["content-type"], message["content-encoding"]),
        "headers": {k: v for k, v in message["headers"].items()
                    if k not in PER_MESSAGE | PUSHED_ONLY},
        "properties": {k: v for k, v in message["properties"].items()
                       if k not in PER_MESSAGE},
    }


def test_pushed_message_is_what_kombu_publishes(make_app, worker, redis_client):
    app = make_app(fair_max_inflight=10)
    fair, _ = twins.register(app)
    queue = twins.queue_of(app)
    options = dict(priority=5, headers={"x_trace": "t-1"}, shadow="shadowed",
                   time_limit=30, soft_time_limit=20)
    pushed = fair.apply_async(("same",), **options)
    assert _step(app, direct=True) == []  # the script pushed it: kombu published nothing
    published = fair.apply_async(("same",), **options)
    assert _step(app, direct=False) == [published.id]
    # Priority 5 lands in kombu's priority list for step 3, as kombu puts it.
    key = f"{queue}\x06\x163"
    assert redis_client.llen(key) == 2
    by_script, by_kombu = _pop(redis_client, key), _pop(redis_client, key)  # oldest first
    assert by_script["headers"]["id"] == pushed.id
    assert by_script["properties"]["delivery_tag"] == by_script["headers"]["fair_dispatch_id"]
    assert by_script["headers"]["fair_queue"] == queue
    # the lease the push gave the dispatch; kombu's publish knows none (a pick lease)
    leases = store_for(app).keys(queue).leases
    assert by_script["headers"]["fair_lease_until"] == redis_client.zscore(
        leases, by_script["headers"]["fair_dispatch_id"])
    assert "fair_lease_until" not in by_kombu["headers"]
    assert _comparable(by_script) == _comparable(by_kombu)
    assert set(by_script) == set(by_kombu)
    # Back in the queue, both run on a real worker and say the same.
    redis_client.lpush(key, json.dumps(by_script), json.dumps(by_kombu))
    with worker(concurrency=2, the_app=app):
        assert pushed.get(timeout=60) == published.get(timeout=60)
    wait_for(lambda: twins.settled(app), what="both slots released")


def test_routing_key_bound_to_another_queue_too_goes_through_kombu(make_app, redis_client):
    """kombu delivers to every queue bound to the routing key: the script does not try."""
    app = make_app(fair_max_inflight=10)
    fair, _ = twins.register(app)
    queue = twins.queue_of(app)
    route = dict(exchange=queue, routing_key=queue)  # the queue's own direct exchange
    fair.apply_async(("alone",), **route)
    assert _step(app, direct=True) == []  # only this queue is bound: pushed by the script
    assert redis_client.llen(queue) == 1
    other = Queue(queue + "-copy", Exchange(queue, type="direct"), routing_key=queue)
    with app.connection_for_write() as conn:
        other.bind(conn.default_channel).declare()
    result = fair.apply_async(("both",), **route)
    assert _step(app, direct=True) == [result.id]
    assert redis_client.llen(queue) == 2
    assert _pop(redis_client, queue + "-copy")["headers"]["id"] == result.id


def test_value_stored_before_the_split_goes_through_kombu(make_app, redis_client):
    """A held value written by an earlier celery_fair (headers inside the meta JSON)."""
    app = make_app(fair_max_inflight=10)
    fair, _ = twins.register(app)
    queue = twins.queue_of(app)
    result = fair.delay("old")
    store = store_for(app)
    k = store.keys(queue)
    value = redis_client.hget(k.msg, result.id)
    prefix_end = value.index(b"{")
    meta_end = value.index(b"\n", prefix_end)
    headers_end = value.index(b"\n", meta_end + 1)
    properties_end = value.index(b"\n", headers_end + 1)
    meta = json.loads(value[prefix_end:meta_end])
    meta["h"] = json.loads(value[meta_end + 1:headers_end])
    meta["p"] = json.loads(value[headers_end + 1:properties_end])
    old = value[:prefix_end] + dumps(meta).encode() + b"\n" + value[properties_end + 1:]
    redis_client.hset(k.msg, result.id, old)
    assert _step(app, direct=True) == [result.id]
    assert _pop(redis_client, queue)["headers"]["id"] == result.id


def test_only_on_the_store_own_redis_database(make_app, redis_server):
    app = make_app()
    twins.register(app)
    queue = twins.queue_of(app)
    with app.connection_for_write() as conn:
        same = direct_push(app, store_for(app), conn, queue)
        other_db = RedisStore.from_url(redis_server.url + "/1")
        try:
            assert direct_push(app, other_db, conn, queue) is None
        finally:
            other_db.close()
    assert same is not None
    assert (same.queue, same.exchange, same.routing_key) == (queue, queue, queue)
    assert same.binding_key == f"_kombu.binding.{queue}"


def test_setting_must_be_a_bool(make_app):
    from celery_fair.config import get_config
    from celery_fair.errors import ConfigurationError

    app = make_app(fair_direct_push="yes")
    with pytest.raises(ConfigurationError, match="fair_direct_push='yes'.*True or False"):
        get_config(app)
