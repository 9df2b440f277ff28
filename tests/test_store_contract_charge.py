"""The store contract on every backend (``any_store``): what a dispatch charges its
group's share under wfq (``fair_charge``). 'cost' (the default) advances the group's tag
by cost / weight, 'count' by 1 / weight whatever the cost, and 'runtime' by the cost at
pick (the estimate) then by (runtime - estimate) / weight when the release reports the
seconds the task ran: the tags, and the pick order they make."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fair.envelope import BACKGROUND
from celery_fair.errors import InvalidLimit
from celery_fair.limits import COST, COUNT, RUNTIME
from celery_fair.store.base import BeginResult, Picked, Policy, Store
from celery_fair.store.models import HARMONY
from celery_fair.store.redis import RedisStore

from .store_helpers import (
    LEASE,
    NOW,
    Q,
    group_of,
    hold,
    pick,
    pick_groups,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def charge(store: Store, how: str, weights: dict[str, float] | None = None,
           name: str = "wfq") -> None:
    store.configure(Q, Policy(None, 0, 1.0, {}, weights or {}, name=name, charge=how))


def tag(store: Store, group: str, klass: str = BACKGROUND) -> float | None:
    """The group's virtual start tag of ``klass`` (None: none): Redis's from its keys,
    the others' through their ``inspect``."""
    if isinstance(store, RedisStore):
        raw = store.client.hget(store.keys(Q).group(group), "t" + klass)
        return None if raw is None else float(raw)
    state: Any = store.inspect(Q)  # type: ignore[attr-defined]
    return state.tags.get((klass, group))


def backlog(store: Store, costs: dict[str, float], n: int = 6) -> None:
    for _ in range(n):
        for g, cost in costs.items():
            hold(store, g, cost=cost)


def ran(store: Store, picked: Picked, runtime: float | None) -> bool:
    """``picked`` run to its end by a worker that measured ``runtime`` seconds."""
    store.confirm(Q, [picked.dispatch_id], NOW + LEASE)
    store.begin(Q, picked.dispatch_id, NOW + LEASE, now_ms=NOW, run="r1")
    return store.release(Q, picked.dispatch_id, 3600, run="r1", runtime=runtime)


def test_the_default_charge_is_the_cost(store: Store) -> None:
    store.configure(Q, Policy(None, 0, 1.0, {}, {}))  # no charge named: as before it
    backlog(store, {"a": 3.0, "b": 1.0})
    assert pick_groups(store, 5) == ["a", "b", "b", "b", "a"]
    assert tag(store, "a") == 6.0 and tag(store, "b") == 3.0


def test_count_charges_one_per_task_whatever_its_cost(store: Store) -> None:
    charge(store, COUNT)
    backlog(store, {"a": 3.0, "b": 1.0})
    assert pick_groups(store, 6) == ["a", "b"] * 3
    assert tag(store, "a") == 3.0 and tag(store, "b") == 3.0


def test_count_divides_by_the_weight(store: Store) -> None:
    charge(store, COUNT, {"a": 2.0})
    backlog(store, {"a": 5.0, "b": 1.0})
    assert pick_groups(store, 6) == ["a", "b", "a", "a", "b", "a"]
    assert tag(store, "a") == 2.0


def test_runtime_charges_the_estimate_then_corrects_it_by_the_runtime(store: Store) -> None:
    charge(store, RUNTIME)
    backlog(store, {"a": 1.0, "b": 1.0})
    first = pick(store, 2)
    assert [group_of(p) for p in first] == ["a", "b"]
    assert tag(store, "a") == 1.0  # the declared cost, as the estimate
    assert ran(store, first[0], 0.25)  # a ran a quarter of a second
    assert tag(store, "a") == 0.25
    assert ran(store, first[1], 3.0)  # b ran three
    assert tag(store, "b") == 3.0
    # a has used 0.25 s, b 3 s; their next estimates are their runtimes so far (the
    # means): a goes until its estimates pass b's tag, or it runs dry
    assert pick_groups(store, 6) == ["a"] * 5 + ["b"]
    assert tag(store, "a") == 0.25 + 5 * 0.25 and tag(store, "b") == 6.0


def test_the_estimate_is_the_groups_mean_runtime(store: Store) -> None:
    """Each runtime moves the group's mean an eighth of the way (the first is the mean);
    its next dispatches are charged the mean, corrected again at release."""
    charge(store, RUNTIME)
    backlog(store, {"a": 1.0})
    [first] = pick(store)
    assert ran(store, first, 2.0)
    assert tag(store, "a") == 2.0  # 1 charged, + (2 - 1)
    [second] = pick(store)
    assert tag(store, "a") == 4.0  # charged the mean, 2
    assert ran(store, second, 6.0)
    assert tag(store, "a") == 8.0  # + (6 - 2); the mean 2 + (6 - 2) / 8 = 2.5
    pick(store)
    assert tag(store, "a") == 10.5


