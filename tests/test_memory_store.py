"""What only the memory store does (the contract it keeps with every backend is
tests/test_store_contract_*.py's): a summary written with no time to live has lapsed at
once, and it has no server settings to advise on."""

from __future__ import annotations

from celery_fair.testing import MemoryStore

Q = "fairq"


def test_a_summary_without_time_to_live_has_lapsed_at_once() -> None:
    store = MemoryStore()
    store.put_summary(Q, '{"queue": "q"}', ttl_seconds=60)
    store.put_summary("other", "{}", ttl_seconds=0)  # already lapsed
    assert store.summaries([Q, "other"]) == {Q: '{"queue": "q"}', "other": None}


def test_advice_is_empty() -> None:
    assert MemoryStore().advice() == []
