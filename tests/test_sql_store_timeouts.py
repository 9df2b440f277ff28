"""The SQL store's commands are bounded in time too (``fair_store_socket_timeout``): on
PostgreSQL, a store whose established connection stops answering (a partition, a frozen
server) must fail a command with StoreConnectionError within the bound, as the Redis
store does (tests/test_store_timeouts.py), not block a task start or release until the
network comes back."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Callable

import pytest
from sqlalchemy.engine import make_url

from bench.proxy import StoreProxy
from celery_fair.errors import StoreConnectionError
from celery_fair.store import store_for_url
from celery_fair.store.connection import Bounds

from .conftest import wait_for

BOUNDS = Bounds(socket_timeout=0.3, connect_timeout=0.3, retries=2)
#: 1 + 2 tries of at most connect + socket timeout each, plus at most 1 s backoff between.
LONGEST = 3 * (0.3 + 0.3) + 2 * 1.0
#: How long the store stops answering: far longer than the bound.
CUT = 8.0


def test_a_postgresql_store_that_stops_answering_fails_within_the_bound(
        sql_url: Callable[[str], str]) -> None:
    url = make_url(sql_url("postgresql"))
    proxy = StoreProxy(url.port or 5432)
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(
        hide_password=False)
    store = store_for_url(through, "t" + uuid.uuid4().hex[:10], BOUNDS)
    cutter = threading.Thread(target=proxy.cut, args=(CUT,), daemon=True)
    try:
        store.queues()  # connected, schema checked: the next command reuses the connection
        cutter.start()
        wait_for(lambda: not proxy._up.is_set(), what="the relay to stop answering")
        started = time.monotonic()
        with pytest.raises(StoreConnectionError):
            store.queues()
        took = time.monotonic() - started
    finally:
        cutter.join(CUT + 5)
        proxy.close()
        store.close()
    assert took <= LONGEST, f"a command waited {took:.1f}s (bound {LONGEST}s)"
