"""The direct push, a capability a store backend declares (``celery_fair.direct``,
``celery_fair.refill``): a backend on the broker's own Redis may push picked messages
into kombu's list itself and let releases refill the slots they free. These defaults
say it cannot; callers check :attr:`DirectPushing.supports_direct_push`, never the
backend's type."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class DirectPushing:
    #: The backend can push picked messages into kombu's Redis list itself
    #: (``pick_and_push`` with a ``DirectPush``). Without it, ``push`` must be None.
    supports_direct_push: bool = False

    def same_redis(self, connection_kwargs: Mapping[str, Any]) -> bool:
        """Whether a redis-py connection with ``connection_kwargs`` (the broker's) reaches
        this store's server and database: where a direct push may go. False unless the
        backend :attr:`supports_direct_push`."""
        return False

    def refilling(self, queue: str) -> bool:
        """Whether a dispatcher lets ``queue``'s releases refill the slots they free now
        (its parameters are in the store): ``fair status`` shows the dispatch-ahead
        "auto" gives it. False for a backend without direct push (this default)."""
        return False

    def end_refill(self, queues: Iterable[str]) -> list[str]:
        """A dispatcher stops: the refill parameters its picks left for ``queues``
        (``DirectPush.refill_ms``) go, and releases wake dispatchers again. Returns those
        of ``queues`` where what releases refilled or handed off waits for a pick.
        Nothing to do for a backend without direct push (this default)."""
        return []
