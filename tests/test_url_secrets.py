"""Passwords in store and broker URLs never show: not in errors, logs, CLI output or the
demo's. URLs are shown as Celery shows them (kombu's sanitize_url: ``redis://:**@host``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_fair.cli import fair, main
from celery_fair.config import reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import ConfigurationError, StoreConnectionError
from celery_fair.testing import RedisServer, free_port

from .proj import create_app

SECRET = "s3cret-pw"


@pytest.fixture
def locked_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own that asks for a password."""
    server = RedisServer()
    redis.Redis(port=server.port).config_set("requirepass", SECRET)
    yield server
    server.stop()


def locked_url(server: RedisServer) -> str:
    return f"redis://:{SECRET}@127.0.0.1:{server.port}/0"


def cli(app: Celery, *args: str) -> str:
    obj = CLIContext(app=app, no_color=True, workdir=None)
    result = CliRunner().invoke(fair, list(args), obj=obj)
    return result.output + repr(result.exception)


def test_an_unreachable_store_is_named_without_its_password(
        make_app: Callable[..., Celery]) -> None:
    port = free_port()
    app = make_app(fair_store_url=f"redis://user:{SECRET}@127.0.0.1:{port}/0")
    with pytest.raises(StoreConnectionError) as info:
        app.tasks["proj.work"].delay("acme", "x")
    assert f"127.0.0.1:{port}" in str(info.value)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert SECRET not in cli(app, "status")


@pytest.mark.parametrize("conf", [
    {"fair_store_url": None, "broker_url": f"amqp://guest:{SECRET}@127.0.0.1:1//"},
    {"fair_store_url": f"http://user:{SECRET}@127.0.0.1:6379/0"},
    {"fair_store_url": f"redis://:{SECRET}@127.0.0.1:1/0", "fair_key_prefix": ""},
], ids=["broker-not-redis", "store-not-redis", "store-url-beside-a-bad-setting"])
def test_a_setting_error_never_shows_a_password(make_app: Callable[..., Celery],
                                                conf: dict[str, Any]) -> None:
    app = make_app(**conf)
    with pytest.raises(ConfigurationError) as info:
        Dispatcher(app)
    assert SECRET not in str(info.value), str(info.value)


@pytest.mark.parametrize("direct_push", [True, False], ids=["direct-push", "kombu-publish"])
def test_dispatcher_worker_and_cli_never_show_the_password(
        namespace: str, worker: Callable[..., Any], dispatcher: Callable[..., Any],
        locked_server: RedisServer, caplog: Any, direct_push: bool) -> None:
    # Broker, results and store all on the Redis that asks for a password.
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    app = create_app(locked_url(locked_server), namespace, "q-" + namespace,
                     fair_direct_push=direct_push)
    reset_config(app)
    with worker(concurrency=2, the_app=app), dispatcher(app):
        assert app.tasks["proj.work"].delay("acme", "x").get(timeout=30) == "x"
    # The store was named (its persistence is off: the dispatcher warns, naming it) ...
    assert f"127.0.0.1:{locked_server.port}" in caplog.text
    # ... never with its password.
    assert SECRET not in caplog.text
    for command in (("status",), ("check",), ("groups",)):
        assert SECRET not in cli(app, *command), command
    locked_server.halt()
    for command in (("status",), ("check",)):
        output = cli(app, *command)
        assert f"127.0.0.1:{locked_server.port}" in output and SECRET not in output, output


def test_the_demo_names_an_unreachable_redis_without_its_password() -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(main, ["demo", "--redis", url])
    assert result.exit_code != 0
    assert "cannot reach Redis" in result.output and SECRET not in result.output, \
        result.output


#: Passwords with the characters that end a URL's netloc (written unencoded, as people
#: do): a parser that splits at them must not show the part before the split.
UNENCODED = [
    f"redis+sentinel://admin:{SECRET}/x@s1:26379,s2:26379/0",
    f"redis+sentinel://admin:{SECRET}?x@s1:26379/0",
    f"redis+cluster://admin:{SECRET}?x@n1:7000/",
    f"redis+cluster://admin:{SECRET}/x@n1:7000,n2:7001/",
    f"redis://:{SECRET}/x@127.0.0.1:6379/0",
    f"redis://:{SECRET}@x/y@127.0.0.1:6379/0",
    f"postgresql://app:{SECRET}#x@127.0.0.1/db",
]


@pytest.mark.parametrize("url", UNENCODED)
def test_a_password_with_unencoded_delimiters_never_shows(
        make_app: Callable[..., Celery], url: str) -> None:
    from celery_fair.redact import safe_url

    assert SECRET not in safe_url(url)
    app = make_app(fair_store_url=url)
    try:
        Dispatcher(app)
    except Exception as exc:  # noqa: BLE001 - whatever it is, it names no secret
        assert SECRET not in str(exc) and SECRET not in repr(exc), str(exc)


def test_parsed_store_urls_keep_their_credentials_out_of_their_repr() -> None:
    from celery_fair.urls import parse_cluster_url, parse_sentinel_url

    sentinel = parse_sentinel_url(f"redis+sentinel://admin:{SECRET}@s1:26379/0")
    cluster = parse_cluster_url(f"redis+cluster://admin:{SECRET}@n1:7000/")
    assert sentinel.password == cluster.password == SECRET
    assert SECRET not in repr(sentinel) and SECRET not in repr(cluster)
