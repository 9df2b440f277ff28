"""The ready sets and (soft caps) the over sets of one fair queue as a :class:`Unit`
reads and writes them: membership known from the locked rows by the invariant (a group
is in its class's ready set exactly when it is eligible, in its over set exactly when it
stands over its cap under soft caps), rows read only where the invariant cannot tell,
and what changed written back at the end (``decisions.standing``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Table, delete, select

from ...limits import SOFT
from ...policy.decisions import CLASSES, OVER, READY, entry_tag, standing
from .rows import chunks


class UnitRows:
    """What the mixins of :class:`~celery_fair.store.sql.unit.Unit` (``ReadySets``,
    ``scoping.ScopeCounts``) take from it: its connection, tables, queue, key, the group
    rows it locked and the queue's row ``q``."""

    conn: Connection
    t: Any
    ns: str
    queue: str
    key: dict[str, str]
    groups: dict[str, dict[str, Any] | None]

    @property
    def q(self) -> dict[str, Any]:
        raise NotImplementedError


class ReadySets(UnitRows):
    """A mixin of :class:`~celery_fair.store.sql.unit.Unit` (which gives the rows and
    the queue's row ``q``)."""

    s: Any
    _seen: dict[str, tuple[int, int, int] | None]
    ready: dict[tuple[str, str], float | None]
    _ready_loaded: dict[tuple[str, str], float | None]
    over: dict[tuple[str, str], float | None]
    _over_loaded: dict[tuple[str, str], float | None]
    cap: Any
    paused: Any
    throttled: Any
    vt: Any
    harmony: Any
    rank: Any
    cap_count: Any
    app_scoped: Any

    def soft(self) -> bool:
        """Whether the queue's caps are soft (``fair_cap_mode``)."""
        return bool(self.q.get("cap_mode") == SOFT)

    def load_ready(self, keys: Iterable[tuple[str, str]]) -> None:
        """Read ready rows (and under soft caps over rows) of ``keys``: before a change
        the invariant cannot tell (``check`` compares them with eligibility)."""
        keys = list(keys)
        self._load(self.t.ready, [k for k in keys if k not in self.ready], self._know)
        wanted = [k for k in keys if k not in self.over]
        if self.soft():
            self._load(self.t.over, wanted, self._know_over)
        for k in wanted:
            self._know_over(k, None)

    def _load(self, t: Table, wanted: list[tuple[str, str]],
              know: Any) -> None:
        for klass in CLASSES:
            names = sorted({g for c, g in wanted if c == klass})
            for chunk in chunks(names, 500):
                rows = self.conn.execute(select(t.c.grp, t.c.tag).where(
                    t.c.ns == self.ns, t.c.queue == self.queue, t.c.klass == klass,
                    t.c.grp.in_(chunk)))
                for g, tag in rows:
                    know((klass, g), tag)
        for k in wanted:
            know(k, None)

    def _know(self, key: tuple[str, str], tag: float | None) -> None:
        if key not in self.ready:
            self.ready[key] = self._ready_loaded[key] = tag

    def _know_over(self, key: tuple[str, str], tag: float | None) -> None:
        if key not in self.over:
            self.over[key] = self._over_loaded[key] = tag

    def head_of_ready(self, klass: str, limit: int) -> list[tuple[str, float]]:
        """The first ``limit`` groups of the class's ready set, (tag, name) order."""
        rows: list[Any] = list(self.s.run(self.conn, "ready_head", {
            **self.key, "klass": klass, "n": limit}))
        for g, tag in rows:
            self._know((klass, g), tag)
        return [(g, tag) for g, tag in rows]

    def head_of_over(self, klass: str, limit: int) -> list[tuple[str, float]]:
        """The first ``limit`` groups of the class's over set (soft caps)."""
        rows: list[Any] = list(self.s.run(self.conn, "over_head", {
            **self.key, "klass": klass, "n": limit}))
        for g, tag in rows:
            self._know_over((klass, g), tag)
        return [(g, tag) for g, tag in rows]

    def standing_of(self, klass: str, g: str, counts: tuple[int, int, int] | None
                  ) -> str | None:
        if counts is None:
            return None
        held = counts[0] if klass == "i" else counts[1]
        if held <= 0:
            return None
        cap = self.cap(g)
        n = counts[2] if cap < 0 else self.cap_count(g, counts[2])  # fair_scope 'app'
        return standing(klass, held, n, cap, self.q["reserve"],
                        self.paused(g), self.throttled(g), self.soft())

    def _eligible(self, klass: str, g: str, counts: tuple[int, int, int] | None) -> bool:
        return self.standing_of(klass, g, counts) == READY

    def _membership(self, klass: str, g: str) -> None:
        """Know whether g is in the class's ready set (and over set), from the counts it
        had when its row was locked (the invariant); its tag is the group's. Under Harmony
        its rank then is not known here (its weight or sequence may have moved since):
        NaN, "in the set at some score", so that it is always written again."""
        if (klass, g) in self.ready and (klass, g) in self.over:
            return
        if self.app_scoped():  # another queue's picks move g's standing: read the rows
            self.load_ready([(klass, g)])
            return
        seen = self._seen.get(g)
        where = self.standing_of(klass, g, seen) if seen is not None else None
        tag = ((self.groups[g] or {}).get(f"tag_{klass}") or 0.0) if where else None
        if where and self.harmony():
            tag = math.nan
        self._know((klass, g), tag if where == READY else None)
        self._know_over((klass, g), tag if where == OVER else None)

    def leave_ready(self, g: str) -> None:
        """Take g out of both ready sets and over sets (a pick throttled it), knowing
        first where it was: from its counts, before its throttle is counted."""
        for klass in CLASSES:
            self._membership(klass, g)
            self.ready[(klass, g)] = self.over[(klass, g)] = None

    def retag(self, g: str, klass: str, tag: float) -> None:
        """Set g's tag (a release's correction), its sets' entries known first."""
        self._membership(klass, g)
        self.groups[g][f"tag_{klass}"] = tag  # type: ignore[index]

    def refresh(self, g: str) -> bool:
        """Make g's ready-set (and over-set) membership match where it stands
        (``common._refresh``), scored by its tag, or its rank under Harmony; True when it
        entered a set."""
        row = self.groups.get(g)
        now = None if row is None else (row["held_i"], row["held_b"], row["inflight"])
        seen = self._seen.get(g)
        entered = False
        scoped = self.app_scoped()  # the app's count may have moved: always look
        for i, klass in enumerate(CLASSES):
            key = (klass, g)
            if not scoped and key not in self.ready and key not in self.over \
                    and now is not None \
                    and seen is not None and (now[i] > 0) == (seen[i] > 0) \
                    and now[2] == seen[2]:
                continue  # standing unchanged, so membership and tag are too
            self._membership(klass, g)
            where = None if row is None else self.standing_of(klass, g, now)
            if row is not None and where is not None:
                if self.harmony():  # both sets scored by the rank, as in Redis
                    score = self.rank(g)
                else:
                    member = self.ready[key] is not None or self.over[key] is not None
                    if not member:  # wfq shares across queues: nothing owed from before
                        self.scope_entered(klass, g)  # type: ignore[attr-defined]
                    tag = entry_tag(row[f"tag_{klass}"], self.vt(klass), member)
                    row[f"tag_{klass}"] = tag
                    score = tag or 0.0
                into, out = (self.ready, self.over) if where == READY \
                    else (self.over, self.ready)
                entered = entered or into[key] is None
                into[key], out[key] = score, None
            else:
                self.ready[key] = self.over[key] = None
        self._seen[g] = now
        return entered

    def _flush_ready(self) -> None:
        for t, now, loaded, put in ((self.t.ready, self.ready, self._ready_loaded, "ready_put"),
                                    (self.t.over, self.over, self._over_loaded, "over_put")):
            self._flush_set(t, now, loaded, put)

    def _flush_set(self, t: Table, now: dict[tuple[str, str], float | None],
                   loaded: dict[tuple[str, str], float | None], put_name: str) -> None:
        gone: dict[str, list[str]] = {}
        put = []
        for (klass, g), tag in now.items():
            before = loaded.get((klass, g))
            if tag is None and before is not None:
                gone.setdefault(klass, []).append(g)
            elif tag is not None and tag != before:
                put.append({**self.key, "klass": klass, "grp": g, "tag": tag})
        for klass, names in gone.items():
            for chunk in chunks(sorted(names), 500):
                self.conn.execute(delete(t).where(t.c.ns == self.ns, t.c.queue == self.queue,
                                                  t.c.klass == klass, t.c.grp.in_(chunk)))
        self.s.many(self.conn, put_name, put)

