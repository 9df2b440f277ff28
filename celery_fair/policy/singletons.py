"""Singleton keys: ``include/singleton.lua``'s counterpart (the same decisions;
DESIGN.md "Singleton keys"). At most one message of a key is out of its waiting list,
across every fair queue of the namespace (the app): the key's owner, listed in its
group, handed to its queue to enter at its next promote, or in flight; the others wait
in the key's list, in order, in no group's list.

:class:`SingletonRules` makes the decisions over four mappings: ``skeys`` (this queue's
hold id -> key), and, shared by the namespace's queues, ``sowner`` (key -> owner: 'h' or
'd' and a :func:`ref`) and ``swait`` (key -> its waiting refs, oldest first), with its
executor's steps: whether a hold id is still held, entering a waiter into its group,
handing one to another queue (:meth:`SingletonRules._singleton_hand`) and taking back
what this queue was handed. The memory store runs it over dicts (:class:`Singletons`),
the SQL store over rows (``store/sql/singletons.py``): the same code decides."""

from __future__ import annotations

from collections import deque
from typing import Any

from .common import QueueData
from .records import Group

#: Between a queue's name and a hold or dispatch id in a ref (no queue name has it).
SEP = "\x1f"


def ref(queue: str, ident: str) -> str:
    """A hold or dispatch id of ``queue``, as the namespace's key state names it."""
    return queue + SEP + ident


def unref(r: str) -> tuple[str, str]:
    """(queue, id) of a :func:`ref`."""
    queue, _, ident = r.partition(SEP)
    return queue, ident


class SingletonRules:
    """The singleton decisions; ``skeys``, ``sowner`` and ``swait`` behave as dicts (a
    waiting list as a deque: append, appendleft, popleft, remove, ``in``, truth);
    ``squeue`` is this queue's name."""

    squeue: str
    skeys: Any
    sowner: Any
    swait: Any

    def _singleton_held(self, hold_id: str) -> bool:
        """Whether ``hold_id`` is still held (a waiter cancelled by damage is skipped)."""
        raise NotImplementedError

    def _singleton_admit(self, hold_id: str, now_ms: int) -> None:
        """Waiter ``hold_id`` enters its group's list at the head of its class."""
        raise NotImplementedError

    def _singleton_hand(self, queue: str, hold_id: str) -> None:
        """Waiter ``hold_id`` of another ``queue`` owns its key now: that queue's next
        promote admits it (its "to admit" list), and its dispatchers are woken."""
        raise NotImplementedError

    def _singleton_unhand(self, hold_id: str) -> None:
        """``hold_id`` leaves this queue's "to admit" list (if in it)."""
        raise NotImplementedError

    def _singleton_handed(self) -> list[str]:
        """Takes this queue's "to admit" list (emptied), in order."""
        raise NotImplementedError

    def _singleton_drops(self, key: str) -> bool:
        """'drop': whether ``key`` has a message waiting (owner listed, or a waiter)."""
        owner = self.sowner.get(key)
        return owner is not None and (owner[0] == "h" or bool(self.swait.get(key)))

    def _singleton_enter(self, hold_id: str, key: str, front: bool) -> bool:
        """``hold_id`` of ``key`` is about to enter its list: True when it may (it owns
        the key), False when it waits (first when ``front``: a retry)."""
        self.skeys[hold_id] = key
        mine = ref(self.squeue, hold_id)
        if key not in self.sowner:
            self.sowner[key] = "h" + mine
            return True
        waiting = self.swait.setdefault(key, deque())
        waiting.appendleft(mine) if front else waiting.append(mine)
        return False

    def _singleton_next(self, key: str, now_ms: int) -> None:
        """The key's next waiter owns it: one of this queue enters its group's list at
        the head of its class, one of another queue is handed to it."""
        waiting = self.swait.get(key)
        while waiting:
            r = waiting.popleft()
            queue, hold_id = unref(r)
            if queue == self.squeue and not self._singleton_held(hold_id):
                self.skeys.pop(hold_id, None)
                continue
            if not waiting:
                del self.swait[key]
            self.sowner[key] = "h" + r
            if queue == self.squeue:
                self._singleton_admit(hold_id, now_ms)
            else:
                self._singleton_hand(queue, hold_id)
            return
        self.swait.pop(key, None)
        self.sowner.pop(key, None)

    def _singleton_admitted(self, now_ms: int) -> int:
        """Promote: the waiters other queues handed this one enter their groups (one no
        longer held passes its key on); returns how many entered."""
        n = 0
        for hold_id in self._singleton_handed():
            key = self.skeys.get(hold_id)
            if key is None or self.sowner.get(key) != "h" + ref(self.squeue, hold_id):
                continue  # cancelled meanwhile: nothing to admit
            if self._singleton_held(hold_id):
                self._singleton_admit(hold_id, now_ms)
                n += 1
            else:
                self.skeys.pop(hold_id, None)
                self._singleton_next(key, now_ms)
        return n

    def _singleton_picked(self, hold_id: str, did: str) -> str | None:
        """``hold_id`` was picked as ``did``: the dispatch owns its key (returned)."""
        key: str | None = self.skeys.pop(hold_id, None)
        if key is not None:
            self.sowner[key] = "d" + ref(self.squeue, did)
        return key

    def _singleton_ended(self, key: str | None, did: str, now_ms: int) -> None:
        """Dispatch ``did`` of ``key`` ended or lost its slot: the key passes on."""
        if key is not None and self.sowner.get(key) == "d" + ref(self.squeue, did):
            self._singleton_next(key, now_ms)

    def _singleton_requeued(self, key: str, did: str, hold_id: str) -> bool:
        """Reclaim holds ``did`` again as ``hold_id``: True when it keeps its key and
        enters its list, False when it waits first (the key passed on)."""
        self.skeys[hold_id] = key
        if self.sowner.get(key) == "d" + ref(self.squeue, did):
            self.sowner[key] = "h" + ref(self.squeue, hold_id)
            return True
        return self._singleton_enter(hold_id, key, True)

    def _singleton_removed(self, hold_id: str, now_ms: int) -> None:
        """Held ``hold_id`` is removed (cancel): out of its key's list, or the key
        passes on."""
        key = self.skeys.pop(hold_id, None)
        if key is None:
            return
        mine = ref(self.squeue, hold_id)
        if self.sowner.get(key) == "h" + mine:
            self._singleton_unhand(hold_id)
            self._singleton_next(key, now_ms)
        elif mine in self.swait.get(key, ()):
            self.swait[key].remove(mine)
            if not self.swait[key]:
                del self.swait[key]


