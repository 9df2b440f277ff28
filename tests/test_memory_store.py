"""What only the memory store does (the contract it keeps with every backend is
tests/test_store_contract_*.py's): a summary written with no time to live has lapsed at
once, it has no server settings to advise on, and its check compares each routing
target's count with its routed dispatches."""

from __future__ import annotations

from celery_fair.store.base import Placement
from celery_fair.testing import MemoryStore

Q = "fairq"


def test_a_summary_without_time_to_live_has_lapsed_at_once() -> None:
    store = MemoryStore()
    store.put_summary(Q, '{"queue": "q"}', ttl_seconds=60)
    store.put_summary("other", "{}", ttl_seconds=0)  # already lapsed
    assert store.summaries([Q, "other"]) == {Q: '{"queue": "q"}', "other": None}


def test_advice_is_empty() -> None:
    assert MemoryStore().advice() == []


def test_check_compares_each_target_s_count_with_its_routed_dispatches() -> None:
    """``wflight`` is kept by pick, release, reclaim and renewal; ``check`` (the model
    test's teardown) finds a count that drifted from the live routed records."""
    store = MemoryStore()
    store.hold(Q, "t1", b"v", Placement("g1", "b", 1.0, False), 0, 1_000)
    store.assign(Q, [("g1", "", "w1")])
    got = store.pick_routed(Q, 1, None, 1_000, 10_000, {"w1": 2}, None)
    assert got.workers == ["w1"] and store.check(Q, False, 1_000, 10_000) == []
    with store._queue(Q) as fq:
        fq.wflight["w1"] = 2  # drifted
    assert store.check(Q, False, 1_000, 10_000) == [
        ("wflight", "w1", "counted 2, live routed dispatches 1", "")]
    with store._queue(Q) as fq:
        fq.wflight["w1"] = 1
    store.release(Q, got.picked[0].dispatch_id)
    assert store.worker_inflight(Q) == {} and store.check(Q, False, 1_000, 10_000) == []
