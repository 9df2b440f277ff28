"""Affinity routing's decisions (``include/routing.lua`` and ``assign.lua``'s counterpart),
shared by the memory store (:class:`FairQueue`'s routed pick) and the SQL store: a ready
set's head is its first group whose target (a worker, or ``queue:<name>`` for a dedicated
queue) has room, or whose head has waited the spill time (then the worker with the most
room takes it; never to or from a queue target). A group without a live target is
looked past and reported. Pure: the caller passes the map, the in-flight counts and the
head times it read."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .decisions import LIVE
from .records import Group, Record

#: Most entries of one set looked at for one head (the rest waits for the next call):
#: ``ROUTE_SCAN`` in ``include/routing.lua``.
ROUTE_SCAN = 1000


def queue_target(w: str) -> bool:
    """Whether target ``w`` is a real queue (fair_group_queues), not a worker."""
    return w.startswith("queue:")


def worker_slot(wflight: dict[str, int], target: str, delta: int) -> None:
    """A routed dispatch takes (1) or frees (-1) a slot of its target (``worker_slot`` in
    ``common.lua``); nothing for a dispatch not routed ('')."""
    if target:
        n = wflight.get(target, 0) + delta
        if n > 0:
            wflight[target] = n
        else:
            wflight.pop(target, None)


def routing_problems(records: Iterable[Record], wflight: Mapping[str, int]
                     ) -> list[tuple[str, str, str]]:
    """Each target's routed dispatches in flight against its live routed records (a
    problem of ``FairQueue.problems``)."""
    live: dict[str, int] = {}
    for rec in records:
        if rec.target and rec.state in LIVE:
            live[rec.target] = live.get(rec.target, 0) + 1
    return [("wflight", w, f"counted {wflight.get(w, 0)}, live routed dispatches "
             f"{live.get(w, 0)}") for w in sorted(set(live) | set(wflight))
            if live.get(w, 0) != wflight.get(w, 0)]


@dataclass
class RouteCall:
    """One routed pick's view of the targets (``routing_of`` in ``include/routing.lua``):
    each live target's room, the groups looked past per class, the groups met without a
    live target, and the target of each message taken."""

    order: list[str]
    room: dict[str, int]
    spill_ms: int | None
    now_ms: int
    owner: dict[str, str | None] = field(default_factory=dict)
    skip: set[tuple[str, str]] = field(default_factory=set)
    unassigned: set[str] = field(default_factory=set)
    #: class -> the target of the last head found in that class
    host: dict[str, str] = field(default_factory=dict)
    #: the target of each message taken, in order
    targets: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, limits: Mapping[str, int], inflight: Mapping[str, int],
           spill_ms: int | None, now_ms: int) -> RouteCall:
        """``limits``: each live target -> the most it may have in flight (the caller's
        order breaks ties of room); ``inflight``: each target's routed dispatches."""
        order = list(limits)
        return cls(order, {w: n - inflight.get(w, 0) for w, n in limits.items()},
                   spill_ms, now_ms)

    @property
    def open(self) -> int:
        """Targets with a slot free (the pick stops at 0)."""
        return sum(1 for w in self.order if self.room[w] > 0)

    def roomiest(self) -> str | None:
        """The worker with the most room (the first in order on a tie), never a queue."""
        best, most = None, 0
        for w in self.order:
            if self.room[w] > most and not queue_target(w):
                best, most = w, self.room[w]
        return best

    def route(self, g: str, klass: str, owner_of: Callable[[str], str | None],
              since_of: Callable[[str, str], int | None]) -> str | None:
        """Where g's next message of ``klass`` may go now (None: it waits). ``owner_of``
        reads the map, ``since_of`` the head time of (group, class)."""
        if g not in self.owner:
            self.owner[g] = owner_of(g)
        w = self.owner[g]
        if not w or w not in self.room:
            self.unassigned.add(g)
            return None
        if self.room[w] > 0:
            return w
        if self.spill_ms is not None and not queue_target(w):
            since = since_of(g, klass)
            if since is not None and self.now_ms - since >= self.spill_ms:
                return self.roomiest()
        return None

    def top(self, entries: Iterable[tuple[str, float]], klass: str,
            owner_of: Callable[[str], str | None],
            since_of: Callable[[str, str], int | None]) -> tuple[str, float] | None:
        """The first of ``entries`` (a set's (group, tag) in its order) that may go now,
        its target kept in :attr:`host`; the groups looked past are remembered for the
        call."""
        for place, (g, tag) in enumerate(entries):
            if place >= ROUTE_SCAN:
                break
            if (klass, g) in self.skip:
                continue
            w = self.route(g, klass, owner_of, since_of)
            if w is not None:
                self.host[klass] = w
                return g, tag
            self.skip.add((klass, g))
        return None

    def taken(self, klass: str) -> str:
        """A message of ``klass`` was taken for the head found last: one slot of its
        target used. Returns the target."""
        w = self.host[klass]
        self.room[w] -= 1
        self.targets.append(w)
        return w


def assigned(current: str, old: str | None, new: str, known: bool
             ) -> tuple[str | None, bool]:
    """One change of ``assign.lua``: the group's target as read is ``current`` ('' for
    none), the caller read ``old`` (None: any), wants ``new``; ``known``: the queue
    still knows the group. Returns (the target to keep, '' to drop the entry, None to
    leave it; whether it is a move from one target to another)."""
    if old is not None and current != old:
        return None, False
    if not known:
        return "", False
    if current == new:
        return None, False
    return new, current != ""


class QueueRouting:
    """:class:`~celery_fair.policy.FairQueue`'s routing (a mixin over its state): the map,
    ``assign`` and the routed head of a set."""

    aff: dict[str, str]
    groups: dict[str, Group]
    stat: dict[str, int]

    def assign(self, changes: Iterable[tuple[str, str | None, str]]) -> int:
        """Set groups' targets over what the caller read; see ``assign.lua``. Returns
        the moves, also counted in ``stat`` ``moves``."""
        moves = 0
        for g, old, new in changes:
            keep, moved = assigned(self.aff.get(g, ""), old, new, g in self.groups)
            if keep == "":
                self.aff.pop(g, None)
            elif keep is not None:
                self.aff[g] = keep
            moves += moved
        if moves:
            self.stat["moves"] = self.stat.get("moves", 0) + moves
        return moves

    def _top(self, tags: dict[str, float], klass: str, routing: RouteCall | None
             ) -> tuple[str, float] | None:
        """A set's head: its lowest (tag, name), or with ``routing`` the first that may
        go now."""
        if not tags:
            return None
        if routing is None:
            return min(tags.items(), key=lambda gt: (gt[1], gt[0].encode()))
        entries = sorted(tags.items(), key=lambda gt: (gt[1], gt[0].encode()))
        return routing.top(entries, klass, self.aff.get,
                           lambda g, k: self.groups[g].since.get(k))
