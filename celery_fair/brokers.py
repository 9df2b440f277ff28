"""What celery_fair needs from the Celery app and its broker, checked with clear errors.

Also undoes the one broker-specific rewrite Celery makes at publish time: with RabbitMQ
quorum queues, an ETA/countdown message goes to the native delayed-delivery exchange
(``celery_delayed_27``) with the delay encoded in its routing key. celery_fair keeps the
delay itself (the delayed set), so a held message gets its real destination back.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.transport import TRANSPORT_ALIASES

from .errors import ConfigurationError
from .redact import safe_url

REDIS, AMQP = "redis", "amqp"
#: kombu transports celery_fair can publish through, by module.
_SUPPORTED = {"kombu.transport.redis": REDIS, "kombu.transport.pyamqp": AMQP}
_WORKS = ("Redis (redis://, rediss://, sentinel://) or RabbitMQ through py-amqp "
          "(amqp://, amqps://, pyamqp://)")

#: Celery's native delayed-delivery exchanges (``celery_delayed_<level>``, maybe prefixed).
_DELAYED_EXCHANGE = re.compile(r"(?:^|_)celery_delayed_\d+$")
#: The 28 bits of delay kombu prepends to the routing key (``0.1.0....1.<routing key>``).
_DELAY_PREFIX = re.compile(r"^(?:[01]\.){28}")


@dataclass(frozen=True)
class _Checked:
    key: tuple[Any, ...]
    kind: str


_checked: weakref.WeakKeyDictionary[Celery, _Checked] = weakref.WeakKeyDictionary()


def broker_kind(app: Celery) -> str:
    """``'redis'`` or ``'amqp'``: the app's broker; raises ConfigurationError otherwise."""
    conf = app.conf
    key = (conf.broker_write_url, conf.broker_transport, conf.task_protocol)
    checked = _checked.get(app)
    if checked is None or checked.key != key:
        _check_protocol(conf.task_protocol)
        checked = _checked[app] = _Checked(key, _transport_kind(*key[:2]))
    return checked.kind


def check_app(app: Celery, dispatching: bool = False) -> str:
    """Fail early and clearly on what celery_fair cannot work with; returns the broker kind.

    Called at each fair publish (not in eager mode) and when a dispatcher starts.
    """
    if dispatching and app.conf.task_always_eager:
        raise ConfigurationError(
            "task_always_eager is set: fair tasks run at once in the caller and nothing is "
            "held, so a dispatcher has nothing to do; unset task_always_eager to hold and "
            "dispatch tasks, or don't start a dispatcher")
    return broker_kind(app)


def _check_protocol(protocol: Any) -> None:
    if protocol != 2:
        raise ConfigurationError(
            f"task_protocol={protocol!r} is not supported: celery_fair needs Celery's task "
            "message protocol 2 (the default since Celery 4); remove the task_protocol "
            "setting or set it to 2")


def _transport_kind(url: Any, transport: Any) -> str:
    first = (url or "").split(";")[0] if isinstance(url, str) else ""
    name = transport or first.partition("://")[0].split("+")[0] or "amqp"
    target = TRANSPORT_ALIASES.get(name, name) if isinstance(name, str) else name
    module = target.partition(":")[0] if isinstance(target, str) \
        else getattr(target, "__module__", "")
    kind = _SUPPORTED.get(module)
    if kind is None:
        raise ConfigurationError(
            f"broker transport {name!r} ({safe_url(first) or 'set by broker_transport'}) "
            f"is not supported by celery_fair: use {_WORKS} as the Celery broker. "
            "task_always_eager=True keeps working on any broker (tests)")
    return kind


def publish_connection(app: Celery) -> Connection:
    """A new broker connection for the dispatcher; on RabbitMQ every publish is confirmed.

    With ``confirm_publish`` py-amqp waits for the broker's ack of each publish and raises
    ``MessageNacked`` when the broker refuses it (a full ``reject-publish`` queue...).
    """
    options = {"confirm_publish": True} if broker_kind(app) == AMQP else {}
    connection: Connection = app.connection_for_write(transport_options=options)
    return connection


def real_destination(app: Celery, exchange: str, routing_key: str,
                     declared: Sequence[Any]) -> tuple[str, str, str]:
    """``(exchange, routing key, queue)`` a held message is to be published to.

    The queue names the fair queue (its capacity is the workers consuming it).
    """
    if _DELAYED_EXCHANGE.search(exchange) and _DELAY_PREFIX.match(routing_key):
        return _undelayed(app, _DELAY_PREFIX.sub("", routing_key, count=1))
    if not exchange:  # the default exchange routes by queue name
        return exchange, routing_key, routing_key
    names = [getattr(q, "name", q) for q in declared]
    candidates = [q for q in declared if not isinstance(q, str)]
    candidates += list(app.amqp.queues.values())
    for queue in candidates:
        if _binds(queue, exchange, routing_key):
            return exchange, routing_key, str(queue.name)
    return exchange, routing_key, str(names[0]) if names else routing_key


def _binds(queue: Any, exchange: str, routing_key: str) -> bool:
    if getattr(queue.exchange, "name", None) == exchange and queue.routing_key == routing_key:
        return True
    return any(getattr(b.exchange, "name", b.exchange) == exchange
               and b.routing_key == routing_key for b in queue.bindings or ())


def _undelayed(app: Celery, routing_key: str) -> tuple[str, str, str]:
    """The queue Celery rerouted to its delayed-delivery exchange: the one with this key."""
    found = [q for q in app.amqp.queues.values()
             if q.routing_key == routing_key and q.exchange is not None
             and q.exchange.type != "direct"]
    exchanges = {q.exchange.name for q in found}
    if len(exchanges) != 1:
        raise ConfigurationError(
            f"cannot tell the real destination of a delayed message with routing key "
            f"{routing_key!r}: Celery sent it to its native delayed-delivery exchange and "
            f"{len(exchanges)} exchanges of task_queues match; declare the target queue "
            "(with its topic exchange) in task_queues, once")
    queue = found[0]
    return str(queue.exchange.name), routing_key, str(queue.name)
