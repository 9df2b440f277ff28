"""Head times through the store contract, on every backend (``any_store``): each change
of a group's head stamps when the new head became the head, per class (a hold into an
empty list or to the front, a pick, a cancel of the head, a delayed task promoted to the
head, a reclaim, a boost to the front), and nothing else does; ``summarize`` reports
them and ``head_wait`` counts from them (or from the due time, when later); Redis data
written before head times passes ``fair check``."""

from __future__ import annotations

import pytest
import redis

from celery_fair.check import check
from celery_fair.envelope import Envelope
from celery_fair.store.base import GroupHeads, Placement, Policy, Store
from celery_fair.store.heads import head_wait, waiting_since
from celery_fair.store.redis import RedisStore

Q = "q"
T0 = 1_700_000_000_000


def hold(store: Store, task_id: str, now_ms: int, group: str = "acme", klass: str = "b",
         front: bool = False, due_ms: int = 0) -> str:
    envelope = Envelope(body=b"{}", content_type="application/json",
                        content_encoding="utf-8", headers={"id": task_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q, due_at=now_ms / 1000)
    return store.hold(Q, task_id, envelope.encode(group, klass, 1.0, front),
                      Placement(group, klass, 1.0, front), due_ms, now_ms)


def since(store: Store, group: str = "acme") -> tuple[float | None, float | None]:
    [heads] = store.summarize(Q, [group])
    return heads.since_interactive, heads.since_background


@pytest.fixture
def store(any_store: Store) -> Store:
    any_store.configure(Q, Policy(None, 0, 1.0, {}, {}))
    return any_store


def test_holds_stamp_a_new_head_only(store: Store) -> None:
    hold(store, "a", T0)  # into an empty list: the head since now
    hold(store, "b", T0 + 1000)  # behind it: the head is unchanged
    assert since(store) == (None, T0 / 1000)
    hold(store, "c", T0 + 2000, front=True)  # a retry to the front: a new head
    hold(store, "i", T0 + 3000, klass="i")  # the other class has a head of its own
    assert since(store) == ((T0 + 3000) / 1000, (T0 + 2000) / 1000)


def test_a_pick_stamps_the_next_head_when_it_is_taken(store: Store) -> None:
    for i in range(3):
        hold(store, f"t{i}", T0)
    assert [p.hold_id for p in store.pick(Q, 1, None, T0 + 5000, 60_000)] == ["t0"]
    assert since(store) == (None, (T0 + 5000) / 1000)


def test_cancelling_the_head_stamps_the_next_one_and_another_does_not(
        store: Store) -> None:
    for i in range(3):
        hold(store, f"t{i}", T0)
    store.cancel(Q, ["t1"], now_ms=T0 + 1000)  # not the head
    assert since(store) == (None, T0 / 1000)
    store.cancel(Q, ["t0"], now_ms=T0 + 2000)
    assert since(store) == (None, (T0 + 2000) / 1000)


def test_a_boost_to_the_front_stamps_a_new_head_only(store: Store) -> None:
    for i in range(3):
        hold(store, f"t{i}", T0)
    assert store.boost_task(Q, "t0", now_ms=T0 + 1000) == "acme"  # the head already
    assert since(store) == (None, T0 / 1000)
    assert store.boost_task(Q, "t2", now_ms=T0 + 2000) == "acme"
    assert since(store) == (None, (T0 + 2000) / 1000)


def test_a_delayed_task_promoted_into_an_empty_list_is_the_head_since_then(
        store: Store) -> None:
    hold(store, "later", T0, due_ms=T0 + 10_000)
    store.promote(Q, T0 + 12_000, 100)
    assert since(store) == (None, (T0 + 12_000) / 1000)
    hold(store, "later2", T0, due_ms=T0 + 20_000)  # behind a head: unchanged
    store.promote(Q, T0 + 21_000, 100)
    assert since(store) == (None, (T0 + 12_000) / 1000)


def test_a_reclaimed_task_is_the_head_since_its_reclaim(store: Store) -> None:
    hold(store, "t0", T0)
    hold(store, "t1", T0)
    store.pick(Q, 1, None, T0 + 1000, 5_000)  # its dispatcher dies before publishing
    assert store.reclaim(Q, T0 + 7000, 100) == (1, 0)
    assert since(store) == (None, (T0 + 7000) / 1000)


def test_the_wait_counts_from_the_later_of_head_time_and_due_time() -> None:
    steady = GroupHeads("g", 0, 500, 1, 0, None, 1000.0, None, 1990.0)
    assert head_wait(steady, 2000.0) == 10.0  # a long backlog served steadily
    not_due = GroupHeads("g", 0, 1, 0, 0, None, 1995.0, None, 1990.0)
    assert head_wait(not_due, 2000.0) == 5.0  # not waiting before it was due
    old = GroupHeads("g", 1, 0, 0, 0, 1000.0, None)  # stamped before head times
    assert head_wait(old, 2000.0) == 1000.0
    both = GroupHeads("g", 1, 1, 0, 0, 1500.0, 1000.0, 1900.0, 1800.0)
    assert waiting_since(both) == 1800.0  # the class whose head waited longest
    stale = GroupHeads("g", 0, 0, 1, 0, None, None, None, None)
    assert head_wait(stale, 2000.0) is None


def test_check_accepts_heads_held_before_head_times_and_the_wait_falls_back(
        redis_client: redis.Redis, namespace: str) -> None:
    """Redis data an older version wrote has no head times: ``fair check`` finds nothing
    to report, and the head's wait counts from its due time."""
    store = RedisStore(redis_client, namespace)
    hold(store, "t0", T0)
    hold(store, "t1", T0)
    redis_client.hdel(store.keys(Q).group("acme"), "hb")  # as an older version left it
    assert check(store, queues=[Q]).ok
    [heads] = store.summarize(Q, ["acme"])
    assert (heads.due_background, heads.since_background) == (T0 / 1000, None)
    assert head_wait(heads, T0 / 1000 + 5) == 5.0
