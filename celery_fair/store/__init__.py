"""Where held messages and dispatch state live. See base.Store for the contract.

The factory is here: :func:`store_for` gives an app its store, and :func:`store_for_url`
chooses the backend by the URL's scheme (:data:`BACKENDS`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

from celery import Celery

from ..config import FairConfig, get_config
from ..errors import ConfigurationError
from ..redact import safe_url
from ..urls import (
    CLUSTER_SCHEMES,
    REDIS_SCHEMES,
    SENTINEL_SCHEMES,
    SQL_SCHEMES,
    describe_schemes,
    scheme_of,
)
from .base import BeginResult, Picked, Store
from .cluster import ClusterStore
from .redis import Bounds, RedisStore
from .sentinel import RedisOptions, SentinelStore

__all__ = ["BACKENDS", "BeginResult", "Bounds", "ClusterStore", "Picked", "RedisOptions",
           "RedisStore", "SentinelStore", "Store", "bounds_of", "close_stores", "open_stores",
           "redis_options_of", "store_for", "store_for_url"]

Opener = Callable[[str, str, Bounds, str, RedisOptions], Store]


def _redis(url: str, namespace: str, bounds: Bounds, table_prefix: str,
           options: RedisOptions) -> Store:
    return RedisStore.from_url(url, namespace, bounds, options.replicas,
                               options.replicas_timeout)


def _sentinel(url: str, namespace: str, bounds: Bounds, table_prefix: str,
              options: RedisOptions) -> Store:
    return SentinelStore.from_sentinel_url(url, namespace, bounds, options)


def _cluster(url: str, namespace: str, bounds: Bounds, table_prefix: str,
             options: RedisOptions) -> Store:
    return ClusterStore.from_cluster_url(url, namespace, bounds, options)


def _sql(url: str, namespace: str, bounds: Bounds, table_prefix: str,
         options: RedisOptions) -> Store:
    try:
        from .sql.store import SqlStore
    except ImportError as exc:  # SQLAlchemy is an extra
        raise ConfigurationError(
            f"setting fair_store_url={safe_url(url)!r} needs the SQL store's packages: "
            f"pip install 'celery-fair[sql]' ({exc})") from None
    return SqlStore.from_url(url, namespace, bounds, table_prefix)


#: URL scheme of ``fair_store_url`` -> how to open a store there.
BACKENDS: dict[str, Opener] = {**{s: _redis for s in REDIS_SCHEMES},
                               **{s: _sentinel for s in SENTINEL_SCHEMES},
                               **{s: _cluster for s in CLUSTER_SCHEMES},
                               **{s: _sql for s in SQL_SCHEMES}}

_stores: dict[tuple[int, str, str, Bounds, str, RedisOptions], Store] = {}
#: store_for's answer per app's settings (by identity: the config is kept, so its id is
#: not reused; the process checked, so a fork opens its own): each fair publish asks, and
#: the key of _stores (the bounds and Redis options made again, hashed) costs more.
_last: dict[int, tuple[FairConfig, int, Store]] = {}


def store_for(app: Celery) -> Store:
    """The store of ``app``'s fair queues in this process."""
    config = get_config(app)
    last = _last.get(id(config))
    if last is not None and last[0] is config and last[1] == os.getpid():
        return last[2]
    store = store_for_url(config.store_url, config.key_prefix, bounds_of(config),
                          getattr(config, "store_table_prefix", "fair_"),
                          redis_options_of(config))
    _last[id(config)] = (config, os.getpid(), store)
    return store


def redis_options_of(config: FairConfig) -> RedisOptions:
    """The Redis store's Sentinel and replication settings (``fair_store_*``)."""
    return RedisOptions.of(config.store_master_name, config.store_sentinel_kwargs,
                           config.store_replicas, config.store_replicas_timeout)


def bounds_of(config: FairConfig) -> Bounds:
    """How long the store's commands may block, from the ``fair_store_*`` settings."""
    return Bounds(config.store_socket_timeout, config.store_connect_timeout,
                  config.store_retries)


def store_for_url(url: str, namespace: str, bounds: Bounds | None = None,
                  table_prefix: str = "fair_", options: RedisOptions | None = None) -> Store:
    """One store per process, URL, namespace, bounds, table prefix and Redis options (a
    new one after fork), of the backend that serves the URL's scheme (the prefix names the
    SQL store's tables; ``options`` are a Redis store's Sentinel master and replicas).

    Raises:
        ConfigurationError: no backend serves the URL's scheme.
    """
    bounds, options = bounds or Bounds(), options or RedisOptions()
    key = (os.getpid(), url, namespace, bounds, table_prefix, options)
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = _backend(url)(url, namespace, bounds, table_prefix, options)
    return store


def open_stores() -> list[Store]:
    """The stores :func:`store_for_url` has opened in this process and not closed."""
    return [store for key, store in _stores.items() if key[0] == os.getpid()]


def close_stores(keep: Collection[Store] = ()) -> None:
    """Close and forget this process's stores but those in ``keep``, and so their
    connections (a SQL store's pool and listener): for a test's teardown, or a process
    that is done with a namespace. The next :func:`store_for` opens a new one."""
    _last.clear()
    for key, store in list(_stores.items()):
        if key[0] == os.getpid() and all(store is not kept for kept in keep):
            del _stores[key]
            try:
                store.close()
            except Exception:  # noqa: BLE001 - a broken connection has nothing to release
                pass


def _backend(url: str) -> Opener:
    scheme = scheme_of(url)
    if scheme not in BACKENDS:
        raise ConfigurationError(f"setting fair_store_url={safe_url(url)!r} is invalid: "
                                 "expected a URL of a scheme celery_fair supports "
                                 f"({describe_schemes()})")
    return BACKENDS[scheme]
