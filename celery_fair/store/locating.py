"""Where a held task stands (``locate``), the same arithmetic over any backend's reads.

Each backend finds the task (held, delayed or dispatched) its own way; for a held one it
answers three small reads (:class:`PlaceReads`) and :func:`place_of` estimates the
dispatches before it. Reads only, bounded by :data:`MAX_GROUPS_READ` groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol

from .base import GroupFigures, Location, Place, QueueFigures

#: Most ready groups read to estimate the dispatches ahead (beyond: a lower bound).
MAX_GROUPS_READ = 1000
CLASS_NAMES = {"i": "interactive", "b": "background"}


class Locating:
    """``locate`` for a backend that finds a task queue by queue (a mixin)."""

    def queues(self) -> list[str]:
        raise NotImplementedError

    def _held_at(self, queue: str, task_id: str) -> Location | None:
        raise NotImplementedError

    def _dispatched_at(self, queue: str, task_id: str) -> Location | None:
        raise NotImplementedError

    def _copies_at(self, queue: str, task_id: str) -> list[str]:
        """The hold ids ``<task_id>~<suffix>`` of the copies of ``task_id`` held in
        ``queue``, sorted (each backend's copies index: O(copies), no scan)."""
        raise NotImplementedError

    def locate(self, task_id: str) -> Location | None:
        """See :meth:`~celery_fair.store.base.Store.locate`: the task itself held, else
        a copy of it held under a suffixed id (the first in order), else its dispatch."""
        for queue in self.queues():
            found = self._held_at(queue, task_id) or self._copy_held_at(queue, task_id) \
                or self._dispatched_at(queue, task_id)
            if found is not None:
                return found
        return None

    def _copy_held_at(self, queue: str, task_id: str) -> Location | None:
        if "~" in task_id:  # a hold id already: its own copies index is its task id's
            return None
        for hold_id in self._copies_at(queue, task_id):
            found = self._held_at(queue, hold_id)
            if found is not None:  # reported under the id the caller knows
                return dataclasses.replace(found, task_id=task_id)
        return None


class PlaceReads(Protocol):
    """What :func:`place_of` reads from a backend."""

    def queue_figures(self, queue: str) -> QueueFigures: ...

    def group_figures(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]: ...

    def ready_rank(self, queue: str, klass: str, group: str) -> tuple[int | None, float]:
        """The group's rank in its class's ready set (None: not ready) and its start tag
        (not ready: at least the class's virtual time, where it re-enters)."""
        ...

    def ready_before(self, queue: str, klass: str, start: float,
                     limit: int) -> list[tuple[str, float]]:
        """At most ``limit`` ready groups of the class with a tag below ``start``, in
        order, with their tags."""
        ...


def place_of(reads: PlaceReads, queue: str, klass: str, group: str,
             position: int | None) -> Place:
    """The place of the message at ``position`` (0-based; None: not found in the list)
    of ``group``'s ``klass`` list. Interactive work goes first."""
    [row] = reads.group_figures(queue, [group])
    rank, tag = reads.ready_rank(queue, klass, group)
    start = tag + (position or 0) / row.weight  # the virtual start tag of this message
    ahead = reads.ready_before(queue, klass, start, MAX_GROUPS_READ)
    others = [(name, other_tag) for name, other_tag in ahead if name != group]
    figures = {r.group: r for r in reads.group_figures(queue, [g for g, _ in others])}
    before = position or 0
    for name, other_tag in others:
        before += min(_held(figures[name], klass),
                      math.ceil((start - other_tag) * figures[name].weight))
    if klass != "i":
        before += reads.queue_figures(queue).held_interactive
    return Place(position=None if position is None else position + 1,
                 group_held=_held(row, klass), inflight=row.inflight, cap=row.cap,
                 weight=row.weight, ready=rank is not None, groups_ahead=rank,
                 dispatches_before=before,
                 estimate_is_lower_bound=len(ahead) >= MAX_GROUPS_READ)


def _held(row: GroupFigures, klass: str) -> int:
    return row.held_interactive if klass == "i" else row.held_background
