"""Backpressure and the held listing in the store contract, on every backend
(``any_store``): a hold given a ``max_held`` is refused with GroupFull, atomically with
the hold, when its group already holds that many messages (both classes and its delayed
ones); nothing is written, other groups hold as before, and a resend of what is held is
never refused. ``held_messages`` lists a group's waiting messages in pick order."""

from __future__ import annotations

import pytest

from celery_fair.errors import GroupFull, InvalidLimit
from celery_fair.store.base import Placement, Store

from .test_store_contract_examples import NOW, Q, hold, picked_ids, value
from .test_store_contract_examples import store as store  # noqa: F401 (fixture)


def hold_max(store: Store, task_id: str, group: str, max_held: int | None,
             klass: str = "b", due_ms: int = 0) -> str:
    return store.hold(Q, task_id, value(task_id, group, klass),
                      Placement(group, klass, 1.0, False, max_held), due_ms, NOW)


def test_a_full_group_refuses_a_hold_naming_group_count_and_limit(store: Store) -> None:
    hold(store, "a1", "acme", klass="i")
    hold(store, "a2", "acme")
    hold(store, "a3", "acme", due_ms=NOW + 60_000)  # delayed ones count too
    with pytest.raises(GroupFull, match="group 'acme' is full in fair queue 'q': it holds "
                                        "3 tasks, its limit is 3") as raised:
        hold_max(store, "a4", "acme", 3, klass="i")
    assert (raised.value.group, raised.value.count, raised.value.limit) == ("acme", 3, 3)
    assert store.locate("a4") is None  # nothing written
    [acme] = store.summarize(Q, ["acme"])
    assert (acme.held_interactive, acme.held_background, acme.delayed) == (1, 1, 1)
    assert hold_max(store, "g1", "globex", 3) == "g1"  # other groups are not affected
    assert hold_max(store, "a4", "acme", 4) == "a4"  # room under a higher limit
    assert picked_ids(store) == ["a1", "a2", "g1", "a4"]


def test_a_resend_of_a_held_task_is_held_once_even_when_full(store: Store) -> None:
    assert hold_max(store, "a1", "acme", 1) == "a1"
    assert hold_max(store, "a1", "acme", 1) == "a1"  # the same publication again
    with pytest.raises(GroupFull):
        hold_max(store, "a2", "acme", 1)
    assert picked_ids(store) == ["a1"]


def test_dispatched_tasks_do_not_count_as_held(store: Store) -> None:
    hold_max(store, "a1", "acme", 1)
    assert picked_ids(store) == ["a1"]  # in flight now, no longer held
    assert hold_max(store, "a2", "acme", 1) == "a2"


def test_a_max_held_out_of_range_is_refused_before_anything_is_written(
        store: Store) -> None:
    with pytest.raises(InvalidLimit, match="hold a1: max held must be None .* got 0"):
        hold_max(store, "a1", "acme", 0)
    assert store.queues() == []


def test_held_messages_lists_a_groups_waiting_messages_in_pick_order(store: Store) -> None:
    hold(store, "b1", "acme")
    hold(store, "b2", "acme")
    hold(store, "i1", "acme", klass="i")
    hold(store, "later", "acme", due_ms=NOW + 60_000)  # delayed: not listed
    hold(store, "g1", "globex")
    hold(store, "b1", "acme", cost=2.0)  # a copy, b1~1, at acme's tail
    listed = store.held_messages(Q, "acme", 10)
    assert [(m.hold_id, m.klass) for m in listed] == \
        [("i1", "i"), ("b1", "b"), ("b2", "b"), ("b1~1", "b")]
    assert listed[1].value == value("b1", "acme")
    assert [m.hold_id for m in store.held_messages(Q, "acme", 2)] == ["i1", "b1"]
    assert [m.hold_id for m in store.held_messages(Q, "acme", 10, "b")] == \
        ["b1", "b2", "b1~1"]
    assert picked_ids(store, limit=1) == ["i1"]  # dispatched: no longer listed
    assert [m.hold_id for m in store.held_messages(Q, "acme", 10, "i")] == []
    assert store.held_messages(Q, "nobody", 10) == []
    assert store.held_messages("never", "acme", 10) == []
