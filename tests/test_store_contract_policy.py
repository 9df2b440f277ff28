"""The store contract on every backend (``any_store``; see tests/store_helpers.py):
promote, group names, runtime limits and the held counters."""

from __future__ import annotations

from collections import Counter

import pytest

from celery_fair.envelope import INTERACTIVE
from celery_fair.store.base import RESET, Store

from .store_helpers import (
    LEASE,
    NOW,
    Q,
    _assert_counters_exact,
    configure,
    group_of,
    hold,
    klass_of,
    pick,
    pick_groups,
    snapshot_groups,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def test_promote_retries_to_head_others_to_tail(store: Store) -> None:
    hold(store, "a", hold_id="a1")
    hold(store, "a", hold_id="a2")
    hold(store, "a", hold_id="eta", due=NOW + 100)
    hold(store, "a", hold_id="retry", front=True, due=NOW + 100)
    hold(store, "a", hold_id="later", due=NOW + 500)
    hold(store, "b", hold_id="b-retry", front=True, due=NOW + 700)
    assert store.promote(Q, NOW + 99, 100) == (0, NOW + 100)
    assert store.promote(Q, NOW + 100, 100) == (2, NOW + 500)
    assert snapshot_groups(store)["a"]["delayed"] == 1
    got = pick(store, 10, now=NOW + 100)
    assert [p.hold_id for p in got] == ["retry", "a1", "a2", "eta"]
    assert store.promote(Q, NOW + 10_000, 1) == (1, NOW + 700)  # limit respected
    assert store.promote(Q, NOW + 10_000, 100) == (1, None)
    assert store.promote(Q, NOW + 10_000, 100) == (0, None)
    assert [p.hold_id for p in pick(store, 10, now=NOW + 10_000)] in (
        ["later", "b-retry"], ["b-retry", "later"])

def test_promote_makes_a_group_ready_and_a_retry_skips_its_backlog(store: Store) -> None:
    configure(store, cap=1)
    for i in range(3):
        hold(store, "a", hold_id=f"a{i}")
    [p] = pick(store, 1)
    # the running task retries: its new message is delayed, then re-enters at the head
    hold(store, "a", hold_id="a0-retry", front=True, due=NOW + 50)
    assert store.release(Q, p.dispatch_id)
    assert store.promote(Q, NOW + 50, 100) == (1, None)
    assert [x.hold_id for x in pick(store, 10, now=NOW + 50)] == ["a0-retry"]

@pytest.mark.parametrize("names", [
    ["emoji 😀🎉", "租户 七", "ünïcödé", "with space", " lead"],
    ["a:b", "a", "b:a", "q:b:x", "x:", ":"],
    ["{brace}", "}{", "{", "}", "{a}:{b}", "ns:{fairq}:g"],
])
def test_group_names_used_verbatim_as_keys(store: Store, names: list[str]) -> None:
    configure(store, cap=2, caps={names[0]: 1}, weights={names[1]: 2.0})
    for g in names:
        for _ in range(4):
            hold(store, g)
        hold(store, g, klass=INTERACTIVE)
    snap = snapshot_groups(store)
    assert set(snap) == set(names)
    assert snap[names[0]]["cap"] == 1 and snap[names[1]]["weight"] == 2.0
    assert all(row["held_background"] == 4 and row["held_interactive"] == 1
               for row in snap.values())
    got = pick(store, 1000)
    counts = Counter(group_of(p) for p in got)
    # cap 1 (override, read back from JSON by the script) or the default cap 2
    assert counts == {g: 1 if g == names[0] else 2 for g in names}
    assert all(Counter(klass_of(p) for p in got if group_of(p) == g)[INTERACTIVE] == 1
               for g in names)
    for p in got:
        assert store.release(Q, p.dispatch_id)
    got = pick(store, 1000)
    assert Counter(group_of(p) for p in got) == {g: 1 if g == names[0] else 2 for g in names}
    for p in got:
        store.release(Q, p.dispatch_id)
    while more := pick(store, 1000):
        for p in more:
            store.release(Q, p.dispatch_id)
    assert snapshot_groups(store) == {}  # every name's keys were found again to forget it

    # weight overrides reach the script under the same name
    configure(store, weights={names[1]: 2.0})
    for _ in range(60):
        hold(store, names[1])
        hold(store, names[2])
    assert snapshot_groups(store)[names[1]]["held_background"] == 60
    counts = Counter(pick_groups(store, 60, batch=7))
    assert counts == {names[1]: 40, names[2]: 20}

def test_group_name_containing_another_groups_key_does_not_collide(
        store: Store) -> None:
    # "x" background list is <prefix>:q:b:x; a group named "b:x" has <prefix>:q:b:b:x
    hold(store, "x", hold_id="plain")
    hold(store, "b:x", hold_id="tricky")
    hold(store, "i:x", hold_id="tricky-i")
    got = pick(store, 10)
    assert {(p.hold_id, group_of(p)) for p in got} == {
        ("plain", "x"), ("tricky", "b:x"), ("tricky-i", "i:x")}

def test_limit_overrides_settings_at_once_and_survives_configure(store: Store) -> None:
    configure(store, cap=1)
    for _ in range(4):
        hold(store, "a")
    assert len(pick(store, 4)) == 1                      # the setting's cap
    assert store.limit(Q, "a", 3) == (3, 1.0)
    assert len(pick(store, 4)) == 2                      # re-ranked at once: 3 in flight
    configure(store, cap=1)                              # a dispatcher (re)starts
    row = snapshot_groups(store)["a"]
    assert (row["cap"], row["limited"]) == (3, ["cap"])
    assert store.limit(Q, "a", RESET) == (1, 1.0)       # back to the setting
    assert snapshot_groups(store)["a"]["limited"] == []

def test_limit_reset_restores_the_groups_own_setting(store: Store) -> None:
    configure(store, cap=1, caps={"a": 2}, weights={"a": 4})
    assert store.limit(Q, "a", 5, 0.5) == (5, 0.5)
    configure(store, cap=1, caps={"a": 2}, weights={"a": 4})  # a dispatcher restarts
    assert store.limit(Q, "a") == (5, 0.5)
    assert store.limit(Q, "a", RESET, RESET) == (2, 4.0)
    assert store.limit(Q, "b", 3) == (3, 1.0)
    assert store.limit(Q, "b", RESET) == (1, 1.0)             # the queue default

def test_limit_zero_pauses_a_group_and_minus_one_lifts_the_cap(store: Store) -> None:
    configure(store, cap=1)
    hold(store, "a")
    hold(store, "a")
    hold(store, "b")
    store.limit(Q, "a", 0)
    assert [group_of(p) for p in pick(store, 5)] == ["b"]
    assert store.limit(Q, "a", -1) == (None, 1.0)
    assert [group_of(p) for p in pick(store, 5)] == ["a", "a"]

def test_limit_weight_is_used_by_pick(store: Store) -> None:
    configure(store, weights={"a": 1})
    for _ in range(8):
        hold(store, "a")
        hold(store, "b")
    assert store.limit(Q, "a", weight=3) == (None, 3.0)
    assert Counter(pick_groups(store, 8)) == {"a": 6, "b": 2}

def test_held_counters_follow_every_script(store: Store) -> None:
    configure(store, cap=2)
    for g in ("a", "a", "a", "b"):
        hold(store, g)
    hold(store, "c", INTERACTIVE)
    hold(store, "b", due=NOW + 100)
    _assert_counters_exact(store)
    assert store.top_groups(Q, 1) == [("a", 3)]
    store.promote(Q, NOW + 100, 10)                       # delayed -> held
    _assert_counters_exact(store)
    picked = pick(store, 3)
    _assert_counters_exact(store)
    store.reclaim(Q, NOW + LEASE + 1, 10)                 # picked -> held again
    _assert_counters_exact(store)
    held_id = hold(store, "d")
    store.cancel(Q, [held_id])
    _assert_counters_exact(store)
    assert store.queue_figures(Q).released == 0
    again = pick(store, 2)
    store.confirm(Q, [p.dispatch_id for p in again], NOW + LEASE * 10)
    store.release(Q, again[0].dispatch_id)
    store.release(Q, again[0].dispatch_id)                # idempotent: counted once
    assert store.queue_figures(Q).released == 1
    assert picked  # (the first pick's dispatches were reclaimed above)
