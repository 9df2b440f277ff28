"""Fixtures: a real redis-server per test session, a fresh app per test, real workers.

Each test gets its own key namespace and its own real queue, so tests never see each
other's messages. No fakes: the broker, result backend and store are the real server.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

from bench.sqlstores import RabbitVhost
from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.store import close_stores, open_stores, store_for_url
from celery_fair.store.base import Store
from celery_fair.store.redis import RedisStore
from celery_fair.testing import MemoryStore, RedisServer, free_port, redis_server_binary  # noqa: F401

from .backends import BACKENDS, Database, create_database
from .components import RABBITMQ, require, strict, summary_lines
from .proj import Ledger, create_app


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    """Under CELERY_FAIR_STRICT=1 (CI) a skipped test fails: CI never skips silently."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CELERY_FAIR_STRICT") == "1" \
            and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CELERY_FAIR_STRICT=1: {report.longrepr}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say at the end of the run which components were missing, what was therefore not
    run, and how to get them (tests/components.py)."""
    reports = [r for kind in ("skipped", "failed", "error")
               for r in terminalreporter.stats.get(kind, [])]
    lines = summary_lines([str(getattr(r, "longrepr", "")) for r in reports])
    if lines:
        outcome = "failed: CELERY_FAIR_STRICT=1" if strict() else "skipped"
        terminalreporter.section(f"components missing on this machine (tests {outcome})")
        for line in lines:
            terminalreporter.line(line)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Collect garbage before the test's fixtures stop their servers. A Celery
    ``AsyncResult`` left in a reference cycle unsubscribes from its Redis result backend
    when it is collected; collected after that Redis stopped, it retries the connection
    for a long time, wherever the collection happens (once, in the terminal summary,
    the run hung there)."""
    gc.collect()


@pytest.fixture(autouse=True)
def _close_the_tests_stores() -> Iterator[None]:
    """Close the stores a test opened in this process once its fixtures are done. Every
    test has a namespace of its own, so its stores are never used again; left open, a SQL
    store's pool and listener would keep up to 31 PostgreSQL connections each, and the
    suite ran out of the server's 100 halfway."""
    before = open_stores()
    yield
    close_stores(keep=before)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def redis_client(redis_server: RedisServer) -> redis.Redis:
    return redis.Redis(port=redis_server.port)


@pytest.fixture(scope="session")
def sql_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], str]]:
    """``sql_url(kind)``: the URL of the session's migrated database of ``kind``
    ("sqlite", "postgresql" or "mariadb"), made on first use and dropped at the end (see
    tests/backends.py). Skips the test when the server cannot be reached (a failure
    under CELERY_FAIR_STRICT=1, as in CI)."""
    made: dict[str, Database] = {}
    refused: dict[str, BaseException] = {}

    def url(kind: str) -> str:
        if kind in refused:  # a server found unreachable once is not tried again
            raise refused[kind]
        if kind not in made:
            try:
                made[kind] = create_database(kind, tmp_path_factory.mktemp(kind))
            except (pytest.skip.Exception, pytest.fail.Exception) as missing:
                refused[kind] = missing  # tests/components.py: skipped, or failed in CI
                raise
        return made[kind].url

    yield url
    for database in made.values():
        database.drop()


@pytest.fixture(params=BACKENDS)
def any_store(request: Any, sql_url: Callable[[str], str]) -> Iterator[Store]:
    """A fresh :class:`Store` of each backend in turn (memory, redis, sqlite, postgresql,
    mariadb), under a namespace of its own: on a SQL server the tables are shared by the
    session and the namespace is the test's "schema" (its rows carry it). Flushed and
    closed afterwards."""
    kind, namespace = request.param, "t" + uuid.uuid4().hex[:10]
    store: Store
    if kind == "memory":
        store = MemoryStore(namespace)
    elif kind == "redis":
        server = request.getfixturevalue("redis_server")
        store = RedisStore(redis.Redis(port=server.port), namespace)
    else:
        store = store_for_url(sql_url(kind), namespace)
    try:
        yield store
    finally:
        store.flush()
        store.close()


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitVhost]:
    require(RABBITMQ)
    vhost = RabbitVhost()
    yield vhost
    vhost.delete()


@pytest.fixture(params=["redis", "amqp"])
def broker(request: Any) -> str:
    """Run a test once per broker: Redis, and RabbitMQ (py-amqp). The store is Redis."""
    return str(request.param)


@pytest.fixture(params=["redis", "postgresql"])
def store_backend(request: Any) -> str:
    """Run a test once per store of celery_fair: Redis, and the SQL store on the
    session's PostgreSQL database. The broker, results and ledger stay where they were."""
    return str(request.param)


