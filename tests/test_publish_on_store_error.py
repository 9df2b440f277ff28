"""``fair_on_store_error="publish"``: a fair task is published straight to the broker only
when it was certainly not held, so it never runs twice.

Real parts throughout: the store is a redis-server of the test's own, reached directly or
through a TCP proxy that loses one reply; the broker and the worker are real.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery

from celery_fair.errors import StoreConnectionError
from celery_fair.task import store_for
from celery_fair.testing import RedisServer

from .conftest import wait_for


@pytest.fixture
def store_server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly="yes", appendfsync="always")  # keeps data over halt()
    yield server
    server.stop()


class ReplyLosingProxy:
    """A TCP proxy to a redis-server that forwards everything both ways, except the reply
    to the first script call that ran: it then drops the client's connection and refuses
    new ones, so redis-py's resends of that call fail at connect. The script has run."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.lost = threading.Event()
        self._script_sent = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed: the reply was lost
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        while data := _recv(client):
            if b"EVALSHA" in data.upper():
                self._script_sent.set()
            server.sendall(data)
        server.close()

    def _replies(self, server: socket.socket, client: socket.socket) -> None:
        while data := _recv(server):
            if self._script_sent.is_set() and not data.startswith(b"-NOSCRIPT"):
                # The script ran (its reply is here): lose the reply, refuse resends.
                self.listener.close()
                client.shutdown(socket.SHUT_RDWR)
                client.close()
                self.lost.set()
                return
            self._script_sent.clear()
            client.sendall(data)
        client.close()

    def close(self) -> None:
        self.listener.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def held_count(app: Celery) -> int:
    snapshot = store_for(app).snapshot(app.conf.task_default_queue)
    return sum(g["held_background"] + g["held_interactive"] for g in snapshot["groups"])


def test_a_store_down_before_the_call_publishes_the_task_straight_and_it_runs_once(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        store_server: RedisServer, redis_client: redis.Redis) -> None:
    app = make_app(fair_store_url=store_server.url + "/0", fair_on_store_error="publish")
    work = app.tasks["proj.work"]
    work.delay("acme", "held before the outage")  # the store's connection is in the pool
    assert held_count(app) == 1
    store_server.halt()
    result = work.delay("acme", "published straight")  # nothing could be sent: no hold
    assert redis_client.llen(app.conf.task_default_queue) == 1
    with worker(concurrency=2, the_app=app):
        assert result.get(timeout=30) == "published straight"
    assert app.ledger.runs()["published straight"] == 1  # type: ignore[attr-defined]
    store_server.start()
    assert held_count(app) == 1  # only the one held before the outage


def test_a_hold_whose_reply_is_lost_raises_and_the_task_runs_exactly_once(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        dispatcher: Callable[..., Any], store_server: RedisServer,
        redis_client: redis.Redis) -> None:
    proxy = ReplyLosingProxy(store_server.port)
    try:
        publisher = make_app(fair_store_url=proxy.url + "/0", fair_on_store_error="publish")
        with pytest.raises(StoreConnectionError) as info:
            publisher.tasks["proj.work"].delay("acme", "reply lost")
        assert proxy.lost.is_set()
    finally:
        proxy.close()
    assert "outcome is unknown" in str(info.value), str(info.value)
    assert redis_client.llen(publisher.conf.task_default_queue) == 0  # not published
    app = make_app(fair_store_url=store_server.url + "/0")  # same namespace and queue
    assert held_count(app) == 1  # the script ran: the task is held
    with worker(concurrency=2, the_app=app), dispatcher(app):
        wait_for(lambda: app.ledger.ends() >= 1,  # type: ignore[attr-defined]
                 what="the held task to run")
        wait_for(lambda: store_for(app).snapshot(app.conf.task_default_queue)["inflight"] == 0,
                 what="its slot back")
    assert app.ledger.runs() == {"reply lost": 1}  # type: ignore[attr-defined]
    assert redis_client.llen(app.conf.task_default_queue) == 0


def test_a_full_store_publishes_the_task_straight_and_it_runs_once(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        store_server: RedisServer, redis_client: redis.Redis) -> None:
    app = make_app(fair_store_url=store_server.url + "/0", fair_on_store_error="publish")
    store = store_for(app)
    store.client.config_set("maxmemory", 1)  # Redis refuses a script's first write: OOM
    try:
        result = app.tasks["proj.work"].delay("acme", "store full")
    finally:
        store.client.config_set("maxmemory", 0)
    assert redis_client.llen(app.conf.task_default_queue) == 1
    with worker(concurrency=2, the_app=app):
        assert result.get(timeout=30) == "store full"
    assert app.ledger.runs() == {"store full": 1}  # type: ignore[attr-defined]
    assert held_count(app) == 0
