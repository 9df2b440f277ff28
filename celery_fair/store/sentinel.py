"""The Redis store on a master found through Redis Sentinel (``redis+sentinel://`` or
kombu's ``sentinel://``).

redis-py's ``SentinelConnectionPool`` asks the sentinels for the master's address each
time it opens a connection, and drops its connections when that address changed (or when
the old master answers READONLY, demoted to a replica): a store command that fails during
a failover is retried by the store's own retries (``Bounds``) and, past those, by the
dispatcher's and workers' outage handling, and lands on the new master once the sentinels
promoted one. Nobody restarts.

The direct push is off: it needs the broker's Redis to be provably the store's own, and a
Sentinel master's address changes under both clients independently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from ..errors import ConfigurationError
from ..redact import safe_url
from ..urls import parse_sentinel_url
from .connection import Bounds, client_options
from .redis import RedisStore


@dataclass(frozen=True)
class RedisOptions:
    """The Redis store's settings beyond its URL and bounds: the Sentinel master's name
    and the sentinels' connection options (``fair_store_transport_options``), and the
    replicas each hold, release and cancel waits for (``fair_store_replicas``)."""

    master_name: str | None = None
    # sorted items (hashable); not in the repr: a password is among them
    sentinel_kwargs: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    replicas: int = 0
    replicas_timeout: float = 1.0

    @classmethod
    def of(cls, master_name: str | None = None,
           sentinel_kwargs: Mapping[str, Any] | None = None, replicas: int = 0,
           replicas_timeout: float = 1.0) -> RedisOptions:
        return cls(master_name, tuple(sorted((sentinel_kwargs or {}).items())), replicas,
                   replicas_timeout)


class SentinelStore(RedisStore):
    """The Redis store on the current master of a Sentinel-monitored service."""

    supports_direct_push = False

    def same_redis(self, connection_kwargs: Mapping[str, Any]) -> bool:
        return False  # see the module's docstring

    @classmethod
    def from_sentinel_url(cls, url: str, namespace: str, bounds: Bounds | None,
                          options: RedisOptions) -> SentinelStore:
        """A store on the master ``options.master_name`` of the sentinels of ``url``; the
        master's connections bounded by ``bounds`` like a plain Redis store's, the
        sentinels' by the same timeouts unless ``sentinel_kwargs`` say otherwise.

        Raises:
            ConfigurationError: no master name, or ``url`` is not a Sentinel URL.
        """
        try:
            parsed = parse_sentinel_url(url)
        except ValueError as exc:
            raise ConfigurationError(
                f"setting fair_store_url={safe_url(url)!r} is invalid: {exc}") from None
        if not options.master_name:
            raise ConfigurationError(
                f"setting fair_store_transport_options must name the Sentinel master of "
                f"fair_store_url={safe_url(url)!r}: {{'master_name': 'mymaster'}}")
        bounds = bounds or Bounds()
        # No retries of their own: asking for the master already tries each sentinel in
        # turn, and the store's command retries ask again.
        sentinel_kwargs = {"socket_timeout": bounds.socket_timeout,
                           "socket_connect_timeout": bounds.connect_timeout,
                           "retry": Retry(NoBackoff(), 0),
                           **dict(options.sentinel_kwargs)}
        sentinels = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs)
        master: redis.Redis = sentinels.master_for(
            options.master_name, db=parsed.db, username=parsed.username,
            password=parsed.password, **client_options(bounds, {}))
        return cls(master, namespace, where=parsed.where(options.master_name),
                   replicas=options.replicas, replicas_timeout=options.replicas_timeout)
