"""One transaction's view of one fair queue: the rows it locked, changed in memory and
written back at the end (a small unit of work).

The operations (``lifecycle.py``) read and change a queue through a :class:`Unit`, as
the memory store's policy changes its dicts, and make the same decisions
(:mod:`celery_fair.policy.decisions`). Locks are always taken in one order, so two
transactions never wait for each other in a circle: the queue's row (pick, promote,
reclaim, configure, cancel), then group rows, then dispatch rows. Hold, release and
begin lock only their group's row: groups never wait for each other, and no single row
is written by every release (the counters are sharded).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, select, update

from ...limits import DEFAULT_AGING, HARMONY, SMALLEST, Rate, decode_rate
from ...policy.decisions import CLASSES, harmony_rank, in_force, smallest_key
from .ready import ReadySets
from .rows import chunks
from .scoping import ScopeCounts
from .statements import GROUP_COLUMNS, Statements, list_order

COUNTER_SHARDS = 16
#: The queue of the namespace's rows: singleton keys' owners and waiters (a key spans
#: the app), and the queue row their lock is (``Unit.lock_scope``). No fair queue has
#: an empty name.
SCOPE = ""


def held_count(row: Any) -> int:
    """What a group's row says it holds: both class lists, delayed and parked (caps per
    subgroup: held all the same). fair_group_max_held's count."""
    return int(row["held_i"] + row["held_b"] + row["delayed"]
               + row["parked_i"] + row["parked_b"])


