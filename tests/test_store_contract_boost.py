"""The store contract on every backend (``any_store``; see tests/store_helpers.py):
boosts (``store/boosting.py``): a boosted group is picked with the boost weight until
the boost ends (unboost or expiry); the weight in force then is the configured one,
including a runtime limit set meanwhile (the boost is kept apart, nothing restored)."""

from __future__ import annotations

import pytest

from celery_fair.errors import InvalidGroup, InvalidLimit
from celery_fair.store.base import Store

from .store_helpers import (
    NOW,
    Q,
    hold,
    pick,
    pick_groups,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def backlog(store: Store, per_group: int = 8) -> None:
    for _ in range(per_group):
        hold(store, "acme")
        hold(store, "globex")


def test_a_boosted_group_is_picked_with_the_boost_weight(store: Store) -> None:
    backlog(store)
    store.boost(Q, "acme", 3, None)
    assert store.boosts(Q) == {"acme": (3.0, None)}
    order = pick_groups(store, 8)
    assert order.count("acme") == 6, order  # 3:1 with equal weights otherwise
    assert store.unboost(Q, "acme") is True
    assert store.unboost(Q, "acme") is False  # a resend changes nothing
    assert store.boosts(Q) == {}


def test_a_boost_expires_and_the_configured_weight_is_back(store: Store) -> None:
    backlog(store, 12)
    assert store.limit(Q, "globex", weight=2) == (None, 2.0)
    store.boost(Q, "globex", 0.5, NOW + 1_000)  # a boost may lower a weight too
    store.boost(Q, "acme", 5, NOW + 5_000)
    assert store.boosts(Q) == {"globex": (0.5, NOW + 1_000), "acme": (5.0, NOW + 5_000)}
    assert store.expire_boosts(Q, NOW + 999) == []
    assert store.expire_boosts(Q, NOW + 1_000) == ["globex"]
    assert store.expire_boosts(Q, NOW + 1_000) == []  # once
    assert store.unboost(Q, "acme") is True
    # both back to their configured weights: globex's runtime 2 (set before the boost)
    order = pick_groups(store, 9)
    assert order.count("globex") == 6, order
    assert store.limit(Q, "globex", weight="reset") == (None, 1.0)


def test_a_boost_again_replaces_the_last(store: Store) -> None:
    store.boost(Q, "acme", 3, NOW + 1_000)
    store.boost(Q, "acme", 4, None)
    assert store.boosts(Q) == {"acme": (4.0, None)}
    assert store.expire_boosts(Q, NOW + 10_000) == []


def test_a_bad_boost_is_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(InvalidGroup):
        store.boost(Q, "bad\x00group", 2, None)
    for weight in (0, -1, float("nan"), float("inf"), 1e9):
        with pytest.raises(InvalidLimit):
            store.boost(Q, "acme", weight, None)
    assert store.boosts(Q) == {}


def test_a_boosted_task_goes_to_the_front_of_its_group_and_its_group_first(
        store: Store) -> None:
    for _ in range(3):
        hold(store, "acme")
    hold(store, "globex")
    second = hold(store, "globex")
    last = hold(store, "globex")
    assert pick_groups(store, 2) == ["acme", "globex"]  # acme is next (a tie, by name)
    assert store.boost_task(Q, last) == "globex"
    picked = pick(store)
    assert [p.hold_id for p in picked] == [last]  # first in its group, its group first
    assert pick_groups(store, 1) == ["acme"]  # once: the order goes on as before
    assert [p.hold_id for p in pick(store)] == [second]


def test_a_boosted_task_of_the_group_in_front_goes_first_in_it(store: Store) -> None:
    hold(store, "acme")
    late = hold(store, "acme")
    hold(store, "globex")
    assert store.boost_task(Q, late) == "acme"
    assert [p.hold_id for p in pick(store)] == [late]


def test_boosting_a_task_not_held_changes_nothing(store: Store) -> None:
    held_id = hold(store, "acme")
    later = hold(store, "acme", due=NOW + 60_000)  # delayed: not held yet
    assert store.boost_task(Q, later) is None
    assert store.boost_task(Q, "no-such-task") is None
    taken = pick(store)
    assert [p.hold_id for p in taken] == [held_id]
    assert store.boost_task(Q, held_id) is None  # dispatched