def test_runtime_corrections_are_per_unit_of_weight(store: Store) -> None:
    charge(store, RUNTIME, {"a": 4.0})
    backlog(store, {"a": 2.0})
    [picked] = pick(store)
    assert tag(store, "a") == 0.5
    assert ran(store, picked, 1.0)
    assert tag(store, "a") == 0.5 + (1.0 - 2.0) / 4.0


@pytest.mark.parametrize("how", [COST, COUNT])
def test_other_charges_ignore_a_reported_runtime(store: Store, how: str) -> None:
    charge(store, how)
    backlog(store, {"a": 2.0})
    [picked] = pick(store)
    before = tag(store, "a")
    assert ran(store, picked, 0.5)
    assert tag(store, "a") == before


@pytest.mark.parametrize("runtime", [None, float("nan"), -1.0, 1e12])
def test_a_release_without_a_runtime_leaves_the_estimate(store: Store,
                                                         runtime: float | None) -> None:
    """An older worker (no runtime), a release retried later, or a runtime that is not a
    number of seconds from 0 to a year: no correction, no mean."""
    charge(store, RUNTIME)
    backlog(store, {"a": 1.5})
    first, second = pick(store, 2)
    assert store.release(Q, first.dispatch_id)
    assert ran(store, second, runtime)
    assert tag(store, "a") == 3.0
    pick(store)
    assert tag(store, "a") == 4.5  # still charged its cost: no mean


def test_the_estimate_charged_at_pick_is_corrected_under_a_later_charge(
        store: Store) -> None:
    """The dispatch keeps what it was charged: a restart with another charge in between
    still corrects it (and a dispatch picked under 'cost' is never corrected)."""
    charge(store, RUNTIME)
    backlog(store, {"a": 1.0})
    [under_runtime] = pick(store)
    charge(store, COST)
    [under_cost] = pick(store)
    assert tag(store, "a") == 2.0
    charge(store, RUNTIME)
    assert ran(store, under_cost, 0.5)
    assert tag(store, "a") == 2.0
    assert ran(store, under_runtime, 0.5)
    assert tag(store, "a") == 1.5
    pick(store)
    assert tag(store, "a") == 2.0  # the mean of the one runtime corrected


def test_a_lost_dispatch_corrects_nothing(store: Store) -> None:
    """A dispatch whose worker died (its slot reclaimed) releases nothing: its group may
    have been forgotten and come back since."""
    charge(store, RUNTIME)
    backlog(store, {"a": 1.0}, n=3)
    [picked] = pick(store)
    store.confirm(Q, [picked.dispatch_id], NOW + LEASE)
    assert store.begin(Q, picked.dispatch_id, NOW + LEASE, now_ms=NOW,
                       run="r1") is BeginResult.RUN
    assert store.reclaim(Q, NOW + LEASE + 1, 100) == (0, 1)
    before = tag(store, "a")
    assert not store.release(Q, picked.dispatch_id, 3600, run="r1", runtime=0.1)
    assert tag(store, "a") == before


def _overcharged(store: Store, held: int) -> None:
    """a and b charged an estimate of 10 each; b ran 10, then a ran 0 twice: a's tag 0,
    the virtual time 10 (a's second pick)."""
    charge(store, RUNTIME)
    for _ in range(held):
        hold(store, "a", cost=10.0)
    hold(store, "b", cost=10.0)
    hold(store, "b", cost=10.0)
    a1, b1 = pick(store, 2)
    assert ran(store, b1, 10.0)  # b as estimated: tag 10
    [a2] = pick(store)  # a and b at 10: a by name, the virtual time 10 now
    assert group_of(a2) == "a"
    assert ran(store, a1, 0.0)
    assert ran(store, a2, 0.0)  # a's tag 20 - 20 = 0, below the virtual time


def test_a_waiting_group_keeps_a_correction_below_the_virtual_time(store: Store) -> None:
    """What a group was overcharged is its own: while it waits in the ready set its
    tag stays below the virtual time, and it goes first."""
    _overcharged(store, held=3)
    assert tag(store, "a") == 0.0
    assert group_of(pick(store)[0]) == "a"


def test_a_group_that_ran_dry_enters_again_at_the_virtual_time(store: Store) -> None:
    """A group with nothing held is out of the ready set: when work comes back it
    enters at the virtual time, as a group back from idling (no credit)."""
    _overcharged(store, held=2)
    hold(store, "a", cost=10.0)
    assert tag(store, "a") == 10.0


@pytest.mark.parametrize("any_store", ["memory", "redis"], indirect=True)
def test_harmony_charges_nothing_and_corrects_nothing(store: Store) -> None:
    charge(store, RUNTIME, name=HARMONY)
    backlog(store, {"a": 1.0}, n=2)
    [picked] = pick(store)
    assert ran(store, picked, 5.0)
    assert tag(store, "a") is None


def test_an_unknown_charge_is_refused_before_anything_is_written(store: Store) -> None:
    charge(store, COUNT)
    with pytest.raises(InvalidLimit, match="charge must be one of"):
        charge(store, "seconds")
    backlog(store, {"a": 3.0}, n=1)
    pick(store)
    assert tag(store, "a") == 1.0  # still count
