"""The store contract on every backend (``any_store``; see tests/store_helpers.py): the
audit log of controls (``store/audit.py``): append, read newest first, since, bound."""

from __future__ import annotations

from unittest import mock

from celery_fair.store import audit
from celery_fair.store.audit import AuditEntry
from celery_fair.store.base import Store

from .store_helpers import (
    NOW,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def entry(n: int, **extra: object) -> AuditEntry:
    return AuditEntry(NOW + n, f"user{n}", "limit", {"group": f"g😀{n}", "cap": n},
                      **extra)  # type: ignore[arg-type]


def test_entries_read_back_whole_newest_first(store: Store) -> None:
    assert store.audit_read() == []
    first = entry(1, reason="incident 42", until_ms=NOW + 3_600_000)
    second = entry(2)
    store.audit_append(first)
    store.audit_append(second)
    assert store.audit_read() == [second, first]  # every field as written
    assert store.audit_read(limit=1) == [second]
    assert store.audit_read(limit=0) == []


def test_since_keeps_the_entries_made_at_or_after_it(store: Store) -> None:
    for n in range(4):
        store.audit_append(entry(n))
    assert [e.at_ms - NOW for e in store.audit_read(since_ms=NOW + 2)] == [3, 2]


def test_the_log_keeps_only_the_newest_entries(store: Store) -> None:
    """AUDIT_MAX (patched small here: every backend reads it at each append)."""
    with mock.patch.object(audit, "AUDIT_MAX", 3):
        for n in range(5):
            store.audit_append(entry(n))
    assert [e.at_ms - NOW for e in store.audit_read(limit=10)] == [4, 3, 2]
