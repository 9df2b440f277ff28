"""The store contract on every backend (``any_store``; see tests/store_helpers.py):
hold, fair picking, capacity, caps and classes."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from celery_fair.envelope import BACKGROUND, INTERACTIVE, placement_of
from celery_fair.store.base import RESET, BeginResult, Picked, Store

from .store_helpers import (
    LEASE,
    NOW,
    Q,
    assert_round_robin,
    configure,
    group_of,
    hold,
    klass_of,
    pick,
    pick_groups,
    snapshot_groups,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
    value,
)


def test_hold_due_in_the_past_is_immediate(store: Store) -> None:
    hid = hold(store, "acme", due=NOW - 1)
    assert [p.hold_id for p in pick(store, 10)] == [hid]
    hid = hold(store, "acme", due=NOW, now=NOW)
    assert [p.hold_id for p in pick(store, 10)] == [hid]

def test_duplicate_hold_id_gets_a_suffix_and_overwrites_nothing(store: Store) -> None:
    first = value("acme", body=b"first")
    second = value("acme", body=b"second")
    third = value("other", body=b"third-delayed")
    fourth = value("other", body=b"fourth")
    assert store.hold(Q, "same", first, placement_of(first), 0, NOW) == "same"
    id2 = store.hold(Q, "same", second, placement_of(second), 0, NOW)
    assert id2 != "same" and id2.startswith("same")
    # delayed, same id again
    id3 = store.hold(Q, "same", third, placement_of(third), NOW + 100, NOW)
    assert id3 not in ("same", id2) and id3.startswith("same")
    id4 = store.hold(Q, "same", fourth, placement_of(fourth), 0, NOW)
    assert len({"same", id2, id3, id4}) == 4

    assert store.promote(Q, NOW + 100, 10) == (1, None)
    got = {p.hold_id: p.value for p in pick(store, 10, now=NOW + 100)}
    assert got == {"same": first, id2: second, id3: third, id4: fourth}

def test_the_same_hold_sent_twice_is_held_once(store: Store) -> None:
    """redis-py resends a call whose reply a dropped connection lost: the very same value
    under the same id is one publication, not a second copy (which would run twice)."""
    once = value("acme", body=b"payload")
    assert store.hold(Q, "t1", once, placement_of(once), 0, NOW) == "t1"
    assert store.hold(Q, "t1", once, placement_of(once), 0, NOW) == "t1"
    assert store.snapshot(Q)["held_background"] == 1
    assert [p.hold_id for p in pick(store, 10)] == ["t1"]
    assert pick(store, 10) == []

@pytest.mark.parametrize("batch", [1, 7, 300])
def test_pick_round_robin_three_equal_groups(store: Store, batch: int) -> None:
    groups = ["gamma", "alpha", "beta"]
    for g in groups:  # all of one group, then the next: fairness is not arrival order
        for _ in range(100):
            hold(store, g)
    order = pick_groups(store, 300, batch=batch)
    assert Counter(order) == {g: 100 for g in groups}
    assert_round_robin(order, groups)
    assert pick(store, 10) == []

def test_pick_round_robin_across_releases(store: Store) -> None:
    """Releasing as we go (a real dispatcher's pattern) keeps the interleaving."""
    groups = ["a", "b", "c"]
    for g in groups:
        for _ in range(60):
            hold(store, g)
    order: list[str] = []
    inflight: list[str] = []
    while len(order) < 180:
        got = pick(store, 5, capacity=4)
        assert got or inflight
        order.extend(group_of(p) for p in got)
        inflight.extend(p.dispatch_id for p in got)
        assert len(inflight) <= 4
        assert store.release(Q, inflight.pop(0))
    assert_round_robin(order, groups)

def test_pick_weights_three_to_one(store: Store) -> None:
    configure(store, weights={"heavy": 3.0})
    for _ in range(400):
        hold(store, "heavy")
        hold(store, "light")
    order = pick_groups(store, 400, batch=16)
    counts = Counter(order)
    share = counts["heavy"] / 400
    assert 0.75 * 0.95 <= share <= 0.75 * 1.05, counts
    # and at every point, not only on average
    heavy = 0
    for i, g in enumerate(order, 1):
        heavy += g == "heavy"
        assert abs(heavy - 0.75 * i) <= 2, (i, heavy)

def test_pick_default_weight_applies_to_groups_without_override(store: Store) -> None:
    configure(store, weight=2.0, weights={"slow": 1.0})
    for _ in range(300):
        hold(store, "normal")
        hold(store, "slow")
    counts = Counter(pick_groups(store, 300, batch=50))
    assert counts["normal"] == pytest.approx(200, abs=2), counts

def test_cost_affects_share(store: Store) -> None:
    for _ in range(400):
        hold(store, "cheap", cost=1)
        hold(store, "pricey", cost=3)
    order = pick_groups(store, 400, batch=9)
    counts = Counter(order)
    assert counts["cheap"] / 400 == pytest.approx(0.75, rel=0.05), counts
    # equal work (cost) per group, at every point
    work = Counter()
    for g in order:
        work[g] += 3 if g == "pricey" else 1
        assert abs(work["cheap"] - work["pricey"]) <= 3, dict(work)

def test_fractional_cost(store: Store) -> None:
    for _ in range(200):
        hold(store, "half", cost=0.5)
        hold(store, "whole", cost=1)
    counts = Counter(pick_groups(store, 150, batch=10))
    assert counts["half"] == pytest.approx(100, abs=2), counts

def test_new_group_starts_at_current_virtual_time(store: Store) -> None:
    for _ in range(100):
        hold(store, "old")
    assert Counter(pick_groups(store, 40, batch=8)) == {"old": 40}
    # "new" was idle all along: it gets its share from now on, no catching up
    for _ in range(40):
        hold(store, "new")
    order = pick_groups(store, 40, batch=3)
    counts = Counter(order)
    assert 19 <= counts["new"] <= 21, counts
    assert "new" in order[:2]  # but it does not wait behind old's backlog either
    assert_round_robin(order[1:], ["old", "new"])

def test_returning_group_gets_no_credit_for_idle_time(store: Store) -> None:
    for _ in range(200):
        hold(store, "busy")
    first = pick(store, 1)
    assert group_of(first[0]) == "busy"
    hold(store, "sometimes")
    took = pick(store, 2)
    assert [group_of(p) for p in took] == ["sometimes", "busy"]
    for p in first + took:
        store.release(Q, p.dispatch_id)
    assert "sometimes" not in snapshot_groups(store)  # idle: forgotten
    pick_groups(store, 100, batch=25)  # busy alone moves virtual time on
    for _ in range(30):
        hold(store, "sometimes")
    counts = Counter(pick_groups(store, 30, batch=5))
    assert 14 <= counts["sometimes"] <= 16, counts

def test_concurrent_picks_never_return_a_message_twice(store: Store) -> None:
    held = {hold(store, g) for g in ("a", "b", "c", "d") for _ in range(100)}
    results: list[list[Picked]] = [[] for _ in range(4)]

    def run(i: int) -> None:
        while True:  # one store object, as a dispatcher's threads share it
            got = store.pick(Q, 3, None, NOW, LEASE)
            if not got:
                return
            results[i].extend(got)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ids = [p.hold_id for r in results for p in r]
    dids = [p.dispatch_id for r in results for p in r]
    assert sorted(ids) == sorted(held)
    assert len(set(dids)) == len(dids)
    assert store.snapshot(Q)["inflight"] == 400

def test_a_pick_sent_twice_never_reuses_a_dispatch_id(store: Store) -> None:
    """redis-py resends a call whose reply a dropped connection lost (its default retry),
    and a pipeline is resent after NOSCRIPT: the same pick, same id prefix, reaches Redis
    twice. The second must not overwrite the first's records (found by the chaos
    campaign: a running task's record overwritten by another group's dispatch, whose
    release then freed the wrong group's slot, and whose copy was skipped as finished)."""
    for g in ("a", "b", "c", "d"):
        hold(store, g)
    first = store.pick(Q, 2, None, NOW, LEASE, token="same.")
    assert store.begin(Q, first[0].dispatch_id, NOW + LEASE, now_ms=NOW) is BeginResult.RUN
    again = store.pick(Q, 2, None, NOW, LEASE, token="same.")
    assert len(first) == len(again) == 2
    dids = [p.dispatch_id for p in first + again]
    assert len(set(dids)) == 4
    assert {group_of(p) for p in first + again} == {"a", "b", "c", "d"}
    # every slot is released once, by its own dispatch, in its own group
    for p in first + again:
        assert store.release(Q, p.dispatch_id) is True
    assert store.snapshot(Q)["inflight"] == 0
    assert all(g["inflight"] == 0 for g in snapshot_groups(store).values())

def test_pick_respects_capacity(store: Store) -> None:
    for _ in range(10):
        hold(store, "a")
        hold(store, "b")
    got = pick(store, 100, capacity=3)
    assert len(got) == 3
    assert pick(store, 100, capacity=3) == []
    assert store.snapshot(Q)["inflight"] == 3
    assert store.release(Q, got[0].dispatch_id)
    assert len(pick(store, 100, capacity=3)) == 1
    assert pick(store, 100, capacity=3) == []
    # a lower capacity (fewer workers now) takes nothing until in-flight drops below it
    assert pick(store, 100, capacity=2) == []
    assert pick(store, 100, capacity=0) == []
    assert len(pick(store, 100, capacity=5)) == 2
    assert store.snapshot(Q)["inflight"] == 5

def test_pick_respects_group_caps(store: Store) -> None:
    configure(store, cap=2, caps={"one": 1, "many": 5})
    for g in ("a", "b", "one", "many"):
        for _ in range(10):
            hold(store, g)
    got = pick(store, 100)
    counts = Counter(group_of(p) for p in got)
    assert counts == {"a": 2, "b": 2, "one": 1, "many": 5}
    assert pick(store, 100) == []
    snap = snapshot_groups(store)
    assert (snap["a"]["cap"], snap["one"]["cap"], snap["many"]["cap"]) == (2, 1, 5)
    assert snap["a"]["inflight"] == 2 and snap["a"]["held_background"] == 8

    # releasing a slot of "one" makes exactly one more of "one" pickable
    one = next(p for p in got if group_of(p) == "one")
    assert store.release(Q, one.dispatch_id)
    again = pick(store, 100)
    assert [group_of(p) for p in again] == ["one"]
    assert pick(store, 100) == []

def test_configure_lowers_and_raises_caps_of_backlogged_groups(store: Store) -> None:
    for _ in range(10):
        hold(store, "a")
    configure(store, cap=1)
    assert len(pick(store, 100)) == 1
    assert pick(store, 100) == []
    configure(store, cap=3)  # re-ranks: "a" is eligible again
    assert len(pick(store, 100)) == 2
    configure(store, cap=None)
    assert len(pick(store, 100)) == 7

def test_interactive_picked_before_background(store: Store) -> None:
    for _ in range(5):
        hold(store, "bulk")
    bg = pick(store, 2)  # background groups have run and their tags moved on
    assert [klass_of(p) for p in bg] == [BACKGROUND] * 2
    hold(store, "web", klass=INTERACTIVE)
    hold(store, "bulk", klass=INTERACTIVE)
    hold(store, "web", klass=INTERACTIVE)
    got = pick(store, 10)
    assert [klass_of(p) for p in got] == [INTERACTIVE] * 3 + [BACKGROUND] * 3
    assert Counter(group_of(p) for p in got[:3]) == {"web": 2, "bulk": 1}

def test_interactive_first_under_capacity(store: Store) -> None:
    for _ in range(5):
        hold(store, "bulk")
    hold(store, "web", klass=INTERACTIVE)
    got = pick(store, 10, capacity=1)
    assert [(group_of(p), klass_of(p)) for p in got] == [("web", INTERACTIVE)]

def test_interactive_reserve_above_cap(store: Store) -> None:
    configure(store, cap=1, reserve=1)
    for _ in range(3):
        hold(store, "a")
    [bg] = pick(store, 10)
    assert klass_of(bg) == BACKGROUND
    assert pick(store, 10) == []  # "a" is at its cap
    for _ in range(3):
        hold(store, "a", klass=INTERACTIVE)
    [i1] = pick(store, 10)  # the reserve lets one interactive through...
    assert klass_of(i1) == INTERACTIVE
    assert pick(store, 10) == []  # ...and not more than cap + reserve
    assert snapshot_groups(store)["a"]["inflight"] == 2

    assert store.release(Q, i1.dispatch_id)
    [i2] = pick(store, 10)
    assert klass_of(i2) == INTERACTIVE
    assert pick(store, 10) == []
    # the background slot ends: interactive still comes first, within cap + reserve
    assert store.release(Q, bg.dispatch_id)
    [i3] = pick(store, 10)
    assert klass_of(i3) == INTERACTIVE
    assert pick(store, 10) == []
    assert store.release(Q, i2.dispatch_id)
    assert store.release(Q, i3.dispatch_id)
    # interactive all gone; a background task may take the one cap slot, not the reserve
    got = pick(store, 10)
    assert [klass_of(p) for p in got] == [BACKGROUND]

def test_no_reserve_means_interactive_waits_at_cap(store: Store) -> None:
    configure(store, cap=1, reserve=0)
    hold(store, "a")
    assert len(pick(store, 10)) == 1
    hold(store, "a", klass=INTERACTIVE)
    assert pick(store, 10) == []
    hold(store, "b", klass=INTERACTIVE)  # other groups are not held up
    assert [group_of(p) for p in pick(store, 10)] == ["b"]

def test_a_paused_group_dispatches_nothing_in_any_class(store: Store) -> None:
    configure(store, cap=2)  # the production reserve: interactive work may go above a cap
    hold(store, "a", klass=INTERACTIVE)
    hold(store, "a")
    hold(store, "b", klass=INTERACTIVE)
    store.limit(Q, "a", 0)
    # cap 0 pauses the group: not even the interactive reserve lets its tasks through
    assert [group_of(p) for p in pick(store, 10)] == ["b"]
    assert store.limit(Q, "a", RESET) == (2, 1.0)  # resumed
    assert sorted((group_of(p), klass_of(p)) for p in pick(store, 10)) == \
        [("a", BACKGROUND), ("a", INTERACTIVE)]
