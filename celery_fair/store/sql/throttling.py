"""Rate limits and throttles on SQL (:class:`~celery_fair.store.throttling.Throttling`):
a group's runtime rate on its ``limits`` row (``limit_rate``, over the setting's
``conf_rate`` over the queue's ``default_rate``), its throttle in ``throttles`` (counted
in the queue's row, so a queue without any never reads it) and its bucket in ``tats``.
Each change locks the queue's row (as pick does), so a pick sees it whole or not at all;
the pick's metering and promote's lifting are ``metering.py``'s."""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from ... import limits
from ...limits import Rate
from ...names import validate_group
from ..models import KEEP
from ..throttling import check_rate_arg, check_until
from .controls import drop_empty_limits
from .metering import rerate, rethrottle
from .mixin import SqlMixin
from .rows import upsert
from .unit import Unit


class SqlThrottling(SqlMixin):
    """A mixin of :class:`~celery_fair.store.sql.store.SqlStore` (it gives ``_do``, the
    statements and the wake-ups)."""

    def set_rate(self, queue: str, group: str, rate: Rate | str | None) -> Rate | None:
        group = validate_group(group)
        if rate == KEEP:
            return self._do("rate", queue, lambda c: Unit(  # type: ignore[no-any-return]
                c, self.s, self.namespace, queue).rate(group))
        checked = check_rate_arg(rate, group)  # a str: RESET
        stored = None if isinstance(checked, str) else limits.encode_rate(checked)

        def work(c: Connection) -> tuple[Rate | None, bool]:
            u = Unit(c, self.s, self.namespace, queue, True, self.wakes.notice)
            lt = self.s.t.limits.c
            before = u.rate(group)
            if stored is None:  # the setting, or the default, again
                c.execute(update(self.s.t.limits).where(
                    lt.ns == u.ns, lt.queue == queue, lt.grp == group).values(limit_rate=None))
                drop_empty_limits(c, self.s.t, u.ns, queue, lt.grp == group)
            else:
                upsert(c, self.s.t.limits, [{**u.key, "grp": group, "limit_rate": stored}],
                       ["limit_rate"])
            u.forget_limits(group)
            u.woken = rerate(u, group, before)  # a change of the rate in force (rate.lua)
            u.flush()
            return u.rate(group), u.woken
        now, woken = self._do("rate", queue, work)
        self._wake_if(queue, woken)
        return now  # type: ignore[no-any-return]

    def throttle(self, queue: str, group: str, until_ms: float) -> float:
        group = validate_group(group)
        until = check_until(until_ms)

        def work(c: Connection) -> float:
            u = Unit(c, self.s, self.namespace, queue, True, self.wakes.notice)
            th = self.s.t.throttles.c
            current = c.execute(select(th.until_ms).where(
                th.ns == u.ns, th.queue == queue, th.grp == group)).scalar()
            if current is not None and float(current) >= until:
                return float(current)  # a throttle never shortens another
            upsert(c, self.s.t.throttles, [{**u.key, "grp": group, "until_ms": until}],
                   ["until_ms"])
            if current is None:
                u.know_throttled([group], False)
                rethrottle(u, [group], True)
                u.flush()
            return until
        return self._do("throttle", queue, work)  # type: ignore[no-any-return]

    def throttles(self, queue: str) -> dict[str, float]:
        th = self.s.t.throttles.c
        rows = self._do("throttles", queue, lambda c: c.execute(
            select(th.grp, th.until_ms).where(th.ns == self.namespace,
                                              th.queue == queue)).all())
        return {g: float(until) for g, until in rows}

    def rates(self, queue: str) -> dict[str, Rate | None]:
        lt = self.s.t.limits.c
        rows = self._do("rates", queue, lambda c: c.execute(
            select(lt.grp, lt.limit_rate, lt.conf_rate).where(
                lt.ns == self.namespace, lt.queue == queue,
                lt.limit_rate.is_not(None) | lt.conf_rate.is_not(None))).all())
        return {g: limits.decode_rate(runtime if runtime is not None else setting)
                for g, runtime, setting in rows}
