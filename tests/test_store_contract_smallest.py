"""The store contract for ``fair_policy = "smallest"`` with ``fair_aging_seconds``: groups
go as under wfq; inside a group (and class) the held task with the lowest sort key goes
first, the key being when it became held plus its cost times the aging (a task of cost c
ranks as if it had come c × aging seconds later). Front holds (retries, reclaims,
``boost --task``) still go first, cancel, position and a switch of policy keep the lists
right, on every backend."""

from __future__ import annotations

import pytest

from celery_fair.envelope import BACKGROUND
from celery_fair.store.base import Placement, Policy, Store
from celery_fair.store.models import SMALLEST, WFQ

from .store_helpers import NOW, Q, group_of, pick, value


@pytest.fixture(name="store")
def store_fixture(any_store: Store) -> Store:
    return any_store


def smallest(store: Store, aging: float = 1.0, name: str = SMALLEST, charge: str = "cost",
             cap: int | None = None) -> None:
    store.configure(Q, Policy(cap, 0, 1.0, {}, {}, name=name, charge=charge,
                              aging_seconds=aging))


def hold(store: Store, hold_id: str, cost: float, at: int = NOW, group: str = "a",
         front: bool = False, due: int = 0) -> str:
    data = value(group, BACKGROUND, cost, front, body=hold_id.encode(), task_id=hold_id)
    return store.hold(Q, hold_id, data, Placement(group, BACKGROUND, cost, front), due, at)


def picked_ids(store: Store, n: int, now: int = NOW) -> list[str]:
    return [p.hold_id for p in pick(store, n, now=now)]


def listed(store: Store, group: str = "a") -> list[str]:
    return [m.hold_id for m in store.held_messages(Q, group, 1000)]


def test_the_smallest_declared_cost_goes_first_inside_a_group(store: Store) -> None:
    smallest(store)
    for hid, cost in (("c5", 5), ("c1", 1), ("c3", 3), ("c2", 2)):
        hold(store, hid, cost)
    assert listed(store) == ["c1", "c2", "c3", "c5"]  # the list itself is in key order
    assert picked_ids(store, 4) == ["c1", "c2", "c3", "c5"]


def test_groups_go_as_under_wfq(store: Store) -> None:
    smallest(store, charge="count")
    hold(store, "a3", 3, group="a")
    hold(store, "a1", 1, group="a")
    hold(store, "b2", 2, group="b")
    hold(store, "b1", 1, group="b")
    got = pick(store, 4)
    assert [group_of(p) for p in got] == ["a", "b", "a", "b"]  # round robin, by count
    assert [p.hold_id for p in got] == ["a1", "b1", "a3", "b2"]


def test_aging_bounds_how_long_a_big_task_is_passed(store: Store) -> None:
    """A task of cost 10 held at NOW, aging 1 s: key NOW + 10 s. Small tasks (cost 0.5,
    key = held + 0.5 s) held every second pass it only while they were held before
    NOW + 9.5 s: ten of them; the ones held later go after it, however many come."""
    smallest(store, aging=1.0)
    hold(store, "big", 10, at=NOW)
    for k in range(20):
        hold(store, f"s{k:02}", 0.5, at=NOW + 1_000 * k)
    order = picked_ids(store, 21, now=NOW + 20_000)
    assert order.index("big") == 10
    assert order[:10] == [f"s{k:02}" for k in range(10)]
    ahead = order[:order.index("big")]
    assert all(int(h[1:]) * 1_000 < 10 * 1_000 for h in ahead)  # held before NOW + c·A


def test_aging_zero_is_arrival_order(store: Store) -> None:
    smallest(store, aging=0)
    for k, cost in enumerate((5, 1, 3)):
        hold(store, f"h{k}", cost, at=NOW + k)
    assert picked_ids(store, 3) == ["h0", "h1", "h2"]


def test_front_holds_go_first(store: Store) -> None:
    smallest(store)
    hold(store, "small", 0.5)
    hold(store, "retry", 9, front=True)  # a retry enters at the head, whatever its cost
    hold(store, "big", 5)
    assert listed(store) == ["retry", "small", "big"]
    assert store.boost_task(Q, "big", now_ms=NOW) == "a"  # to the front, once
    assert listed(store) == ["big", "retry", "small"]
    hold(store, "tiny", 0.1)  # keyed: behind the front ones, before "small"
    assert picked_ids(store, 4) == ["big", "retry", "tiny", "small"]


def test_a_reclaimed_task_goes_first_and_later_holds_keep_their_order(store: Store) -> None:
    smallest(store)
    hold(store, "big", 5)
    hold(store, "small", 1)
    [first] = picked_ids(store, 1)
    assert first == "small"
    assert store.reclaim(Q, NOW + 60_000, 10) == (1, 0)  # its lease ran out: held again
    hold(store, "mid", 2, at=NOW + 60_000)
    assert listed(store) == ["small", "big", "mid"]


def test_cancel_and_position_follow_the_key_order(store: Store) -> None:
    smallest(store)
    for hid, cost in (("c4", 4), ("c1", 1), ("c3", 3)):
        hold(store, hid, cost)
    where = store.locate("c3")
    assert where is not None and where.place is not None and where.place.position == 2
    assert [i for i, _ in store.cancel(Q, ["c1"], now_ms=NOW)] == ["c1"]
    hold(store, "c2", 2)
    assert listed(store) == ["c2", "c3", "c4"]
    assert picked_ids(store, 3) == ["c2", "c3", "c4"]


def test_a_delayed_task_is_keyed_when_it_becomes_held(store: Store) -> None:
    smallest(store)
    hold(store, "late", 1, due=NOW + 5_000)  # held at NOW + 5 s: key NOW + 6 s
    hold(store, "big", 5, at=NOW)  # key NOW + 5 s
    assert store.promote(Q, NOW + 5_000, 10)[0] == 1
    hold(store, "next", 1, at=NOW + 5_500)  # key NOW + 6.5 s
    assert listed(store) == ["big", "late", "next"]


def test_switching_policy_keeps_the_held_lists_working(store: Store) -> None:
    smallest(store, name=WFQ)
    hold(store, "w5", 5)
    hold(store, "w1", 1)
    smallest(store)  # held before the switch: first, in their order
    hold(store, "s3", 3)
    hold(store, "s2", 2)
    assert listed(store) == ["w5", "w1", "s2", "s3"]
    assert picked_ids(store, 1) == ["w5"]
    smallest(store, name=WFQ)  # back: the list keeps its order, new holds at its tail
    hold(store, "w0", 0.5)
    assert listed(store) == ["w1", "s2", "s3", "w0"]
    smallest(store)  # and again: new keyed holds after everything held before
    hold(store, "s1", 1)
    hold(store, "s0", 0.5)
    assert picked_ids(store, 6) == ["w1", "s2", "s3", "w0", "s0", "s1"]
