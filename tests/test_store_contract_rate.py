"""The store contract on every backend (``any_store``; see tests/store_helpers.py): rate
limits and throttles (``store/throttling.py``). A rate-limited group is metered by GCRA in
the pick and leaves the ready sets until its next token is due; ``promote`` lifts the
throttle and says when the next one is due; a task's throttle holds a
group back in both classes; a runtime rate lays over the settings and starts afresh."""

from __future__ import annotations

import pytest

from celery_fair.check import check
from celery_fair.errors import InvalidControl, InvalidGroup, InvalidLimit
from celery_fair.limits import Rate
from celery_fair.policy.decisions import INTERACTIVE
from celery_fair.store.base import KEEP, RATE_EARLY_MS, RESET, Policy, Store

from .store_helpers import (
    NOW,
    Q,
    group_of,
    hold,
    pick,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)

TEN_A_SECOND = Rate(100.0)


def picked(store: Store, now: int = NOW) -> list[str]:
    """The groups of everything one pick takes at ``now`` (up to 10), in order."""
    return [group_of(p) for p in pick(store, 10, now=now)]


def backlog(store: Store, group: str, n: int, **kw: object) -> None:
    for _ in range(n):
        hold(store, group, **kw)  # type: ignore[arg-type]


def test_a_rate_limited_group_gets_one_token_per_interval(store: Store) -> None:
    backlog(store, "acme", 5)
    backlog(store, "globex", 3)
    assert store.set_rate(Q, "acme", TEN_A_SECOND) == TEN_A_SECOND
    # one acme, then acme waits for its next token while globex goes on
    assert picked(store) == ["acme", "globex", "globex", "globex"]
    # a quiet group's token counts from RATE_EARLY_MS before now (gcra's late_ms)
    first = NOW + 100 - RATE_EARLY_MS
    assert store.throttles(Q) == {"acme": first}
    assert check(store, queues=[Q]).ok  # a throttled group is rightly not ready
    # promote names the step that lifts the throttle, when it ends
    assert store.promote(Q, NOW + 10, 1000) == (0, first)
    assert picked(store, NOW + 10) == []
    assert store.promote(Q, first - 1, 1000) == (0, first)
    assert store.throttles(Q) == {"acme": first}  # not yet
    assert store.promote(Q, first, 1000) == (0, None)
    assert store.throttles(Q) == {}
    assert picked(store, first) == ["acme"]
    assert store.throttles(Q) == {"acme": first + 100}


def test_a_burst_lets_that_many_go_at_once_after_a_quiet_spell(store: Store) -> None:
    backlog(store, "acme", 6)
    store.set_rate(Q, "acme", Rate(100.0, burst=3))
    assert picked(store) == ["acme"] * 3
    assert store.throttles(Q) == {"acme": NOW + 100 - RATE_EARLY_MS}
    store.promote(Q, NOW + 100, 1000)
    assert picked(store, NOW + 100) == ["acme"]  # one token back, not a new burst
    store.promote(Q, NOW + 1_000, 1000)  # quiet long enough to fill the bucket again
    assert picked(store, NOW + 1_000) == ["acme", "acme"]  # all that is left


def test_a_throttle_holds_a_group_back_in_both_classes(store: Store) -> None:
    hold(store, "acme", klass=INTERACTIVE)
    hold(store, "acme")
    hold(store, "globex")
    assert store.throttle(Q, "acme", NOW + 30_000) == NOW + 30_000
    assert store.throttle(Q, "acme", NOW + 1_000) == NOW + 30_000  # never shortened
    assert picked(store) == ["globex"]
    assert store.promote(Q, NOW + 1_000, 1000) == (0, NOW + 30_000)
    store.promote(Q, NOW + 30_000, 1000)
    assert store.throttles(Q) == {}
    assert picked(store, NOW + 30_000) == ["acme", "acme"]


def test_the_next_due_is_the_sooner_of_a_delayed_message_and_a_throttle(
        store: Store) -> None:
    hold(store, "acme")
    hold(store, "globex", due=NOW + 50)
    store.throttle(Q, "acme", NOW + 500)
    assert store.promote(Q, NOW, 1000) == (0, NOW + 50)
    assert store.promote(Q, NOW + 50, 1000) == (1, NOW + 500)


def test_settings_give_a_default_and_per_group_rates_under_runtime_ones(
        store: Store) -> None:
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, default_rate=Rate(1000.0),
                              rates={"acme": Rate(50.0), "free": None}))
    assert store.rates(Q) == {"acme": Rate(50.0), "free": None}
    for g in ("acme", "globex", "free"):
        backlog(store, g, 3)
    assert sorted(picked(store)) == ["acme", "free", "free", "free", "globex"]
    assert store.throttles(Q) == {"acme": NOW + 50 - RATE_EARLY_MS,
                                  "globex": NOW + 1_000 - RATE_EARLY_MS}
    assert store.set_rate(Q, "globex", None) is None  # no rate, whatever the default
    assert store.throttles(Q) == {"acme": NOW + 30}  # a change lifts its throttle
    assert picked(store) == ["globex", "globex"]
    assert store.set_rate(Q, "acme", Rate(20.0, 5)) == Rate(20.0, 5)
    assert store.set_rate(Q, "acme", KEEP) == Rate(20.0, 5)
    # a dispatcher restart configures the settings again: the runtime rate stays
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, default_rate=Rate(1000.0),
                              rates={"acme": Rate(50.0)}))
    assert store.rates(Q) == {"acme": Rate(20.0, 5), "globex": None}
    assert store.set_rate(Q, "acme", RESET) == Rate(50.0)  # the setting again
    assert store.set_rate(Q, "globex", RESET) == Rate(1000.0)  # the default again
    assert store.rates(Q) == {"acme": Rate(50.0)}


def test_a_runtime_rate_starts_the_bucket_full(store: Store) -> None:
    backlog(store, "acme", 4)
    store.set_rate(Q, "acme", Rate(60_000.0))  # one a minute
    assert picked(store) == ["acme"]
    store.set_rate(Q, "acme", Rate(60_000.0, burst=2))
    assert picked(store) == ["acme", "acme"]
    assert store.throttles(Q) == {"acme": NOW + 60_000 - RATE_EARLY_MS}


def test_bad_rates_and_groups_are_refused_before_anything_is_written(store: Store) -> None:
    hold(store, "acme")
    with pytest.raises(InvalidLimit, match="rate limit for group 'acme'"):
        store.set_rate(Q, "acme", Rate(0.0))
    with pytest.raises(InvalidLimit, match="burst"):
        store.set_rate(Q, "acme", Rate(100.0, burst=0))
    for bad in (Rate("100"), Rate(True), Rate(100.0, "2")):  # type: ignore[arg-type]
        with pytest.raises(InvalidLimit, match=r"rate limit for group 'acme' .*got Rate\("):
            store.set_rate(Q, "acme", bad)  # built by hand: named, not a TypeError
    with pytest.raises(InvalidGroup):
        store.set_rate(Q, "", Rate(100.0))
    with pytest.raises(InvalidGroup):
        store.throttle(Q, "a b\n", NOW + 1)
    for end in (float("inf"), float("nan"), "soon"):
        with pytest.raises(InvalidControl, match="a throttle's end must be a finite time"):
            store.throttle(Q, "acme", end)  # type: ignore[arg-type]
    with pytest.raises(InvalidLimit, match="default rate limit"):
        store.configure(Q, Policy(None, 0, 1.0, {}, {}, default_rate=Rate(-1.0)))
    assert store.rates(Q) == {}
    assert store.throttles(Q) == {}
    assert picked(store) == ["acme"]