class Singletons(SingletonRules, QueueData):
    """The singleton operations :class:`~celery_fair.policy.operations.FairQueue` calls,
    over the queue's dicts (``sowner``, ``swait`` and ``sadmit`` shared by the store's
    queues: :meth:`share_singletons`)."""

    def share_singletons(self, queue: str, sowner: dict[str, str],
                         swait: dict[str, deque[str]],
                         sadmit: dict[str, deque[str]], swake: set[str]) -> None:
        """This queue is ``queue`` of a store whose queues share these mappings, and
        ``swake`` (the queues a hand-over woke; a queue never told so has its own: the
        key's scope is the queue)."""
        self.squeue, self.sowner, self.swait, self.sadmit = queue, sowner, swait, sadmit
        self.swake = swake

    def _singleton_held(self, hold_id: str) -> bool:
        return hold_id in self.msgs

    def _singleton_admit(self, hold_id: str, now_ms: int) -> None:
        p = self.msgs[hold_id].placement
        self.groups.setdefault(p.group, Group())
        self._list(p.klass, p.group).appendleft(hold_id)
        self.groups[p.group].since[p.klass] = now_ms
        self._count("held:" + p.klass, 1)
        self.woken = self._refresh(p.group) or self.woken

    def _singleton_hand(self, queue: str, hold_id: str) -> None:
        self.sadmit.setdefault(queue, deque()).append(hold_id)
        self.swake.add(queue)
        self.woken = True  # the store signals its waiters: swake names the queue

    def _singleton_unhand(self, hold_id: str) -> None:
        handed = self.sadmit.get(self.squeue)
        if handed and hold_id in handed:
            handed.remove(hold_id)

    def _singleton_handed(self) -> list[str]:
        handed = self.sadmit.pop(self.squeue, None)
        return list(handed) if handed else []
