"""Holding many messages in one call (``hold_many``), on every backend (``any_store``): the
batch is held as the same holds one by one would be, or, when one of them is refused,
not at all; a batch sent again holds each message once."""

from __future__ import annotations

import pytest

from celery_fair.errors import GroupFull, InvalidGroup
from celery_fair.store.base import Placement, Store
from celery_fair.store.bulk import Hold

from .test_store_contract_examples import NOW, Q, hold, picked_ids, value
from .test_store_contract_examples import store as store  # noqa: F401 (fixture)


def held(task_id: str, group: str, klass: str = "b", due_ms: int = 0,
         max_held: int | None = None) -> Hold:
    return Hold(task_id, value(task_id, group, klass),
                Placement(group, klass, 1.0, False, max_held), due_ms)


def counts(store: Store, *groups: str) -> list[tuple[int, int, int]]:
    return [(g.held_interactive, g.held_background, g.delayed)
            for g in store.summarize(Q, list(groups))]


def test_a_batch_is_held_as_its_holds_one_by_one_would_be(store: Store) -> None:
    batch = [held("a1", "acme"), held("a2", "acme"), held("g1", "globex", klass="i"),
             held("a3", "acme", due_ms=NOW + 60_000), held("g2", "globex")]
    assert store.hold_many(Q, batch, NOW) == ["a1", "a2", "g1", "a3", "g2"]
    assert store.queues() == [Q]
    assert counts(store, "acme", "globex") == [(0, 2, 1), (1, 1, 0)]
    assert picked_ids(store) == ["g1", "a1", "g2", "a2"]  # interactive first, then fair
    assert store.hold_many(Q, [], NOW) == []


def test_an_id_held_already_with_another_value_is_kept_as_a_copy(store: Store) -> None:
    hold(store, "a1", "acme")
    copy = Hold("a1", value("a1", "acme", "i"), Placement("acme", "i", 1.0, False))
    assert store.hold_many(Q, [copy], NOW) == ["a1~1"]
    assert sorted(picked_ids(store)) == ["a1", "a1~1"]


def test_a_batch_sent_again_holds_each_message_once(store: Store) -> None:
    # The retry after a lost reply (HoldOutcomeUnknown): the same ids with the same values.
    batch = [held("a1", "acme"), held("a2", "acme"), held("a1", "acme")]
    assert store.hold_many(Q, batch, NOW) == ["a1", "a2", "a1"]
    assert store.hold_many(Q, batch, NOW) == ["a1", "a2", "a1"]
    assert counts(store, "acme") == [(0, 2, 0)]
    assert picked_ids(store, limit=1) == ["a1"]
    # Once dispatched, a message is no longer held: sent again, it is held again, unless
    # the store remembers what it held under the id (then it runs once).
    assert store.hold_many(Q, batch, NOW) == ["a1", "a2", "a1"]
    assert picked_ids(store) == (["a2"] if store.remembers_sent else ["a2", "a1"])


def test_a_bad_message_refuses_the_batch_naming_it_and_nothing_is_written(
        store: Store) -> None:
    batch = [held("a1", "acme"), held("a2", "acme")]
    batch.append(Hold("x", value("x", "acme"), Placement("", "b", 1.0, False)))
    with pytest.raises(InvalidGroup, match="message 2 of the batch: hold x: "):
        store.hold_many(Q, batch, NOW)
    with pytest.raises(TypeError, match="message 0 of the batch is a tuple"):
        store.hold_many(Q, [("a1", b"", None, 0)], NOW)  # type: ignore[list-item]
    assert store.queues() == []


def test_a_group_without_room_for_the_batch_refuses_all_of_it(store: Store) -> None:
    hold(store, "a0", "acme")
    batch = [held("g1", "globex", max_held=2), held("a1", "acme", max_held=3),
             held("a2", "acme", max_held=3), held("a3", "acme", max_held=3)]
    with pytest.raises(GroupFull, match="group 'acme' is full in fair queue 'q': it holds "
                                        "3 tasks, its limit is 3") as raised:
        store.hold_many(Q, batch, NOW)
    assert (raised.value.group, raised.value.count, raised.value.limit) == ("acme", 3, 3)
    assert counts(store, "acme", "globex") == [(0, 1, 0), (0, 0, 0)]  # none of it
    assert store.hold_many(Q, batch[:3], NOW) == ["g1", "a1", "a2"]  # room for these
    assert counts(store, "acme", "globex") == [(0, 3, 0), (0, 1, 0)]


def test_resends_in_a_batch_are_not_counted_against_its_groups_room(store: Store) -> None:
    first = [held("a1", "acme", max_held=2), held("a2", "acme", max_held=2)]
    assert store.hold_many(Q, first, NOW) == ["a1", "a2"]
    assert store.hold_many(Q, first, NOW) == ["a1", "a2"]  # full, but only resends
    with pytest.raises(GroupFull):
        store.hold_many(Q, [*first, held("a3", "acme", max_held=2)], NOW)
    assert counts(store, "acme") == [(0, 2, 0)]


def test_a_retry_in_a_batch_enters_at_the_head_of_its_group(store: Store) -> None:
    hold(store, "a1", "acme")
    retry = Hold("r1", value("r1", "acme", front=True), Placement("acme", "b", 1.0, True))
    assert store.hold_many(Q, [held("a2", "acme"), retry], NOW) == ["a2", "r1"]
    assert picked_ids(store) == ["r1", "a1", "a2"]
