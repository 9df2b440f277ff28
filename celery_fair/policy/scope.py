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
"""

from __future__ import annotations

from typing import Any

from ..limits import APP_SCOPE
from .common import QueueData


class AppScope(QueueData):
    """The steps of ``fair_scope`` 'app' (a mixin of :class:`FairQueue`)."""

    def share_scope(self, counts: dict[str, int], queues: dict[str, Any]) -> None:
        """This queue is one of ``queues`` (name -> queue, the store's), which share
        ``counts`` (group -> in flight over the app-scoped ones)."""
        self.scope_n, self.app_queues = counts, queues

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
        self.scope = scope
