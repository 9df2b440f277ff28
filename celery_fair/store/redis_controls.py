"""Operator controls on Redis: the audit log (:class:`~celery_fair.store.audit.Audit`),
one list per namespace, newest first, trimmed to AUDIT_MAX on each append; pauses
(:class:`~celery_fair.store.pausing.Pausing`), ``pause.lua``; boosts
(:class:`~celery_fair.store.boosting.Boosting`), ``boost.lua``; and rate limits and
throttles (:class:`~celery_fair.store.throttling.Throttling`), ``rate.lua``."""

from __future__ import annotations

import math
from typing import Any

from .. import limits
from ..names import validate_group
from . import audit
from .audit import AuditEntry
from .connection import _text, _wrapped
from .keys import QueueKeys, audit_key
from .models import now_ms as _now
from .pausing import WHOLE_QUEUE
from .throttling import check_rate_arg, check_until


class RedisAudit:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives the client)."""

    client: Any
    namespace: str
    where: str

    def audit_append(self, entry: AuditEntry) -> None:
        """LPUSH and LTRIM in one MULTI: the list never passes AUDIT_MAX."""
        key = audit_key(self.namespace)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=True)
            pipe.lpush(key, entry.dumps())
            pipe.ltrim(key, 0, audit.AUDIT_MAX - 1)
            pipe.execute()

    def audit_read(self, limit: int = 100, since_ms: int | None = None) -> list[AuditEntry]:
        if limit <= 0:
            return []
        with _wrapped(self.where):
            docs = self.client.lrange(audit_key(self.namespace), 0, limit - 1)
        entries = [AuditEntry.loads(doc) for doc in docs]
        return [e for e in entries if since_ms is None or e.at_ms >= since_ms]


class RedisPausing:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives ``_run``)."""

    client: Any
    where: str
    keys: Any
    _run: Any

    def pause(self, queue: str, group: str, until_ms: int | None) -> None:
        if group != WHOLE_QUEUE:
            group = validate_group(group)
        self._run("pause", queue, "pause", group, "inf" if until_ms is None else until_ms)

    def resume(self, queue: str, group: str) -> bool:
        return bool(self._run("pause", queue, "resume", group))

    def pauses(self, queue: str) -> dict[str, int | None]:
        keys: QueueKeys = self.keys(queue)
        with _wrapped(self.where):
            found = self.client.zrange(keys.pauses, 0, -1, withscores=True)
        return {_text(g): None if math.isinf(until) else int(until) for g, until in found}

    def expire_pauses(self, queue: str, now_ms: int) -> list[str]:
        return [_text(g) for g in self._run("pause", queue, "expire", now_ms)]


class RedisBoosting:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives ``_run``)."""

    client: Any
    where: str
    keys: Any
    _run: Any

    def boost(self, queue: str, group: str, weight: float, until_ms: int | None) -> None:
        group = validate_group(group)
        weight = limits.weight(weight, f"boost weight for group {group!r}")
        self._run("boost", queue, "boost", group, repr(weight),
                  "inf" if until_ms is None else until_ms)

    def unboost(self, queue: str, group: str) -> bool:
        return bool(self._run("boost", queue, "unboost", group))

    def boosts(self, queue: str) -> dict[str, tuple[float, int | None]]:
        keys: QueueKeys = self.keys(queue)
        with _wrapped(self.where):
            pipe = self.client.pipeline(transaction=True)
            pipe.hgetall(keys.boosts)
            pipe.zrange(keys.boosts_until, 0, -1, withscores=True)
            weights, until = pipe.execute()
        ends = {_text(g): None if math.isinf(u) else int(u) for g, u in until}
        return {_text(g): (float(w), ends.get(_text(g))) for g, w in weights.items()}

    def boost_task(self, queue: str, hold_id: str, *, now_ms: int | None = None) -> str | None:
        group = self._run("boost_task", queue, hold_id, _now() if now_ms is None else now_ms)
        return _text(group) if group else None

    def expire_boosts(self, queue: str, now_ms: int) -> list[str]:
        return [_text(g) for g in self._run("boost", queue, "expire", now_ms)]


class RedisThrottling:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives ``_run``)."""

    client: Any
    where: str
    keys: Any
    _run: Any

    def set_rate(self, queue: str, group: str, rate: limits.Rate | str | None
                 ) -> limits.Rate | None:
        group = validate_group(group)
        rate = check_rate_arg(rate, group)
        if not isinstance(rate, str):  # else KEEP or RESET
            rate = limits.encode_rate(rate)
        return limits.decode_rate(self._run("rate", queue, "set", group, rate))

    def throttle(self, queue: str, group: str, until_ms: float) -> float:
        group = validate_group(group)
        until = check_until(until_ms)
        return float(self._run("rate", queue, "throttle", group, repr(until)))

    def throttles(self, queue: str) -> dict[str, float]:
        keys: QueueKeys = self.keys(queue)
        with _wrapped(self.where):
            found = self.client.zrange(keys.throttled, 0, -1, withscores=True)
        return {_text(g): float(until) for g, until in found}

    def rates(self, queue: str) -> dict[str, limits.Rate | None]:
        keys: QueueKeys = self.keys(queue)
        with _wrapped(self.where):
            found = self.client.hgetall(keys.rates)
        return {_text(g): limits.decode_rate(r) for g, r in found.items()}
