"""Boosts on SQL (:class:`~celery_fair.store.boosting.Boosting`): two columns of the
group's ``limits`` row, apart from its settings and runtime limit (a row left with
nothing else is dropped when the boost ends). A boost changes no eligibility, only the
weight the next pick reads, so under wfq nothing is re-ranked; under Harmony the group's
rank (its weight in it) is, with its row locked. No queue row is locked."""

from __future__ import annotations

from sqlalchemy import Connection, and_, select, update

from ... import limits
from ...names import validate_group
from ...policy.decisions import CLASSES, front_tag
from ..models import now_ms as wall_ms
from .controls import drop_empty_limits
from .mixin import SqlMixin
from .rows import upsert
from .subgrouping import emptied
from .unit import Unit


class SqlBoosting(SqlMixin):
    """A mixin of :class:`~celery_fair.store.sql.store.SqlStore` (it gives ``_do``)."""

    def boost(self, queue: str, group: str, weight: float, until_ms: int | None) -> None:
        group = validate_group(group)
        weight = limits.weight(weight, f"boost weight for group {group!r}")
        row = {"ns": self.namespace, "queue": queue, "grp": group, "boost_weight": weight,
               "boost_until_ms": until_ms}

        def work(c: Connection) -> None:
            upsert(c, self.s.t.limits, [row], ["boost_weight", "boost_until_ms"])
            self._rerank(c, queue, [group])
        self._do("boost", queue, work)

    def unboost(self, queue: str, group: str) -> bool:
        return bool(self._do("unboost", queue, lambda c: self._end(c, queue, [group])))

    def boosts(self, queue: str) -> dict[str, tuple[float, int | None]]:
        lt = self.s.t.limits.c
        rows = self._do("boosts", queue, lambda c: c.execute(
            select(lt.grp, lt.boost_weight, lt.boost_until_ms).where(
                lt.ns == self.namespace, lt.queue == queue,
                lt.boost_weight.is_not(None))).all())
        return {g: (float(w), None if u is None else int(u)) for g, w, u in rows}

    def boost_task(self, queue: str, hold_id: str, *, now_ms: int | None = None) -> str | None:
        m = self.s.t.messages.c

        def work(c: Connection) -> str | None:
            u = Unit(c, self.s, self.namespace, queue, True, self.wakes.notice)  # as pick
            msg = c.execute(select(m.grp, m.klass, m.seq).where(
                m.ns == self.namespace, m.queue == queue, m.hold_id == hold_id)).first()
            row = None if msg is None or msg.seq is None else u.group(msg.grp)
            if msg is None or row is None:
                return None  # not held: delayed (no seq), dispatched or unknown
            if hold_id != u.list_head(msg.grp, msg.klass):  # a new head
                row[f"since_{msg.klass}"] = wall_ms() if now_ms is None else now_ms
            row["head"] -= 1  # the front of its group's list (as a hold with front)
            row[f"held_{msg.klass}"] -= 1  # unlist_held: a list it alone was in starts
            emptied(row, msg.klass)  # afresh (fair_subgroup), then it is back in it
            row[f"held_{msg.klass}"] += 1
            c.execute(update(self.s.t.messages).where(
                m.ns == self.namespace, m.queue == queue, m.hold_id == hold_id
            ).values(seq=row["head"], sort_key=None))
            klass, g = msg.klass, msg.grp
            if u.harmony():  # first in the queue, until its next pick
                heads = [t for k in CLASSES for _, t in u.head_of_ready(k, 1)]
                row["jump"] = front_tag(min(heads, default=None), u.rank(g))
                u.rerank(g)
                u.flush()
                return str(g)
            head = u.head_of_ready(klass, 1)
            u.load_ready([(klass, g)])
            tag = front_tag(head[0][1] if head else None, row[f"tag_{klass}"])
            row[f"tag_{klass}"] = tag
            if tag < (u.vt(klass) or 0.0):  # a refresh would take it back to the vt
                u.set_vt(klass, tag)
            for known in (u.ready, u.over):  # in whichever it is
                if known[(klass, g)] is not None:
                    known[(klass, g)] = tag
            u.flush()
            return str(g)
        return self._do("boost task", queue, work)  # type: ignore[no-any-return]

    def expire_boosts(self, queue: str, now_ms: int) -> list[str]:
        lt = self.s.t.limits.c

        def work(c: Connection) -> list[str]:
            due = sorted(c.execute(select(lt.grp).where(
                lt.ns == self.namespace, lt.queue == queue, lt.boost_weight.is_not(None),
                lt.boost_until_ms <= now_ms)).scalars())
            # the update counts again: of several dispatchers only one ends each boost
            return [g for g in due if self._end(c, queue, [g])]
        return list(self._do("expire boosts", queue, work))

    def _end(self, c: Connection, queue: str, groups: list[str]) -> int:
        """Clear the boosts of ``groups``; how many there were. A row left empty goes."""
        lt = self.s.t.limits.c
        mine = and_(lt.ns == self.namespace, lt.queue == queue, lt.grp.in_(groups))
        gone = c.execute(update(self.s.t.limits).where(mine, lt.boost_weight.is_not(None))
                         .values(boost_weight=None, boost_until_ms=None)).rowcount
        drop_empty_limits(c, self.s.t, self.namespace, queue, lt.grp.in_(groups))
        if gone:
            self._rerank(c, queue, groups)
        return int(gone)

    def _rerank(self, c: Connection, queue: str, groups: list[str]) -> None:
        """Under Harmony, re-rank ``groups`` after their boost changed (``_rerank``)."""
        u = Unit(c, self.s, self.namespace, queue, False, self.wakes.notice)
        if u.harmony():
            for g in groups:
                u.rerank(g)
            u.flush()
