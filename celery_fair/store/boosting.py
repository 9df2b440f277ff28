"""Boosts (``fair boost``), a family of the store contract
(:class:`~celery_fair.store.base.Store` inherits it).

A boosted group is picked with the boost's weight instead of its weight in force (the
setting or ``fair limit``'s), until the boost's end (``until_ms``) or an unboost. The
boost is kept apart from the runtime limits and the settings, so nothing is saved or
restored: when it ends the weight in force is whatever ``fair limit`` or the settings
say then. The dispatchers lift the due boosts at their steps
(:meth:`Boosting.expire_boosts`, one range read, as for pauses). Boosts live in the
store: they survive dispatcher and store restarts.
"""

from __future__ import annotations

import abc

__all__ = ["Boosting"]


class Boosting(abc.ABC):
    """Boosts of the groups of each fair queue."""

    @abc.abstractmethod
    def boost(self, queue: str, group: str, weight: float, until_ms: int | None) -> None:
        """Pick ``group`` of ``queue`` with ``weight`` until ``until_ms`` (None: until
        unboosted). A boost again replaces the last. The group's name and the weight are
        checked before anything is written (InvalidGroup, InvalidLimit)."""

    @abc.abstractmethod
    def unboost(self, queue: str, group: str) -> bool:
        """End ``group``'s boost; True when it was boosted (a resend answers False)."""

    @abc.abstractmethod
    def boosts(self, queue: str) -> dict[str, tuple[float, int | None]]:
        """{group: (boost weight, until when (None: no end))}. Reads only; a boost past
        its end stays listed until expired."""

    @abc.abstractmethod
    def boost_task(self, queue: str, hold_id: str, *, now_ms: int | None = None) -> str | None:
        """Move the message held under ``hold_id`` to the front of its group's list, and
        its group to the front of its class's ready set once (its tag just below the
        lowest: picked next, unless the other class or a cap comes first). Atomic. A new
        head is stamped ``now_ms`` (default: the wall clock) as its head time.
        Returns its group, or None when it is not held (delayed, dispatched, unknown):
        nothing changed."""

    @abc.abstractmethod
    def expire_boosts(self, queue: str, now_ms: int) -> list[str]:
        """End the boosts of ``queue`` whose end is at or before ``now_ms``; returns
        their groups, sorted."""
