"""Affinity routing, a family of the store contract (:class:`~celery_fair.store.base.Store`
inherits it): with ``fair_affinity = "hash"`` each group's tasks go to one worker, and a
worker's capacity is its own.

The store keeps what every dispatcher must agree on: each group's worker (the *map*,
written by the dispatchers, who compute the owners: :mod:`celery_fair.routing`), each
worker's routed dispatches in flight (the dispatch record names its worker; release and
reclaim give the slot back to it) and the number of groups moved so far. The pick takes a
group only when its worker has a free slot of its own, or when its head has waited the
spill time (then the worker with the most room takes it).

A backend declares :attr:`supports_affinity`; one without it refuses the setting when a
dispatcher starts (:func:`refuse_affinity`). Every store of celery-fair has it (Redis:
``redis_routing.py``; memory and SQL: the shared policy's ``policy/routing.py``); the
refusal is for another backend of the contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigurationError
from .models import Picked

__all__ = ["Routed", "Routing", "refuse_affinity", "refuse_group_queues"]


@dataclass(frozen=True)
class Routed:
    """What one routed pick took."""

    #: The messages taken, in pick order.
    picked: list[Picked] = field(default_factory=list)
    #: The worker each one goes to (same order).
    workers: list[str] = field(default_factory=list)
    #: Ready groups met without a live worker in the map: the caller assigns them (their
    #: messages stay held, in their place, meanwhile).
    unassigned: list[str] = field(default_factory=list)
    #: ``promote``'s answer when it ran in the same round trip: (moved, next due ms).
    promoted: tuple[int, int | None] = (0, None)


def refuse_affinity(store: Routing, queues: Sequence[str]) -> None:
    """Raise ConfigurationError when ``queues`` ask for affinity (``"*"``: the app-wide
    setting) and ``store`` has none."""
    _refuse(store, queues, "fair_affinity='hash'", "routes by worker", "fair_affinity='none'")


def refuse_group_queues(store: Routing, queues: Sequence[str]) -> None:
    """Raise ConfigurationError when ``queues`` set fair_group_queues (``"*"``: the
    app-wide setting) and ``store`` cannot route (the same machinery as affinity)."""
    _refuse(store, queues, "fair_group_queues", "routes groups",
            "leave fair_group_queues empty")


def _refuse(store: Routing, queues: Sequence[str], setting: str, needs: str,
            instead: str) -> None:
    if queues and not store.supports_affinity:
        which = "every fair queue" if "*" in queues else \
            "queues " + ", ".join(map(repr, queues))
        raise ConfigurationError(
            f"setting {setting} ({which}) needs a store that {needs}; the "
            f"{type(store).__name__} does not: use one of celery-fair's stores (Redis, "
            f"SQL or memory: fair_store_url redis://..., postgresql://...), or {instead}")


class Routing:
    """Affinity routing; a backend without it keeps :attr:`supports_affinity` False and
    the methods below refuse."""

    #: The backend can route groups to workers (:meth:`pick_routed` and the map).
    supports_affinity: bool = False

    def pick_routed(self, queue: str, limit: int, capacity: int | None, now_ms: int,
                    lease_ms: int, workers: Mapping[str, int], spill_ms: int | None, *,
                    promote: bool = False, token: str | None = None) -> Routed:
        """:meth:`~Store.pick` for a queue with affinity, atomic as it is: a group is
        taken only while its worker in the map is one of ``workers`` (worker -> the most
        it may have in flight) with a slot free, or once its head has waited
        ``spill_ms`` (None: never; then the worker with the most room takes it). Each
        dispatch's record names its worker, which it counts against until its release or
        reclaim. With ``promote``, due delayed messages are promoted first (the same
        round trip). ``token``: the dispatch ids' prefix (as :meth:`~Store.pick`'s;
        None: a random one). Without ``workers`` nothing is taken (no pick counted).
        Returns the picks, their workers, the groups met unassigned."""
        raise ConfigurationError(f"the {type(self).__name__} has no affinity routing")

    def assign(self, queue: str, changes: Sequence[tuple[str, str | None, str]]) -> int:
        """Set groups' workers: each (group, worker as read, new worker) applies only if
        the map still says the worker as read ('' for none; None: whatever it says),
        atomically, so two dispatchers making one change make it once; a group the
        queue no longer knows is dropped from the map instead. Returns the number of
        groups moved from one worker to another, also added to :meth:`affinity_moves`."""
        raise ConfigurationError(f"the {type(self).__name__} has no affinity routing")

    def assignments(self, queue: str) -> dict[str, str]:
        """The map: {group: worker}. Reads only."""
        return {}

    def worker_inflight(self, queue: str) -> dict[str, int]:
        """Each worker's routed dispatches in flight (workers with none are left out).
        Reads only."""
        return {}

    def affinity_moves(self, queue: str) -> int:
        """Groups moved from one worker to another in ``queue`` so far. Reads only."""
        return 0
