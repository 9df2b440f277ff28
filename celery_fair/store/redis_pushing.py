"""The Redis store's direct push (``pushing.py``): it may push picked messages into
kombu's list when the broker is its own Redis database, and let releases refill the
slots they free while a dispatcher's parameters are in the queue's ``refill`` hash
(``refill.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis

from .connection import _wrapped
from .keys import QueueKeys
from .lane import Lane, round_trip
from .pushing import DirectPushing

#: redis-py connection settings that name a server and database.
_WHERE = ("host", "port", "db", "path")


class RedisPushing(DirectPushing):
    """The direct push of :class:`~celery_fair.store.redis.RedisStore` (a mixin)."""

    supports_direct_push = True
    client: redis.Redis
    where: str
    _lane: Lane | None

    def keys(self, queue: str) -> QueueKeys:
        raise NotImplementedError  # RedisStore gives them

    def same_redis(self, connection_kwargs: Mapping[str, Any]) -> bool:
        """See :meth:`Store.same_redis`: the same host and port or socket path, and db."""
        ours = self.client.connection_pool.connection_kwargs
        return all(ours.get(key) == connection_kwargs.get(key) for key in _WHERE) \
            and any(ours.get(key) for key in ("host", "path"))

    def refilling(self, queue: str) -> bool:
        with _wrapped(self.where):
            return bool(self.client.exists(self.keys(queue).refill))

    def end_refill(self, queues: Iterable[str]) -> list[str]:
        keys = [self.keys(q) for q in queues]
        commands = [c for k in keys for c in (("DEL", k.refill), ("EXISTS", k.refilled, k.handoff))]
        with _wrapped(self.where):
            answers = round_trip(self.client, self._lane, commands) if keys else []
        return [k.queue for k, waiting in zip(keys, answers[1::2]) if waiting]
