"""Singleton keys over a fair queue's state: ``include/singleton.lua``'s counterpart
(the same decisions; DESIGN.md "Singleton keys"). At most one message of a key is out of
its waiting list: the key's owner, listed in its group or in flight; the others wait in
the key's list, in order, in no group's list.

:class:`SingletonRules` makes the decisions over three mappings (``skeys`` hold id ->
key, ``sowner`` key -> owner, ``swait`` key -> its waiting hold ids, oldest first) and
two steps its executor gives: whether a hold id is still held, and entering a waiter
into its group. The memory store runs it over dicts (:class:`Singletons`), the SQL store
over rows (``store/sql/singletons.py``): the same code decides."""

from __future__ import annotations

from collections import deque
from typing import Any

from .common import QueueData
from .records import Group


class SingletonRules:
    """The singleton decisions; ``skeys``, ``sowner`` and ``swait`` behave as dicts (a
    waiting list as a deque: append, appendleft, popleft, remove, ``in``, truth)."""

    skeys: Any
    sowner: Any
    swait: Any

    def _singleton_held(self, hold_id: str) -> bool:
        """Whether ``hold_id`` is still held (a waiter cancelled by damage is skipped)."""
        raise NotImplementedError

    def _singleton_admit(self, hold_id: str, now_ms: int) -> None:
        """Waiter ``hold_id`` enters its group's list at the head of its class."""
        raise NotImplementedError

    def _singleton_drops(self, key: str) -> bool:
        """'drop': whether ``key`` has a message waiting (owner listed, or a waiter)."""
        owner = self.sowner.get(key)
        return owner is not None and (owner[0] == "h" or bool(self.swait.get(key)))

    def _singleton_enter(self, hold_id: str, key: str, front: bool) -> bool:
        """``hold_id`` of ``key`` is about to enter its list: True when it may (it owns
        the key), False when it waits (first when ``front``: a retry)."""
        self.skeys[hold_id] = key
        if key not in self.sowner:
            self.sowner[key] = "h" + hold_id
            return True
        waiting = self.swait.setdefault(key, deque())
        waiting.appendleft(hold_id) if front else waiting.append(hold_id)
        return False

    def _singleton_next(self, key: str, now_ms: int) -> None:
        """The key's next waiter enters its group's list at the head of its class."""
        waiting = self.swait.get(key)
        while waiting:
            hold_id = waiting.popleft()
            if not self._singleton_held(hold_id):
                self.skeys.pop(hold_id, None)
                continue
            if not waiting:
                del self.swait[key]
            self.sowner[key] = "h" + hold_id
            self._singleton_admit(hold_id, now_ms)
            return
        self.swait.pop(key, None)
        self.sowner.pop(key, None)

    def _singleton_picked(self, hold_id: str, did: str) -> str | None:
        """``hold_id`` was picked as ``did``: the dispatch owns its key (returned)."""
        key: str | None = self.skeys.pop(hold_id, None)
        if key is not None:
            self.sowner[key] = "d" + did
        return key

    def _singleton_ended(self, key: str | None, did: str, now_ms: int) -> None:
        """Dispatch ``did`` of ``key`` ended or lost its slot: the key passes on."""
        if key is not None and self.sowner.get(key) == "d" + did:
            self._singleton_next(key, now_ms)

    def _singleton_requeued(self, key: str, did: str, hold_id: str) -> bool:
        """Reclaim holds ``did`` again as ``hold_id``: True when it keeps its key and
        enters its list, False when it waits first (the key passed on)."""
        self.skeys[hold_id] = key
        if self.sowner.get(key) == "d" + did:
            self.sowner[key] = "h" + hold_id
            return True
        return self._singleton_enter(hold_id, key, True)

    def _singleton_removed(self, hold_id: str, now_ms: int) -> None:
        """Held ``hold_id`` is removed (cancel): out of its key's list, or the key
        passes on."""
        key = self.skeys.pop(hold_id, None)
        if key is None:
            return
        if self.sowner.get(key) == "h" + hold_id:
            self._singleton_next(key, now_ms)
        elif hold_id in self.swait.get(key, ()):
            self.swait[key].remove(hold_id)
            if not self.swait[key]:
                del self.swait[key]


class Singletons(SingletonRules, QueueData):
    """The singleton operations :class:`~celery_fair.policy.operations.FairQueue` calls,
    over the queue's dicts."""

    def _singleton_held(self, hold_id: str) -> bool:
        return hold_id in self.msgs

    def _singleton_admit(self, hold_id: str, now_ms: int) -> None:
        p = self.msgs[hold_id].placement
        self.groups.setdefault(p.group, Group())
        self._list(p.klass, p.group).appendleft(hold_id)
        self.groups[p.group].since[p.klass] = now_ms
        self._count("held:" + p.klass, 1)
        self.woken = self._refresh(p.group) or self.woken