class Unit(ScopeCounts, ReadySets):
    """Rows of one fair queue that one transaction reads and writes (see the module
    docstring). :meth:`flush` writes what changed.

    Ready sets are not read: every operation keeps "a group is in its class's ready set
    exactly when it is eligible" (``fair check`` verifies it), so a group's membership
    before a change follows from the row it locked, and only a change of eligibility
    writes a ready row."""

    def __init__(self, conn: Connection, s: Statements, ns: str, queue: str,
                 lock_queue: bool = False, notify: str | None = None) -> None:
        self.conn, self.s, self.t, self.ns, self.queue = conn, s, s.t, ns, queue
        self.key = {"ns": ns, "queue": queue}
        self.notify = notify  # PostgreSQL: the channel to NOTIFY (the queue) when woken
        self._q: dict[str, Any] | None = self._queue_row(True) if lock_queue else None
        self.groups: dict[str, dict[str, Any] | None] = {}
        self._seen: dict[str, tuple[int, int, int] | None] = {}  # g -> (held i, b, inflight)
        self.ready: dict[tuple[str, str], float | None] = {}  # (klass, g) -> tag / absent
        self._ready_loaded: dict[tuple[str, str], float | None] = {}
        # soft caps: the over sets, as the ready sets (empty under hard caps)
        self.over: dict[tuple[str, str], float | None] = {}
        self._over_loaded: dict[tuple[str, str], float | None] = {}
        # g -> cap, weight, pick weight, rate in force
        self._limits: dict[str, tuple[int, float, float, Rate | None]] = {}
        self._paused: set[str] | None = None  # the paused groups ('' the queue), once read
        self._throttled: dict[str, bool] = {}  # g -> throttled, as read or changed
        self.throttles_added = 0  # to the queue row's count of throttles
        self.counts: dict[str, int] = {}
        self.queue_changed = False
        self.woken = False
        self.handed: set[str] = set()  # queues a singleton key was handed to: woken too
        self._scoped = False  # the namespace's row is locked (lock_scope)
        # fair_scope 'app' (scoping.py): the app's counts of the groups locked
        self.scope_n: dict[str, int] = {}
        self._scope_read: dict[str, int] = {}
        self._scope_freed: set[str] = set()
        #: (class, group) -> the app's charge total now, and as read (scoping.py)
        self.scope_charge: dict[tuple[str, str], float] = {}
        self._charge_read: dict[tuple[str, str], float | None] = {}
        # caps per subgroup (subcaps.py): path -> its cap, its dispatches in flight
        self.path_caps: dict[str, int] = {}
        self.sflight: dict[str, int] = {}

    # -- the queue's row ------------------------------------------------------------------

    @property
    def q(self) -> dict[str, Any]:
        """The queue's row (read without a lock unless the unit locked it)."""
        if self._q is None:
            self._q = self._queue_row(False)
        return self._q

    def _queue_row(self, lock: bool) -> dict[str, Any]:
        name = "queue_lock" if lock else "queue"
        row = self.s.run(self.conn, name, self.key).mappings().first()
        if row is None:
            self.s.run(self.conn, "queue_new", self.key)
            row = self.s.run(self.conn, name, self.key).mappings().one()
        return dict(row)

    def lock_scope(self) -> None:
        """Lock the namespace's row (singleton keys span its queues), once, after the
        queue's row: every keyed step takes them in this order."""
        if not self._scoped:
            self._scoped = True
            key = {"ns": self.ns, "queue": SCOPE}
            if self.s.run(self.conn, "queue_lock", key).first() is None:
                self.s.run(self.conn, "queue_new", key)
                self.s.run(self.conn, "queue_lock", key).one()

    def register(self) -> None:
        """Make the queue one of ``queues()``: a hold that creates a group does, with the
        queue's row locked, so a ``forget_queue`` (which locks it too and finds no group)
        never forgets a queue a hold is adding to."""
        self._q = self._queue_row(True)
        if not self._q["registered"]:
            self._q["registered"] = True
            self.s.run(self.conn, "queue_register", self.key)

    def harmony(self) -> bool:
        """Whether the queue runs Harmony (its row's ``policy``; None: 'wfq')."""
        return self.q.get("policy") == HARMONY

    def rank(self, g: str) -> float:
        """g's place in the ready sets under Harmony (``FairQueue._rank``)."""
        row = self.groups[g]
        assert row is not None
        return harmony_rank(self.cap_count(g, row["inflight"]), self.pick_weight(g),
                            row["served"] or 0, row["jump"])

    def vt(self, klass: str) -> float | None:
        return self.q[f"vt_{klass}"]  # type: ignore[no-any-return]

    def sort_key(self, cost: float, front: bool, now_ms: int) -> float | None:
        """'smallest': the sort key of a message held at the tail now (None: another
        policy, or the front)."""
        if front or self.q.get("policy") != SMALLEST:
            return None
        aging = self.q.get("aging")
        return smallest_key(now_ms, cost, DEFAULT_AGING if aging is None else aging)

    def list_head(self, g: str, klass: str) -> str | None:
        """The hold id at the head of group ``g``'s list of ``klass`` (None: empty)."""
        m = self.t.messages.c
        return self.conn.execute(select(m.hold_id).where(
            m.ns == self.ns, m.queue == self.queue, m.grp == g, m.klass == klass,
            m.seq.is_not(None)).order_by(*list_order(m)).limit(1)).scalar()

    def set_vt(self, klass: str, value: float) -> None:
        self.q[f"vt_{klass}"] = value
        self.queue_changed = True

    # -- groups ------------------------------------------------------------------------

    def lock_groups(self, names: Iterable[str]) -> None:
        """Load and lock the rows of ``names`` not loaded yet (one query)."""
        wanted = sorted({g for g in names if g not in self.groups})
        if not wanted:
            return
        if len(wanted) == 1:
            row = self.s.run(self.conn, "group_lock", {**self.key, "grp": wanted[0]}
                             ).mappings().first()
            self._loaded(wanted[0], None if row is None else dict(row))
            self.lock_counts(wanted)  # fair_scope 'app': after the group's row
            return
        t = self.t.groups
        for chunk in chunks(wanted, 500):
            rows = self.conn.execute(select(t).where(
                t.c.ns == self.ns, t.c.queue == self.queue, t.c.grp.in_(chunk)
            ).order_by(t.c.grp).with_for_update()).mappings()
            for row in rows:
                self._loaded(row["grp"], dict(row))
        for g in wanted:
            if g not in self.groups:
                self._loaded(g, None)
        self.lock_counts(wanted)  # fair_scope 'app': after the group rows, in name order

    def _loaded(self, g: str, row: dict[str, Any] | None) -> None:
        self.groups[g] = row
        self._seen[g] = None if row is None else (row["held_i"], row["held_b"],
                                                  row["inflight"])

    def group(self, g: str, create: bool = False) -> dict[str, Any] | None:
        """Group ``g``'s row, locked (None: no work; with ``create`` a new one, the queue
        registered)."""
        self.lock_groups([g])
        row = self.groups[g]
        if row is None and create:
            self.register()
            # Two holds may create the group at once: one inserts, the other waits for it
            # and locks the row it committed.
            self.s.run(self.conn, "group_new", {**self.key, "grp": g})
            del self.groups[g], self._seen[g]
            self.lock_groups([g])
            row = self.groups[g]
        return row

    def forget_if_idle(self, g: str) -> None:
        row = self.groups.get(g)
        if row is not None and not (row["inflight"] > 0 or row["delayed"] > 0
                                    or row["held_i"] > 0 or row["held_b"] > 0
                                    or row["parked_i"] > 0 or row["parked_b"] > 0):
            self.groups[g] = None
            self.s.run(self.conn, "group_drop", {**self.key, "grp": g})
            self.scope_forgot(g)

    # -- caps and weights ---------------------------------------------------------------

    def load_limits(self, names: Iterable[str]) -> None:
        """The caps, weights and rates in force of ``names``: one query for one group (with the
        queue's row, when not read yet), one per 500 groups otherwise."""
        wanted = sorted({g for g in names if g not in self._limits})
        if not wanted:
            return
        t = self.t.limits
        found: dict[str, Any] = {}  # group -> its limits row
        if len(wanted) == 1 and self._q is None:
            row = self.s.run(self.conn, "queue_with_limits", {**self.key, "grp": wanted[0]}
                             ).mappings().first()
            if row is not None:
                self._q = {c.name: row[c.name] for c in self.t.queues.columns}
                found[wanted[0]] = row
        for chunk in chunks(wanted, 500) if not found else ():
            for found_row in self.conn.execute(select(t).where(
                    t.c.ns == self.ns, t.c.queue == self.queue, t.c.grp.in_(chunk))).mappings():
                found[found_row["grp"]] = found_row
        q_row = self.q
        for g in wanted:
            lim: Any = found.get(g, {})
            cap = in_force(lim.get("limit_cap"), lim.get("conf_cap"), q_row["default_cap"])
            weight = in_force(lim.get("limit_weight"), lim.get("conf_weight"),
                              q_row["default_weight"])
            boost = lim.get("boost_weight")  # the pick's weight while it lasts
            rate = next((r for r in (lim.get("limit_rate"), lim.get("conf_rate"),
                                     q_row["default_rate"]) if r is not None), None)
            self._limits[g] = (int(cap), float(weight), float(boost or weight),
                               decode_rate(rate))

    def cap(self, g: str) -> int:
        self.load_limits([g])
        return self._limits[g][0]

    def weight(self, g: str) -> float:
        self.load_limits([g])
        return self._limits[g][1]

    def pick_weight(self, g: str) -> float:
        """The weight the pick uses: a boost's while it lasts (``FairQueue.pick_weight``)."""
        self.load_limits([g])
        return self._limits[g][2]

    def rate(self, g: str) -> Rate | None:
        """g's rate limit in force (None: none): its runtime one, else its setting, else
        the queue's default (``QueueData.rate_of``)."""
        self.load_limits([g])
        return self._limits[g][3]

    def forget_limits(self, g: str) -> None:
        self._limits.pop(g, None)

    def paused(self, g: str) -> bool:
        """Whether g ('' the whole queue) is paused; read once per unit, and only when
        the queue has pauses (its row counts them)."""
        if not self.q.get("pauses"):
            return False
        if self._paused is None:
            p = self.t.pauses.c
            self._paused = set(self.conn.execute(select(p.grp).where(
                p.ns == self.ns, p.queue == self.queue)).scalars())
        return g in self._paused

    def forget_pauses(self, count: int) -> None:
        """The pauses changed (``count`` of them now): read them again when needed."""
        self.q["pauses"], self._paused = count, None

    def throttled(self, g: str) -> bool:
        """Whether g is throttled; read once per group and unit, and only when the queue
        has throttles (its row counts them)."""
        if not self.q.get("throttles"):
            return False
        if g not in self._throttled:
            t = self.t.throttles.c
            self._throttled[g] = self.conn.execute(select(t.grp).where(
                t.ns == self.ns, t.queue == self.queue, t.grp == g)).first() is not None
        return self._throttled[g]

    def know_throttled(self, groups: Iterable[str], throttled: bool) -> None:
        """What the caller read or knows of ``groups``' throttles (a group in a ready set
        is not throttled): no query for them."""
        self._throttled.update((g, throttled) for g in groups)

    def set_throttled(self, g: str, throttled: bool) -> None:
        """g's throttle row was written or deleted (as ``throttled`` says): count it.
        Re-rank g after (its ready membership known before, as ``load_ready`` does)."""
        if throttled != self.throttled(g):
            step = 1 if throttled else -1
            self.q["throttles"] = (self.q.get("throttles") or 0) + step
            self.throttles_added += step
        self._throttled[g] = throttled

    def rerank(self, g: str) -> None:
        """Under Harmony, re-rank g after its pick weight or jump changed (its counts did
        not, so a refresh alone would keep its rank); its limits are read again."""
        self.forget_limits(g)
        if self.harmony() and self.group(g) is not None:
            for klass in CLASSES:
                self._membership(klass, g)
            self.refresh(g)

    # -- counters -------------------------------------------------------------------------

    def count(self, name: str, delta: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + delta

    # -- writing back ---------------------------------------------------------------------

    def resent(self, hold_id: str, value: bytes) -> bool:
        """Whether ``value`` is held under ``hold_id`` already (a resend, held once); then
        the unit is flushed though it changed nothing, so that the count rows it made at 0
        to lock them go (fair_scope 'app', scoping.py)."""
        row = self.s.run(self.conn, "message", {**self.key, "hold_id": hold_id}).first()
        if row is None or bytes(row.value) != value:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        """Write the groups, ready sets, counters and queue row this unit changed, and
        notify the listening dispatchers when woken (delivered at the commit)."""
        self._flush_groups()
        self._flush_ready()
        if self.counts:
            shard = random.randrange(COUNTER_SHARDS)
            self.s.run(self.conn, "count_add", [{**self.key, "name": n, "shard": shard,
                                                 "n": d} for n, d in self.counts.items()])
        if self.throttles_added:
            qc = self.t.queues.c
            self.conn.execute(update(self.t.queues).where(
                qc.ns == self.ns, qc.queue == self.queue).values(
                throttles=qc.throttles + self.throttles_added))
            self.throttles_added = 0
        if self.queue_changed:
            q = self.q
            self.s.run(self.conn, "queue_save", {**self.key, "vt_i": q["vt_i"],
                                                 "vt_b": q["vt_b"], "picks": q["picks"],
                                                 "dups": q["dups"], "served": q["served"]})
        self.flush_scope()  # fair_scope 'app': may hand queues a refresh (woken below)
        if self.woken and self.notify:
            self.s.run(self.conn, "notify", {"channel": self.notify, "payload": self.queue})
        for queue in sorted(self.handed):  # another queue's dispatchers: here, and others
            if self.notify:  # (PostgreSQL; the other databases' waits poll)
                self.s.run(self.conn, "notify", {"channel": self.notify, "payload": queue})
            if self.s.on_hand is not None:
                self.s.on_hand(queue)

    def _flush_groups(self) -> None:
        rows = [row for row in self.groups.values() if row is not None]
        if len(rows) == 1:
            row = rows[0]
            self.s.run(self.conn, "group_save", {**self.key, "b_grp": row["grp"],
                                                 **{c: row[c] for c in GROUP_COLUMNS}})
        elif rows:
            self.s.many(self.conn, "groups_save", rows)

