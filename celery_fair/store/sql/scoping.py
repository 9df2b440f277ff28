"""``fair_scope`` 'app' on the SQL store (DESIGN.md "Tenant scope"): a group's cap binds
its dispatches in flight over every app-scoped queue of the namespace, once
(``policy/scope.py`` and common.lua's ``SC`` make the same steps).

``scope_n`` holds a row per group with dispatches in flight over the app-scoped queues
(queues whose ``scope`` is 'app'); ``scope_refresh`` the groups a queue's next promote
refreshes. A unit of an app-scoped queue locks a group's count row after the group's
row (the order queue -> dispatch -> group -> count every transaction keeps; several at
once in name order), created when missing so that two queues' picks of a group never
both read a count that is not there: the count a pick, hold or release decides with is
the one committed last, and it stays so until this transaction ends. A freed slot marks
the group for the other app-scoped queues that know it, and wakes them (``Unit.handed``);
a ``scope_refresh`` row is written and deleted only under its group's count row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, select, update

from ...limits import APP_SCOPE, QUEUE_SCOPE
from ...policy.decisions import CLASSES
from .ready import UnitRows
from .rows import chunks, insert_ignore, upsert


class ScopeCounts(UnitRows):
    """A mixin of :class:`~celery_fair.store.sql.unit.Unit`: the app's in-flight counts
    of the groups the unit touches."""

    handed: set[str]
    #: group -> the app's count now, and as read (locked)
    scope_n: dict[str, int]
    _scope_read: dict[str, int]
    _scope_freed: set[str]
    #: (class, group) -> the app's charge total now, and as read (None: no row)
    scope_charge: dict[tuple[str, str], float]
    _charge_read: dict[tuple[str, str], float | None]

    def app_scoped(self) -> bool:
        """Whether the queue's scope is 'app' (its row's ``scope``; None: 'queue')."""
        return bool(self.q.get("scope") == APP_SCOPE)

    def lock_counts(self, names: Iterable[str], force: bool = False) -> None:
        """Lock the count rows of ``names`` not locked yet (in name order; made when
        missing, so that a group with none is locked too); only in an app-scoped queue,
        unless ``force``."""
        if not (force or self.app_scoped()):
            return
        wanted = sorted({g for g in names if g not in self.scope_n})
        if not wanted:
            return
        c = self.t.scope_n.c
        while wanted:  # a row deleted (at 0) between the insert and the lock: again
            for chunk in chunks(wanted, 500):
                insert_ignore(self.conn, self.t.scope_n, [{"ns": self.ns, "grp": g, "n": 0}
                                                          for g in chunk])
                for g, n in self.conn.execute(select(c.grp, c.n).where(
                        c.ns == self.ns, c.grp.in_(chunk)).order_by(c.grp).with_for_update()):
                    self.scope_n[g] = self._scope_read[g] = int(n)
            wanted = [g for g in wanted if g not in self.scope_n]

    def cap_count(self, g: str, n: int) -> int:
        """The in-flight count g's cap binds: the queue's ``n``, or the app's
        (``QueueData._cap_count``)."""
        if not self.app_scoped():
            return n
        self.lock_counts([g])
        return self.scope_n[g]

    def scope_add(self, g: str, delta: int, force: bool = False) -> None:
        """g's in flight in this queue moved by ``delta``: the app's count too."""
        if force or self.app_scoped():
            self.lock_counts([g], force=True)
            self.scope_n[g] = max(self.scope_n[g] + delta, 0)

    # -- wfq shares across queues (policy/scope.py's, common.lua SC.charged/behind) ----

    def _charge(self, klass: str, g: str) -> float:
        """The app's charge total of g in ``klass`` (read under g's count row)."""
        key = (klass, g)
        if key not in self.scope_charge:
            self.lock_counts([g], force=True)
            c = self.t.scope_charge.c
            total = self.conn.execute(select(c.total).where(
                c.ns == self.ns, c.klass == klass, c.grp == g)).scalar()
            self._charge_read[key] = None if total is None else float(total)
            self.scope_charge[key] = 0.0 if total is None else float(total)
        return self.scope_charge[key]

    def scope_charged(self, klass: str, g: str, advance: float) -> None:
        """g's tag in ``klass`` moved by ``advance`` here: the app's total with it, and
        this queue has seen it (``AppScope._scope_charged``)."""
        if not self.app_scoped():
            return
        self.scope_charge[(klass, g)] = self._charge(klass, g) + advance
        row = self.groups[g]
        assert row is not None
        row[f"seen_{klass}"] = (row[f"seen_{klass}"] or 0.0) + advance

    def scope_entered(self, klass: str, g: str) -> None:
        """g enters a set of ``klass`` from outside both: nothing owed from before."""
        row = self.groups[g]
        if self.app_scoped() and row is not None:
            row[f"seen_{klass}"] = self._charge(klass, g)

    def scope_behind(self, klass: str, g: str, synced: set[tuple[str, str]]) -> float | None:
        """What other queues charged the pick's head g since this one last looked (once
        per class and group per pick), now taken as seen; None: nothing."""
        key = (klass, g)
        if not self.app_scoped() or self.harmony() or key in synced:  # type: ignore[attr-defined]
            return None
        synced.add(key)
        total = self._charge(klass, g)
        row = self.groups[g]
        assert row is not None
        behind = total - (row[f"seen_{klass}"] or 0.0)
        if behind <= 0:
            return None
        row[f"seen_{klass}"] = total
        return behind

    def sync_seen(self, names: list[str]) -> None:
        """The queue enters the scope: nothing owed from before by the groups ``names``
        (their count rows locked), as by a group entering a set."""
        c = self.t.scope_charge.c
        totals: dict[tuple[str, str], float] = {}
        for chunk in chunks(names, 500):
            totals.update(((str(k), str(g)), float(t)) for k, g, t in self.conn.execute(
                select(c.klass, c.grp, c.total).where(c.ns == self.ns, c.klass.in_(CLASSES),
                                                      c.grp.in_(chunk))))
        for g in names:
            row = self.groups[g]
            assert row is not None
            for klass in CLASSES:
                row[f"seen_{klass}"] = totals.get((klass, g), 0.0)

    def scope_forgot(self, g: str) -> None:
        """This queue forgot g: when no app-scoped queue knows it any more, its charge
        totals go (``AppScope._scope_forgot``; under g's count row, as a hold that
        makes g in another queue reads them)."""
        if not self.app_scoped():
            return
        self.lock_counts([g], force=True)
        gc = self.t.groups.c
        if self.conn.execute(app_groups(self.t, gc.queue).where(
                gc.ns == self.ns, gc.grp == g, gc.queue != self.queue).limit(1)
        ).first() is not None:
            return
        c = self.t.scope_charge.c
        self.conn.execute(delete(self.t.scope_charge).where(  # the key's points
            c.ns == self.ns, c.klass.in_(CLASSES), c.grp == g))
        for klass in CLASSES:
            self.scope_charge.pop((klass, g), None)
            self._charge_read.pop((klass, g), None)

    def _flush_charges(self) -> None:
        moved = sorted((key, total) for key, total in self.scope_charge.items()
                       if self._charge_read.get(key) != total)
        upsert(self.conn, self.t.scope_charge, [
            {"ns": self.ns, "klass": klass, "grp": g, "total": total}
            for (klass, g), total in moved], ["total"])
        self._charge_read.update(moved)

    def scope_freed(self, g: str) -> None:
        """A slot of g came back: the other app-scoped queues knowing g refresh it at
        their next promote, woken (``FairQueue._scope_freed``)."""
        if self.app_scoped():
            self._scope_freed.add(g)

    def scope_stale(self, klass: str, g: str) -> bool:
        """Whether the pick's head ``g`` (in ``klass``'s ready set) is at its cap
        app-wide: another queue's picks took it there after it was ranked here
        (``FairQueue._scope_stale``)."""
        cap = self.cap(g)  # type: ignore[attr-defined]
        if not self.app_scoped() or cap < 0 or self.ready.get((klass, g)) is None:
            return False
        if klass == "i" and cap > 0:
            cap += self.q["reserve"]
        return bool(self.cap_count(g, 0) >= cap)

    ready: dict[tuple[str, str], float | None]

    def scope_marked(self, g: str) -> bool:
        """Whether another queue freed a slot of g that this queue's next promote
        refreshes (``scope_admit``): until then g may stand ready outside the ready set."""
        r = self.t.scope_refresh.c
        return self.app_scoped() and self.conn.execute(select(r.grp).where(
            r.ns == self.ns, r.queue == self.queue, r.grp == g)).first() is not None

    def scope_admit(self) -> bool:
        """Promote: refresh the groups another queue freed a slot of (their count rows
        locked before their marks are deleted: a mark written meanwhile waits for this
        transaction). True when one entered a ready set."""
        if not self.app_scoped():
            return False
        r = self.t.scope_refresh.c
        mine = (r.ns == self.ns) & (r.queue == self.queue)
        marked = sorted(str(g) for g in self.conn.execute(select(r.grp).where(mine)).scalars())
        if not marked:
            return False
        self.lock_groups(marked)  # type: ignore[attr-defined]
        self.lock_counts(marked)
        entered = False
        for g in marked:
            if self.groups.get(g) is not None:
                for klass in CLASSES:
                    self._membership(klass, g)  # type: ignore[attr-defined]
                entered = self.refresh(g) or entered  # type: ignore[attr-defined]
        for chunk in chunks(marked, 500):
            self.conn.execute(delete(self.t.scope_refresh).where(mine, r.grp.in_(chunk)))
        return entered

    def flush_scope(self) -> None:
        """Write the counts that moved (a row at 0 goes) and mark the freed groups for
        the other app-scoped queues that know them."""
        c = self.t.scope_n.c
        moved = [(g, n) for g, n in self.scope_n.items() if n != self._scope_read.get(g)]
        for g, n in moved:
            if n > 0:
                self.conn.execute(update(self.t.scope_n).where(
                    c.ns == self.ns, c.grp == g).values(n=n))
        zero = sorted(g for g, n in self.scope_n.items() if n == 0)
        for chunk in chunks(zero, 500):
            self.conn.execute(delete(self.t.scope_n).where(c.ns == self.ns,
                                                           c.grp.in_(chunk)))
        for g, n in moved:
            self._scope_read[g] = n
        self._flush_charges()
        if self._scope_freed:
            self._mark_freed(sorted(self._scope_freed))
            self._scope_freed.clear()

    def _mark_freed(self, freed: list[str]) -> None:
        g = self.t.groups.c
        rows = []
        for chunk in chunks(freed, 500):
            rows += [{"ns": self.ns, "queue": queue, "grp": grp} for queue, grp in
                     self.conn.execute(app_groups(self.t, g.queue, g.grp).where(
                         g.ns == self.ns, g.grp.in_(chunk), g.queue != self.queue
                     ).order_by(g.queue, g.grp))]
        insert_ignore(self.conn, self.t.scope_refresh, rows)
        self.handed.update(row["queue"] for row in rows)  # woken at the flush


def app_groups(t: Any, *columns: Any) -> Any:
    """SELECT ``columns`` over the ``groups`` rows of the app-scoped queues."""
    g, q = t.groups.c, t.queues.c
    return select(*columns).join_from(t.groups, t.queues, (q.ns == g.ns) & (
        q.queue == g.queue)).where(q.scope == APP_SCOPE)


def scope_change(u: Any, scope: str) -> None:
    """configure (its groups locked): entering 'app' adds the queue's in-flight counts
    to the app's, leaving takes them out (``FairQueue._scope_change``)."""
    if (u.q.get("scope") or QUEUE_SCOPE) == scope:
        return
    sign = 1 if scope == APP_SCOPE else -1
    busy = sorted(g for g, row in u.groups.items() if row is not None and row["inflight"])
    u.lock_counts(busy, force=True)
    for g in busy:
        u.scope_add(g, sign * u.groups[g]["inflight"], force=True)
    known = sorted(g for g, row in u.groups.items() if row is not None)
    u.lock_counts(known, force=True)
    if sign > 0:  # nothing owed from before (as a group entering a set)
        u.sync_seen(known)
    else:  # nothing left behind (as a group forgotten)
        for g in known:
            u.scope_forgot(g)
