"""The store contract on every backend (``any_store``; see tests/store_helpers.py): how a
change of a group's rate in force meets its bucket and throttle, and the burst at high
rates (``store/throttling.py``). A change (``set_rate``, or ``configure`` by a restart
with other settings) starts the bucket full and lifts the old rate's throttle, not a
task's; the same rate again changes nothing; promote and pick repeated at one instant
never let more than the burst go, and a token taken a little late counts from its own
time."""

from __future__ import annotations

import pytest

from celery_fair.limits import Rate
from celery_fair.store.base import KEEP, RATE_EARLY_MS, RESET, Policy, Store

from .store_helpers import (
    NOW,
    Q,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)
from .test_store_contract_rate import backlog, picked

HOURLY = Rate(3_600_000.0)
NEXT_HOUR = NOW + 3_600_000 - RATE_EARLY_MS  # a quiet group's next token (gcra)


def settings(**rates: Rate | None) -> Policy:
    return Policy(None, 0, 1.0, {}, {}, rates=rates)


def test_a_restart_with_another_rate_drops_the_old_rates_throttle(store: Store) -> None:
    backlog(store, "acme", 4)
    store.configure(Q, settings(acme=HOURLY))
    assert picked(store) == ["acme"]
    store.configure(Q, settings(acme=HOURLY))  # the same settings: nothing changes
    assert store.throttles(Q) == {"acme": NEXT_HOUR}
    store.configure(Q, settings())  # the rate removed: not an hour's wait more
    assert store.throttles(Q) == {}
    assert store.promote(Q, NOW + 1, 1000) == (0, None)
    assert picked(store, NOW + 1) == ["acme"] * 3
    backlog(store, "acme", 3)
    store.configure(Q, settings(acme=HOURLY))
    assert picked(store, NOW + 2) == ["acme"]
    store.configure(Q, settings(acme=Rate(100.0)))  # raised: its bucket starts full
    assert store.throttles(Q) == {}
    assert picked(store, NOW + 3) == ["acme"]
    assert store.throttles(Q) == {"acme": NOW + 103 - RATE_EARLY_MS}


def test_a_restart_with_another_default_rate_drops_its_throttles(store: Store) -> None:
    backlog(store, "acme", 2)
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, default_rate=HOURLY))
    assert picked(store) == ["acme"]
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, default_rate=Rate(50.0)))
    assert store.throttles(Q) == {}
    assert picked(store) == ["acme"]


def test_a_rate_change_never_lifts_a_tasks_throttle(store: Store) -> None:
    backlog(store, "acme", 2)
    store.configure(Q, settings(acme=Rate(100.0)))
    assert picked(store) == ["acme"]
    store.throttle(Q, "acme", NOW + 30_000)  # a 429: later than its rate's throttle
    store.configure(Q, settings())
    assert store.set_rate(Q, "acme", Rate(50.0)) == Rate(50.0)
    assert store.set_rate(Q, "acme", None) is None
    assert store.set_rate(Q, "acme", RESET) is None
    assert store.throttles(Q) == {"acme": NOW + 30_000}
    store.promote(Q, NOW + 1_000, 1000)
    assert picked(store, NOW + 1_000) == []
    store.promote(Q, NOW + 30_000, 1000)
    assert picked(store, NOW + 30_000) == ["acme"]


def test_the_rate_in_force_again_changes_nothing(store: Store) -> None:
    backlog(store, "acme", 3)
    store.configure(Q, settings(acme=HOURLY))
    assert picked(store) == ["acme"]
    # `fair limit acme --reset` with no runtime rate, or the same rate set again
    assert store.set_rate(Q, "acme", RESET) == HOURLY
    assert store.set_rate(Q, "acme", HOURLY) == HOURLY
    assert store.set_rate(Q, "acme", RESET) == HOURLY
    assert store.set_rate(Q, "acme", KEEP) == HOURLY
    assert store.throttles(Q) == {"acme": NEXT_HOUR}
    store.promote(Q, NOW + 1, 1000)
    assert picked(store, NOW + 1) == []
    # nor lifts a task's throttle
    backlog(store, "globex", 2)
    store.throttle(Q, "globex", NOW + 5_000)
    assert store.set_rate(Q, "globex", RESET) is None
    assert store.set_rate(Q, "globex", None) is None
    assert store.throttles(Q)["globex"] == NOW + 5_000
    assert picked(store, NOW + 1) == []


@pytest.mark.parametrize("rate", [Rate(10.0), Rate(1.0), Rate(10.0, burst=3),
                                  Rate(1.0, burst=5), Rate(30.0, burst=2)])
def test_promote_and_pick_at_one_instant_never_exceed_the_burst(store: Store,
                                                               rate: Rate) -> None:
    backlog(store, "acme", 30)
    store.set_rate(Q, "acme", rate)
    took = 0
    for _ in range(10):
        store.promote(Q, NOW, 1000)
        took += len(picked(store))
    assert took == rate.burst
    # a token taken late still never lets more than the burst go at once
    late = NOW + 100 * int(rate.interval_ms) + 3
    for _ in range(10):
        store.promote(Q, late, 1000)
        took += len(picked(store, late))
    assert took == 2 * rate.burst


def test_a_token_taken_a_little_late_counts_from_its_own_time(store: Store) -> None:
    backlog(store, "acme", 5)
    store.set_rate(Q, "acme", Rate(100.0))
    assert picked(store) == ["acme"]
    first = NOW + 100 - RATE_EARLY_MS  # a quiet group's token counts from now - 20 ms
    # promote names the token's own time; a dispatcher that wakes 5 ms late loses nothing
    assert store.promote(Q, NOW + 10, 1000) == (0, first)
    assert store.promote(Q, first - 1, 1000) == (0, first)
    assert picked(store, first - 1) == []
    assert store.promote(Q, first + 5, 1000) == (0, None)
    assert picked(store, first + 5) == ["acme"]
    assert store.throttles(Q) == {"acme": first + 100}
    # later than RATE_EARLY_MS: only the excess is lost
    late = first + 100 + RATE_EARLY_MS + 5
    store.promote(Q, late, 1000)
    assert picked(store, late) == ["acme"]
    assert store.throttles(Q) == {"acme": late - RATE_EARLY_MS + 100}
