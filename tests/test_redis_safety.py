"""Redis settings that can lose held tasks are reported when a dispatcher starts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis

from celery_fair.store.safety import unsafe_settings
from celery_fair.testing import RedisServer

from .conftest import wait_for


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A server of this module's own: the tests change its settings."""
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture
def client(own_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=own_server.port)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("appendonly", "yes")
    client.config_set("save", "")
    yield client
    client.config_set("appendonly", "no")


def test_safe_settings_say_nothing(client: redis.Redis) -> None:
    assert unsafe_settings(client) == []
    client.config_set("appendonly", "no")
    client.config_set("save", "3600 1")  # RDB snapshots alone count as persistence
    assert unsafe_settings(client) == []


@pytest.mark.parametrize("policy,text", [
    ("allkeys-lru", "deletes any key"),
    ("allkeys-random", "deletes any key"),
    ("volatile-lru", "keys with a TTL"),
    ("volatile-ttl", "keys with a TTL"),
])
def test_evicting_policies_are_reported(client: redis.Redis, policy: str, text: str) -> None:
    client.config_set("maxmemory-policy", policy)
    [sentence] = unsafe_settings(client)
    assert f"maxmemory-policy is {policy}" in sentence and text in sentence
    assert "noeviction" in sentence


def test_persistence_off_is_reported(client: redis.Redis) -> None:
    client.config_set("appendonly", "no")
    [sentence] = unsafe_settings(client)
    assert "persistence is off" in sentence and "appendonly yes" in sentence


def test_unreadable_settings_are_not_an_error(client: redis.Redis, own_server: RedisServer,
                                              caplog: Any) -> None:
    """Managed services often forbid CONFIG: a user without it gets no warning, no error."""
    client.acl_setuser("limited", enabled=True, passwords=["+secret"], keys=["*"],
                       commands=["+@all", "-config"])
    limited = redis.Redis(port=own_server.port, username="limited", password="secret")
    caplog.set_level(logging.INFO)
    assert unsafe_settings(limited) == []
    assert "could not read the Redis settings" in caplog.text


def test_dispatcher_warns_once_at_start(make_app: Callable[..., Any],
                                        dispatcher: Callable[..., Any],
                                        redis_client: redis.Redis, caplog: Any) -> None:
    """The session's test server runs without persistence: the dispatcher says so."""
    app = make_app()
    caplog.set_level(logging.WARNING, logger="celery_fair.dispatcher")
    redis_client.config_set("maxmemory-policy", "volatile-lru")
    try:
        with dispatcher(app):
            wait_for(lambda: "persistence is off" in caplog.text, timeout=10,
                     what="the persistence warning")
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    lines = [r.getMessage() for r in caplog.records if r.name == "celery_fair.dispatcher"
             and r.getMessage().startswith("celery_fair store ")]  # the store's advice
    assert len(lines) == 2, lines
    assert "maxmemory-policy is volatile-lru" in lines[0]
    assert lines[1].startswith("celery_fair store redis://127.0.0.1:")
