"""The store contract on every backend (``any_store``): soft caps (``fair_cap_mode =
"soft"``). A group at its cap may go on only while no other group has work it may run:
a lone capped group exceeds its cap, a newcomer with work is picked before the over-cap
group gets another slot, a cap of 0 still pauses, the interactive reserve still comes
first. Hard caps (the default) change nothing."""

from __future__ import annotations

import pytest

from celery_fair.envelope import BACKGROUND, INTERACTIVE
from celery_fair.errors import InvalidLimit
from celery_fair.store.base import Policy, Store
from celery_fair.store.models import HARD, SOFT, WFQ

from .store_helpers import (
    Q,
    each_policy,
    group_of,
    hold,
    klass_of,
    pick,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def capped(store: Store, cap: int = 2, mode: str = SOFT, reserve: int = 0,
           caps: dict[str, int] | None = None, policy: str = WFQ) -> None:
    store.configure(Q, Policy(cap, reserve, 1.0, caps or {}, {}, name=policy,
                              cap_mode=mode))


def backlog(store: Store, group: str, n: int, klass: str = BACKGROUND) -> None:
    for _ in range(n):
        hold(store, group, klass)


def inflight(store: Store) -> dict[str, int]:
    return {row["group"]: row["inflight"] for row in store.snapshot(Q)["groups"]}


@each_policy
def test_a_lone_capped_group_exceeds_its_cap(store: Store, policy: str) -> None:
    capped(store, cap=2, policy=policy)
    backlog(store, "a", 6)
    assert [group_of(p) for p in pick(store, 10, capacity=4)] == ["a"] * 4
    assert inflight(store)["a"] == 4


@each_policy
def test_a_newcomer_goes_before_the_over_cap_group(store: Store, policy: str) -> None:
    capped(store, cap=2, policy=policy)
    backlog(store, "a", 10)
    first = pick(store, 4, capacity=4)
    assert [group_of(p) for p in first] == ["a"] * 4
    backlog(store, "b", 3)
    assert pick(store, 1, capacity=4) == []  # no free slot: nothing is preempted
    assert store.release(Q, first[0].dispatch_id)
    # the free slot goes to the newcomer, not to a (still over its cap)
    assert [group_of(p) for p in pick(store, 1, capacity=4)] == ["b"]
    assert store.release(Q, first[1].dispatch_id)
    assert [group_of(p) for p in pick(store, 1, capacity=4)] == ["b"]
    # both at their caps now: a slot of a frees, a is under its cap again and gets it
    assert store.release(Q, first[2].dispatch_id)
    assert [group_of(p) for p in pick(store, 1, capacity=4)] == ["a"]
    assert inflight(store) == {"a": 2, "b": 2}
    # a slot of a fifth: both at their caps, both over: the policy shares it out
    got = pick(store, 2, capacity=6)
    assert sorted(group_of(p) for p in got) == ["a", "b"]


def test_an_uncapped_or_under_cap_group_goes_before_an_over_cap_one(store: Store) -> None:
    capped(store, cap=1, caps={"free": 10})
    backlog(store, "a", 4)
    assert [group_of(p) for p in pick(store, 2)] == ["a", "a"]  # alone: over its cap
    backlog(store, "free", 3)
    backlog(store, "c", 1)
    # every group the normal way first (c under its cap, free without one), then a
    assert [group_of(p) for p in pick(store, 5)] == ["c", "free", "free", "free", "a"]


def test_a_cap_of_zero_still_pauses_under_soft_caps(store: Store) -> None:
    capped(store, cap=2, caps={"a": 0})
    backlog(store, "a", 3)
    backlog(store, "a", 1, INTERACTIVE)
    assert pick(store, 5) == []
    assert store.limit(Q, "a", cap=1)[0] == 1  # lifted: over its cap of 1, alone
    assert [group_of(p) for p in pick(store, 5)] == ["a"] * 4


def test_paused_groups_stay_out_under_soft_caps(store: Store) -> None:
    capped(store, cap=1)
    backlog(store, "a", 3)
    store.pause(Q, "a", None)
    assert pick(store, 3) == []
    assert store.resume(Q, "a")
    assert len(pick(store, 3)) == 3


def test_the_interactive_reserve_comes_before_the_over_sets(store: Store) -> None:
    capped(store, cap=1, reserve=1)
    backlog(store, "a", 3)
    backlog(store, "b", 3)
    assert [group_of(p) for p in pick(store, 2)] == ["a", "b"]  # both at their caps
    backlog(store, "a", 1, INTERACTIVE)
    got = pick(store, 1)  # a's interactive task in its reserve, the normal way
    assert (group_of(got[0]), klass_of(got[0])) == ("a", INTERACTIVE)
    # then only groups over their caps, in tag order (a's interactive tag is apart)
    assert [group_of(p) for p in pick(store, 3)] == ["a", "b", "a"]


def test_configure_back_to_hard_caps_stops_the_overflow(store: Store) -> None:
    capped(store, cap=1)
    backlog(store, "a", 5)
    assert len(pick(store, 2)) == 2
    capped(store, cap=1, mode=HARD)
    assert pick(store, 3) == []
    capped(store, cap=1, mode=SOFT)
    assert len(pick(store, 1)) == 1


def test_hard_caps_change_nothing(store: Store) -> None:
    """Every backend: the default (hard) holds a capped group at its cap, alone or not."""
    capped(store, cap=2, mode=HARD)
    backlog(store, "a", 5)
    assert [group_of(p) for p in pick(store, 10, capacity=4)] == ["a", "a"]
    backlog(store, "b", 5)
    assert [group_of(p) for p in pick(store, 10, capacity=4)] == ["b", "b"]
    assert inflight(store) == {"a": 2, "b": 2}



def test_an_unknown_cap_mode_is_refused(store: Store) -> None:
    capped(store, cap=1)
    before = store.snapshot(Q)
    with pytest.raises(InvalidLimit, match="cap mode must be one of 'hard', 'soft'"):
        capped(store, cap=1, mode="squishy")
    assert store.snapshot(Q) == before
