"""Every store command is bounded in time (``fair_store_socket_timeout``,
``fair_store_connect_timeout``, ``fair_store_retries``): against a store that accepts
connections and never answers, a task start or a publish fails with StoreConnectionError
within the configured bound instead of hanging on whatever the installed redis-py does."""

from __future__ import annotations

import time
from typing import Callable

import pytest
from celery import Celery

from celery_fair.config import get_config
from celery_fair.errors import ConfigurationError, StoreConnectionError
from celery_fair.store.redis import RedisStore
from celery_fair.task import DISPATCH_HEADER, QUEUE_HEADER, begin_dispatch, store_for

from .blackhole import Blackhole

BOUNDED = {"fair_store_socket_timeout": 0.3, "fair_store_connect_timeout": 0.3,
           "fair_store_retries": 2}
#: 1 + 2 tries of at most connect + socket timeout each, plus at most 1 s backoff between.
LONGEST = 3 * (0.3 + 0.3) + 2 * 1.0


def _took(call: Callable[[], object]) -> float:
    started = time.monotonic()
    with pytest.raises(StoreConnectionError, match="unreachable"):
        call()
    return time.monotonic() - started


def test_begin_and_hold_on_a_store_that_never_answers_fail_within_the_bound(
        make_app: Callable[..., Celery]) -> None:
    with Blackhole() as hole:
        app = make_app(fair_store_url=hole.url, **BOUNDED)
        queue = str(app.conf.task_default_queue)
        took_begin = _took(lambda: begin_dispatch(
            app, {DISPATCH_HEADER: "d1", QUEUE_HEADER: queue}, acks_late=True))
        took_hold = _took(lambda: app.tasks["proj.work"].delay("acme", "never held"))
    # tried 1 + retries times, each waiting out the socket timeout: not less, not forever
    assert 3 * 0.3 <= took_begin <= LONGEST
    assert 3 * 0.3 <= took_hold <= LONGEST


def test_store_clients_get_explicit_timeouts_and_bounded_retries_by_default(
        make_app: Callable[..., Celery]) -> None:
    store = store_for(make_app())
    options = store.client.connection_pool.connection_kwargs
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (5.0, 5.0)
    assert store.client.get_retry().get_retries() == 3
    plain = RedisStore.from_url("redis://127.0.0.1:1/0", "x")
    assert plain.client.get_retry().get_retries() == 3


@pytest.mark.parametrize("name, value", [("fair_store_socket_timeout", 0),
                                         ("fair_store_connect_timeout", "5"),
                                         ("fair_store_retries", -1)])
def test_a_bad_store_bound_is_refused_naming_the_setting(
        make_app: Callable[..., Celery], name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=name):
        get_config(make_app(**{name: value}))
