"""The store contract through examples of what the dispatcher, worker and CLI ask of a
store, run unchanged against every backend (``any_store``: memory, Redis, SQLite,
PostgreSQL, MariaDB): the lifecycle, the policy's decisions, bad holds refused, the
wake-ups, the worker registry, locate and the summaries. That the backends' decisions are
one policy step by step is test_store_model.py's claim; these are readable examples.
What only the memory store does is tests/test_memory_store.py's."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from celery_fair.config import SETTINGS
from celery_fair.envelope import Envelope
from celery_fair.errors import (
    CorruptMessage,
    InvalidCost,
    InvalidGroup,
    InvalidLimit,
    InvalidOption,
)
from celery_fair.store.base import BeginResult, Placement, Policy, Store
from celery_fair.store.memory import wall_ms

Q = "q"
NOW = 1_700_000_000_000
DEFAULTS = {s.name: s.default for s in SETTINGS}
LEASE_MS = int(DEFAULTS["fair_lease_seconds"] * 1000)
DONE_SECONDS = DEFAULTS["fair_done_ttl"]


def value(task_id: str, group: str, klass: str = "b", cost: float = 1.0,
          front: bool = False) -> bytes:
    envelope = Envelope(body=b"{}", content_type="application/json",
                        content_encoding="utf-8", headers={"id": task_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q)
    return envelope.encode(group, klass, cost, front)


def hold(store: Store, task_id: str, group: str, klass: str = "b",
         cost: float = 1.0, due_ms: int = 0) -> str:
    return store.hold(Q, task_id, value(task_id, group, klass, cost),
                      Placement(group, klass, cost, False), due_ms, NOW)


def picked_ids(store: Store, limit: int = 100, capacity: int | None = None,
               now_ms: int = NOW) -> list[str]:
    return [p.hold_id for p in store.pick(Q, limit, capacity, now_ms, LEASE_MS)]


@pytest.fixture
def store(any_store: Store) -> Store:
    any_store.configure(Q, Policy(None, DEFAULTS["fair_interactive_reserve"], 1.0, {}, {}))
    return any_store


def test_a_held_message_is_picked_begun_and_released_once(store: Store) -> None:
    hold(store, "t1", "acme")
    [p] = store.pick(Q, 10, None, NOW, LEASE_MS)
    assert (p.hold_id, p.value) == ("t1", value("t1", "acme"))
    assert store.confirm(Q, [p.dispatch_id], NOW + LEASE_MS) == []
    assert store.begin(Q, p.dispatch_id, NOW + LEASE_MS, now_ms=NOW) == BeginResult.RUN
    assert store.queue_figures(Q).inflight == 1
    assert store.release(Q, p.dispatch_id, DONE_SECONDS) is True
    assert store.release(Q, p.dispatch_id, DONE_SECONDS) is False  # idempotent
    assert store.queue_figures(Q).inflight == 0
    # the broker redelivers the finished task: its tombstone skips it
    assert store.begin(Q, p.dispatch_id, NOW + LEASE_MS, now_ms=NOW) == BeginResult.SKIP
    assert store.pick(Q, 10, None, NOW, LEASE_MS) == []


def test_a_group_at_its_cap_waits_while_others_are_picked(store: Store) -> None:
    store.configure(Q, Policy(1, 0, 1.0, {}, {}))
    for i in range(3):
        hold(store, f"a{i}", "big")
    hold(store, "s0", "small")
    assert picked_ids(store) == ["a0", "s0"]
    assert store.queue_figures(Q).held_background == 2


def test_the_queue_capacity_bounds_every_pick(store: Store) -> None:
    for i in range(5):
        hold(store, f"t{i}", f"g{i}")
    assert len(picked_ids(store, capacity=3)) == 3
    assert picked_ids(store, capacity=3) == []


def test_cap_zero_pauses_a_group_in_both_classes(store: Store) -> None:
    assert store.limit(Q, "acme", 0) == (0, 1.0)
    hold(store, "i1", "acme", klass="i")
    hold(store, "b1", "acme")
    assert picked_ids(store) == []  # the interactive reserve is no way past a pause
    assert store.limit(Q, "acme", "reset") == (None, 1.0)
    assert picked_ids(store) == ["i1", "b1"]


def test_a_limit_out_of_range_is_refused_before_anything_changes(
        store: Store) -> None:
    with pytest.raises(InvalidLimit, match="concurrency for group 'acme'"):
        store.limit(Q, "acme", 2_000_000)
    assert store.group_figures(Q, ["acme"])[0].limited == ()


def test_a_policy_out_of_range_is_refused_before_anything_changes(
        store: Store) -> None:
    store.configure(Q, Policy(None, 1, 1.0, {}, {"acme": 2.0}))
    with pytest.raises(InvalidLimit, match="weight for group 'acme'"):
        store.configure(Q, Policy(3, 1, 1.0, {}, {"acme": float("nan")}))
    [figures] = store.group_figures(Q, ["acme"])
    assert (figures.cap, figures.weight) == (None, 2.0)


def test_interactive_work_is_picked_before_background(store: Store) -> None:
    hold(store, "b1", "acme")
    hold(store, "b2", "other")
    hold(store, "i1", "other", klass="i")
    assert picked_ids(store, limit=1) == ["i1"]


def test_the_interactive_reserve_is_room_above_the_cap(store: Store) -> None:
    store.configure(Q, Policy(1, 1, 1.0, {}, {}))
    hold(store, "b1", "acme")
    hold(store, "b2", "acme")
    assert picked_ids(store) == ["b1"]  # at its cap of 1
    hold(store, "i1", "acme", klass="i")
    assert picked_ids(store) == ["i1"]  # the reserve of 1 above it; b2 still waits
    assert picked_ids(store) == []


def test_a_group_weighing_twice_as_much_is_picked_twice_as_often(
        store: Store) -> None:
    store.configure(Q, Policy(None, 0, 1.0, {}, {"heavy": 2.0}))
    for i in range(6):
        hold(store, f"h{i}", "heavy")
        hold(store, f"l{i}", "light")
    first = picked_ids(store, limit=6)
    assert sum(i.startswith("h") for i in first) == 4


def test_a_delayed_message_is_held_when_it_becomes_due(store: Store) -> None:
    hold(store, "later", "acme", due_ms=NOW + 5_000)
    assert picked_ids(store) == []
    assert store.promote(Q, NOW + 4_999, 100) == (0, NOW + 5_000)
    assert store.promote(Q, NOW + 5_000, 100) == (1, None)
    assert picked_ids(store, now_ms=NOW + 5_000) == ["later"]


def test_a_dispatch_whose_lease_runs_out_is_held_again_at_its_groups_head(
        store: Store) -> None:
    hold(store, "t1", "acme")
    hold(store, "t2", "acme")
    [p] = store.pick(Q, 1, None, NOW, LEASE_MS)  # the dispatcher dies before publishing
    assert store.reclaim(Q, NOW + LEASE_MS, 100) == (1, 0)
    assert store.dispatch_state(Q, p.dispatch_id) == "superseded"
    assert store.begin(Q, p.dispatch_id, NOW + 2 * LEASE_MS,
                       now_ms=NOW + LEASE_MS) == BeginResult.SKIP  # a stale copy
    assert picked_ids(store, now_ms=NOW + LEASE_MS) == ["t1", "t2"]


def test_a_cancel_resent_with_its_token_gets_the_same_answer(store: Store) -> None:
    hold(store, "t1", "acme")
    hold(store, "t1", "acme", cost=2.0)  # the same id held twice: a copy, t1~1
    first = store.cancel(Q, ["t1"], token="call-1")
    assert sorted(h for h, _ in first) == ["t1", "t1~1"]
    # its reply was lost: the same messages again (in no promised order)
    assert sorted(store.cancel(Q, ["t1"], token="call-1")) == sorted(first)
    assert store.cancel(Q, ["t1"], token="call-2") == []
    assert picked_ids(store) == []


@pytest.mark.parametrize("bad, error, says", [
    (Placement("acme", "x", 1.0, False), InvalidOption, "class 'x' is invalid"),
    (Placement("", "b", 1.0, False), InvalidGroup, "fair group is empty"),
    (Placement("acme", "b", float("inf"), False), InvalidCost, "cost must be a finite number"),
    (Placement("acme", "b", 1.0, "yes"), InvalidOption, "front 'yes' is invalid"),
    (("acme", "b", 1.0, False), InvalidOption, "expected a Placement"),
])
def test_a_bad_placement_is_refused_naming_the_hold_and_nothing_is_written(
        store: Store, bad: Any, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=f"hold t1: .*{re.escape(says)}"):
        store.hold(Q, "t1", value("t1", "acme"), bad, 0, NOW)
    assert store.queue_figures(Q).group_count == 0 and store.queues() == []


def test_a_value_that_is_not_bytes_is_refused_naming_the_hold(store: Store) -> None:
    with pytest.raises(CorruptMessage, match="hold t1: the stored value has type str"):
        store.hold(Q, "t1", "not bytes", Placement("acme", "b", 1.0, False), 0, NOW)
    assert store.queue_figures(Q).group_count == 0 and store.queues() == []


def test_wait_returns_the_queue_a_hold_wakes(store: Store) -> None:
    assert store.wait([Q], 0) == {Q}  # configure woke it
    woken: list[set[str]] = []
    waiting = threading.Thread(target=lambda: woken.append(store.wait([Q], 10)))
    waiting.start()
    hold(store, "t1", "acme")
    waiting.join(10)
    assert woken == [{Q}]
    assert store.wait([Q], 0) == set()  # taken


def test_summaries_show_each_class_head_and_when_it_became_due(store: Store) -> None:
    envelope = Envelope(body=b"{}", content_type="application/json",
                        content_encoding="utf-8", headers={"id": "t1", "task": "t"},
                        exchange="", routing_key=Q, queue=Q, due_at=1_700_000_000.5)
    store.hold(Q, "t1", envelope.encode("acme", "i", 1.0, False),
               Placement("acme", "i", 1.0, False), 0, NOW)
    hold(store, "t2", "acme", due_ms=NOW + 1_000)
    [figures] = store.summarize(Q, ["acme"])
    assert (figures.held_interactive, figures.held_background, figures.delayed) == (1, 0, 1)
    assert (figures.due_interactive, figures.due_background) == (1_700_000_000.5, None)


def test_only_live_workers_count_towards_capacity(store: Store) -> None:
    now = wall_ms()  # registering prunes by the caller's clock
    store.register_worker(Q, "w1", 4, now + 10_000, now)
    store.register_worker(Q, "w2", 2, now - 1, now)  # its registration expired
    assert store.worker_pools(Q, now) == {"w1": 4}
    assert store.worker_capacity(Q, now) == 4
    store.unregister_worker(Q, "w1")
    assert store.worker_capacity(Q, now) == 0


def test_locate_tells_where_a_held_delayed_or_dispatched_task_stands(
        store: Store) -> None:
    for i in range(3):
        hold(store, f"a{i}", "acme")
    hold(store, "g0", "globex")
    hold(store, "i0", "initech", klass="i")
    hold(store, "later", "acme", due_ms=NOW + 60_000)
    where = store.locate("a2")
    assert where is not None and where.place is not None
    assert (where.queue, where.group, where.klass, where.state) == \
        (Q, "acme", "background", "held")
    assert (where.place.position, where.place.group_held, where.place.ready) == (3, 3, True)
    # initech's interactive task first, then acme and globex in turn: i0 a0 g0 a1 a2
    assert where.place.dispatches_before == 4
    assert picked_ids(store).index("a2") == 4
    assert store.locate("later") == \
        type(where)("later", Q, "acme", "background", "delayed", due_ms=NOW + 60_000)
    dispatched = store.locate("g0")
    assert dispatched is not None and dispatched.state == "picked"
    assert dispatched.as_json()["dispatch_id"] == dispatched.dispatch_id
    assert store.locate("nobody") is None


def test_one_summary_writer_at_a_time_and_summaries_are_read_back(store: Store) -> None:
    assert store.claim_writer(Q, 60_000) is True
    assert store.claim_writer(Q, 60_000) is False  # another dispatcher's claim lasts
    store.put_summary(Q, '{"queue": "q"}', ttl_seconds=60)
    assert store.summaries([Q, "never"]) == {Q: '{"queue": "q"}', "never": None}


def test_flush_forgets_the_queues(store: Store) -> None:
    hold(store, "t1", "acme")
    store.flush()
    assert store.queues() == [] and store.locate("t1") is None
