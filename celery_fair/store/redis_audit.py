"""The audit log on Redis (:class:`~celery_fair.store.audit.Audit`): one list per
namespace, newest first, trimmed to AUDIT_MAX on each append."""

from __future__ import annotations

from typing import Any

from . import audit
from .audit import AuditEntry
from .connection import _wrapped
from .keys import audit_key


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
