"""The direct push: when the broker is the store's own Redis, ``pick.lua`` moves messages
into kombu's list itself.

Publishing through kombu costs the dispatcher a round trip (or a pipelined command) and
~100-200 µs of Python per message; the pick script building kombu's Redis message and
pushing it in the same atomic call costs a few µs inside Redis, and leaves no window
between pick and publish (the dispatch is 'queued' at once). It is used only where the
result is exactly what kombu would have published:

- the broker is kombu's Redis transport on the same server and database as the store,
  without ``global_keyprefix`` and with base64 bodies (kombu's defaults);
- the real queue has no ``x-expires`` (kombu would refresh it on each publish);
- per message (decided in the script): it is addressed to the queue by name, or through
  the queue's own direct exchange and routing key while every binding of that routing key
  leads to this queue alone; and it carries no ``expires`` (the dispatcher checks those).

Everything else is returned by the pick and published with kombu as before. Setting
``fair_direct_push = False`` turns it off.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.connection import Connection

from .store.base import DirectPush, Store


def direct_push(app: Celery, store: Store, connection: Connection,
                queue: str) -> DirectPush | None:
    """How ``pick`` may push into ``queue``'s kombu list, or None where it may not."""
    channel: Any = connection.default_channel  # kombu's Redis Channel
    if not _same_redis(store, channel):
        return None
    if channel.global_keyprefix or channel.body_encoding != "base64":
        return None  # keys or bodies kombu writes differently
    definition = app.amqp.queues.get(queue)
    exchange, routing_key = "", ""
    if definition is not None:
        if definition.expires or (definition.queue_arguments or {}).get("x-expires"):
            return None
        entity = definition.exchange
        if entity is not None and entity.name and entity.type == "direct":
            exchange, routing_key = entity.name, definition.routing_key or ""
    return DirectPush(
        queue=queue, sep=channel.sep, priority_steps=tuple(channel.priority_steps),
        exchange=exchange, routing_key=routing_key,
        binding_key=channel.keyprefix_queue % exchange)


def _same_redis(store: Store, channel: Any) -> bool:
    client = getattr(channel, "client", None)
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return False
    return store.same_redis(pool.connection_kwargs)
