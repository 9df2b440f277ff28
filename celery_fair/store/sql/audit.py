"""The audit log on SQL (:class:`~celery_fair.store.audit.Audit`): the ``audit`` table,
trimmed to AUDIT_MAX entries per namespace on each append."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, insert, select

from .. import audit
from ..audit import AuditEntry
from .schema import Tables

T = TypeVar("T")


class SqlAudit:
    """A mixin of :class:`~celery_fair.store.sql.store.SqlStore` (it gives the tables and
    ``_read``, one transaction with retries)."""

    t: Tables
    namespace: str
    _read: Callable[..., Any]

    def audit_append(self, entry: AuditEntry) -> None:
        t = self.t.audit

        def work(c: Connection) -> None:
            c.execute(insert(t).values(ns=self.namespace, at_ms=entry.at_ms,
                                       doc=entry.dumps()))
            # the newest entry past the bound (two statements: MySQL cannot delete from
            # a table its own subquery reads)
            oldest_kept = c.execute(select(t.c.seq).where(t.c.ns == self.namespace)
                                    .order_by(t.c.seq.desc()).offset(audit.AUDIT_MAX - 1)
                                    .limit(1)).scalar()
            if oldest_kept is not None:
                c.execute(delete(t).where(t.c.ns == self.namespace, t.c.seq < oldest_kept))
        self._read("audit append", work)

    def audit_read(self, limit: int = 100, since_ms: int | None = None) -> list[AuditEntry]:
        if limit <= 0:
            return []
        t = self.t.audit
        query = select(t.c.doc).where(t.c.ns == self.namespace)
        if since_ms is not None:
            query = query.where(t.c.at_ms >= since_ms)
        docs = self._read("audit read", lambda c: list(
            c.execute(query.order_by(t.c.seq.desc()).limit(limit)).scalars()))
        return [AuditEntry.loads(doc) for doc in docs]