def fair_store_url(request: Any, redis_url: str) -> str:
    """celery_fair's store for a test: Redis, unless it uses ``store_backend``."""
    kind = (request.getfixturevalue("store_backend")
            if "store_backend" in request.fixturenames else "redis")
    return redis_url if kind == "redis" else str(request.getfixturevalue("sql_url")(kind))


@pytest.fixture
def make_app(redis_server: RedisServer, namespace: str,
             request: Any) -> Callable[..., Celery]:
    """Build the test project app; settings override the defaults.

    ``make_app(broker="amqp")`` (or a test using the ``broker`` fixture) puts the Celery
    broker on RabbitMQ; results, the ledger and celery_fair's store stay on Redis. A test
    using the ``store_backend`` fixture runs again with celery_fair's store on PostgreSQL
    (``fair_store_url``; results and the ledger stay on Redis).
    """

    def make(broker: str | None = None, **conf: Any) -> Celery:
        kind = broker or (request.getfixturevalue("broker")
                          if "broker" in request.fixturenames else "redis")
        store = redis_server.url + "/0"
        url = store if kind == "redis" else request.getfixturevalue("rabbitmq").url
        conf.setdefault("fair_store_url", fair_store_url(request, store))
        app = create_app(url, namespace, "q-" + namespace, store=store, **conf)
        reset_config(app)
        return app

    return make


@pytest.fixture
def app(make_app: Callable[..., Celery]) -> Celery:
    return make_app()


@pytest.fixture
def ledger(app: Celery) -> Ledger:
    return app.ledger  # type: ignore[attr-defined, no-any-return]


@pytest.fixture
def worker(app: Celery) -> Callable[..., Any]:
    """Start an in-thread worker: ``with worker(concurrency=4): ...``."""

    @contextmanager
    def start(concurrency: int = 4, pool: str = "threads", the_app: Celery | None = None,
              **kw: Any) -> Iterator[Any]:
        # The worker's event loop is process-global. Older Celery (5.3) reuses the previous
        # embedded worker's loop, whose timer is not the new worker's: ETA messages never
        # fire. Each embedded worker gets a loop of its own (real workers have one anyway).
        set_event_loop(None)
        with start_worker(the_app or app, concurrency=concurrency, pool=pool,
                          perform_ping_check=False, shutdown_timeout=30, **kw) as w:
            hub = getattr(w, "hub", None)
            if hub is not None:
                # On RabbitMQ the event loop has no timer of its own and polls for up to
                # 10 s, so it notices shutdown that late; a no-op timer bounds the poll.
                hub.call_soon(hub.call_repeatedly, 0.25, lambda: None)
            yield w

    return start


class DispatcherThread:
    """A real Dispatcher running its loop in a thread."""

    def __init__(self, app: Celery, **kw: Any) -> None:
        self.dispatcher = Dispatcher(app, **kw)
        self.thread = threading.Thread(target=self.dispatcher.run, daemon=True)

    def __enter__(self) -> Dispatcher:
        self.thread.start()
        return self.dispatcher

    def __exit__(self, *exc: Any) -> None:
        self.dispatcher.stop()
        nudge(self.dispatcher)
        self.thread.join(10)
        assert not self.thread.is_alive(), "dispatcher did not stop"


def nudge(dispatcher: Dispatcher) -> None:
    """Wake a stopping dispatcher's wait as a hold would, so it sees the stop now and not
    when the wait times out (up to a second, in every test that runs a dispatcher). A
    spurious wake-up left behind is one the store contract allows."""
    store, directory = dispatcher.store, dispatcher.directory
    try:
        for queue in directory.fixed_queues or directory.queues:
            if isinstance(store, RedisStore):
                wake = store.keys(queue).wake
                store.client.pipeline(transaction=False).lpush(wake, "1").ltrim(wake, 0, 0) \
                    .execute()
            elif hasattr(store, "wakes"):  # the SQL store
                store.wakes.wake(queue)
    except Exception:  # noqa: BLE001 - a store that is down: the wait times out as before
        pass


@pytest.fixture
def dispatcher(app: Celery) -> Callable[..., DispatcherThread]:
    def make(the_app: Celery | None = None, **kw: Any) -> DispatcherThread:
        return DispatcherThread(the_app or app, **kw)

    return make


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02,
             what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def subprocess_env(app_conf: dict[str, Any], broker: str, namespace: str,
                   store: str | None = None) -> dict[str, str]:
    """Environment for ``celery -A tests.proj ...`` subprocesses (see tests/proj.py)."""
    import json

    env = dict(os.environ)
    env.update(FAIR_TEST_BROKER=broker, FAIR_TEST_NS=namespace,
               FAIR_TEST_QUEUE="q-" + namespace, FAIR_TEST_CONF=json.dumps(app_conf),
               FAIR_TEST_STORE=store or "",
               PYTHONFAULTHANDLER="1")  # CeleryProcess.stacks(): SIGABRT prints every thread
    return env
