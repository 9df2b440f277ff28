"""The longest-waiting group heads, a family of the store contract (:class:`~celery_fair.
store.base.Store` inherits it): for the per-group tip-of-queue wait metrics, which must
keep the groups whose head has waited longest (a small tenant starved behind a big one),
not the groups holding the most.

A head waits from when it became the head (each group keeps that time per class,
stamped at every change of its head), or from its due time when that is later: a group
served steadily from a long backlog does not look stuck (:func:`head_wait`).

No backend keeps its groups ordered by head time (the ready sets are ordered by virtual
start tag, the ``backlog`` ranking by held count). So this is a bounded scan over the
existing contract reads, the same on every backend: the groups of the ``backlog``
ranking (:meth:`top_groups`, at most ``scan`` of them), their heads read :data:`CHUNK`
groups per :meth:`summarize` call (on Redis one short script each), the ``limit`` oldest
kept. Cost: O(min(groups, scan)) reads per call, in calls of :data:`CHUNK` groups; past
``scan`` groups, those holding the fewest messages are not read.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from .models import GroupHeads

__all__ = ["CHUNK", "SCAN_LIMIT", "HeadWaits", "head_due", "head_wait", "waiting_since"]

#: Groups read per ``summarize`` call: bounds how long one call keeps the store busy.
CHUNK = 200
#: Most groups one :meth:`HeadWaits.longest_heads` call reads.
SCAN_LIMIT = 10_000


def head_due(heads: GroupHeads) -> float | None:
    """When the group's oldest held message (of either class) became due, epoch
    seconds; None when it holds none (or only messages held before due times)."""
    dues = [d for d in (heads.due_interactive, heads.due_background) if d is not None]
    return min(dues) if dues else None


def waiting_since(heads: GroupHeads) -> float | None:
    """Since when the group's longest-waiting head (of either class) has waited, epoch
    seconds: the later of when it became the head and when it became due (a delayed head
    is not waiting before it is due). A head stamped before the store kept head times
    (``since`` None) counts from its due time; None when the group holds nothing with a
    time."""
    starts = []
    for held, due, since in ((heads.held_interactive, heads.due_interactive,
                              heads.since_interactive),
                             (heads.held_background, heads.due_background,
                              heads.since_background)):
        known = [t for t in (due, since) if t is not None]
        if held and known:
            starts.append(max(known))
    return min(starts) if starts else None


def head_wait(heads: GroupHeads, now: float) -> float | None:
    """How long the group's head has waited at ``now`` (epoch seconds): since it became
    the head, or since it became due when that is later (:func:`waiting_since`)."""
    since = waiting_since(heads)
    return None if since is None else max(now - since, 0.0)


class HeadWaits(abc.ABC):
    """Groups by how long their head has waited (reads only)."""

    @abc.abstractmethod
    def top_groups(self, queue: str, limit: int) -> list[tuple[str, int]]: ...

    @abc.abstractmethod
    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupHeads]: ...

    def longest_heads(self, queue: str, limit: int,
                      scan: int = SCAN_LIMIT) -> list[GroupHeads]:
        """At most ``limit`` groups holding work, the longest-waiting head first (the
        oldest :func:`waiting_since`, then by name); a bounded scan of at most ``scan``
        groups (see the module docstring). Groups whose heads have no time are left
        out."""
        if limit <= 0:
            return []
        names = [g for g, _ in self.top_groups(queue, scan)]
        found = [h for start in range(0, len(names), CHUNK)
                 for h in self.summarize(queue, names[start:start + CHUNK])
                 if waiting_since(h) is not None]
        found.sort(key=lambda h: (waiting_since(h), h.group))
        return found[:limit]
