"""The dispatchers' heartbeats, a family of the store contract (:class:`~celery_fair.
store.base.Store` inherits it): which dispatchers are alive, and what they serve.

A dispatcher beats at most once a second (``celery_fair.heartbeat``); a beat lasts
``ttl_ms``, so a dispatcher that stops beating (killed, hung, cut off from the store)
drops out of :meth:`Beats.dispatchers` within that time, and a clean stop forgets it at
once. The caller's clock, as for the worker registry.
"""

from __future__ import annotations

import abc

from .models import PRUNE_GRACE_MS, DispatcherBeat

__all__ = ["PRUNE_GRACE_MS", "Beats", "DispatcherBeat"]


class Beats(abc.ABC):
    """Heartbeats of the dispatchers of one namespace (every fair queue's together)."""

    @abc.abstractmethod
    def beat(self, dispatcher: DispatcherBeat, now_ms: int, ttl_ms: int) -> None:
        """``dispatcher`` is alive until ``now_ms + ttl_ms``: written whole (the newest
        beat of an id replaces its last). Idempotent. Beats expired :data:`PRUNE_GRACE_MS`
        before ``now_ms`` are dropped (the margin keeps a host whose clock runs ahead
        from dropping beats another host's clock still sees as live)."""

    @abc.abstractmethod
    def dispatchers(self, now_ms: int) -> list[DispatcherBeat]:
        """The dispatchers alive at ``now_ms`` (their last beat has not expired), by id.
        Reads only."""

    @abc.abstractmethod
    def forget_dispatcher(self, dispatcher_id: str) -> None:
        """The dispatcher stopped cleanly: drop its beat now (idempotent)."""
