"""Where held messages and dispatch state live. See base.Store for the contract.

The factory is here: :func:`store_for` gives an app its store, and :func:`store_for_url`
chooses the backend by the URL's scheme (:data:`BACKENDS`).
"""

from __future__ import annotations

import os
from typing import Callable

from celery import Celery

from ..config import FairConfig, get_config
from ..errors import ConfigurationError
from ..redact import safe_url
from .base import BeginResult, Picked, Store
from .redis import Bounds, RedisStore

__all__ = ["BACKENDS", "BeginResult", "Bounds", "Picked", "RedisStore", "Store", "bounds_of",
           "store_for", "store_for_url"]

#: URL scheme of ``fair_store_url`` -> how to open a store there.
BACKENDS: dict[str, Callable[[str, str, Bounds], Store]] = {
    "redis": RedisStore.from_url,
    "rediss": RedisStore.from_url,
    "unix": RedisStore.from_url,
}

_stores: dict[tuple[int, str, str, Bounds], Store] = {}


def store_for(app: Celery) -> Store:
    """The store of ``app``'s fair queues in this process."""
    config = get_config(app)
    return store_for_url(config.store_url, config.key_prefix, bounds_of(config))


def bounds_of(config: FairConfig) -> Bounds:
    """How long the store's commands may block, from the ``fair_store_*`` settings."""
    return Bounds(config.store_socket_timeout, config.store_connect_timeout,
                  config.store_retries)


def store_for_url(url: str, namespace: str, bounds: Bounds | None = None) -> Store:
    """One store per process, URL, namespace and bounds (a new one after fork), of the
    backend that serves the URL's scheme.

    Raises:
        ConfigurationError: no backend serves the URL's scheme.
    """
    bounds = bounds or Bounds()
    key = (os.getpid(), url, namespace, bounds)
    store = _stores.get(key)
    if store is None:
        store = _stores[key] = _backend(url)(url, namespace, bounds)
    return store


def _backend(url: str) -> Callable[[str, str, Bounds], Store]:
    scheme, found, _ = url.partition("://")
    if not found or scheme not in BACKENDS:
        schemes = ", ".join(f"{name}://" for name in BACKENDS)
        raise ConfigurationError(f"setting fair_store_url={safe_url(url)!r} is invalid: "
                                 f"expected a URL of a scheme celery_fair supports ({schemes})")
    return BACKENDS[scheme]
