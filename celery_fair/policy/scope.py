"""``fair_scope`` 'app': a group's cap binds its dispatches in flight over every fair
queue of the store whose scope is 'app' (DESIGN.md "Tenant scope"; Redis: common.lua's
``SC``). The queues of a store share one count per group (``scope_n``) and see each
other (``app_queues``); each keeps its own in-flight counts, ready sets and tags.

Three steps keep the cap once across queues. Every change of a group's in-flight count
in an app-scoped queue changes the shared count too (``_scope_add``). A pick looks at
its head again when the group is at its cap app-wide (``_scope_stale``): another queue's
picks raised the count after the group was ranked here, so it leaves the ready set and
the pick looks further. A slot coming back (``_free_slot``) marks the group for every
other app-scoped queue that knows it (``_scope_freed``) and wakes it; that queue's next
promote refreshes it (``_scope_admit``), so it does not wait for its own release.

Under wfq a group's share is counted across the queues too. The app keeps, per class
and group, the total of the tag advances its picks were charged in every app-scoped
queue (``scope_charge``); each queue keeps in the group the total it has taken into the
group's tag (``Group.seen``). A pick's own charge moves both (``_scope_charged``). A
pick's head whose total moved past what this queue has seen was charged by other queues
since: its tag takes the difference and the pick looks again (``_scope_behind``, once
per group and class per pick). Only differences cross queues, never a tag, so each
queue's own virtual time stays its scale. A group entering a set here (or the queue
entering the scope) owes nothing from before, as idle time is forgiven; a group no
app-scoped queue knows any more leaves no total behind (``_scope_forgot``).
"""

from __future__ import annotations

from typing import Any

from ..limits import APP_SCOPE, HARMONY
from .common import QueueData
from .decisions import CLASSES


class AppScope(QueueData):
    """The steps of ``fair_scope`` 'app' (a mixin of :class:`FairQueue`)."""

    def share_scope(self, counts: dict[str, int], queues: dict[str, Any],
                    charges: dict[tuple[str, str], float] | None = None) -> None:
        """This queue is one of ``queues`` (name -> queue, the store's), which share
        ``counts`` (group -> in flight over the app-scoped ones) and ``charges`` ((class,
        group) -> its tag advances over them, under wfq)."""
        self.scope_n, self.app_queues = counts, queues
        if charges is not None:
            self.scope_charge = charges

    # -- wfq shares across queues ---------------------------------------------------

    def _scope_charged(self, klass: str, g: str, advance: float) -> None:
        """g's tag in ``klass`` moved by ``advance`` here (a pick's charge, a runtime
        correction): the app's total moves with it, and this queue has seen it."""
        if self.scope != APP_SCOPE:
            return
        key = (klass, g)
        self.scope_charge[key] = self.scope_charge.get(key, 0.0) + advance
        seen = self.groups[g].seen
        seen[klass] = seen.get(klass, 0.0) + advance

    def _scope_moved(self, klass: str, g: str, synced: set[tuple[str, str]]) -> bool:
        """Whether the pick's head g moved since it was ranked here (look again): at
        its cap across the queues (refreshed out), or charged by other queues (its tag
        takes that)."""
        if self._scope_stale(klass, g):
            self._refresh(g)
            return True
        return self._scope_behind(klass, g, synced)

    def _scope_behind(self, klass: str, g: str, synced: set[tuple[str, str]]) -> bool:
        """Whether the pick's head ``g`` was charged by other queues since this one
        last looked (once per group and class per pick): then its tag takes those
        charges, its score moves, and the pick looks again."""
        key = (klass, g)
        if self.scope != APP_SCOPE or self.policy == HARMONY or key in synced:
            return False
        synced.add(key)
        group = self.groups[g]
        total = self.scope_charge.get(key, 0.0)
        behind = total - group.seen.get(klass, 0.0)
        if behind <= 0:
            return False
        tag = group.tags[klass] = group.tags.get(klass, 0.0) + behind
        group.seen[klass] = total
        for sets in (self.ready[klass], self.over[klass]):
            if g in sets:
                sets[g] = tag
        return True

    def _scope_forgot(self, g: str) -> None:
        """This queue forgot g: when no app-scoped queue knows it any more, its charge
        totals go (whoever meets it next syncs from 0 as it enters a set)."""
        if self.scope != APP_SCOPE or any(
                q is not self and q.scope == APP_SCOPE and g in q.groups
                for q in self.app_queues.values()):
            return
        for klass in CLASSES:
            self.scope_charge.pop((klass, g), None)

    def _scope_add(self, g: str, delta: int) -> None:
        if self.scope != APP_SCOPE:
            return
        total = self.scope_n.get(g, 0) + delta
        if total <= 0:
            self.scope_n.pop(g, None)
        else:
            self.scope_n[g] = total

    def _scope_freed(self, g: str) -> None:
        if self.scope != APP_SCOPE:
            return
        for name, q in self.app_queues.items():
            if q is not self and q.scope == APP_SCOPE and g in q.groups:
                q.scope_refresh.add(g)
                self.swake.add(name)

    def _scope_admit(self) -> None:
        """Promote: refresh the groups another queue freed a slot of."""
        for g in sorted(self.scope_refresh):
            if g in self.groups:
                self.woken = self._refresh(g) or self.woken
        self.scope_refresh.clear()

    def _scope_stale(self, klass: str, g: str) -> bool:
        """Whether the pick's head ``g`` (in ``klass``'s ready set) is at its cap app-wide
        (then it is refreshed out of the set and the pick looks again)."""
        cap = self.cap_of(g)
        if self.scope != APP_SCOPE or cap < 0 or g not in self.ready[klass]:
            return False
        if klass == "i" and cap > 0:
            cap += self.reserve
        return self.scope_n.get(g, 0) >= cap

    def _scope_change(self, scope: str) -> None:
        """configure: entering 'app' adds this queue's in-flight counts to the app's,
        leaving it takes them out (the app's count stays the sum over its queues)."""
        if scope == self.scope:
            return
        sign = 1 if scope == APP_SCOPE else -1
        self.scope = APP_SCOPE
        for g, group in self.groups.items():
            if group.inflight:
                self._scope_add(g, sign * group.inflight)
            if sign > 0:  # nothing owed from before (as a group entering a set)
                group.seen = {k: self.scope_charge.get((k, g), 0.0) for k in CLASSES}
            else:  # nothing left behind (as a group forgotten)
                self._scope_forgot(g)
        self.scope = scope
