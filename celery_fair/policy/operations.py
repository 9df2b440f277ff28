"""The operations of the store contract over a fair queue's state: one method per Lua
script of the same name (``store/lua/<operation>.lua``), making the same decisions."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from ..errors import GroupFull, SingletonDropped
from ..limits import HARMONY, PATH_SUBGROUP, RUNTIME, SOFT
from ..store.base import BeginResult, Picked, check_hold
from .common import Placement
from .controls import QueueControls
from .decisions import (
    CLASSES,
    LIVE,
    LOST,
    PICKED,
    QUEUED,
    RUNNING,
    SUPERSEDED,
    advance,
    background_first,
    batch_room,
    charged,
    copy_id,
    corrected,
    dispatch_id,
    may_release,
    mean_runtime,
    requeues,
    runtime_of,
    skip_copy,
)
from .records import Group, Held, Record
from .routing import QueueRouting, RouteCall, worker_slot
from .scope import AppScope
from .singletons import Singletons


class FairQueue(AppScope, QueueRouting, QueueControls, Singletons):
    """One fair queue: its state and the operations of the store contract."""

    # -- the lifecycle -----------------------------------------------------------------

    def hold(self, hold_id: str, value: bytes, p: Placement, due_ms: int, now_ms: int) -> str:
        """Keep a message (delayed until ``due_ms``); returns the hold id used. See
        ``hold.lua``.

        Raises:
            what :func:`~celery_fair.store.base.check_hold` raises; nothing written.
        """
        p = check_hold(hold_id, value, p)
        held = self.msgs.get(hold_id)
        if held is not None and held.value == value:
            return hold_id  # the same publication, resent
        self._check_room(p)
        key = p.singleton
        if key is not None and p.drop and self._singleton_drops(key):
            raise SingletonDropped(hold_id, key)
        p = replace(p, max_held=None, singleton=None, drop=False)  # max_held, key: not kept
        if held is not None:
            self._count("dup", 1)
            hold_id = copy_id(hold_id, self.stat["dup"])
            self._index_copy(hold_id)
        self.msgs[hold_id] = Held(value, p)
        if due_ms > now_ms:
            self.delayed[hold_id] = due_ms
            self.groups.setdefault(p.group, Group()).delayed += 1
            self.woken = self.woken or min(self._delayed_order())[2] == hold_id
            if key is not None:  # its key's turn is taken at promote
                self.skeys[hold_id] = key
        elif key is not None and not self._singleton_enter(hold_id, key, p.front):
            pass  # it waits in its key's list, its group untouched (none if idle)
        else:
            self.groups.setdefault(p.group, Group())
            self.woken = self._enqueue(hold_id, p, now_ms) or self.woken
        return hold_id

    def hold_many(self, holds: list[tuple[str, bytes, Placement, int]],
                  now_ms: int) -> list[str]:
        """Keep every one of ``holds`` (hold id, value, checked placement, due), or none:
        the backpressure of the whole batch is checked first (``hold_many.lua``)."""
        batch_room(((p.group, p.max_held, self._is_new(i, v)) for i, v, p, _ in holds),
                   self._held_count)
        return [self.hold(i, v, replace(p, max_held=None), due, now_ms)
                for i, v, p, due in holds]

    def _is_new(self, hold_id: str, value: bytes) -> bool:
        held = self.msgs.get(hold_id)
        return held is None or held.value != value

    def _check_room(self, p: Placement) -> None:
        """Raise GroupFull (queue left to the caller) when ``p``'s group is full."""
        if p.max_held is None:
            return
        count = self._held_count(p.group)
        if count >= p.max_held:
            raise GroupFull(group=p.group, count=count, limit=p.max_held)

    def _delayed_order(self) -> list[tuple[int, bytes, str]]:
        return sorted((due, i.encode(), i) for i, due in self.delayed.items())

    def _head(self, capacity: int | None, routing: RouteCall | None,
              synced: set[tuple[str, str]]) -> tuple[str, str, float] | None:
        """The class, group and score picked next: from the ready sets, else (soft caps)
        the over sets. See ``_head_of``. ``synced``: the pick call's (scope.py)."""
        first_b = background_first(self.stat.get("inflight:i", 0), self.share, capacity)
        while True:
            head = self._head_of(self.ready, first_b, routing)
            if head is None and self.cap_mode == SOFT:
                head = self._head_of(self.over, first_b, routing)
            if head is None or not self._scope_moved(head[0], head[1], synced):
                return head

    def _head_of(self, sets: dict[str, dict[str, float]], background_first: bool,
                 routing: RouteCall | None = None) -> tuple[str, str, float] | None:
        """The head of ``sets``: interactive first under wfq; under Harmony the lowest
        rank of either class, the interactive one of a tie; with ``background_first``
        (the interactive share is used up) background while it has a group; with
        ``routing``, each set's first group that may go now (``routed_top``)."""
        # each set's head is found when needed, as pick.lua does: a routed one reports
        # the groups it looked past
        tops: dict[str, tuple[str, float] | None] = {}

        def top(klass: str) -> tuple[str, float] | None:
            if klass not in tops:
                tops[klass] = self._top(sets[klass], klass, routing)
            return tops[klass]
        if background_first and (b := top("b")) is not None:
            return "b", b[0], b[1]
        heads = []
        for i, klass in enumerate(CLASSES):
            if (t := top(klass)) is not None:
                if self.policy != HARMONY:
                    return klass, t[0], t[1]
                heads.append((t[1], t[0].encode(), i, klass, t[0]))
        if not heads:
            return None
        tag, _, _, klass, g = min(heads)
        return klass, g, tag

    def pick(self, want: int, capacity: int | None, now_ms: int, lease_ms: int,
             token: str, routing: RouteCall | None = None) -> list[Picked]:
        """Take up to ``want`` messages in fair order; see ``pick.lua``. With ``routing``
        (fair_affinity) only groups whose target has room, each record naming it."""
        self._count("picks", 1)
        if "" in self.pauses:  # the whole queue is paused: nothing leaves it
            return []
        if capacity is not None:
            want = min(want, capacity - self.stat.get("inflight", 0))
        out: list[Picked] = []
        synced: set[tuple[str, str]] = set()
        while len(out) < want and not (routing and routing.open == 0) and \
                (head := self._head(capacity, routing, synced)) is not None:
            klass, g, tag = head
            if self.subgroup == PATH_SUBGROUP and self._park_capped(klass, g, now_ms):
                continue  # its head changed, it may have left: look again
            queue = self.lists[(klass, g)]
            hold_id = self._pop_head(klass, g, queue)
            held = self.msgs.pop(hold_id)
            self._unindex_copy(hold_id)
            self._count("held:" + klass, -1)
            group = self.groups[g]
            estimate = None  # what a 'runtime' charge corrects at release
            if self.policy == HARMONY:  # served now; a jump (boost_task) is spent
                self._count("served", 1)
                group.served, group.jump = self.stat["served"], None
            else:
                self.vt[klass] = tag
                spent = charged(self.charge, held.placement.cost, group.runtime)
                weight = self.pick_weight(g)
                tag = group.tags[klass] = advance(tag, spent, weight)
                self._scope_charged(klass, g, spent / weight)
                estimate = spent if self.charge == RUNTIME else None
            group.inflight += 1
            self._scope_add(g, 1)
            sub = self._sub_entered(g, held.placement)
            if klass == "i":
                self._count("inflight:i", 1)
            group.since[klass] = now_ms  # the next one is the head now (stale if none)
            did = dispatch_id(token, self.stat["picks"], len(out) + 1)
            self.records[did] = Record(PICKED, held.placement, hold_id, held.value,
                                       estimate=estimate,
                                       singleton=self._singleton_picked(hold_id, did),
                                       subgroup=sub)
            if routing is not None:
                self.records[did].target = target = routing.taken(klass)
                worker_slot(self.wflight, target, 1)
            self.leases[did] = now_ms + lease_ms
            out.append(Picked(did, hold_id, held.value))
            if self.policy == HARMONY:  # its rank moved, in both classes
                self._refresh(g)
            elif self.cap_of(g) < 0:  # no cap: only this class's membership can change
                if queue:
                    self.ready[klass][g] = tag
                else:
                    self.ready[klass].pop(g)
            else:
                self.ready[klass].pop(g, None)
                self._refresh(g)
            self._meter(g, now_ms)
            self._drop_empty(klass, g)
        self._count("inflight", len(out))
        return out

    def confirm(self, dids: list[str], deadline_ms: int) -> list[str]:
        """The broker took these; returns the stale ones. See ``confirm.lua``."""
        stale = []
        for did in dids:
            rec = self.records.get(did)
            if rec is not None and rec.state == PICKED:
                rec.state = QUEUED
                self.leases[did] = deadline_ms
            elif rec is not None and rec.state == SUPERSEDED:
                stale.append(did)
        return stale

    def begin(self, did: str, deadline_ms: int, now_ms: int, run: str, acks_late: bool,
              host: str = "", taken_over: str = "") -> BeginResult | str:
        """Whether a worker may run ``did``; see ``begin.lua``. A string is the token of
        a run of ``host`` that holds it: the caller sees whether that run is gone and
        calls again with it as ``taken_over``."""
        rec = self.records.get(did)
        state = rec.state if rec is not None else ("released" if did in self.done else None)
        verdict = None if rec is None and state is None else skip_copy(
            state, rec.runner if rec else "", rec.kept if rec else False,
            rec is not None and rec.value is not None, self.leases.get(did), now_ms, run,
            taken_over, host)
        if isinstance(verdict, str):
            return verdict
        if verdict is not None:
            self._count("skipped", 1)
            return verdict
        held = self._hold_lease(did, deadline_ms)
        if rec is None or held is None:
            return BeginResult.RUN_UNKNOWN
        rec.state, rec.runner = RUNNING, run
        if acks_late:
            rec.kept = True
        else:
            rec.kept, rec.value = False, None
        return BeginResult.RUN_REACQUIRED if held == LOST else BeginResult.RUN

    def renew(self, dids: list[str], deadline_ms: int) -> int:
        """Extend the leases of dispatches a worker holds; see ``renew.lua``."""
        return sum(1 for did in dids
                   if self._hold_lease(did, deadline_ms) not in (None, SUPERSEDED))

    def release(self, did: str, done_until_ms: int | None = None, run: str = "",
                runtime: float | None = None, now_ms: int = 0) -> bool:
        """Free a dispatch's slot; with ``done_until_ms`` a tombstone lasts until then (a
        redelivered copy is skipped); with ``runtime`` (seconds), a dispatch charged its
        estimate corrects its group's tag by the difference. See ``release.lua``."""
        rec = self.records.get(did)
        if rec is None or rec.state == SUPERSEDED:
            return False
        if not may_release(rec.runner, run):
            return False  # another run took it over
        del self.records[did]
        if done_until_ms is not None:
            self.done[did] = max(self.done.get(did, 0), done_until_ms)
        self.leases.pop(did, None)
        self._count("released", 1)
        if rec.state == LOST:
            return False
        self._correct(rec, runtime_of(runtime))
        self._free_slot(rec.group, rec.klass)
        self._unpark_freed(rec.group, rec.subgroup)
        self._singleton_ended(rec.singleton, did, now_ms)  # its next waiter enters
        worker_slot(self.wflight, rec.target, -1)
        self.woken = True
        return True

    def _correct(self, rec: Record, runtime: float | None) -> None:
        """A released dispatch charged ``rec.estimate`` corrects its group's tag by the
        ``runtime`` it ran (under wfq; a group's tag is never set under Harmony), and
        the runtime goes into the group's mean."""
        if runtime is None or rec.estimate is None or self.policy == HARMONY:
            return
        group = self.groups[rec.group]
        group.runtime = mean_runtime(group.runtime, runtime)
        tags = group.tags
        if rec.klass in tags:
            weight = self.pick_weight(rec.group)
            tags[rec.klass] = corrected(tags[rec.klass], runtime, rec.estimate, weight)
            self._scope_charged(rec.klass, rec.group, (runtime - rec.estimate) / weight)

    def reclaim(self, now_ms: int, limit: int, tombstone_until_ms: int) -> tuple[int, int]:
        """Take back slots whose lease ran out; see ``reclaim.lua``."""
        due = sorted((t, d.encode(), d) for d, t in self.leases.items() if t <= now_ms)
        requeued = lost = 0
        for _, _, did in due[:limit]:
            del self.leases[did]
            rec = self.records.get(did)
            if rec is None or rec.state not in LIVE:
                continue
            # its subgroup's room first: what it unparks goes behind the message held
            # again, which goes first as every retry
            self._unpark_freed(rec.group, rec.subgroup)
            if requeues(rec.state, rec.kept, rec.value is not None):
                self._hold_again(did, rec, now_ms)
                rec.state, rec.value, rec.kept = SUPERSEDED, None, False
                requeued += 1
            else:
                rec.state = LOST
                lost += 1
                self._singleton_ended(rec.singleton, did, now_ms)
            rec.expires_ms = tombstone_until_ms
            self._free_slot(rec.group, rec.klass)
            worker_slot(self.wflight, rec.target, -1)
        self.woken = self.woken or requeued + lost > 0
        return requeued, lost

    def _hold_again(self, did: str, rec: Record, now_ms: int) -> None:
        assert rec.value is not None
        hold_id = rec.hold_id
        if hold_id in self.msgs:
            hold_id = copy_id(hold_id, did)
        self._index_copy(hold_id)
        self.msgs[hold_id] = Held(rec.value, rec.placement)
        if rec.singleton is not None and not self._singleton_requeued(rec.singleton, did,
                                                                       hold_id):
            return  # it waits first in its key's list
        self._list(rec.klass, rec.group).appendleft(hold_id)
        self.groups[rec.group].since[rec.klass] = now_ms
        self._count("held:" + rec.klass, 1)

    def promote(self, now_ms: int, limit: int) -> tuple[int, int | None]:
        """Move due delayed messages into their groups and lift the throttles due; see
        ``promote.lua``."""
        admitted = self._singleton_admitted(now_ms)  # waiters other queues handed it
        self._scope_admit()  # fair_scope 'app': groups another queue freed a slot of
        order = self._delayed_order()
        moved = [hold_id for due, _, hold_id in order if due <= now_ms][:limit]
        for hold_id in moved:
            del self.delayed[hold_id]
            p = self.msgs[hold_id].placement
            self.groups[p.group].delayed -= 1
            key = self.skeys.get(hold_id)
            if key is None or self._singleton_enter(hold_id, key, p.front):
                self._enqueue(hold_id, p, now_ms)
            else:  # it waits for its key, in no group: its group may have nothing else
                self._forget_if_idle(p.group)
        nxt = order[len(moved)][0] if len(order) > len(moved) else None
        lifted = self._lift_throttles(now_ms, limit)
        return admitted + len(moved), nxt if lifted is None or (nxt is not None and nxt < lifted) \
            else lifted

    def cancel(self, task_ids: list[str], token: str, keep_until_ms: int,
               now_ms: int) -> list[tuple[str, bytes]]:
        """Remove held or delayed messages of ``task_ids`` with their copies; the same
        ``token`` again gets the same answer. See ``cancel.lua``."""
        if token in self.cancelled:
            return list(self.cancelled[token][1])
        out: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        for task_id in task_ids:
            for hold_id in [task_id, *self._copies_of(task_id)]:
                value = None if hold_id in seen else self._remove(hold_id, now_ms)
                seen.add(hold_id)
                if value is not None:
                    out.append((hold_id, value))
        if out:
            self.cancelled[token] = (keep_until_ms, out)
        return list(out)

    def _copies_of(self, task_id: str) -> list[str]:
        head = task_id + "~"
        return sorted(c for c in self.copies.get(task_id.split("~", 1)[0], ())
                      if c.startswith(head))

    def _remove(self, hold_id: str, now_ms: int) -> bytes | None:
        held = self.msgs.pop(hold_id, None)
        self._unindex_copy(hold_id)
        if held is None:
            return None
        self._singleton_removed(hold_id, now_ms)
        p = held.placement
        if self.delayed.pop(hold_id, None) is not None:
            self.groups[p.group].delayed -= 1
        elif hold_id in (queue := self.lists.get((p.klass, p.group), deque())):
            if queue[0] == hold_id:  # the head goes: the next one is the head now
                self.groups[p.group].since[p.klass] = now_ms
            queue.remove(hold_id)
            self._unkey(p.klass, p.group, hold_id)
            self._count("held:" + p.klass, -1)
            self._drop_empty(p.klass, p.group)
        elif self._drop_parked(hold_id, p):
            self._count("held:" + p.klass, -1)
        self._refresh(p.group)
        self._forget_if_idle(p.group)
        return held.value

    def set_aside(self, hold_id: str, value: bytes, why: str) -> None:
        """Quarantine ``value`` (never dropped; a human looks at it)."""
        self.quarantine[hold_id] = (value, why)
        if hold_id in self.quarantine_order:
            self.quarantine_order.remove(hold_id)
        self.quarantine_order.insert(0, hold_id)
