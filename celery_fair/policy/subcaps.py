"""Caps per subgroup (``fair_subgroup = "path"``, a cap keyed by "<group>/<subgroup>")
in the shared Python policy, ``common.lua``'s ``park_head`` and ``unpark`` counterparts.
A pick that meets at the head of a group's class list a message whose subgroup has its
cap's worth of dispatches in flight sets it aside, *parked* in a list of its own (class,
group, subgroup), in the order met (the list's order), and goes on with the next head;
a group whose list holds only parked work empties it and leaves the ready sets. When a
release (or a reclaim, a raised or cleared cap, a change of settings) leaves the
subgroup room, as many parked messages as the room go back to the front of their list,
in order: O(1) a message, never a scan of a backlog. Parked messages stay held (counts,
cancel, positions, ``check``). Subgroup caps are hard under either ``fair_cap_mode``."""

from __future__ import annotations

from collections import deque

from .common import Placement, QueueData
from .decisions import CLASSES
from .subgroups import PATH_SUBGROUP

__all__ = ["SubgroupCaps", "path_of"]


def path_of(p: Placement) -> str | None:
    """The path ("<group>/<subgroup>") a message of ``p`` counts against (None: none)."""
    return f"{p.group}/{p.subgroup}" if p.subgroup else None


class SubgroupCaps(QueueData):
    """Parking and unparking the work of capped-out subgroups."""

    def _sub_room(self, path: str) -> int | None:
        """Room left under the cap of ``path`` (None: no cap binds it now)."""
        cap = self.caps.get(path, -1)
        if self.subgroup != PATH_SUBGROUP or cap < 0:
            return None
        return max(cap - self.sflight.get(path, 0), 0)

    def _held_count(self, g: str) -> int:
        """g's held work: both class lists, delayed and parked (a full group's test)."""
        group = self.groups.get(g)
        return self._held("i", g) + self._held("b", g) + (
            group.delayed + group.parked if group else 0)

    def _sub_entered(self, g: str, p: Placement) -> str:
        """Count a pick of ``p`` in its subgroup's flight (only under 'path'); the
        subgroup it counted in ('' none), which its record keeps."""
        sub = (p.subgroup or "") if self.subgroup == PATH_SUBGROUP else ""
        self._sub_count(g, sub, 1)
        return sub

    def _sub_count(self, g: str, sub: str, delta: int) -> None:
        """A dispatch of subgroup ``sub`` of g ('' none) entered (1) or left (-1) its
        subgroup's flight."""
        if sub:
            path = f"{g}/{sub}"
            n = self.sflight.get(path, 0) + delta
            if n:
                self.sflight[path] = n
            else:
                del self.sflight[path]

    def _park_capped(self, klass: str, g: str, now_ms: int) -> bool:
        """Park the heads of g's class list while their subgroup is at its cap; True
        when it parked any (the head changed, g may have left the ready sets)."""
        queue = self.lists[(klass, g)]
        parked = False
        while queue and self._capped_out(self.msgs[queue[0]].placement):
            hold_id = queue.popleft()
            self._subgroup_picked(klass, g, hold_id)  # passed in key order, as a pick
            sub = self.msgs[hold_id].placement.subgroup or ""
            self.parked.setdefault((klass, g, sub), deque()).append(hold_id)
            self.groups[g].parked += 1
            parked = True
        if parked:
            self.groups[g].since[klass] = now_ms
            self._drop_empty(klass, g)
            self._refresh(g)
        return parked

    def _capped_out(self, p: Placement) -> bool:
        path = path_of(p)
        return path is not None and self._sub_room(path) == 0

    def _unpark(self, g: str, sub: str) -> None:
        """Subgroup ``sub`` of g may have room: as many of its parked messages as the
        room (all when no cap binds it) back to the front of their list, in order. The
        list's head time is left as it is (no clock: ``limit`` and ``configure`` have
        none): the head's before, or the time the park emptied it."""
        room = self._sub_room(f"{g}/{sub}")
        moved = False
        for klass in CLASSES:
            ids = self.parked.get((klass, g, sub))
            if not ids or room == 0:
                continue
            n = len(ids) if room is None else min(room, len(ids))
            back = [ids.popleft() for _ in range(n)]
            self._list(klass, g).extendleft(reversed(back))
            self.groups[g].parked -= n
            room = None if room is None else room - n
            moved = True
            if not ids:
                del self.parked[(klass, g, sub)]
        if moved and self._refresh(g):
            self.woken = True

    def _unpark_path(self, path: str) -> None:
        """``path``'s cap or flight changed: unpark what it has room for."""
        g, _, sub = path.partition("/")
        if any((klass, g, sub) in self.parked for klass in CLASSES):
            self._unpark(g, sub)

    def _unpark_all(self) -> None:
        """The settings changed: every parked subgroup gets what its room allows."""
        for g, sub in sorted({(g, sub) for _, g, sub in self.parked}):
            self._unpark(g, sub)

    def _unpark_freed(self, g: str, sub: str) -> None:
        """A dispatch of subgroup ``sub`` of g ('' none) left the flight (release,
        reclaim): what the subgroup has room for now is unparked."""
        if sub:
            self._sub_count(g, sub, -1)
            self._unpark_path(f"{g}/{sub}")

    def _drop_parked(self, hold_id: str, p: Placement) -> bool:
        """``hold_id`` (cancelled) out of its parked list, if there; True when it was."""
        where = (p.klass, p.group, p.subgroup or "")
        ids = self.parked.get(where)
        if not ids or hold_id not in ids:
            return False
        ids.remove(hold_id)
        if not ids:
            del self.parked[where]
        self.groups[p.group].parked -= 1
        return True

    def held_ids(self, klass: str, g: str) -> list[str]:
        """What g holds in ``klass``: its list, head first, then its parked messages by
        subgroup name and order (for the reads: positions, counts, ``fair peek``)."""
        return [*self.lists.get((klass, g), ()),
                *(i for (k, grp, _), ids in sorted(self.parked.items())
                  if k == klass and grp == g for i in ids)]
