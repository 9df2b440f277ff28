"""Rate limits and throttles inside the SQL store's pick and promote: the pick meters
each group it takes (``FairQueue._meter``), promote lifts the throttles due
(``FairQueue._lift_throttles``). Both run with the queue's row locked, as every change
of the ``throttles`` table does, so the queue's count of them stays exact."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, func, select

from ...limits import Rate
from ...policy.decisions import CLASSES, gcra, throttle_due
from ..models import RATE_EARLY_MS
from .rows import upsert
from .unit import Unit


class Meter:
    """The GCRA of one pick: the buckets of the groups it takes, and the throttles of
    those it empties, written back at the end (``pick.lua`` ``meter``)."""

    def __init__(self, u: Unit, now_ms: int) -> None:
        self.u, self.now = u, now_ms
        self.tats: dict[str, float | None] = {}  # g -> its TAT read or moved on
        self.moved: dict[str, float] = {}
        self.until: dict[str, float] = {}  # g -> the throttle the pick gave it

    def load(self, groups: Iterable[str]) -> None:
        """Read the buckets of the rate-limited ``groups`` at once (the heads a pick
        reached; a group in a ready set is not throttled, so that is known too)."""
        wanted = sorted(g for g in groups if self.u.rate(g) is not None
                        and g not in self.tats)
        t = self.u.t.tats.c
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            found = {g: tat for g, tat in self.u.conn.execute(select(t.grp, t.tat).where(
                t.ns == self.u.ns, t.queue == self.u.queue, t.grp.in_(chunk)))}
            self.tats.update((g, found.get(g)) for g in chunk)

    def __call__(self, g: str) -> None:
        """g was just picked: count it against its rate, and throttle it until its next
        token once its bucket is empty: it leaves both ready sets."""
        rate = self.u.rate(g)
        if rate is None:
            return
        self.load([g])
        tat, free_at = gcra(self.tats[g], self.now, rate.interval_ms, rate.burst,
                            RATE_EARLY_MS)
        self.tats[g] = self.moved[g] = tat
        if free_at > self.now:
            self.u.leave_ready(g)
            self.u.set_throttled(g, True)
            self.until[g] = free_at

    def write(self) -> None:
        key = self.u.key
        if self.moved:  # buckets gone full (gcra reads them as now) go with a pick that
            # meters, not with every promote: a queue without rates never touches ``tats``
            tc = self.u.t.tats.c
            self.u.conn.execute(delete(self.u.t.tats).where(
                tc.ns == self.u.ns, tc.queue == self.u.queue,
                tc.tat <= self.now - RATE_EARLY_MS))
        upsert(self.u.conn, self.u.t.tats,
               [{**key, "grp": g, "tat": tat} for g, tat in sorted(self.moved.items())],
               ["tat"])
        upsert(self.u.conn, self.u.t.throttles,
               [{**key, "grp": g, "until_ms": until} for g, until in sorted(self.until.items())],
               ["until_ms"])


def rethrottle(u: Unit, groups: list[str], throttled: bool) -> bool:
    """The throttle rows of ``groups`` were written (``throttled``) or deleted, what
    they were before known (``Unit.know_throttled``): count them and re-rank the groups
    (their eligibility changed though their counts did not); True when one entered a
    ready set."""
    u.lock_groups(groups)
    u.load_ready([(k, g) for g in groups for k in CLASSES])  # before the change
    entered = False
    for g in groups:
        u.set_throttled(g, throttled)
        entered = u.refresh(g) or entered
    return entered


def rerate(u: Unit, g: str, before: Rate | None) -> bool:
    """g's rate in force was ``before`` (its limits forgotten since): when it changed, its
    bucket starts full and the throttle its old rate gave it goes, not a task's (ending
    later); True when g then entered a ready set. See ``common.lua`` ``rerate``."""
    if u.rate(g) == before:
        return False
    t, th = u.t.tats.c, u.t.throttles.c
    tat = u.conn.execute(select(t.tat).where(t.ns == u.ns, t.queue == u.queue,
                                             t.grp == g)).scalar()
    if tat is None:
        return False
    u.conn.execute(delete(u.t.tats).where(t.ns == u.ns, t.queue == u.queue, t.grp == g))
    ends = u.conn.execute(select(th.until_ms).where(
        th.ns == u.ns, th.queue == u.queue, th.grp == g)).scalar() if u.throttled(g) else None
    if ends is None or before is None \
            or float(ends) > float(tat) - (before.burst - 1) * before.interval_ms:
        return False  # none, or a task's
    u.conn.execute(delete(u.t.throttles).where(th.ns == u.ns, th.queue == u.queue,
                                               th.grp == g))
    return rethrottle(u, [g], False)


def lift_throttles(u: Unit, now_ms: int, limit: int) -> int | None:
    """Lift up to ``limit`` throttles ending by ``now_ms`` (ends first, then names);
    returns when the next throttle is to be lifted (None: none is left). See
    ``promote.lua``; the arrival times past are ``Meter.write``'s."""
    t, c = u.t.throttles, u.t.throttles.c
    mine = (c.ns == u.ns, c.queue == u.queue)
    if u.q.get("throttles"):
        due = list(u.conn.execute(select(c.grp).where(
            *mine, c.until_ms <= now_ms).order_by(c.until_ms, c.grp)
            .limit(limit)).scalars())
        if due:
            u.know_throttled(due, True)
            u.conn.execute(delete(t).where(*mine, c.grp.in_(due)))
            rethrottle(u, due, False)
    if not u.q.get("throttles"):
        return None
    least = u.conn.execute(select(func.min(c.until_ms)).where(*mine)).scalar()
    return None if least is None else throttle_due(float(least))
