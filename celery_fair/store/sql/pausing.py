"""Pauses on SQL (:class:`~celery_fair.store.pausing.Pausing`): the ``pauses`` table,
counted in the queue's row so that a queue without pauses never reads it. Each change
locks the queue's row (as pick does), so a pick sees a pause whole or not at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, delete, func, select, update

from ...names import validate_group
from ..pausing import WHOLE_QUEUE
from .mixin import SqlMixin
from .rows import upsert
from .statements import Statements
from .unit import Unit

T = TypeVar("T")
_FOREVER = None  # until_ms of a pause without an end


class SqlPausing(SqlMixin):
    """A mixin of :class:`~celery_fair.store.sql.store.SqlStore` (it gives ``_do``, the
    statements and the wake-ups)."""

    def pause(self, queue: str, group: str, until_ms: int | None) -> None:
        if group != WHOLE_QUEUE:
            group = validate_group(group)
        self._change(queue, group, lambda u, c: upsert(
            c, self.s.t.pauses, [{**u.key, "grp": group, "until_ms": until_ms}],
            ["until_ms"]))

    def resume(self, queue: str, group: str) -> bool:
        # A group that was not paused is left as it is, as by pause.lua and the memory
        # store: not re-ranked (under fair_scope 'app' that would take in the other
        # queues' counts, which only the group's own events do).
        return bool(self._change(queue, group, lambda u, c: _drop(self.s, u, c, [group]),
                                 settle=bool))

    def pauses(self, queue: str) -> dict[str, int | None]:
        p = self.s.t.pauses.c
        rows = self._do("pauses", queue, lambda c: c.execute(select(p.grp, p.until_ms).where(
            p.ns == self.namespace, p.queue == queue)).all())
        return {g: None if until is None else int(until) for g, until in rows}

    def expire_pauses(self, queue: str, now_ms: int) -> list[str]:
        p = self.s.t.pauses.c

        def work(c: Connection) -> tuple[list[str], bool]:
            def due() -> list[str]:
                return sorted(c.execute(select(p.grp).where(
                    p.ns == self.namespace, p.queue == queue, p.until_ms.is_not(None),
                    p.until_ms <= now_ms)).scalars())
            if not due():  # the common case (a look each second): nothing locked
                return [], False
            u = Unit(c, self.s, self.namespace, queue, True, self.wakes.notice)
            lifted = due()  # again under the lock: another dispatcher may have lifted them
            _drop(self.s, u, c, lifted)
            return _settle(self.s, u, c, lifted), u.woken
        lifted, woken = self._do("expire pauses", queue, work)
        self._wake_if(queue, woken)
        return list(lifted)

    def _change(self, queue: str, group: str, write: Callable[[Unit, Connection], T],
                settle: Callable[[T], bool] = lambda _: True) -> T:
        """Run ``write`` with the queue's row locked, then, when ``settle`` says so of
        its answer, re-rank the group (a queue: wake the dispatchers)."""
        def work(c: Connection) -> tuple[T, bool]:
            u = Unit(c, self.s, self.namespace, queue, True, self.wakes.notice)
            answer = write(u, c)
            if settle(answer):
                _settle(self.s, u, c, [group])
            return answer, u.woken
        answer: T
        answer, woken = self._do("pause", queue, work)
        self._wake_if(queue, woken)
        return answer


def _drop(s: Statements, u: Unit, c: Connection, groups: list[str]) -> int:
    """Delete the pauses of ``groups``; how many there were. A lifted queue pause wakes."""
    p = s.t.pauses.c
    gone = c.execute(delete(s.t.pauses).where(p.ns == u.ns, p.queue == u.queue,
                                              p.grp.in_(groups))).rowcount
    if gone and WHOLE_QUEUE in groups:
        u.woken = True
    return int(gone)


def _settle(s: Statements, u: Unit, c: Connection, groups: list[str]) -> list[str]:
    """Count the queue's pauses into its row and re-rank ``groups`` (their eligibility
    changed though their counts did not); returns ``groups``."""
    p, q = s.t.pauses.c, s.t.queues.c
    count = int(c.execute(select(func.count()).where(p.ns == u.ns, p.queue == u.queue))
                .scalar_one())
    c.execute(update(s.t.queues).where(q.ns == u.ns, q.queue == u.queue).values(pauses=count))
    u.forget_pauses(count)
    for g in groups:
        if g != WHOLE_QUEUE:
            u.group(g)
            u.load_ready([(k, g) for k in ("i", "b")])
            if u.groups.get(g) is not None and u.refresh(g):
                u.woken = True
    u.flush()
    return groups
