"""Pauses (``fair pause`` / ``fair resume``), a family of the store contract
(:class:`~celery_fair.store.base.Store` inherits it).

A paused group is not eligible in either class (interactive too, whatever its cap): it
leaves the ready sets, so the pick never scans it, and comes back on resume. A paused
queue (group :data:`WHOLE_QUEUE`) gives nothing to the pick. Running tasks are not
touched; held and newly held tasks wait. A pause has an end (``until_ms``) or none; the
dispatchers lift the due ones at their steps (:meth:`Pausing.expire_pauses`, one range
read of a sorted set or table, not a scan per pick). Pauses live in the store: they
survive dispatcher and store restarts, and a cap (``fair limit``) set meanwhile is kept
apart and in force again on resume.
"""

from __future__ import annotations

import abc

__all__ = ["WHOLE_QUEUE", "Pausing"]

#: The "group" of a whole-queue pause (no group name is empty).
WHOLE_QUEUE = ""


class Pausing(abc.ABC):
    """Pauses of the groups of each fair queue, and of whole queues."""

    @abc.abstractmethod
    def pause(self, queue: str, group: str, until_ms: int | None) -> None:
        """Pause ``group`` (:data:`WHOLE_QUEUE`: every group) of ``queue`` until
        ``until_ms`` (None: until resumed). A pause again replaces the last's end.
        The group's name is checked before anything is written (InvalidGroup)."""

    @abc.abstractmethod
    def resume(self, queue: str, group: str) -> bool:
        """Lift the pause of ``group`` (:data:`WHOLE_QUEUE`: the queue's) and wake the
        dispatchers; True when it was paused (a resend answers False, changing nothing)."""

    @abc.abstractmethod
    def pauses(self, queue: str) -> dict[str, int | None]:
        """{group (:data:`WHOLE_QUEUE`: the queue): until when (None: no end)}. Reads
        only; a pause past its end stays listed until expired."""

    @abc.abstractmethod
    def expire_pauses(self, queue: str, now_ms: int) -> list[str]:
        """Lift the pauses of ``queue`` whose end is at or before ``now_ms``, as
        :meth:`resume` does; returns their groups, sorted."""
