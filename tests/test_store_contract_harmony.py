"""The store contract on every backend (``any_store``): the Harmony policy
(``fair_policy = "harmony"``). The group with the fewest tasks in flight per unit of
weight goes first, ties to the group served least recently, interactive first inside a
group; caps, the reserve, pauses and boosts keep working, on every backend."""

from __future__ import annotations

from collections import Counter

import pytest

from celery_fair.envelope import BACKGROUND, INTERACTIVE
from celery_fair.errors import InvalidLimit
from celery_fair.store.base import Picked, Policy, Store
from celery_fair.store.models import HARMONY, WFQ

from .store_helpers import (
    Q,
    group_of,
    hold,
    klass_of,
    pick,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def harmony(store: Store, cap: int | None = None, reserve: int = 0,
            weights: dict[str, float] | None = None) -> None:
    store.configure(Q, Policy(cap, reserve, 1.0, {}, weights or {}, name=HARMONY))


def backlog(store: Store, groups: dict[str, int], klass: str = BACKGROUND) -> None:
    for g, n in groups.items():
        for _ in range(n):
            hold(store, g, klass)


def release(store: Store, picked: Picked) -> None:
    assert store.release(Q, picked.dispatch_id)


def test_harmony_picks_the_group_with_fewest_in_flight(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 5, "b": 5})
    got = pick(store, 4)
    assert [group_of(p) for p in got] == ["a", "b", "a", "b"]
    for p in got:
        if group_of(p) == "b":
            release(store, p)
    # b has none in flight, a two: b goes until it has as many (wfq would give a, b)
    assert [group_of(p) for p in pick(store, 2)] == ["b", "b"]
    assert group_of(pick(store, 1)[0]) == "a"  # two each: a was served longer ago


def test_harmony_ties_go_to_the_group_served_least_recently(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 4, "b": 4, "c": 4})
    first = pick(store, 3)
    assert [group_of(p) for p in first] == ["a", "b", "c"]  # never served: by name
    release(store, first[0])
    assert group_of(pick(store, 1)[0]) == "a"  # the fewest in flight
    # one in flight each: the group served longest ago first, not the name
    assert [group_of(p) for p in pick(store, 3)] == ["b", "c", "a"]


def test_harmony_interactive_before_background_inside_a_group(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 2}, BACKGROUND)
    backlog(store, {"a": 2}, INTERACTIVE)
    backlog(store, {"b": 1}, BACKGROUND)
    got = pick(store, 5)
    assert [(group_of(p), klass_of(p)) for p in got] == [
        ("a", INTERACTIVE), ("b", BACKGROUND), ("a", INTERACTIVE), ("a", BACKGROUND),
        ("a", BACKGROUND)]


def test_harmony_counts_in_flight_per_unit_of_weight(store: Store) -> None:
    harmony(store, weights={"heavy": 3})
    backlog(store, {"heavy": 20, "light": 20})
    order = [group_of(p) for p in pick(store, 8)]
    # nothing released: heavy keeps three in flight for each one of light's
    assert Counter(order) == {"heavy": 6, "light": 2}, order


def test_harmony_keeps_caps_and_the_interactive_reserve(store: Store) -> None:
    harmony(store, cap=1, reserve=1)
    backlog(store, {"a": 3, "b": 3})
    backlog(store, {"a": 1}, INTERACTIVE)
    got = [(group_of(p), klass_of(p)) for p in pick(store, 10)]
    # one each under the cap; a's interactive task takes the reserve slot above it
    assert sorted(got) == [("a", INTERACTIVE), ("b", BACKGROUND)]
    assert pick(store, 10) == []


def test_harmony_skips_a_paused_group(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 2, "b": 2})
    store.pause(Q, "a", None)
    assert [group_of(p) for p in pick(store, 5)] == ["b", "b"]
    store.resume(Q, "a")
    assert [group_of(p) for p in pick(store, 5)] == ["a", "a"]


def test_harmony_boost_weight_and_task(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 6, "b": 6})
    pick(store, 2)  # one each in flight
    store.boost(Q, "b", 4.0, None)  # b's one in flight counts as a quarter: level 0
    assert [group_of(p) for p in pick(store, 3)] == ["b", "b", "b"]
    store.unboost(Q, "b")  # b: 4 in flight, a: 1
    assert [group_of(p) for p in pick(store, 2)] == ["a", "a"]
    # a task to the front: its group goes first once, whatever it has in flight
    tail = hold(store, "b")
    assert store.boost_task(Q, tail) == "b"
    assert [p.hold_id for p in pick(store, 1)] == [tail]
    assert group_of(pick(store, 1)[0]) == "a"  # once: a has 3 in flight, b 5


def test_configure_switches_the_policy_at_once(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 4, "b": 4})
    held = pick(store, 2)
    release(store, held[0])  # a: 0 in flight, b: 1
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, name=WFQ))
    # wfq: the groups entered at virtual time 0 and a was served once, b once: by tag
    order = [group_of(p) for p in pick(store, 4)]
    assert Counter(order) == {"a": 2, "b": 2}
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, name=HARMONY))
    assert Counter(group_of(p) for p in pick(store, 2)) == {"a": 1, "b": 1}


def test_an_unknown_policy_is_refused_and_nothing_written(store: Store) -> None:
    harmony(store)
    backlog(store, {"a": 2})
    before = store.snapshot(Q)
    with pytest.raises(InvalidLimit, match="policy must be one of 'wfq', 'harmony'"):
        store.configure(Q, Policy(None, 0, 1.0, {}, {}, name="lottery"))
    assert store.snapshot(Q) == before
